# cython: language_level=3
"""Cached scoring sessions and the persistent tuning cache.

A :c:type:`CSession` wraps the core per-thread :c:type:`SessionC` with an exact n-gram score
cache (key: the n-1 padded context ids and the word; no hash-only keys, so a collision can
never return a wrong score).  With a persistent directory ``DIR`` the cache of sentence ``i``
is also kept on disk in ``DIR/<model checksum>/<i>.nlmc``: loaded at sentence begin, merged
with whatever another process wrote meanwhile and written atomically (temporary file +
rename, under an advisory lock) at sentence end.  Tuning decodes the same dev set many
times; from the second iteration on most n-gram scores come from these files.

File format (little-endian)::

    0   8 bytes  magic "NLMPCACH"
    8   uint32   format version (1)
    12  uint32   key length K (= model order: n-1 context ids + word)
    16  8 bytes  model checksum (raw)
    24  int64    sentence id
    32  uint64   entry count N
    40  int32    keys (N, K)
        float64  scores (N,)
        uint64   checksum of all preceding bytes (see :func:`data_checksum`)

A file that is truncated, corrupt, of another version, model or sentence is ignored with a
warning on stderr and rewritten at sentence end.  The directory is bounded: when its size
exceeds ``max_bytes`` the least recently used files (by mtime; a load touches the file) are
deleted until it is under 80% of the bound.

Everything here except the Python classes at the bottom runs without the GIL.
"""
cimport cython
from libc.errno cimport errno, ENOENT, EEXIST, EINTR
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdio cimport fprintf, stderr, snprintf, rename, FILE, fopen, fwrite, fclose
from libc.stdlib cimport getenv
from libc.stdlib cimport calloc, free, malloc, realloc, qsort
from libc.string cimport memcpy, memset, strlen, strerror, strcmp, strncpy
from posix.stat cimport struct_stat, fstat, stat, S_ISDIR, S_ISREG
from cpython.pycapsule cimport PyCapsule_GetPointer

from nlmfeature._scorer cimport (ModelC, SessionC, nlm_session_new, nlm_session_free,
                                 nlm_session_begin, nlm_score_padded, nlm_pad_context,
                                 splitmix64, NLM_MAX_ORDER, NgramTable, nt_alloc, nt_free,
                                 nt_clear, nt_find, nt_insert, nt_slot, nt_value, nt_set, nt_disk,
                                 nt_live, nlm_alloc_lines)

import numpy as np

cdef extern from "<fcntl.h>" nogil:
    int c_open "open"(const char* path, int flags, ...)
    int O_RDONLY, O_WRONLY, O_RDWR, O_CREAT, O_TRUNC, O_EXCL, O_CLOEXEC

cdef extern from "<unistd.h>" nogil:
    ssize_t c_read "read"(int fd, void* buf, size_t n)
    ssize_t c_write "write"(int fd, const void* buf, size_t n)
    int c_close "close"(int fd)
    int c_unlink "unlink"(const char* path)
    int c_getpid "getpid"()

cdef extern from "<sys/stat.h>" nogil:
    int c_mkdir "mkdir"(const char* path, unsigned int mode)
    int c_futimens "futimens"(int fd, const void* times)

cdef extern from "<sys/file.h>" nogil:
    int c_flock "flock"(int fd, int op)
    int LOCK_EX, LOCK_UN

cdef extern from "<dirent.h>" nogil:
    ctypedef struct DIR:
        pass
    struct dirent:
        char d_name[256]
    DIR* opendir(const char* name)
    dirent* readdir(DIR* d)
    int closedir(DIR* d)

cdef extern from *:
    """
    static unsigned long long nlm_pcache_counter = 0;
    static unsigned long long nlm_pcache_next(void) {
        return __atomic_fetch_add(&nlm_pcache_counter, 1, __ATOMIC_RELAXED);
    }
    """
    unsigned long long nlm_pcache_next() nogil

cdef enum:
    HEADER_BYTES = 40
    PATH_MAX_LEN = 4096
cdef const char* MAGIC = b"NLMPCACH"
cdef uint32_t FORMAT_VERSION = 1
cdef int64_t C_DEFAULT_MAX_BYTES = 4LL << 30
cdef int64_t C_DEFAULT_NGRAM_ENTRIES = 1 << 20
#: default bound on a persistent cache directory (bytes)
DEFAULT_MAX_BYTES = C_DEFAULT_MAX_BYTES
#: default bound on the n-gram cache entries of one sentence
DEFAULT_NGRAM_ENTRIES = C_DEFAULT_NGRAM_ENTRIES
FILE_SUFFIX = ".nlmc"
HEADER_SIZE = HEADER_BYTES

# ---------------------------------------------------------------------------------------
# file helpers
# ---------------------------------------------------------------------------------------

cdef uint64_t data_checksum_c(const unsigned char* p, int64_t n) noexcept nogil:
    """64-bit checksum: splitmix64 chained over little-endian 8-byte words, then the tail."""
    cdef uint64_t h = 0x6A09E667F3BCC909ULL ^ <uint64_t>n
    cdef uint64_t w
    cdef int64_t i = 0, j
    while i + 8 <= n:
        memcpy(&w, p + i, 8)
        h = splitmix64(h ^ w)
        i += 8
    if i < n:
        w = 0
        for j in range(n - i):
            w |= (<uint64_t>p[i + j]) << (8 * j)
        h = splitmix64(h ^ w)
    return h


cdef int write_all(int fd, const void* buf, int64_t n) noexcept nogil:
    cdef const char* p = <const char*>buf
    cdef ssize_t r
    while n > 0:
        r = c_write(fd, p, n)
        if r < 0:
            if errno == EINTR:
                continue
            return -1
        p += r
        n -= r
    return 0


cdef unsigned char* read_file(const char* path, int64_t* size, int* err, int touch) noexcept nogil:
    """Whole file in a malloc'd buffer (NULL + err=errno on failure, err=0 if absent...)."""
    cdef int fd = c_open(path, O_RDONLY | O_CLOEXEC)
    cdef struct_stat st
    cdef unsigned char* buf
    cdef int64_t got = 0
    cdef ssize_t r
    if fd < 0:
        err[0] = errno
        return NULL
    if fstat(fd, &st) != 0:
        err[0] = errno
        c_close(fd)
        return NULL
    buf = <unsigned char*>malloc(st.st_size + 1)
    if buf == NULL:
        err[0] = 12  # ENOMEM
        c_close(fd)
        return NULL
    while got < st.st_size:
        r = c_read(fd, buf + got, st.st_size - got)
        if r < 0:
            if errno == EINTR:
                continue
            err[0] = errno
            free(buf)
            c_close(fd)
            return NULL
        if r == 0:
            break
        got += r
    if touch:
        c_futimens(fd, NULL)  # LRU: a use counts as recent (best effort)
    c_close(fd)
    size[0] = got
    err[0] = 0
    return buf


cdef const char* check_file(const unsigned char* buf, int64_t size, int key_len,
                            const unsigned char* checksum, int64_t sentence_id,
                            uint64_t* count) noexcept nogil:
    """NULL if ``buf`` is a valid cache file for this model/sentence, else the reason."""
    cdef uint32_t version, klen
    cdef int64_t sid
    cdef uint64_t n, stored
    if size < 8 or memcmp_(buf, <const unsigned char*>MAGIC, 8) != 0:
        return "not an nlmfeature cache file (bad magic number)"
    if size < HEADER_BYTES + 8:
        return "truncated (shorter than a header)"
    memcpy(&version, buf + 8, 4)
    memcpy(&klen, buf + 12, 4)
    memcpy(&sid, buf + 24, 8)
    memcpy(&n, buf + 32, 8)
    if version != FORMAT_VERSION:
        return "written by another cache format version"
    if klen != <uint32_t>key_len:
        return "written for a model of another order"
    if memcmp_(buf + 16, checksum, 8) != 0:
        return "written for another model (checksum differs)"
    if sid != sentence_id:
        return "written for another sentence id"
    if n > <uint64_t>((size - HEADER_BYTES - 8) // (4 * key_len + 8)) or \
            <int64_t>(HEADER_BYTES + n * (4 * key_len + 8) + 8) != size:
        return "truncated or extended (size does not match the entry count)"
    memcpy(&stored, buf + size - 8, 8)
    if stored != data_checksum_c(buf, size - 8):
        return "corrupted (checksum mismatch)"
    count[0] = n
    return NULL


cdef inline int memcmp_(const unsigned char* a, const unsigned char* b, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if a[i] != b[i]:
            return 1
    return 0


cdef int make_dirs(const char* path) noexcept nogil:
    """mkdir -p; 0 on success."""
    cdef char buf[PATH_MAX_LEN]
    cdef size_t n = strlen(path), i
    cdef struct_stat st
    if n == 0 or n >= PATH_MAX_LEN:
        return -1
    memcpy(buf, path, n + 1)
    for i in range(1, n):
        if buf[i] == b'/':
            buf[i] = 0
            if c_mkdir(buf, 0o777) != 0 and errno != EEXIST:
                return -1
            buf[i] = b'/'
    if c_mkdir(buf, 0o777) != 0 and errno != EEXIST:
        return -1
    if stat(path, &st) != 0 or not S_ISDIR(st.st_mode):
        return -1
    return 0

# ---------------------------------------------------------------------------------------
# pruning (bounded disk use)
# ---------------------------------------------------------------------------------------

ctypedef struct FileEntry:
    int64_t mtime
    int64_t size
    char* path


cdef int cmp_entry(const void* a, const void* b) noexcept nogil:
    cdef const FileEntry* x = <const FileEntry*>a
    cdef const FileEntry* y = <const FileEntry*>b
    if x.mtime != y.mtime:
        return -1 if x.mtime < y.mtime else 1
    return strcmp(x.path, y.path)


cdef int ends_with(const char* s, const char* suffix) noexcept nogil:
    cdef size_t n = strlen(s), m = strlen(suffix)
    return n >= m and strcmp(s + n - m, suffix) == 0


cdef int64_t prune_dir(const char* root, int64_t max_bytes, int64_t* removed) noexcept nogil:
    """Size of ``root``'s cache files after deleting the least recently used ones, if the
    total exceeds ``max_bytes``, until it is under 80% of it.  -1 if unreadable."""
    cdef DIR* d = opendir(root)
    cdef DIR* sd
    cdef dirent* e
    cdef dirent* f
    cdef char sub[PATH_MAX_LEN]
    cdef char path[PATH_MAX_LEN]
    cdef struct_stat st
    cdef FileEntry* files = NULL
    cdef FileEntry* grown
    cdef int64_t n = 0, cap = 0, total = 0, i, target
    removed[0] = 0
    if d == NULL:
        return -1
    while True:
        e = readdir(d)
        if e == NULL:
            break
        if e.d_name[0] == b'.' or strlen(e.d_name) != 16:
            continue
        snprintf(sub, PATH_MAX_LEN, "%s/%s", root, e.d_name)
        sd = opendir(sub)
        if sd == NULL:
            continue
        while True:
            f = readdir(sd)
            if f == NULL:
                break
            if not (ends_with(f.d_name, ".nlmc") or ends_with(f.d_name, ".tmp")):
                continue
            snprintf(path, PATH_MAX_LEN, "%s/%s", sub, f.d_name)
            if stat(path, &st) != 0 or not S_ISREG(st.st_mode):
                continue
            if n == cap:
                cap = cap * 2 if cap else 256
                grown = <FileEntry*>realloc(files, cap * sizeof(FileEntry))
                if grown == NULL:
                    break
                files = grown
            files[n].mtime = st.st_mtime
            files[n].size = st.st_size
            files[n].path = <char*>malloc(strlen(path) + 1)
            if files[n].path == NULL:
                break
            memcpy(files[n].path, path, strlen(path) + 1)
            total += st.st_size
            n += 1
        closedir(sd)
    closedir(d)
    if total > max_bytes:
        qsort(files, n, sizeof(FileEntry), cmp_entry)
        target = max_bytes // 10 * 8
        i = 0
        while i < n and total > target:
            if c_unlink(files[i].path) == 0 or errno == ENOENT:
                total -= files[i].size
                removed[0] += 1
            i += 1
    for i in range(n):
        free(files[i].path)
    free(files)
    return total

# ---------------------------------------------------------------------------------------
# sessions
# ---------------------------------------------------------------------------------------

cdef void set_err(char* err, size_t errlen, const char* msg, const char* arg, int code) noexcept nogil:
    if err != NULL and errlen > 0:
        if code:
            snprintf(err, errlen, "%s%s: %s", msg, arg, strerror(code))
        else:
            snprintf(err, errlen, "%s%s", msg, arg)


cdef CSession* cs_new(const ModelC* m, const unsigned char* checksum, const char* checksum_hex,
                      int64_t cache_entries, int64_t ngram_entries, const char* persistent_dir,
                      int64_t max_bytes, int quiet, int context_cache, char* err,
                      size_t errlen) noexcept nogil:
    """A cached session, or NULL with a message in ``err``.  ``context_cache``: -1 lets
    the core decide whether caching hidden vectors pays, 0 turns it off, 1 on."""
    cdef CSession* s = <CSession*>nlm_alloc_lines(sizeof(CSession))
    cdef size_t n
    if s == NULL:
        set_err(err, errlen, "out of memory allocating a session", "", 0)
        return NULL
    s.model = m
    s.key_len = m.order
    s.sentence_id = -1
    s.est_bytes = -1
    s.quiet = quiet
    s.max_bytes = max_bytes if max_bytes > 0 else C_DEFAULT_MAX_BYTES
    memcpy(s.checksum, checksum, 8)
    # Without a persistent cache the core session keeps the n-gram cache (``ngram_entries``
    # < 0: when it pays); with one, this session's table does, so it can be written out.
    s.ngram_on = persistent_dir != NULL and persistent_dir[0] != 0
    s.core = nlm_session_new(m, cache_entries, 0 if s.ngram_on else ngram_entries)
    if s.core == NULL:
        set_err(err, errlen, "out of memory allocating a session", "", 0)
        cs_free(s)
        return NULL
    if context_cache >= 0 and s.core.cache_enabled:
        s.core.ctx_cache_enabled = context_cache
    s.table.key_len = m.order
    s.table.limit = ngram_entries if ngram_entries > 0 else C_DEFAULT_NGRAM_ENTRIES
    if s.ngram_on:
        n = strlen(persistent_dir)
        if n + 40 >= PATH_MAX_LEN:
            set_err(err, errlen, "persistent cache directory path is too long: ", persistent_dir, 0)
            cs_free(s)
            return NULL
        s.root = <char*>malloc(n + 1)
        s.dir = <char*>malloc(n + 20)
        if s.root == NULL or s.dir == NULL:
            set_err(err, errlen, "out of memory allocating a session", "", 0)
            cs_free(s)
            return NULL
        memcpy(s.root, persistent_dir, n + 1)
        while n > 1 and s.root[n - 1] == b'/':
            n -= 1
            s.root[n] = 0
        snprintf(s.dir, n + 20, "%s/%s", s.root, checksum_hex)
        if make_dirs(s.dir) != 0:
            set_err(err, errlen, "cannot create the persistent cache directory ", s.dir, errno)
            cs_free(s)
            return NULL
    open_query_log(s)
    return s


cdef void open_query_log(CSession* s) noexcept nogil:
    """NLMFEATURE_QUERY_LOG=DIR: record every lookup of this session in
    DIR/queries.<pid>.<n>.bin (see ``nlmfeature.querylog``), for replay by
    ``nlmfeature bench query --decoder-stream`` after ``nlmfeature querylog pack``.
    Recording costs one buffered write per lookup."""
    cdef const char* d = getenv("NLMFEATURE_QUERY_LOG")
    cdef char path[PATH_MAX_LEN]
    cdef int32_t head[4]
    if d == NULL or d[0] == 0:
        return
    make_dirs(d)
    snprintf(path, PATH_MAX_LEN, "%s/queries.%d.%llu.bin", d, c_getpid(), nlm_pcache_next())
    s.query_log = fopen(path, "wb")
    if s.query_log == NULL:
        if not s.quiet:
            fprintf(stderr, "nlmfeature: warning: cannot record queries in %s: %s\n", path, strerror(errno))
        return
    fwrite(b"NLMQLOG1", 1, 8, <FILE*>s.query_log)
    head[0] = s.key_len
    head[1] = s.model.vocab_size
    head[2] = 0
    head[3] = 0
    fwrite(head, 4, 4, <FILE*>s.query_log)
    fwrite(s.checksum, 1, 8, <FILE*>s.query_log)


cdef void cs_free(CSession* s) noexcept nogil:
    if s == NULL:
        return
    if s.active:
        cs_end(s)
    if s.query_log != NULL:
        fclose(<FILE*>s.query_log)
    nlm_session_free(s.core)
    nt_free(&s.table)
    free(s.root)
    free(s.dir)
    free(s)


cdef void file_path(CSession* s, int64_t sid, char* out) noexcept nogil:
    snprintf(out, PATH_MAX_LEN, "%s/%lld.nlmc", s.dir, <long long>sid)


cdef void warn(CSession* s, const char* path, const char* why) noexcept nogil:
    if not s.quiet:
        fprintf(stderr, "nlmfeature: warning: ignoring persistent cache file %s: %s; it will be rewritten\n",
                path, why)


cdef int cs_begin(CSession* s, int64_t sentence_id) noexcept nogil:
    """Start a sentence: empties the per-sentence caches and loads the sentence's file."""
    cdef int32_t key[NLM_MAX_ORDER + 1]
    cdef char path[PATH_MAX_LEN]
    cdef unsigned char* buf
    cdef int64_t size = 0, i, slot
    cdef uint64_t count = 0
    cdef int e = 0, found
    cdef const char* why
    cdef const unsigned char* keys
    cdef const unsigned char* vals
    cdef double v
    if s.active:
        cs_end(s)
    nlm_session_begin(s.core, sentence_id)
    s.sentence_id = sentence_id
    s.active = 1
    s.dirty = 0
    s.new_entries = 0
    s.stats[NLM_VT_STAT_SENTENCES] += 1
    if s.query_log != NULL:
        # a sentence marker: key_len int32, the first -1, the second the sentence id
        memset(key, 0, sizeof(key))
        key[0] = -1
        key[1] = <int32_t>sentence_id
        fwrite(key, 4, s.key_len, <FILE*>s.query_log)
    if s.ngram_on and s.table.capacity:
        nt_clear(&s.table)
    if s.dir == NULL or sentence_id < 0:
        return 0
    file_path(s, sentence_id, path)
    buf = read_file(path, &size, &e, 1)
    if buf == NULL:
        if e != ENOENT:
            warn(s, path, strerror(e))
            s.dirty = 1
            s.stats[NLM_VT_STAT_FILES_IGNORED] += 1
        return 0
    why = check_file(buf, size, s.key_len, s.checksum, sentence_id, &count)
    if why != NULL:
        warn(s, path, why)
        s.dirty = 1
        s.stats[NLM_VT_STAT_FILES_IGNORED] += 1
        free(buf)
        return 0
    keys = buf + HEADER_BYTES
    vals = keys + count * 4 * s.key_len
    for i in range(<int64_t>count):
        slot = nt_insert(&s.table, <const int32_t*>(keys + i * 4 * s.key_len), &found)
        if slot < 0:
            break
        memcpy(&v, vals + 8 * i, 8)
        nt_set(nt_slot(&s.table, slot), s.key_len, v, 1)
    s.stats[NLM_VT_STAT_FILES_READ] += 1
    s.stats[NLM_VT_STAT_PERSISTENT_LOADED] += <int64_t>count
    free(buf)
    return 0


cdef int write_merged(CSession* s, const char* path, int64_t* out_entries, int64_t* out_size,
                      int64_t* old_size) noexcept nogil:
    """Re-read ``path`` and write the union of it and the table; 0 or an errno."""
    cdef unsigned char* old = NULL
    cdef int64_t osize = 0, i, k, n_extra = 0, total, nbytes, slot
    cdef uint64_t ocount = 0
    cdef int e = 0, fd
    cdef const char* why
    cdef unsigned char* out
    cdef unsigned char* p
    cdef unsigned char* pv
    cdef int K = s.key_len
    cdef char tmp[PATH_MAX_LEN]
    cdef uint8_t* extra = NULL
    cdef const unsigned char* okeys
    cdef const int32_t* sp
    cdef uint64_t h
    old_size[0] = 0
    old = read_file(path, &osize, &e, 0)
    if old != NULL:
        old_size[0] = osize
        why = check_file(old, osize, K, s.checksum, s.sentence_id, &ocount)
        if why != NULL:
            ocount = 0
        elif ocount:
            extra = <uint8_t*>calloc(ocount, 1)
            if extra == NULL:
                free(old)
                return 12
            okeys = old + HEADER_BYTES
            for i in range(<int64_t>ocount):
                if nt_find(&s.table, <const int32_t*>(okeys + i * 4 * K)) < 0:
                    extra[i] = 1
                    n_extra += 1
    total = s.table.count + n_extra
    nbytes = HEADER_BYTES + total * (4 * K + 8) + 8
    out = <unsigned char*>malloc(nbytes)
    if out == NULL:
        free(old)
        free(extra)
        return 12
    memcpy(out, MAGIC, 8)
    memcpy(out + 8, &FORMAT_VERSION, 4)
    memcpy(out + 12, &K, 4)
    memcpy(out + 16, s.checksum, 8)
    memcpy(out + 24, &s.sentence_id, 8)
    memcpy(out + 32, &total, 8)
    p = out + HEADER_BYTES
    pv = p + total * 4 * K
    for slot in range(s.table.capacity):
        sp = nt_slot(&s.table, slot)
        if nt_live(&s.table, sp):
            memcpy(p, sp + 1, 4 * K)
            memcpy(pv, sp + 1 + K, 8)
            p += 4 * K
            pv += 8
    if n_extra:
        okeys = old + HEADER_BYTES
        for i in range(<int64_t>ocount):
            if extra[i]:
                memcpy(p, okeys + i * 4 * K, 4 * K)
                memcpy(pv, okeys + ocount * 4 * K + 8 * i, 8)
                p += 4 * K
                pv += 8
    free(old)
    free(extra)
    h = data_checksum_c(out, nbytes - 8)
    memcpy(out + nbytes - 8, &h, 8)
    snprintf(tmp, PATH_MAX_LEN, "%s.%d.%llu.tmp", path, c_getpid(), nlm_pcache_next())
    fd = c_open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o666)
    if fd < 0:
        e = errno
        free(out)
        return e
    if write_all(fd, out, nbytes) != 0:
        e = errno
        c_close(fd)
        c_unlink(tmp)
        free(out)
        return e
    free(out)
    if c_close(fd) != 0:
        e = errno
        c_unlink(tmp)
        return e
    if rename(tmp, path) != 0:
        e = errno
        c_unlink(tmp)
        return e
    out_entries[0] = total
    out_size[0] = nbytes
    return 0


cdef int cs_end(CSession* s) noexcept nogil:
    """End the sentence: merge its n-gram scores into its persistent file (if any)."""
    cdef char path[PATH_MAX_LEN]
    cdef char lock[PATH_MAX_LEN]
    cdef int lfd, e
    cdef int64_t entries = 0, size = 0, old_size = 0, removed = 0
    if not s.active:
        return 0
    s.active = 0
    if s.dir == NULL or s.sentence_id < 0 or not (s.new_entries > 0 or s.dirty):
        return 0
    file_path(s, s.sentence_id, path)
    snprintf(lock, PATH_MAX_LEN, "%s/.lock", s.dir)
    lfd = c_open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0o666)
    if lfd >= 0:
        while c_flock(lfd, LOCK_EX) != 0 and errno == EINTR:
            pass
    e = write_merged(s, path, &entries, &size, &old_size)
    if lfd >= 0:
        c_flock(lfd, LOCK_UN)
        c_close(lfd)
    if e != 0:
        if not s.quiet:
            fprintf(stderr, "nlmfeature: warning: cannot write persistent cache file %s: %s\n",
                    path, strerror(e))
        return -1
    s.stats[NLM_VT_STAT_FILES_WRITTEN] += 1
    s.stats[NLM_VT_STAT_PERSISTENT_WRITTEN] += entries
    s.dirty = 0
    s.new_entries = 0
    # bounded disk use: rescan when our estimate says the bound is near
    s.written_since_scan += size
    if s.est_bytes >= 0:
        s.est_bytes += size - old_size
    if s.est_bytes < 0 or s.est_bytes > s.max_bytes or s.written_since_scan > s.max_bytes // 8:
        s.est_bytes = prune_dir(s.root, s.max_bytes, &removed)
        s.written_since_scan = 0
        s.stats[NLM_VT_STAT_FILES_PRUNED] += removed
    return 0


cdef double cs_score_padded(CSession* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """Natural-log score of ``w`` after the padded context ``ctx`` (n-1 ids)."""
    cdef int32_t key[NLM_MAX_ORDER + 1]
    cdef int found, i
    cdef int64_t slot
    cdef int32_t* p
    cdef double v
    s.stats[NLM_VT_STAT_LOOKUPS] += 1
    if s.query_log != NULL:
        fwrite(ctx, 4, s.key_len - 1, <FILE*>s.query_log)
        fwrite(&w, 4, 1, <FILE*>s.query_log)
    if not s.ngram_on:
        return nlm_score_padded(s.core, ctx, w)
    for i in range(s.key_len - 1):
        key[i] = ctx[i]
    key[s.key_len - 1] = w
    slot = nt_insert(&s.table, key, &found)
    if found:
        p = nt_slot(&s.table, slot)
        s.stats[NLM_VT_STAT_NGRAM_HITS] += 1
        if nt_disk(p, s.key_len):
            s.stats[NLM_VT_STAT_PERSISTENT_HITS] += 1
        return nt_value(p, s.key_len)
    v = nlm_score_padded(s.core, ctx, w)
    if slot >= 0:
        nt_set(nt_slot(&s.table, slot), s.key_len, v, 0)
        s.new_entries += 1
    return v


cdef double cs_score(CSession* s, const int32_t* ids, int n, int32_t w) noexcept nogil:
    """Score ``w`` after an unpadded history of ``n`` ids (``<s>``/``<null>`` padding)."""
    cdef int32_t ctx[NLM_MAX_ORDER]
    nlm_pad_context(s.model, ids, n, ctx)
    if w < 0 or w >= s.model.vocab_size:
        w = s.model.unk
    return cs_score_padded(s, ctx, w)


cdef void cs_stats(CSession* s, int64_t* out, int n) noexcept nogil:
    cdef int i
    s.stats[NLM_VT_STAT_CONTEXT_HITS] = s.core.ctx_cache.hits
    s.stats[NLM_VT_STAT_CONTEXT_MISSES] = s.core.ctx_cache.misses
    s.stats[NLM_VT_STAT_CLASS_HITS] = s.core.class_cache.hits
    s.stats[NLM_VT_STAT_CLASS_MISSES] = s.core.class_cache.misses
    if not s.ngram_on:
        s.stats[NLM_VT_STAT_NGRAM_HITS] = s.core.ngram_cache.hits
    for i in range(n):
        out[i] = s.stats[i] if i < NLM_VT_STAT_COUNT else 0

# ---------------------------------------------------------------------------------------
# Python access
# ---------------------------------------------------------------------------------------

STAT_NAMES = ("lookups", "ngram_hits", "context_hits", "context_misses", "class_hits",
              "class_misses", "persistent_hits", "persistent_loaded", "persistent_written",
              "files_read", "files_written", "files_ignored", "files_pruned", "sentences")
assert len(STAT_NAMES) == NLM_VT_STAT_COUNT


def data_checksum(const unsigned char[::1] data) -> int:
    """The checksum a cache file stores in its last 8 bytes (over all bytes before them)."""
    return data_checksum_c(&data[0] if data.shape[0] else <const unsigned char*>b"", data.shape[0])


def check_cache_file(bytes data, int key_len, bytes model_checksum, int64_t sentence_id):
    """None if ``data`` is a valid cache file for the model/sentence, else the reason."""
    cdef uint64_t count = 0
    cdef const char* why
    if len(model_checksum) != 8:
        raise ValueError("model_checksum must be 8 raw bytes")
    why = check_file(<const unsigned char*><char*>data, len(data), key_len,
                     <const unsigned char*><char*>model_checksum, sentence_id, &count)
    return None if why == NULL else why.decode()


def prune(str directory, int64_t max_bytes):
    """Delete least recently used cache files under ``directory`` if it holds more than
    ``max_bytes``; returns (bytes left, files removed)."""
    cdef bytes d = directory.encode()
    cdef int64_t removed = 0, left
    cdef const char* p = d
    with nogil:
        left = prune_dir(p, max_bytes, &removed)
    return left, removed


cdef class CachedScorer:
    """A scoring session with an exact n-gram cache, optionally persistent on disk.

    ``model`` is an :class:`nlmfeature.Model`.  With ``directory`` set, the n-gram scores of
    sentence ``i`` are loaded from ``directory/<model checksum>/<i>.nlmc`` by
    :meth:`begin` and merged back into it by :meth:`end`.  ``max_bytes`` bounds the
    directory (least recently used files are deleted); ``cache_entries`` bounds the core
    context cache and ``ngram_entries`` the n-gram cache of one sentence (-1: the core's
    choice without a directory, :data:`DEFAULT_NGRAM_ENTRIES` with one; 0: off without one); ``context_cache``
    forces caching of hidden vectors on (1) or off (0) instead of the core's choice (-1).  One scorer per
    thread; scores are natural logs, identical to :meth:`Model.score_sentence`.
    """
    cdef CSession* s
    cdef readonly object model
    cdef object _capsule

    def __cinit__(self, model, directory=None, int64_t max_bytes=0, int64_t cache_entries=1 << 18,
                  int64_t ngram_entries=-1, bint quiet=False, int context_cache=-1):
        cdef char err[1024]
        cdef const ModelC* m
        cdef bytes cs = bytes.fromhex(model.checksum)
        cdef bytes cs_hex = model.checksum.encode()
        cdef bytes d = (str(directory).encode() if directory else b"")
        if len(cs) != 8:
            raise ValueError("model checksum must be 8 bytes")
        self.model = model
        self._capsule = model.native.capsule()
        m = <const ModelC*>PyCapsule_GetPointer(self._capsule, b"nlmfeature.ModelC")
        if m.src_window:
            raise ValueError("cached sessions take target-only models; score a joint model "
                             "with JointModel or the C API (nlm_joint_score)")
        err[0] = 0
        self.s = cs_new(m, <const unsigned char*><char*>cs, cs_hex, cache_entries, ngram_entries,
                        <const char*>d, max_bytes, quiet, context_cache, err, sizeof(err))
        if self.s == NULL:
            raise OSError(err.decode("utf-8", "replace"))

    def __dealloc__(self):
        if self.s != NULL:
            cs_free(self.s)
            self.s = NULL

    @property
    def directory(self):
        """The model's subdirectory of the persistent cache, or None."""
        return None if self.s.dir == NULL else self.s.dir.decode()

    def begin(self, int64_t sentence_id) -> None:
        """Start sentence ``sentence_id`` (>= 0 to use the persistent cache)."""
        with nogil:
            cs_begin(self.s, sentence_id)

    def end(self) -> None:
        """End the sentence: write its new scores to the persistent cache."""
        cdef int r
        with nogil:
            r = cs_end(self.s)

    def score_ids(self, const int32_t[::1] history, int32_t word) -> float:
        """Score ``word`` (id) after ``history`` (ids, oldest first; padded as the core does)."""
        cdef int32_t dummy = 0
        return cs_score(self.s, &history[0] if history.shape[0] else &dummy, history.shape[0], word)

    def score(self, context, str word) -> float:
        """Natural-log score of ``word`` after the words ``context`` (oldest first)."""
        return self.score_ids(np.ascontiguousarray(self.model.ids(context), dtype=np.int32),
                              self.model.vocab.id(word))

    def score_padded(self, const int32_t[:, ::1] contexts, const int32_t[::1] words):
        """Scores of N n-grams (padded (N, n-1) contexts) through the caches."""
        cdef int64_t n = words.shape[0], i
        cdef int c = self.s.model.ctx_len
        cdef int32_t V = self.s.model.vocab_size, unk = self.s.model.unk, w
        cdef int32_t dummy = 0
        if contexts.shape[0] != n or (n and contexts.shape[1] != c):
            raise ValueError(f"contexts must have shape ({n}, {c})")
        out = np.empty(n, dtype=np.float64)
        cdef double[::1] o = out
        cdef const int32_t* base = &contexts[0, 0] if (n and c) else &dummy
        with nogil:
            for i in range(n):
                w = words[i]
                if w < 0 or w >= V:
                    w = unk
                o[i] = cs_score_padded(self.s, base + i * c, w)
        return out

    def score_sentence(self, sentence):
        """Per-token scores of a sentence (words and ``</s>``), as :meth:`Model.score_sentence`."""
        ctx, words = self.model.sentence_ngrams(sentence)
        return self.score_padded(ctx, words)

    def stats(self) -> dict:
        """Counters since creation (lookups, n-gram/context/class/persistent cache hits, files)."""
        cdef int64_t out[NLM_VT_STAT_COUNT]
        cs_stats(self.s, out, NLM_VT_STAT_COUNT)
        return {name: int(out[i]) for i, name in enumerate(STAT_NAMES)}
