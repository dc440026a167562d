# cython: language_level=3
"""The persistent tuning cache: a disk bit on the core session's tables.

Tuning decodes the same dev set many times.  With a persistent directory ``DIR`` a core
:c:type:`SessionC` gets a :c:type:`StoreC` attached: at sentence begin the files of sentence
``i`` (``DIR/<model checksum>/i.nlmc``, the base, and up to four deltas ``i.<k>.nlmc``) are
read into memory whole -- nothing is parsed or hashed, the files are hash tables whose slots
unpack in one pass into the core's slot layout; read rather than mapped, so that a file cut short or changed on disk while in use
cannot fault the decoder -- and the session probes them wherever its in-memory tables miss, at every level:

* exact n-gram scores (key: the n-1 padded context ids and the word),
* context normalisers (key: the padded context; log Z of the softmax or of the classes),
* within-class normalisers (key: the padded context and the class).

Values found on disk enter the in-memory tables with the disk bit set; at sentence end the
entries without it (computed in this sentence) are written as a new delta file, and only
when there are any.  When all delta names are taken, the base, the deltas and the new
entries are merged into a new base.  Files are written to a temporary name and published
by link (never overwriting) or rename, under an advisory lock on ``DIR/<checksum>/.lock``,
so several threads and decoder processes may share ``DIR``; a killed writer leaves at most a
``.tmp`` file, which pruning removes.  Keys are exact, never hashes; a changed model has
another checksum, and a model file changed under a running process switches its cache off.

File format (little-endian; see docs/c-api.md)::

    0    8 bytes  magic "NLMPCAC2"
    8    uint32   format version (6)
    12   uint32   model order n
    16   8 bytes  model checksum (raw)
    24   int64    sentence id
    32   uint64   file size
    40   3 x 32   regions (n-gram, context, class): uint16 key length, uint16 bytes per key id
                  (2 or 4), uint32 doubles per slot, uint64 slots (a base file's n-gram
                  region: the least power of two >= 4 x entries; other regions and delta
                  files: entries / 0.7 + 1; 0 if empty), uint64 entries, uint64 longest probe
    136  uint64   checksum of the data (bytes 192 .. end)
    144  3 x uint64  B0 B1 B2: 64-byte blocks of each region's key filter (0: none)
    184  uint64   checksum of bytes 0 .. 183
    192  regions, each (if it has slots) three parts padded to 64 bytes: the slot map (a bit
         per slot, in uint64 words), the keys of the live slots in slot order (ids of 2 bytes
         where all of the region's are below 65536, else 4), then their values (float64).
         A key lives at ``nlm_home(key_hash(key), slots)`` or the next slots (linear probing),
         exactly as in nlmfeature._scorer's TableC: reading a file unpacks it into that layout
         (slot = [1 (0: empty), key ids as int32, values]) in one sequential pass, and the
         session probes it as its own tables.  Version 4 files stored that layout itself:
         this one is 2.3x smaller for a 5-gram model.  A base file's n-gram region has a
         size the session's n-gram table takes (a power of two, with room for as many
         n-grams again -- the deltas', the sentence's new ones -- before the table passes
         load 1/2 and grows), so it unpacks straight into that table at sentence begin, in
         slot order, nothing hashed or copied; the deltas' n-grams are copied in beside them
         (where they outgrow that room, as after MERT steps, the base's are inserted into a
         table sized for all; version 5 bases, at load 0.7, were unpacked beside the table
         and copied in too).
    then B0, B1, B2 x 64 bytes: a blocked Bloom filter of each region's keys (``nlm_filter_add``
         of their ``key_hash``, ~10 bits per key), read before the region is probed: most
         n-grams and contexts a sentence asks after a tuning step are in none of its files, and
         each file's table probe would be a cache miss (version 3 files had no filters).

A file that is not a regular file, truncated, corrupt, of another version, model or sentence
is ignored with a warning on stderr (only its header is read before it is rejected) and
replaced at sentence end.  The directory is bounded by ``max_bytes``.  A tuning loop reads its
sentences in the same order at every iteration, so deleting its least recently used file would
delete the one it needs next, and a bound below one iteration's files would leave none for the
next.  So a session writes only what fits (``write_sentence``): where new entries do not fit,
a sentence that has files gets its working set (what it asked for) in their place, and a
sentence without files gets none: the first sentences of the loop keep theirs, up to date.
Files unused for a day are deleted, least recently used first (by mtime; a use touches them),
when the bound is passed (``prune_dir``).

Everything here except the Python classes at the bottom runs without the GIL.
"""
cimport cython
from libc.errno cimport errno, ENOENT, EEXIST, EINTR, EIO, ENOMEM, ENOSPC
from libc.math cimport isnan, NAN
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdio cimport FILE, fopen, fwrite, fclose, fprintf, stderr, snprintf, rename
from libc.stdlib cimport getenv, calloc, free, malloc, realloc, qsort
from libc.string cimport memcpy, memset, strlen, strerror, strcmp
from posix.stat cimport struct_stat, fstat, stat, S_ISDIR, S_ISREG
from cpython.pycapsule cimport PyCapsule_GetPointer

cdef extern from "../../src/nlmfeature/decoder/capi/nlmfeature.h":
    enum:
        NLM_DEFAULT_CACHE_ENTRIES

from nlmfeature._scorer cimport (ModelC, SessionC, StoreC, TableC, nlm_home, nlm_session_new,
                                 nlm_session_free, nlm_session_begin, nlm_score_padded, nlm_score_clean,
                                 nlm_pad_context, splitmix64, key_hash, table_at, table_live,
                                 table_insert, table_insert_h, table_prefetch, table_grow, table_clear, table_take, tv_get, tv_set, tv_mark, tv_disk, tv_seen, nlm_alloc_lines, nlm_costly_lookup, alloc_table,
                                 nlm_filter_add, NLM_MAX_ORDER, NLM_MAX_KEY, NLM_STORE_MAX_FILES, OUT_SOFTMAX,
                                 OUT_CLASS)

import os

import numpy as np

cdef extern from * nogil:
    void __builtin_prefetch(const void* p)
    int __builtin_popcountll(unsigned long long x)
    int __builtin_ctzll(unsigned long long x)

cdef extern from "<fcntl.h>" nogil:
    int c_open "open"(const char* path, int flags, ...)
    int O_RDONLY, O_WRONLY, O_RDWR, O_CREAT, O_EXCL, O_CLOEXEC, O_NONBLOCK

cdef extern from "<unistd.h>" nogil:
    ssize_t c_pread "pread"(int fd, void* buf, size_t n, long offset)
    ssize_t c_write "write"(int fd, const void* buf, size_t n)
    int c_close "close"(int fd)
    int c_unlink "unlink"(const char* path)
    int c_link "link"(const char* old, const char* new)
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
    #include <sys/stat.h>
    #include <time.h>
    static unsigned long long nlm_pcache_counter = 0;
    static int nlm_pcache_said_off = 0;
    static int nlm_pcache_said_full = 0;
    static unsigned long long nlm_pcache_next(void) {
        return __atomic_fetch_add(&nlm_pcache_counter, 1, __ATOMIC_RELAXED);
    }
    /* 1 the first time it is called in this process (one "cache is off" line per process) */
    static int nlm_pcache_first_off(void) {
        return __atomic_exchange_n(&nlm_pcache_said_off, 1, __ATOMIC_RELAXED) == 0;
    }
    /* 1 the first time it is called in this process (one "at its bound" line per process) */
    static int nlm_pcache_first_full(void) {
        return __atomic_exchange_n(&nlm_pcache_said_full, 1, __ATOMIC_RELAXED) == 0;
    }
    static long long nlm_mtime_ns(const struct stat* st) {
        return (long long)st->st_mtim.tv_sec * 1000000000LL + st->st_mtim.tv_nsec;
    }
    /* the wall clock in ns as the kernel stamps files (its coarse clock: a file touched after
       this call never has an earlier time) */
    static long long nlm_now_ns(void) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME_COARSE, &t);
        return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
    }
    /* checksum of the data regions: four xxh64-style lanes (memory speed) */
    static inline unsigned long long nlm_rotl(unsigned long long x, int r) {
        return (x << r) | (x >> (64 - r));
    }
    static unsigned long long nlm_fast_checksum(const unsigned char* p, long long n) {
        const unsigned long long P1 = 0x9E3779B185EBCA87ULL, P2 = 0xC2B2AE3D27D4EB4FULL;
        unsigned long long h0 = P1 + P2 + (unsigned long long)n, h1 = P2, h2 = 0, h3 = 0 - P1, w[4];
        long long i = 0;
        for (; i + 32 <= n; i += 32) {
            memcpy(w, p + i, 32);
            h0 = nlm_rotl(h0 + w[0] * P2, 31) * P1;
            h1 = nlm_rotl(h1 + w[1] * P2, 31) * P1;
            h2 = nlm_rotl(h2 + w[2] * P2, 31) * P1;
            h3 = nlm_rotl(h3 + w[3] * P2, 31) * P1;
        }
        for (; i < n; i++) h0 = nlm_rotl(h0 ^ (p[i] * P1), 11) * P2;
        h0 = nlm_rotl(h0, 1) + nlm_rotl(h1, 7) + nlm_rotl(h2, 12) + nlm_rotl(h3, 18);
        h0 ^= h0 >> 33; h0 *= P2; h0 ^= h0 >> 29; h0 *= P1; h0 ^= h0 >> 32;
        return h0;
    }
    """
    unsigned long long nlm_pcache_next() nogil
    int nlm_pcache_first_off() nogil
    int nlm_pcache_first_full() nogil
    long long nlm_mtime_ns(const struct_stat* st) nogil
    long long nlm_now_ns() nogil
    unsigned long long nlm_fast_checksum(const unsigned char* p, long long n) nogil

cdef enum:
    HEADER_BYTES = 192
    REGIONS_AT = 40
    DATA_CHECKSUM_AT = 136
    FILTER_AT = 144           # 3 x uint64: 64-byte blocks of each region's key filter (after the regions)
    FILTER_BITS = 10          # filter bits per entry
    HEADER_CHECKSUM_AT = 184
    PATH_MAX_LEN = 4096
    MAX_DELTAS = 4            # delta files per sentence before they are merged into the base
    FILE_LOAD_PERCENT = 70    # most entries per 100 slots in a file's regions
    N_REGIONS = 3
cdef const char* MAGIC = b"NLMPCAC2"
cdef uint32_t FORMAT_VERSION = 6
cdef int64_t C_DEFAULT_MAX_BYTES = 4LL << 30
cdef int64_t C_DEFAULT_NGRAM_ENTRIES = 1 << 20
#: default bound on a persistent cache directory (bytes)
DEFAULT_MAX_BYTES = C_DEFAULT_MAX_BYTES
#: default bound on the n-gram cache entries of one sentence with a persistent cache
DEFAULT_NGRAM_ENTRIES = C_DEFAULT_NGRAM_ENTRIES
FILE_SUFFIX = ".nlmc"
HEADER_SIZE = HEADER_BYTES
MAX_DELTA_FILES = MAX_DELTAS
#: policy names (``NLMFEATURE_PERSISTENT_CACHE`` and ``CachedScorer(policy=...)``)
POLICIES = {"never": PC_POLICY_NEVER, "auto": PC_POLICY_AUTO, "always": PC_POLICY_ALWAYS}

# The session's side of the store: StoreC (the views the scorer probes) must stay first.
ctypedef struct PStore:
    StoreC view
    const ModelC* model
    char* root
    char* dir
    char* model_path
    unsigned char checksum[8]
    unsigned char* wbuf       # the file writer's buffer, kept between sentence ends (no page
    long long wbuf_cap        # faults for a fresh one at every end): its bytes
    unsigned char* raw        # a file as on disk: read before it is unpacked, packed before it
    long long raw_cap         # is written (kept between sentences too)
    int key_width             # bytes per key id on disk, as the model's id ranges allow (2 or 4)
    int ngram_key_len         # ids in an n-gram key: the full context and the word (the order
                              # for a target-only model; the file header's "order" field)
    int ctx_key_len
    int64_t max_bytes
    int quiet
    int print_stats
    int active
    int off                   # the model file changed: no reading or writing any more
    int dirty                 # a file was ignored: rewrite the base at the end
    int files_loaded          # files of the current sentence
    int keep_class            # also write within-class normalisers (CachedScorer(class_normalisers=True))
    int preload               # copy the files' n-grams into the session's table at sentence begin
                              # (CachedScorer(preload=False): probe the files lazily instead)
    int64_t sentence_id
    int64_t est_bytes         # estimate of the directory's size (-1: unknown)
    long long since_ns        # when the session started: files touched since are this run's
    int64_t written_since_scan
    uint64_t m_dev
    uint64_t m_ino
    int64_t m_size
    long long m_mtime
    void* maps[NLM_STORE_MAX_FILES]        # the files read (buffers reused from sentence to sentence)
    long long map_cap[NLM_STORE_MAX_FILES]   # bytes of maps[f] (kept between sentences)
    int64_t files_read
    int64_t files_written
    int64_t files_ignored
    int64_t files_pruned
    int64_t loaded
    int64_t written
    int64_t bytes_written
    int64_t last[7]           # counters at the previous sentence end (per-sentence stats lines)

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


cdef int read_all(int fd, void* buf, int64_t n) noexcept nogil:
    """Read ``n`` bytes from offset 0: 0, or an errno (EIO: the file is shorter now)."""
    cdef char* p = <char*>buf
    cdef ssize_t r
    cdef int64_t at = 0
    while at < n:
        r = c_pread(fd, p + at, n - at, at)
        if r < 0 and errno == EINTR:
            continue
        if r < 0:
            return errno
        if r == 0:
            return EIO
        at += r
    return 0


cdef int grow_buffer(void** buf, long long* cap, int64_t n) noexcept nogil:
    """``buf`` (of ``cap`` bytes) holds at least ``n`` bytes, reallocated (alloc_table) if it
    did not: 0, or -1 (out of memory, ``buf`` NULL).  The store's buffers are kept from
    sentence to sentence: no page faults for fresh memory at every begin and end."""
    if n <= cap[0]:
        return 0
    free(buf[0])
    buf[0] = alloc_table(n)
    cap[0] = n if buf[0] != NULL else 0
    return 0 if buf[0] != NULL else -1


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


cdef inline int region_stride(int key_len, int nd) noexcept nogil:
    return 1 + key_len + 2 * nd


cdef inline int64_t region_slots(int i, int64_t entries, int base) noexcept nogil:
    """Slots of file region ``i`` for ``entries`` keys; readers refuse any other number.  The
    n-gram region of a base file (``base``): the least power of two holding them at load
    <= 1/4, a size the session's n-gram table takes (it grows past load 1/2), so that the
    file unpacks straight into that table with room for as many n-grams again: the deltas'
    and the sentence's new ones (:c:func:`unpack_file`; at load <= 1/3 a replay of four MIRA
    iterations grew the table, a rehash, in a quarter of the sentences, and sentence
    begins after three iterations cost more than the copy they replace).  Other regions and
    delta files: load <= FILE_LOAD (a probe that misses, as new n-grams probe every file,
    stays short; their views stay small)."""
    cdef int64_t n = 1
    if not entries:
        return 0
    if i == 0 and base:
        while n < 4 * entries:
            n *= 2
        return n
    return (entries * 100 + FILE_LOAD_PERCENT - 1) // FILE_LOAD_PERCENT + 1


cdef inline int64_t pad64(int64_t n) noexcept nogil:
    return (n + 63) // 64 * 64


cdef inline int64_t region_bytes(int64_t slots, int key_len, int nd) noexcept nogil:
    """Bytes of a region in memory: ``slots`` slots of the core's table layout."""
    return pad64(slots * region_stride(key_len, nd) * 4)


cdef inline int64_t packed_values_at(int64_t slots, int64_t count, int key_len, int width) noexcept nogil:
    """Where a packed region's values start: after its slot map (a bit per slot, in uint64
    words) and the keys of its live slots (``width`` bytes per id), each padded to 64 bytes;
    the keys start at ``packed_keys_at(slots)``."""
    return packed_keys_at(slots) + pad64(count * key_len * width)


cdef inline int64_t packed_keys_at(int64_t slots) noexcept nogil:
    return pad64((slots + 63) // 64 * 8)


cdef inline int64_t disk_region_bytes(int64_t slots, int64_t count, int key_len, int width,
                                      int nd) noexcept nogil:
    """Bytes of a region on disk: its slot map, then the keys of the live slots and their
    values, in slot order (:c:func:`packed_values_at`)."""
    if not slots:
        return 0
    return packed_values_at(slots, count, key_len, width) + pad64(count * nd * 8)


ctypedef struct RegionDesc:
    uint32_t key_len
    uint32_t width            # bytes per key id on disk: 2 (every id < 65536) or 4
    uint32_t nd
    uint64_t slots
    uint64_t count
    uint64_t max_probe


cdef inline void read_region(const unsigned char* h, int i, RegionDesc* r) noexcept nogil:
    """Region ``i``'s descriptor from a file header (6 little-endian fields)."""
    cdef uint16_t k, w
    memcpy(&k, h + REGIONS_AT + 32 * i, 2)
    memcpy(&w, h + REGIONS_AT + 32 * i + 2, 2)
    r.key_len = k
    r.width = w
    memcpy(&r.nd, h + REGIONS_AT + 32 * i + 4, 4)
    memcpy(&r.slots, h + REGIONS_AT + 32 * i + 8, 8)
    memcpy(&r.count, h + REGIONS_AT + 32 * i + 16, 8)
    memcpy(&r.max_probe, h + REGIONS_AT + 32 * i + 24, 8)


cdef inline void write_region(unsigned char* h, int i, const RegionDesc* r) noexcept nogil:
    cdef uint16_t k = <uint16_t>r.key_len, w = <uint16_t>r.width
    memcpy(h + REGIONS_AT + 32 * i, &k, 2)
    memcpy(h + REGIONS_AT + 32 * i + 2, &w, 2)
    memcpy(h + REGIONS_AT + 32 * i + 4, &r.nd, 4)
    memcpy(h + REGIONS_AT + 32 * i + 8, &r.slots, 8)
    memcpy(h + REGIONS_AT + 32 * i + 16, &r.count, 8)
    memcpy(h + REGIONS_AT + 32 * i + 24, &r.max_probe, 8)


cdef int64_t file_bytes(const unsigned char* h, int packed) noexcept nogil:
    """Bytes of the file that header ``h`` describes: the header, each region packed as on disk
    (``packed``) or in the core's table layout (in memory), then the filters."""
    cdef int64_t n = HEADER_BYTES
    cdef RegionDesc r
    cdef uint64_t blocks
    cdef int i
    for i in range(N_REGIONS):
        read_region(h, i, &r)
        memcpy(&blocks, h + FILTER_AT + 8 * i, 8)
        n += <int64_t>blocks * 64
        if packed:
            n += disk_region_bytes(<int64_t>r.slots, <int64_t>r.count, r.key_len, r.width, r.nd)
        else:
            n += region_bytes(<int64_t>r.slots, r.key_len, r.nd)
    return n


cdef const char* check_header(const unsigned char* h, int64_t size, int order, int ctx_key_len,
                              const unsigned char* checksum, int64_t sentence_id) noexcept nogil:
    """NULL if the 192-byte header ``h`` describes a valid file of ``size`` bytes for this
    model and sentence, else the reason.  Reads nothing beyond the header."""
    cdef uint32_t version, order_
    cdef int64_t sid
    cdef uint64_t fsize, stored, blocks
    cdef RegionDesc r
    cdef int i
    cdef int want_k[3]
    cdef int want_nd[3]
    want_k[0] = order
    want_k[1] = ctx_key_len
    want_k[2] = order
    want_nd[0] = 1
    want_nd[1] = 2
    want_nd[2] = 1
    if size < 8 or memcmp_(h, <const unsigned char*>MAGIC, 8) != 0:
        return "not an nlmfeature cache file (bad magic number)"
    if size < HEADER_BYTES:
        return "truncated (shorter than a header)"
    memcpy(&stored, h + HEADER_CHECKSUM_AT, 8)
    if stored != data_checksum_c(h, HEADER_CHECKSUM_AT):
        return "corrupted (header checksum mismatch)"
    memcpy(&version, h + 8, 4)
    memcpy(&order_, h + 12, 4)
    memcpy(&sid, h + 24, 8)
    memcpy(&fsize, h + 32, 8)
    if version != FORMAT_VERSION:
        return "written by another cache format version"
    if order_ != <uint32_t>order:
        return "written for a model of another order"
    if memcmp_(h + 16, checksum, 8) != 0:
        return "written for another model (checksum differs)"
    if sid != sentence_id:
        return "written for another sentence id"
    for i in range(N_REGIONS):
        read_region(h, i, &r)
        if r.key_len != <uint32_t>want_k[i] or r.nd != <uint32_t>want_nd[i] or \
                (r.width != 2 and r.width != 4):
            return "region layout does not match the model"
        # (slots exactly as the writer sizes them for the entries: a file never unpacks into
        # more than ~16 times its size, a base's n-gram region into the session's table)
        if r.count > (1ULL << 40) or (r.slots != <uint64_t>region_slots(i, <int64_t>r.count, 0) and
                                      r.slots != <uint64_t>region_slots(i, <int64_t>r.count, 1)) or \
                r.max_probe > r.slots or (r.slots and not r.max_probe):
            return "region sizes are inconsistent"
        memcpy(&blocks, h + FILTER_AT + 8 * i, 8)
        if blocks > (1ULL << 34) or (blocks and not r.slots):
            return "region sizes are inconsistent"
    if <int64_t>fsize != size or file_bytes(h, 1) != size:
        return "truncated or extended (size does not match the header)"
    return NULL


cdef inline int memcmp_(const unsigned char* a, const unsigned char* b, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if a[i] != b[i]:
            return 1
    return 0


cdef void view_regions(const unsigned char* base, TableC* ngram, TableC* ctx, TableC* cls) noexcept nogil:
    """Fill the three read-only table views of a checked file read into memory."""
    cdef int64_t at = HEADER_BYTES
    cdef RegionDesc r
    cdef int i
    cdef uint64_t blocks
    cdef TableC* out3[3]
    out3[0] = ngram
    out3[1] = ctx
    out3[2] = cls
    for i in range(N_REGIONS):
        read_region(base, i, &r)
        memset(out3[i], 0, sizeof(TableC))
        out3[i][0].key_len = r.key_len
        out3[i][0].nd = r.nd
        out3[i][0].stride = region_stride(r.key_len, r.nd)
        out3[i][0].capacity = r.slots
        out3[i][0].count = r.count
        out3[i][0].limit = r.count
        out3[i][0].max_probe = r.max_probe
        out3[i][0].generation = 1
        out3[i][0].slots = <int32_t*>(base + at) if r.slots else NULL
        at += region_bytes(r.slots, r.key_len, r.nd)
    for i in range(N_REGIONS):  # the filters follow the regions
        memcpy(&blocks, base + FILTER_AT + 8 * i, 8)
        if blocks:
            out3[i][0].filter = <const uint64_t*>(base + at)
            out3[i][0].filter_blocks = <int64_t>blocks
            at += <int64_t>blocks * 64


cdef enum:
    STAGE = 16                # n-grams of a packed base decoded ahead of their inserts (prefetched)
    TO_VIEW = 0               # unpack_file's destinations of a region: a view in its buffer,
    TO_SLOTS = 1              # the session's table in the region's own slots,
    TO_INSERTS = 2            # inserts into the session's table at the size it has


cdef void insert_staged(TableC* t, int32_t* stage, int n, int stride) noexcept nogil:
    """Insert ``n`` decoded slots of ``stage`` ([unused, key..., value]) into ``t`` as from
    disk, their home slots' loads started first (keys already there keep their value)."""
    cdef uint64_t h[STAGE]
    cdef int m, found
    cdef int64_t slot
    cdef int32_t* q
    cdef double x
    for m in range(n):
        h[m] = table_prefetch(t, stage + m * stride + 1)
    for m in range(n):
        q = stage + m * stride
        slot = table_insert_h(t, q + 1, h[m], &found)
        if slot < 0 or found:
            continue
        memcpy(&x, q + 1 + t.key_len, 8)
        tv_set(t, table_at(t, slot), 0, x)
        tv_mark(table_at(t, slot), 1)


cdef const char* unpack_file(const unsigned char* src, unsigned char* out, TableC* into,
                             int64_t more, int* into_used) noexcept nogil:
    """Unpack a checked file ``src`` into ``out`` (``file_bytes(src, 0)`` bytes): each
    region as the core's table (slot = [1, key ids as int32, values], or all zero where the
    slot map says empty), so that the session probes and copies it as it does its own.  NULL,
    or why the file is corrupt (a slot map that does not hold the region's entry count).

    ``into`` (or NULL): a session's empty n-gram table, to take the n-gram region where its
    bound allows it and ``more`` n-grams (those of the sentence's delta files, copied in
    next).  Where the region (a base file's, sized as the table takes it:
    :c:func:`region_slots`) holds them all at load <= 1/2, it is unpacked into the table,
    which takes its size, in slot order: nothing hashed.  Otherwise (after MERT steps a
    sentence's deltas hold about twice its base's n-grams) they are inserted into the table
    at the size it has, grown once for all of them, sixteen decoded ahead: no view to clear
    and scan.  Either way the entries are marked as from disk, ``out``'s header describes an
    empty n-gram region and ``into_used`` is set; a corrupt region leaves ``into`` empty.
    """
    cdef int64_t at_in = HEADER_BYTES, at_out = HEADER_BYTES, words, w, slot, j, count, filters = 0
    cdef RegionDesc r
    cdef RegionDesc none
    cdef int i, stride, k, kl, width, nd, dest, n = 0
    cdef int64_t need
    cdef int32_t stage[STAGE * (NLM_MAX_KEY + 4)]
    cdef uint64_t bits, blocks
    cdef const unsigned char* keys
    cdef const unsigned char* vals
    cdef int32_t* t
    cdef int32_t* q
    cdef int32_t live = 1
    cdef uint16_t u
    memcpy(out, src, HEADER_BYTES)
    into_used[0] = 0
    for i in range(N_REGIONS):
        read_region(src, i, &r)
        memcpy(&blocks, src + FILTER_AT + 8 * i, 8)
        filters += <int64_t>blocks * 64
        if not r.slots:
            continue
        kl = r.key_len
        width = r.width
        nd = r.nd
        count = <int64_t>r.count
        stride = region_stride(kl, nd)
        words = (<int64_t>r.slots + 63) // 64
        keys = src + at_in + packed_keys_at(<int64_t>r.slots)
        vals = src + at_in + packed_values_at(<int64_t>r.slots, count, kl, width)
        dest = TO_VIEW
        if i == 0 and into != NULL and into.count == 0 and into.key_len == kl and into.nd == nd and \
                into.stride == stride and nd == 1 and 2 * (count + more) <= into.limit:
            if 2 * (count + more) <= <int64_t>r.slots and table_take(into, <int64_t>r.slots) == 0:
                dest = TO_SLOTS
            else:
                dest = TO_INSERTS
                need = 1024  # room for all of them, made once before the inserts
                while need < 2 * (count + more + 1):
                    need *= 2
                if need > into.capacity and table_take(into, need) != 0:
                    dest = TO_VIEW
        if dest == TO_SLOTS:
            # empty slots keep an older generation (table_take): only the live ones are written
            t = into.slots
            live = <int32_t>(into.generation | 0x80000000u)
        elif dest == TO_INSERTS:
            t = stage
        else:
            t = <int32_t*>(out + at_out)
            live = 1
            memset(t, 0, region_bytes(<int64_t>r.slots, kl, nd))
        j = 0
        for w in range(words):
            memcpy(&bits, src + at_in + 8 * w, 8)
            if w == words - 1 and r.slots % 64 and (bits >> (r.slots % 64)) != 0:
                if dest != TO_VIEW:
                    table_clear(into)
                return "corrupted (slot map marks slots beyond the region)"
            if j + __builtin_popcountll(bits) > count:
                if dest != TO_VIEW:
                    table_clear(into)
                return "corrupted (slot map holds more entries than the header)"
            while bits:
                slot = w * 64 + __builtin_ctzll(bits)
                bits &= bits - 1
                if dest == TO_INSERTS:
                    if n == STAGE:
                        insert_staged(into, stage, n, stride)
                        n = 0
                    slot = n
                    n += 1
                q = t + slot * stride
                q[0] = live
                if width == 4:
                    memcpy(q + 1, keys + 4 * kl * j, 4 * kl)
                else:
                    for k in range(kl):
                        memcpy(&u, keys + 2 * (kl * j + k), 2)
                        q[1 + k] = u
                memcpy(q + 1 + kl, vals + 8 * nd * j, 8 * nd)
                j += 1
        if j != count:
            if dest != TO_VIEW:
                table_clear(into)
            return "corrupted (slot map holds fewer entries than the header)"
        at_in += disk_region_bytes(<int64_t>r.slots, count, kl, width, nd)
        if dest == TO_INSERTS:
            insert_staged(into, stage, n, stride)
        if dest != TO_VIEW:
            if dest == TO_SLOTS:
                into.count = count
            into_used[0] = 1
            memset(&none, 0, sizeof(none))
            none.key_len = r.key_len
            none.width = r.width
            none.nd = r.nd
            write_region(out, 0, &none)
        else:
            at_out += region_bytes(<int64_t>r.slots, kl, nd)
    memcpy(out + at_out, src + at_in, filters)  # the filters follow the regions
    return NULL


cdef int load_file(const char* path, int order, int ctx_key_len, const unsigned char* checksum,
                   int64_t sentence_id, int64_t max_size, int touch, void** buf,
                   long long* cap, void** raw, long long* raw_cap, TableC* into, int64_t more,
                   int* into_used, const char** why) noexcept nogil:
    """Read a cache file into ``raw`` (of ``raw_cap`` bytes, grown if needed) after checking
    its header, then its data checksum and that the header read with the data is the one
    checked, and unpack it into ``buf`` (its n-grams into ``into`` where that can take them:
    :c:func:`unpack_file`): 1 read, 0 absent, -1 unusable (``why`` says why).  Never blocks
    on a FIFO nor reads more than the header of a file that is not one of ours."""
    cdef int fd = c_open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
    cdef struct_stat st
    cdef unsigned char head[HEADER_BYTES]
    cdef int64_t size
    cdef ssize_t r
    cdef int e
    cdef void* p
    cdef uint64_t stored
    if fd < 0:
        if errno == ENOENT:
            return 0
        why[0] = strerror(errno)
        return -1
    if fstat(fd, &st) != 0:
        why[0] = strerror(errno)
        c_close(fd)
        return -1
    if not S_ISREG(st.st_mode):
        why[0] = "not a regular file"
        c_close(fd)
        return -1
    size = st.st_size
    r = c_pread(fd, head, HEADER_BYTES, 0)
    if r < 0:
        why[0] = strerror(errno)
        c_close(fd)
        return -1
    why[0] = check_header(head, r if r < HEADER_BYTES else size, order, ctx_key_len, checksum,
                          sentence_id)
    if why[0] == NULL and size > max_size:
        why[0] = "larger than the cache directory's bound"
    if why[0] != NULL:
        c_close(fd)
        return -1
    # read, not mapped: a file cut short on disk under a mapping would fault the decoder at its
    # next probe (SIGBUS), and one changed in place would change bytes already checked
    if grow_buffer(raw, raw_cap, size) != 0 or grow_buffer(buf, cap, file_bytes(head, 0)) != 0:
        why[0] = strerror(ENOMEM)
        c_close(fd)
        return -1
    e = read_all(fd, raw[0], size)
    if e != 0:
        why[0] = strerror(e)
        c_close(fd)
        return -1
    p = raw[0]
    memcpy(&stored, head + DATA_CHECKSUM_AT, 8)
    if stored != nlm_fast_checksum(<const unsigned char*>p + HEADER_BYTES, size - HEADER_BYTES) or \
            memcmp_(<const unsigned char*>p, head, HEADER_BYTES) != 0:
        why[0] = "corrupted (checksum mismatch)"
        c_close(fd)
        return -1
    why[0] = unpack_file(<const unsigned char*>p, <unsigned char*>buf[0], into, more, into_used)
    if why[0] != NULL:
        c_close(fd)
        return -1
    if touch:
        c_futimens(fd, NULL)  # LRU: a use counts as recent (best effort)
    c_close(fd)
    return 1

# ---------------------------------------------------------------------------------------
# writing: the entries of several tables (deduplicated) as one file
# ---------------------------------------------------------------------------------------

cdef enum:
    SRC_ALL = 0               # every live entry (a file's)
    SRC_NEW = 1               # entries computed here (disk bit clear) with a value
    SRC_ASKED = 2             # entries the sentence asked for (computed here, or from disk and
                              # seen): its working set, what the next iteration most likely asks

ctypedef struct Source:
    const TableC* t
    int mode                  # SRC_ALL, SRC_NEW or SRC_ASKED


cdef inline int wanted(const TableC* t, const int32_t* p, int mode) noexcept nogil:
    cdef int i
    if not table_live(t, p):
        return 0
    if mode == SRC_ALL:
        return 1
    if tv_disk(p) and (mode == SRC_NEW or not tv_seen(p)):
        return 0
    for i in range(t.nd):
        if not isnan(tv_get(t, p, i)):
            return 1
    return 0


cdef inline int64_t entry_bytes(int key_len, int nd) noexcept nogil:
    """Bytes of an entry as :c:func:`fill_region` copies it: key ids (int32), then values."""
    return 4 * key_len + 8 * nd


cdef int64_t fill_region(uint32_t* idx, int64_t cap, int key_len, int nd, const Source* src,
                         int nsrc, unsigned char* ents, int64_t limit, int64_t* count, int64_t* maxp,
                         int* width, uint64_t* filter, uint64_t blocks) noexcept nogil:
    """Place the wanted entries of ``src`` in a region of ``cap`` slots as the core's table
    would (home slot, linear probing; keys held by several sources once, the first source's):
    each entry is copied to ``ents`` (key ids as int32, then values: ``entry_bytes`` each, in
    the order placed) and ``idx`` (``cap`` zeroed words) gets, per slot, 1 + the number of
    its entry; the keys go into the (zeroed) filter of ``blocks`` blocks.  ``width``: the
    bytes per key id on disk (2 where every id written is in 0..65535, else 4).  More than
    ``limit`` entries (the room of ``ents``): ``count`` -1, nothing more placed.  The file's
    packed bytes are then made from these in slot order (:c:func:`pack_region`), not from
    the table layout itself: a base's n-gram region has 4x its entries' slots, and at 32
    bytes a slot that layout was most of a sentence end's memory traffic."""
    cdef int k, m
    cdef uint64_t h, kh
    cdef int64_t i, probes
    cdef int64_t es = entry_bytes(key_len, nd)
    cdef const int32_t* p
    cdef uint32_t j
    cdef int dup
    count[0] = 0
    maxp[0] = 0
    width[0] = 2
    for k in range(nsrc):
        for i in range(src[k].t.capacity):
            p = table_at(src[k].t, i)
            if not wanted(src[k].t, p, src[k].mode):
                continue
            if count[0] + 1 >= cap:  # never reached with the counts of count_wanted; no endless probe
                return count[0]
            kh = key_hash(p + 1, key_len)
            h = nlm_home(kh, cap)
            probes = 1
            dup = 0
            j = idx[h]
            while j != 0:
                if memcmp_(ents + (j - 1) * es, <const unsigned char*>(p + 1), 4 * key_len) == 0:
                    dup = 1
                    break
                h = 0 if h + 1 == <uint64_t>cap else h + 1
                probes += 1
                j = idx[h]
            if dup:
                continue
            if count[0] >= limit:
                count[0] = -1
                return -1
            memcpy(ents + count[0] * es, p + 1, 4 * key_len)
            memcpy(ents + count[0] * es + 4 * key_len, p + 1 + src[k].t.key_len, 8 * nd)
            count[0] += 1
            idx[h] = <uint32_t>count[0]
            for m in range(key_len):
                if <uint32_t>p[1 + m] > 65535:
                    width[0] = 4
            nlm_filter_add(filter, blocks, kh)
            if probes > maxp[0]:
                maxp[0] = probes
    return count[0]


cdef void pack_region(unsigned char* out, const uint32_t* idx, const RegionDesc* r,
                      const unsigned char* ents) noexcept nogil:
    """A region as on disk (``disk_region_bytes`` at ``out``) from :c:func:`fill_region`'s
    slot words and entries: its slot map, then the keys of the live slots (ids of
    ``r.width`` bytes) and their values, in slot order."""
    cdef int64_t slot, j = 0
    cdef uint32_t e
    cdef int k, kl = r.key_len, nd = r.nd
    cdef int64_t es = entry_bytes(kl, nd)
    cdef uint16_t u
    cdef int32_t x
    cdef uint64_t* bits = <uint64_t*>out
    cdef unsigned char* kout = out + packed_keys_at(<int64_t>r.slots)
    cdef unsigned char* vout = out + packed_values_at(<int64_t>r.slots, <int64_t>r.count, kl, r.width)
    cdef const unsigned char* p
    memset(out, 0, disk_region_bytes(<int64_t>r.slots, <int64_t>r.count, kl, r.width, nd))
    for slot in range(<int64_t>r.slots):
        e = idx[slot]
        if e == 0:
            continue
        bits[slot // 64] |= 1ULL << (slot % 64)
        p = ents + (e - 1) * es
        if r.width == 4:
            memcpy(kout + 4 * kl * j, p, 4 * kl)
        else:
            for k in range(kl):
                memcpy(&x, p + 4 * k, 4)
                u = <uint16_t>x
                memcpy(kout + 2 * (kl * j + k), &u, 2)
        memcpy(vout + 8 * nd * j, p + 4 * kl, 8 * nd)
        j += 1


cdef int64_t count_scanned(const Source* src, int nsrc) noexcept nogil:
    """Entries of ``src`` to be written, counted by a scan of every source (keys held by
    several sources counted for each)."""
    cdef int64_t n = 0, i
    cdef int k
    for k in range(nsrc):
        for i in range(src[k].t.capacity):
            if wanted(src[k].t, table_at(src[k].t, i), src[k].mode):
                n += 1
    return n


cdef int64_t count_wanted(const Source* src, int nsrc) noexcept nogil:
    """Entries of ``src`` to be written: a session table's new entries are counted as they
    are computed (``fresh``: no scan of the table at every sentence end); a file's by a scan."""
    cdef int64_t n = 0
    cdef int k
    for k in range(nsrc):
        n += src[k].t.fresh if src[k].mode == SRC_NEW else count_scanned(src + k, 1)
    return n


cdef int write_file(PStore* ps, const char* path, Source** src, int* nsrc, int replace,
                    int64_t max_size, int64_t* entries, int64_t* nbytes) noexcept nogil:
    """Write the wanted entries of each region's sources as a cache file at ``path``: each
    region placed (:c:func:`fill_region`) and packed (:c:func:`pack_region`), written to a
    temporary file, then renamed (``replace``) or linked (EEXIST if ``path`` exists).
    0 or an errno; ENOSPC, with nothing written, when the file would be larger than
    ``max_size`` bytes (its size in ``nbytes``)."""
    cdef int64_t n[3]
    cdef int64_t slots[3]
    cdef int64_t cnt[3]
    cdef int64_t idx_at[3]
    cdef int64_t ents_at[3]
    cdef int64_t filt_at[3]
    cdef int64_t maxp, size, disk, scratch, at
    cdef int64_t blocks[3]
    cdef int i, fd, e, width, refill = 1
    cdef uint32_t order
    cdef int key_lens[3]
    cdef int nds[3]
    cdef unsigned char* buf
    cdef unsigned char head[HEADER_BYTES]
    cdef uint64_t h
    cdef RegionDesc r
    cdef char tmp[PATH_MAX_LEN]
    key_lens[0] = ps.ngram_key_len
    key_lens[1] = ps.ctx_key_len
    key_lens[2] = ps.ngram_key_len
    nds[0] = 1
    nds[1] = 2
    nds[2] = 1
    for i in range(N_REGIONS):
        n[i] = count_wanted(src[i], nsrc[i])
    memset(head, 0, HEADER_BYTES)
    memcpy(head, MAGIC, 8)
    memcpy(head + 8, &FORMAT_VERSION, 4)
    order = <uint32_t>ps.ngram_key_len
    memcpy(head + 12, &order, 4)
    memcpy(head + 16, ps.checksum, 8)
    memcpy(head + 24, &ps.sentence_id, 8)
    while refill:
        refill = 0
        disk = HEADER_BYTES  # (ids as wide as the model's ranges need: the file's bound)
        scratch = 0
        for i in range(N_REGIONS):
            slots[i] = region_slots(i, n[i], replace)
            disk += disk_region_bytes(slots[i], n[i], key_lens[i], ps.key_width, nds[i])
            # the keys' filter: a lookup of a key the file does not hold (most new n-grams and
            # contexts probe every file of the sentence) reads one cache line of it, not the table
            blocks[i] = (n[i] * FILTER_BITS + 511) // 512 if n[i] else 0
            disk += blocks[i] * 64
            # scratch: the region's slot words, its entries, its filter
            idx_at[i] = scratch
            scratch += pad64(slots[i] * 4)
            ents_at[i] = scratch
            scratch += pad64(n[i] * entry_bytes(key_lens[i], nds[i]))
            filt_at[i] = scratch
            scratch += blocks[i] * 64
        nbytes[0] = disk
        if disk > max_size:
            return ENOSPC
        if grow_buffer(<void**>&ps.wbuf, &ps.wbuf_cap, scratch) != 0:
            return 12
        buf = ps.wbuf
        entries[0] = 0
        for i in range(N_REGIONS):
            cnt[i] = 0
            maxp = 0
            width = 2
            if slots[i]:
                memset(buf + idx_at[i], 0, slots[i] * 4)
                memset(buf + filt_at[i], 0, blocks[i] * 64)
                fill_region(<uint32_t*>(buf + idx_at[i]), slots[i], key_lens[i], nds[i], src[i], nsrc[i],
                            buf + ents_at[i], n[i], &cnt[i], &maxp, &width, <uint64_t*>(buf + filt_at[i]), <uint64_t>blocks[i])
            memcpy(head + FILTER_AT + 8 * i, &blocks[i], 8)
            r.key_len = key_lens[i]
            r.width = width
            r.nd = nds[i]
            r.slots = slots[i]
            r.count = cnt[i]
            r.max_probe = maxp
            write_region(head, i, &r)
            entries[0] += cnt[i]
        for i in range(N_REGIONS):
            # keys held by several sources are written once: where that left fewer entries
            # than counted, the region is sized again for them (readers check the slots)
            if cnt[i] != n[i]:
                n[i] = cnt[i] if cnt[i] >= 0 else count_scanned(src[i], nsrc[i])
                refill = 1
    size = file_bytes(head, 1)
    nbytes[0] = size
    if size > max_size:  # (only where ids exceed the model's ranges)
        return ENOSPC
    if grow_buffer(<void**>&ps.raw, &ps.raw_cap, size) != 0:
        return 12
    buf = ps.raw
    memcpy(buf, head, HEADER_BYTES)
    memcpy(buf + 32, &size, 8)
    at = HEADER_BYTES
    for i in range(N_REGIONS):
        read_region(head, i, &r)
        if r.slots:
            pack_region(buf + at, <const uint32_t*>(ps.wbuf + idx_at[i]), &r, ps.wbuf + ents_at[i])
            at += disk_region_bytes(<int64_t>r.slots, <int64_t>r.count, r.key_len, r.width, r.nd)
    for i in range(N_REGIONS):
        memcpy(buf + at, ps.wbuf + filt_at[i], blocks[i] * 64)
        at += blocks[i] * 64
    h = nlm_fast_checksum(buf + HEADER_BYTES, size - HEADER_BYTES)
    memcpy(buf + DATA_CHECKSUM_AT, &h, 8)
    h = data_checksum_c(buf, HEADER_CHECKSUM_AT)
    memcpy(buf + HEADER_CHECKSUM_AT, &h, 8)
    snprintf(tmp, PATH_MAX_LEN, "%s.%d.%llu.tmp", path, c_getpid(), nlm_pcache_next())
    fd = c_open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0o666)
    if fd < 0:
        e = errno
        return e
    if write_all(fd, buf, size) != 0:
        e = errno
        c_close(fd)
        c_unlink(tmp)
        return e
    if c_close(fd) != 0:
        e = errno
        c_unlink(tmp)
        return e
    if replace:
        if rename(tmp, path) != 0:
            e = errno
            c_unlink(tmp)
            return e
    else:
        if c_link(tmp, path) != 0:
            e = errno
            c_unlink(tmp)
            return e
        c_unlink(tmp)
    nbytes[0] = size
    return 0

# ---------------------------------------------------------------------------------------
# pruning (bounded disk use)
# ---------------------------------------------------------------------------------------

ctypedef struct FileEntry:
    int group                 # PRUNE_STALE, PRUNE_RUN or PRUNE_KEEP: the order of deletion
    int64_t key               # within a group: deleted in ascending order
    int64_t size
    char* path


cdef enum:
    PRUNE_STALE = 0           # least recently used first: other runs' files, a day unused
    PRUNE_RUN = 1             # most recently used first: files this run has used or written
    PRUNE_KEEP = 2            # not deleted by a decoder: files an earlier run left for this one
    STALE_SECONDS = 86400     # a file unused this long is no tuning loop's any more
    TMP_STALE_SECONDS = 600   # a temporary file this old is a dead writer's (younger: in flight)


cdef int cmp_entry(const void* a, const void* b) noexcept nogil:
    cdef const FileEntry* x = <const FileEntry*>a
    cdef const FileEntry* y = <const FileEntry*>b
    if x.group != y.group:
        return -1 if x.group < y.group else 1
    if x.key != y.key:
        return -1 if x.key < y.key else 1
    return strcmp(x.path, y.path)


cdef int ends_with(const char* s, const char* suffix) noexcept nogil:
    cdef size_t n = strlen(s), m = strlen(suffix)
    return n >= m and strcmp(s + n - m, suffix) == 0


cdef int64_t prune_dir(const char* root, int64_t max_bytes, int64_t* removed, long long since_ns,
                       int64_t need) noexcept nogil:
    """Size of ``root``'s cache files after pruning, if the total and ``need`` bytes more
    exceed ``max_bytes``; -1 if unreadable.

    ``since_ns`` < 0 (``nlmfeature cache --prune``): the least recently used files are
    deleted until the total is under 80% of the bound.  Otherwise a decoder session that
    started at ``since_ns`` prunes, and a tuning loop reads its files in the same order at
    every iteration: there, deleting the least recently used file deletes the one the loop
    needs next, and a bound smaller than one iteration's files would keep none of them for
    the next.  So files unused for a day (and dead writers' temporary files) go first, least
    recently used first, until the total and ``need`` are under 80%; if the total is still
    above the bound (other processes wrote too: a
    session's own writes stay within the bound, see :c:func:`write_sentence`), the files this
    run has used or written go, most recently used first, down to the bound; the files an
    earlier run left for this one are kept."""
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
    cdef long long now = nlm_now_ns(), mt
    cdef int tmp
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
            tmp = ends_with(f.d_name, ".tmp")
            if not (tmp or ends_with(f.d_name, ".nlmc")):
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
            mt = nlm_mtime_ns(&st)
            files[n].key = mt
            if tmp:  # a decoder keeps other writers' files in flight
                files[n].group = PRUNE_STALE if since_ns < 0 or mt < now - TMP_STALE_SECONDS * 1000000000LL \
                    else PRUNE_KEEP
            elif since_ns < 0 or mt < now - STALE_SECONDS * 1000000000LL:
                files[n].group = PRUNE_STALE
            elif mt >= since_ns:
                files[n].group = PRUNE_RUN
                files[n].key = -mt
            else:
                files[n].group = PRUNE_KEEP
            files[n].size = st.st_size
            files[n].path = <char*>malloc(strlen(path) + 1)
            if files[n].path == NULL:
                break
            memcpy(files[n].path, path, strlen(path) + 1)
            total += st.st_size
            n += 1
        closedir(sd)
    closedir(d)
    if total + need > max_bytes:
        qsort(files, n, sizeof(FileEntry), cmp_entry)
        target = max_bytes // 10 * 8 - need
        i = 0
        while i < n and total > target and files[i].group == PRUNE_STALE:
            if c_unlink(files[i].path) == 0 or errno == ENOENT:
                total -= files[i].size
                removed[0] += 1
            i += 1
        while i < n and total > max_bytes and files[i].group == PRUNE_RUN:
            if c_unlink(files[i].path) == 0 or errno == ENOENT:
                total -= files[i].size
                removed[0] += 1
            i += 1
    for i in range(n):
        free(files[i].path)
    free(files)
    return total

# ---------------------------------------------------------------------------------------
# sessions with a store
# ---------------------------------------------------------------------------------------

cdef void set_err(char* err, size_t errlen, const char* msg, const char* arg, int code) noexcept nogil:
    if err != NULL and errlen > 0:
        if code:
            snprintf(err, errlen, "%s%s: %s", msg, arg, strerror(code))
        else:
            snprintf(err, errlen, "%s%s", msg, arg)


cdef char* dup_str(const char* s) noexcept nogil:
    cdef size_t n = strlen(s)
    cdef char* p = <char*>malloc(n + 1)
    if p != NULL:
        memcpy(p, s, n + 1)
    return p


cdef int env_policy() noexcept nogil:
    cdef const char* v = getenv("NLMFEATURE_PERSISTENT_CACHE")
    if v == NULL or v[0] == 0 or strcmp(v, "auto") == 0:
        return PC_POLICY_AUTO
    if strcmp(v, "always") == 0 or strcmp(v, "on") == 0 or strcmp(v, "1") == 0:
        return PC_POLICY_ALWAYS
    if strcmp(v, "never") == 0 or strcmp(v, "off") == 0 or strcmp(v, "0") == 0:
        return PC_POLICY_NEVER
    return PC_POLICY_AUTO


cdef int model_file_changed(PStore* ps, int record) noexcept nogil:
    """The file-identity check of the model (device, inode, size, mtime): 1 if the file at
    the model's path is no longer the one the session started with, so its mapped bytes
    may not match the checksum that keys the cache.  ``record`` stores the identity (and
    checks the file's preamble still holds the model's checksum)."""
    cdef struct_stat st
    cdef unsigned char pre[48]
    cdef int fd
    if ps.model_path == NULL:
        return 0
    if stat(ps.model_path, &st) != 0:
        return 1
    if record:
        ps.m_dev = st.st_dev
        ps.m_ino = st.st_ino
        ps.m_size = st.st_size
        ps.m_mtime = nlm_mtime_ns(&st)
        fd = c_open(ps.model_path, O_RDONLY | O_NONBLOCK | O_CLOEXEC)
        if fd < 0:
            return 1
        if c_pread(fd, pre, 48, 0) != 48 or memcmp_(pre + 40, ps.checksum, 8) != 0:
            c_close(fd)
            return 1
        c_close(fd)
        return 0
    return not (ps.m_dev == <uint64_t>st.st_dev and ps.m_ino == <uint64_t>st.st_ino and
                ps.m_size == st.st_size and ps.m_mtime == nlm_mtime_ns(&st))


cdef void switch_off(PStore* ps) noexcept nogil:
    if not ps.off and not ps.quiet:
        fprintf(stderr, "nlmfeature: warning: model file %s changed since it was loaded: the persistent "
                "cache is off for this session (nothing is read or written under the old checksum; "
                "replace models by writing a new file and renaming it, then restart the decoder)\n",
                ps.model_path)
    ps.off = 1


cdef SessionC* pc_session_new(const ModelC* m, const unsigned char* checksum, const char* checksum_hex,
                              const char* model_path, int64_t cache_entries, int64_t ngram_entries,
                              const char* persistent_dir, int64_t max_bytes, int quiet,
                              int context_cache, int policy, int terms, char* err,
                              size_t errlen) noexcept nogil:
    """A core session, with a persistent store attached when ``persistent_dir`` is set and
    the policy says the cache pays; NULL with a message in ``err``.  ``context_cache``: -1
    lets the core decide whether caching hidden vectors pays, 0 turns it off, 1 on."""
    cdef SessionC* s
    cdef PStore* ps
    cdef size_t n
    cdef int use = persistent_dir != NULL and persistent_dir[0] != 0
    if policy < 0:
        policy = env_policy()
    if use and policy == PC_POLICY_NEVER:
        use = 0
    if use and policy == PC_POLICY_AUTO and not nlm_costly_lookup(m):
        use = 0
        if not quiet and nlm_pcache_first_off():
            fprintf(stderr, "nlmfeature: persistent cache %s not used: this model scores an n-gram "
                    "faster than the cache can look it up (unnormalised output, no dense layers); "
                    "set NLMFEATURE_PERSISTENT_CACHE=always to use it anyway\n", persistent_dir)
    if use and ngram_entries < 0:
        ngram_entries = C_DEFAULT_NGRAM_ENTRIES
    s = nlm_session_new(m, cache_entries, ngram_entries, terms)
    if s == NULL:
        set_err(err, errlen, "out of memory allocating a session", "", 0)
        return NULL
    if context_cache >= 0 and s.cache_enabled:
        s.ctx_cache_enabled = context_cache
    open_query_log(s, checksum)
    if not use:
        return s
    ps = <PStore*>nlm_alloc_lines(sizeof(PStore))
    if ps == NULL:
        nlm_session_free(s)
        set_err(err, errlen, "out of memory allocating a session", "", 0)
        return NULL
    s.store = &ps.view
    ps.model = m
    # key lengths of the n-gram / context / class regions: the full context (joint models:
    # the source window, then the n-1 target ids) plus the word or class
    ps.ngram_key_len = m.key_len + 1
    ps.ctx_key_len = m.key_len if m.key_len > 0 else 1
    # key ids are words, classes or source words: 2 bytes each on disk where all are < 65536
    ps.key_width = 2 if max(m.vocab_size, m.n_classes, m.src_vocab_size) <= 65536 else 4
    ps.sentence_id = -1
    ps.est_bytes = -1
    ps.since_ns = nlm_now_ns()
    ps.quiet = quiet
    ps.print_stats = getenv("NLMFEATURE_CACHE_STATS") != NULL and not quiet
    ps.max_bytes = max_bytes if max_bytes > 0 else C_DEFAULT_MAX_BYTES
    memcpy(ps.checksum, checksum, 8)
    ps.view.probe_context = s.cache_enabled and (m.output_type == OUT_SOFTMAX or m.output_type == OUT_CLASS)
    # Within-class normalisers are read when a file has them but written only on request:
    # in Moses tuning loops only 5-8% of the (context, class) pairs a sentence still needs
    # were on disk, while they made up ~40% of the files (benchmarks/bench_pcache.py)
    ps.keep_class = 0   # CachedScorer(class_normalisers=True) sets it
    ps.preload = 1      # CachedScorer(preload=False) clears it
    n = strlen(persistent_dir)
    if n + 64 >= PATH_MAX_LEN:
        set_err(err, errlen, "persistent cache directory path is too long: ", persistent_dir, 0)
        pc_session_free(s)
        return NULL
    ps.root = dup_str(persistent_dir)
    ps.dir = <char*>malloc(n + 20)
    if model_path != NULL and model_path[0] != 0:
        ps.model_path = dup_str(model_path)
    if ps.root == NULL or ps.dir == NULL:
        set_err(err, errlen, "out of memory allocating a session", "", 0)
        pc_session_free(s)
        return NULL
    while n > 1 and ps.root[n - 1] == b'/':
        n -= 1
        ps.root[n] = 0
    snprintf(ps.dir, n + 20, "%s/%s", ps.root, checksum_hex)
    if make_dirs(ps.dir) != 0:
        set_err(err, errlen, "cannot create the persistent cache directory ", ps.dir, errno)
        pc_session_free(s)
        return NULL
    if model_file_changed(ps, 1):
        switch_off(ps)
    return s


cdef void open_query_log(SessionC* s, const unsigned char* checksum) noexcept nogil:
    """NLMFEATURE_QUERY_LOG=DIR: record every lookup of this session in
    DIR/queries.<pid>.<n>.bin (see ``nlmfeature.decoder.querylog``), for replay by
    ``nlmfeature bench query --decoder-stream`` after ``nlmfeature querylog pack``.
    Recording costs one buffered write per lookup."""
    cdef const char* d = getenv("NLMFEATURE_QUERY_LOG")
    cdef char path[PATH_MAX_LEN]
    cdef int32_t head[4]
    if d == NULL or d[0] == 0:
        return
    if s.model.src_window:
        fprintf(stderr, "nlmfeature: note: NLMFEATURE_QUERY_LOG records target-only models; "
                "this joint model's queries are not recorded\n")
        return
    make_dirs(d)
    snprintf(path, PATH_MAX_LEN, "%s/queries.%d.%llu.bin", d, c_getpid(), nlm_pcache_next())
    s.query_log = fopen(path, "wb")
    if s.query_log == NULL:
        fprintf(stderr, "nlmfeature: warning: cannot record queries in %s: %s\n", path, strerror(errno))
        return
    fwrite(b"NLMQLOG1", 1, 8, <FILE*>s.query_log)
    head[0] = s.model.order
    head[1] = s.model.vocab_size
    head[2] = 0
    head[3] = 0
    fwrite(head, 4, 4, <FILE*>s.query_log)
    fwrite(checksum, 1, 8, <FILE*>s.query_log)


cdef inline void log_query(SessionC* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """Record one lookup when the session has a query log."""
    if s.query_log != NULL:
        fwrite(ctx, 4, s.model.ctx_len, <FILE*>s.query_log)
        fwrite(&w, 4, 1, <FILE*>s.query_log)


cdef double pc_lookup(SessionC* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """The core score of one n-gram (``ctx`` padded, ids valid), recorded first when the
    session has a query log: the C API's and :class:`CachedScorer`'s one entry."""
    log_query(s, ctx, w)
    return nlm_score_padded(s, ctx, w)


cdef double pc_lookup_clean(SessionC* s, int32_t* key, uint64_t h) noexcept nogil:
    """:c:func:`pc_lookup` of a cleaned ``key`` (the full context, then the word) whose
    n-gram cache hash ``nlm_prefetch_clean`` gave."""
    log_query(s, key, key[s.model.key_len])
    return nlm_score_clean(s, key, h)


cdef void drop_files(PStore* ps) noexcept nogil:
    """Forget the sentence's files (their buffers stay for the next sentence's)."""
    ps.view.nfiles = 0


cdef void pc_session_free(SessionC* s) noexcept nogil:
    cdef PStore* ps
    cdef int f
    if s == NULL:
        return
    if s.query_log != NULL:
        fclose(<FILE*>s.query_log)
        s.query_log = NULL
    if s.store != NULL:
        ps = <PStore*>s.store
        if ps.active:
            pc_end(s)
        for f in range(NLM_STORE_MAX_FILES):
            free(ps.maps[f])
        free(ps.root)
        free(ps.dir)
        free(ps.model_path)
        free(ps.wbuf)
        free(ps.raw)
        free(ps)
        s.store = NULL
    nlm_session_free(s)


cdef void file_path(PStore* ps, int64_t sid, int k, char* out) noexcept nogil:
    if k == 0:
        snprintf(out, PATH_MAX_LEN, "%s/%lld.nlmc", ps.dir, <long long>sid)
    else:
        snprintf(out, PATH_MAX_LEN, "%s/%lld.%d.nlmc", ps.dir, <long long>sid, k)


cdef void warn(PStore* ps, const char* path, const char* why) noexcept nogil:
    if not ps.quiet:
        fprintf(stderr, "nlmfeature: warning: ignoring persistent cache file %s: %s; it will be rewritten\n",
                path, why)


cdef int load_sentence(PStore* ps, int64_t sid, int touch, TableC* into) noexcept nogil:
    """Read the delta and base files of sentence ``sid`` into the store's views (``touch``:
    at sentence begin: mark them used, warn about and count unusable ones); the base's
    n-grams into the session's n-gram table ``into`` where it takes them (or NULL).  The
    deltas are read first: how many n-grams they add decides how the base goes in
    (:c:func:`unpack_file`)."""
    cdef char path[PATH_MAX_LEN]
    cdef int j, k, r, f, used = 0
    cdef const char* why = NULL
    cdef int64_t limit = ps.max_bytes, more = 0
    for j in range(MAX_DELTAS + 1):
        k = (j + 1) % (MAX_DELTAS + 1)  # deltas 1..MAX_DELTAS, then the base (0)
        f = ps.view.nfiles
        file_path(ps, sid, k, path)
        r = load_file(path, ps.ngram_key_len, ps.ctx_key_len, ps.checksum, sid, limit, touch,
                      &ps.maps[f], &ps.map_cap[f], <void**>&ps.raw, &ps.raw_cap,
                      into if k == 0 else NULL, more, &used, &why)
        if r == 0:
            continue
        if r < 0:
            if touch:
                warn(ps, path, why)
                ps.dirty = 1
                ps.files_ignored += 1
            continue
        view_regions(<const unsigned char*>ps.maps[f], &ps.view.ngram[f], &ps.view.ctx[f], &ps.view.cls[f])
        more += ps.view.ngram[f].count
        if used:  # the base's n-grams went into the session's table (marked as from disk)
            ps.view.ngram_copied += into.count
            ps.loaded += into.count
        if touch:
            ps.loaded += ps.view.ngram[f].count + ps.view.ctx[f].count + ps.view.cls[f].count
            ps.files_read += 1
        ps.view.nfiles = f + 1
    return 0


cdef void preload_ngrams(SessionC* s, PStore* ps) noexcept nogil:
    """Copy the n-grams of the sentence's files into its n-gram table (disk bit set, the
    first file's value where several hold one): in a tuning loop most of a sentence's
    lookups are n-grams of its files, and a copy in one pass over them (sequential reads,
    inserts prefetched ahead) costs less than probing the files (a filter line and a slot of
    each file, cache misses among the decoder's own) at each n-gram's first lookup.  The
    base file's n-grams are usually in the table already (unpacked into it in slot order,
    nothing hashed: :c:func:`unpack_file`), and this copies the deltas'.  Skipped where
    they would fill more than half the table's bound (the files are probed then)."""
    cdef TableC* t = &s.ngram_cache
    cdef const TableC* v
    cdef int64_t total = 0, i, slot, hits = t.hits, misses = t.misses
    cdef int f, found
    cdef int32_t* q
    cdef const int32_t* p
    cdef const int32_t* ahead
    cdef double x
    if not ps.preload or not s.ngram_cache_enabled:
        return
    for f in range(ps.view.nfiles):
        if ps.view.ngram[f].key_len != t.key_len:
            return
        total += ps.view.ngram[f].count
    if 2 * (t.count + total) > t.limit:
        return
    while 2 * (t.count + total + 1) > t.capacity:  # room first: no rehash while copying
        if table_grow(t) != 0:
            return
    for f in range(ps.view.nfiles):
        v = &ps.view.ngram[f]
        for i in range(v.capacity):
            if i + 16 < v.capacity:
                ahead = table_at(v, i + 16)
                if table_live(v, ahead):
                    table_prefetch(t, ahead + 1)
            p = table_at(v, i)
            if not table_live(v, p):
                continue
            x = tv_get(v, p, 0)
            slot = table_insert(t, p + 1, &found)
            if slot < 0:  # (cannot happen with the room made above) the files stay probed
                t.hits = hits
                t.misses = misses
                return
            q = table_at(t, slot)
            if not found or (isnan(tv_get(t, q, 0)) and not isnan(x)):
                tv_set(t, q, 0, x)
                tv_mark(q, 1)
            ps.view.ngram_copied += not found
    t.hits = hits  # copying is not looking up
    t.misses = misses
    ps.view.ngram_in_table = 1


cdef int pc_begin(SessionC* s, int64_t sentence_id) noexcept nogil:
    """Start a sentence: empties the per-sentence caches and maps the sentence's files."""
    cdef PStore* ps = <PStore*>s.store
    cdef int32_t key[NLM_MAX_ORDER + 1]
    if s.query_log != NULL:
        # a sentence marker: order int32, the first -1, the second the sentence id
        memset(key, 0, sizeof(key))
        key[0] = -1
        key[1] = <int32_t>sentence_id
        fwrite(key, 4, s.model.order, <FILE*>s.query_log)
    if ps != NULL and ps.active:
        pc_end(s)
    if nlm_session_begin(s, sentence_id) != 0:
        # the model file changed in place (nlm_model_file_changed): its scores no longer match
        # the checksum, so nothing is loaded from or written to the persistent cache
        if ps != NULL:
            drop_files(ps)
            ps.active = 0
            switch_off(ps)
        return -2
    if ps == NULL:
        return 0
    drop_files(ps)
    ps.view.ngram_in_table = 0
    ps.view.ngram_copied = 0
    ps.sentence_id = sentence_id
    ps.active = 1
    ps.dirty = 0
    ps.files_loaded = 0
    if ps.off or sentence_id < 0:
        return 0
    if model_file_changed(ps, 0):
        switch_off(ps)
        return 0
    # the base's n-grams straight into the (empty) n-gram table, the deltas' copied into it
    load_sentence(ps, sentence_id, 1,
                  &s.ngram_cache if ps.preload and s.ngram_cache_enabled else NULL)
    ps.files_loaded = ps.view.nfiles
    preload_ngrams(s, ps)
    return 0


cdef int64_t sentence_bytes(PStore* ps) noexcept nogil:
    """Bytes of the current sentence's files on disk (base and deltas)."""
    cdef char path[PATH_MAX_LEN]
    cdef struct_stat st
    cdef int64_t n = 0
    cdef int k
    for k in range(MAX_DELTAS + 1):
        file_path(ps, ps.sentence_id, k, path)
        if stat(path, &st) == 0 and S_ISREG(st.st_mode):
            n += st.st_size
    return n


cdef int64_t room(PStore* ps) noexcept nogil:
    """Bytes the directory's bound leaves (by the session's estimate of its size)."""
    return ps.max_bytes - ps.est_bytes if ps.est_bytes >= 0 else ps.max_bytes


cdef int write_room(PStore* ps, const char* path, Source** src, int* nsrc, int replace, int64_t old,
                    int64_t* entries, int64_t* nbytes) noexcept nogil:
    """:c:func:`write_file` in place of ``old`` bytes of files, within the bound: where the file
    does not fit, files unused for a day are deleted to make room (:c:func:`prune_dir`) and it
    is tried again; ENOSPC if it still does not fit."""
    cdef int64_t removed = 0, t
    cdef int e = write_file(ps, path, src, nsrc, replace, room(ps) + old, entries, nbytes)
    if e != ENOSPC:
        return e
    t = prune_dir(ps.root, ps.max_bytes, &removed, ps.since_ns, nbytes[0] - old)
    if t >= 0:
        ps.est_bytes = t
    ps.files_pruned += removed
    if removed == 0:
        return ENOSPC
    return write_file(ps, path, src, nsrc, replace, room(ps) + old, entries, nbytes)


cdef int write_sentence(SessionC* s, int64_t* entries, int64_t* nbytes, int64_t* freed) noexcept nogil:
    """Under the directory lock: the new entries as a delta, or base + deltas + new entries
    merged into a new base when no delta name is free (or a file was unusable), within the
    directory's bound (:c:func:`write_room`).  Where that does not fit, a sentence that has files gets its
    working set instead (what it asked for: the entries it computed and those of the files it
    used) as its new base, if that fits in place of its files; ENOSPC where nothing fits (a
    sentence without files gets none, one with files keeps them): a tuning loop asks for its sentences in the same order at every iteration,
    so with a bound below one iteration's files the first sentences keep theirs, up to date,
    and the others have none.  ``freed``: bytes of the files replaced."""
    cdef PStore* ps = <PStore*>s.store
    cdef char path[PATH_MAX_LEN]
    cdef char dpath[PATH_MAX_LEN]
    cdef Source srcs[3][NLM_STORE_MAX_FILES + 1]
    cdef Source* src[3]
    cdef int nsrc[3]
    cdef int k, e = 0, f, i
    cdef int64_t old
    cdef struct_stat st
    freed[0] = 0
    for i in range(3):
        src[i] = srcs[i]
    session_sources(s, ps, srcs, nsrc, SRC_NEW)
    file_path(ps, ps.sentence_id, 0, path)
    if not ps.dirty and stat(path, &st) == 0:
        for k in range(1, MAX_DELTAS + 1):
            file_path(ps, ps.sentence_id, k, dpath)
            if stat(dpath, &st) == 0:
                continue
            e = write_room(ps, dpath, src, nsrc, 0, 0, entries, nbytes)
            if e == EEXIST:  # a writer that could not take the lock was faster: the next name
                continue
            if e != ENOSPC:  # written, or an error
                return e
            break
    old = sentence_bytes(ps)
    if e != ENOSPC:
        # merge: what is on disk now (read again under the lock) and the new entries
        drop_files(ps)
        load_sentence(ps, ps.sentence_id, 0, NULL)
        for f in range(ps.view.nfiles):
            srcs[0][nsrc[0]].t = &ps.view.ngram[f]
            srcs[0][nsrc[0]].mode = SRC_ALL
            nsrc[0] += 1
            srcs[1][nsrc[1]].t = &ps.view.ctx[f]
            srcs[1][nsrc[1]].mode = SRC_ALL
            nsrc[1] += 1
            srcs[2][nsrc[2]].t = &ps.view.cls[f]
            srcs[2][nsrc[2]].mode = SRC_ALL
            nsrc[2] += 1
        e = write_room(ps, path, src, nsrc, 1, old, entries, nbytes)
        if e != ENOSPC:
            return base_written(ps, e, old, freed)
    if old == 0:
        return ENOSPC
    # no room: the sentence's working set replaces its files
    session_sources(s, ps, srcs, nsrc, SRC_ASKED)
    return base_written(ps, write_file(ps, path, src, nsrc, 1, room(ps) + old, entries, nbytes), old, freed)


cdef void session_sources(SessionC* s, PStore* ps, Source (*srcs)[NLM_STORE_MAX_FILES + 1], int* nsrc,
                          int mode) noexcept nogil:
    """The session's n-gram, context and class tables as the first source of each region
    (those the cache keeps), taking the entries of ``mode``."""
    cdef int i
    for i in range(3):
        srcs[i][0].mode = mode
    srcs[0][0].t = &s.ngram_cache
    srcs[1][0].t = &s.ctx_cache
    srcs[2][0].t = &s.class_cache
    nsrc[0] = 1 if s.ngram_cache_enabled else 0
    nsrc[1] = 1 if (ps.view.probe_context and s.ctx_cache_enabled) else 0
    nsrc[2] = 1 if (ps.view.probe_context and ps.keep_class) else 0


cdef int base_written(PStore* ps, int e, int64_t old, int64_t* freed) noexcept nogil:
    """After a new base file was written (``e`` 0, else its error, returned): the deltas it
    replaces are removed, and ``old`` bytes freed."""
    cdef char dpath[PATH_MAX_LEN]
    cdef int k
    if e == 0:
        for k in range(1, MAX_DELTAS + 1):
            file_path(ps, ps.sentence_id, k, dpath)
            c_unlink(dpath)
        freed[0] = old
    return e


cdef int64_t count_new(SessionC* s) noexcept nogil:
    """Entries the sentence computed that its files would keep."""
    cdef PStore* ps = <PStore*>s.store
    cdef Source srcs[3][NLM_STORE_MAX_FILES + 1]
    cdef int nsrc[3]
    session_sources(s, ps, srcs, nsrc, SRC_NEW)
    return count_wanted(srcs[0], nsrc[0]) + count_wanted(srcs[1], nsrc[1]) + count_wanted(srcs[2], nsrc[2])


cdef void print_stats(SessionC* s, PStore* ps) noexcept nogil:
    """NLMFEATURE_CACHE_STATS=1: one line per sentence with what each level found on disk
    (the decoder benchmark's hit rates)."""
    cdef int64_t now[7]
    now[0] = s.lookups
    now[1] = s.ngram_cache.hits
    now[2] = ps.view.ngram_hits
    now[3] = ps.view.ngram_found
    now[4] = ps.view.ctx_hits
    now[5] = ps.view.class_hits
    now[6] = ps.bytes_written
    fprintf(stderr, "nlmfeature: cache sentence %lld lookups=%lld ngram_hits=%lld persistent_hits=%lld "
            "ngrams=%lld ngrams_on_disk=%lld contexts=%lld contexts_on_disk=%lld class_pairs=%lld "
            "class_pairs_on_disk=%lld files=%d bytes_written=%lld\n", <long long>ps.sentence_id,
            <long long>(now[0] - ps.last[0]), <long long>(now[1] - ps.last[1]),
            <long long>(now[2] - ps.last[2]),
            <long long>(s.ngram_cache.count - ps.view.ngram_copied),
            <long long>(now[3] - ps.last[3]), <long long>s.ctx_cache.count,
            <long long>(now[4] - ps.last[4]), <long long>s.class_cache.count,
            <long long>(now[5] - ps.last[5]), ps.files_loaded, <long long>(now[6] - ps.last[6]))
    memcpy(ps.last, now, sizeof(now))


cdef int pc_end(SessionC* s) noexcept nogil:
    """End the sentence: write what it computed (if anything) to its persistent files."""
    cdef PStore* ps = <PStore*>s.store
    cdef char lock[PATH_MAX_LEN]
    cdef int lfd, e
    cdef int64_t entries = 0, size = 0, removed = 0, freed = 0
    if ps == NULL or not ps.active:
        return 0
    ps.active = 0
    if ps.off or ps.sentence_id < 0:
        drop_files(ps)
        return 0
    if not ps.dirty and count_new(s) == 0:
        if ps.print_stats:
            print_stats(s, ps)
        drop_files(ps)
        return 0
    if model_file_changed(ps, 0):  # scores of this sentence may come from other weights
        switch_off(ps)
        drop_files(ps)
        return 0
    snprintf(lock, PATH_MAX_LEN, "%s/.lock", ps.dir)
    lfd = c_open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0o666)
    if lfd >= 0:
        while c_flock(lfd, LOCK_EX) != 0 and errno == EINTR:
            pass
    if ps.est_bytes < 0:  # the run's first write: what is on disk (files unused for a day pruned)
        ps.est_bytes = prune_dir(ps.root, ps.max_bytes, &removed, ps.since_ns, 0)
        ps.files_pruned += removed
    e = write_sentence(s, &entries, &size, &freed)
    if lfd >= 0:
        c_flock(lfd, LOCK_UN)
        c_close(lfd)
    drop_files(ps)
    if e == ENOSPC:  # no room: the sentence keeps the files it has (none if it had none)
        if not ps.quiet and nlm_pcache_first_full():
            fprintf(stderr, "nlmfeature: persistent cache %s is at its bound (%lld MB): sentences that have "
                    "files keep them up to date, the others get none; give it more room with "
                    "persistent-cache-max (a Multi30k sentence takes ~2 MB after one tuning iteration, "
                    "~4 MB after four)\n", ps.root, <long long>(ps.max_bytes >> 20))
        ps.dirty = 0
        if ps.print_stats:
            print_stats(s, ps)
        return 0
    if e != 0:
        if not ps.quiet:
            fprintf(stderr, "nlmfeature: warning: cannot write the persistent cache of sentence %lld in %s: %s\n",
                    <long long>ps.sentence_id, ps.dir, strerror(e))
        return -1
    ps.files_written += 1
    ps.written += entries
    ps.bytes_written += size
    ps.dirty = 0
    if ps.print_stats:
        print_stats(s, ps)
    # bounded disk use: rescan when our estimate says the bound is near
    ps.written_since_scan += size
    if ps.est_bytes >= 0:
        ps.est_bytes += size - freed
    # other processes write too: rescan now and then, and when the estimate passes the bound
    if ps.est_bytes < 0 or ps.est_bytes > ps.max_bytes or ps.written_since_scan > ps.max_bytes // 8:
        ps.est_bytes = prune_dir(ps.root, ps.max_bytes, &removed, ps.since_ns, 0)
        ps.written_since_scan = 0
        ps.files_pruned += removed
    return 0


cdef void pc_stats(SessionC* s, int64_t* out, int n) noexcept nogil:
    cdef int64_t v[NLM_VT_STAT_COUNT]
    cdef PStore* ps = <PStore*>s.store
    cdef int i
    memset(v, 0, sizeof(v))
    v[NLM_VT_STAT_LOOKUPS] = s.lookups
    v[NLM_VT_STAT_NGRAM_HITS] = s.ngram_cache.hits
    v[NLM_VT_STAT_CONTEXT_HITS] = s.ctx_cache.hits + s.ctx_memo.hits
    v[NLM_VT_STAT_CONTEXT_MISSES] = s.ctx_cache.misses + s.ctx_memo.misses
    v[NLM_VT_STAT_CLASS_HITS] = s.class_cache.hits
    v[NLM_VT_STAT_CLASS_MISSES] = s.class_cache.misses
    v[NLM_VT_STAT_SENTENCES] = s.sentences
    if ps != NULL:
        v[NLM_VT_STAT_PERSISTENT_HITS] = ps.view.ngram_hits
        v[NLM_VT_STAT_PERSISTENT_CONTEXT_HITS] = ps.view.ctx_hits
        v[NLM_VT_STAT_PERSISTENT_CLASS_HITS] = ps.view.class_hits
        v[NLM_VT_STAT_PERSISTENT_LOADED] = ps.loaded
        v[NLM_VT_STAT_PERSISTENT_WRITTEN] = ps.written
        v[NLM_VT_STAT_FILES_READ] = ps.files_read
        v[NLM_VT_STAT_FILES_WRITTEN] = ps.files_written
        v[NLM_VT_STAT_FILES_IGNORED] = ps.files_ignored
        v[NLM_VT_STAT_FILES_PRUNED] = ps.files_pruned
    for i in range(n):
        out[i] = v[i] if i < NLM_VT_STAT_COUNT else 0

# ---------------------------------------------------------------------------------------
# Python access
# ---------------------------------------------------------------------------------------

STAT_NAMES = ("lookups", "ngram_hits", "context_hits", "context_misses", "class_hits",
              "class_misses", "persistent_hits", "persistent_loaded", "persistent_written",
              "files_read", "files_written", "files_ignored", "files_pruned", "sentences",
              "persistent_context_hits", "persistent_class_hits")
assert len(STAT_NAMES) == NLM_VT_STAT_COUNT


def data_checksum(const unsigned char[::1] data not None) -> int:
    """The checksum a cache file stores for its data regions (all bytes after the header)."""
    return nlm_fast_checksum(&data[0] if data.shape[0] else <const unsigned char*>b"", data.shape[0])


def header_checksum(const unsigned char[::1] data not None) -> int:
    """The checksum a cache file stores for its header's first 184 bytes."""
    return data_checksum_c(&data[0] if data.shape[0] else <const unsigned char*>b"", data.shape[0])


def unpack_cache_file(bytes data, int order, bytes model_checksum, int64_t sentence_id):
    """``(None, unpacked)`` if ``data`` (a whole file) is a valid cache file for the
    model/sentence, else ``(reason, None)``.  Unpacked: the file in memory layout -- the header,
    then each region as ``slots`` slots of int32 ``[1 (0: empty), key ids..., values as
    float64]``, padded to 64 bytes, then the filters."""
    cdef const char* why
    cdef const unsigned char* p = <const unsigned char*><char*>data
    cdef uint64_t stored
    cdef int ctx_key = order - 1 if order > 1 else 1
    cdef bytearray out
    cdef int used = 0
    if len(model_checksum) != 8:
        raise ValueError("model_checksum must be 8 raw bytes")
    why = check_header(p, len(data), order, ctx_key, <const unsigned char*><char*>model_checksum,
                       sentence_id)
    if why != NULL:
        return why.decode(), None
    memcpy(&stored, p + DATA_CHECKSUM_AT, 8)
    if stored != nlm_fast_checksum(p + HEADER_BYTES, len(data) - HEADER_BYTES):
        return "corrupted (checksum mismatch)", None
    out = bytearray(file_bytes(p, 0))
    why = unpack_file(p, <unsigned char*><char*>out, NULL, 0, &used)
    if why != NULL:
        return why.decode(), None
    return None, bytes(out)


def prune(str directory, int64_t max_bytes):
    """Delete least recently used cache files under ``directory`` if it holds more than
    ``max_bytes``; returns (bytes left, files removed)."""
    cdef bytes d = directory.encode()
    cdef int64_t removed = 0, left
    cdef const char* p = d
    with nogil:
        left = prune_dir(p, max_bytes, &removed, -1, 0)
    return left, removed


cdef class CachedScorer:
    """A core scoring session with the persistent tuning cache attached.

    ``model`` is an :class:`nlmfeature.Model`.  With ``directory`` set, sentence ``i``'s
    files in ``directory/<model checksum>/`` are read by :meth:`begin` and what the
    sentence computed is written by :meth:`end` (n-gram scores, context and within-class
    normalisers).  ``max_bytes`` bounds the directory (a run writes only what fits: see
    ``write_sentence``); ``cache_entries`` bounds the core context caches and ``ngram_entries`` the
    n-gram cache of one sentence (-1: the core's choice without a directory,
    :data:`DEFAULT_NGRAM_ENTRIES` with one; 0: off); ``context_cache`` forces caching of
    hidden vectors on (1) or off (0) instead of the core's choice (-1).  ``policy``:
    ``"auto"`` uses the directory only for models whose lookups cost more than a probe
    (one line on stderr says when it is skipped), ``"always"``, ``"never"``; None reads
    ``NLMFEATURE_PERSISTENT_CACHE`` (default auto).  ``position_terms=True`` scores as the
    decoders' sessions do (:meth:`Model.session`).  ``class_normalisers=True`` also writes
    within-class normalisers (read whenever a file has them; off in the decoders: in Moses
    tuning loops only 5-8% of the pairs a sentence needed again were on disk, while they were
    ~40% of the files).  ``preload=False`` probes a sentence's files at each n-gram's first
    lookup instead of copying their n-grams into its table at :meth:`begin` (the path taken
    when they would fill more than half of it; the same scores and files).  One scorer per thread; scores are
    natural logs, identical to :meth:`Model.score_sentence` (to a session's of the same
    ``position_terms``).
    """
    cdef SessionC* s
    cdef readonly object model
    cdef object _capsule

    def __cinit__(self, model, directory=None, int64_t max_bytes=0, int64_t cache_entries=NLM_DEFAULT_CACHE_ENTRIES,
                  int64_t ngram_entries=-1, bint quiet=False, int context_cache=-1, policy=None,
                  bint position_terms=False, bint class_normalisers=False, bint preload=True):
        cdef char err[1024]
        cdef const ModelC* m
        cdef int pol = -1
        cdef bytes cs = bytes.fromhex(model.checksum)
        cdef bytes cs_hex = model.checksum.encode()
        if directory is not None and not isinstance(directory, (str, os.PathLike)):
            raise TypeError(f"directory must be a path (str or path object) or None, not "
                            f"{type(directory).__name__}")
        if directory is not None and not isinstance(os.fspath(directory), str):
            raise TypeError("directory must be a str path, not bytes")
        cdef bytes d = (os.fspath(directory).encode() if directory else b"")
        cdef bytes mp = (str(model.path).encode() if getattr(model, "path", None) else b"")
        if len(cs) != 8:
            raise ValueError("model checksum must be 8 bytes")
        if policy is not None:
            if policy not in POLICIES:
                raise ValueError(f"policy must be one of {sorted(POLICIES)}, not {policy!r}")
            pol = POLICIES[policy]
        self.model = model
        self._capsule = model.native.capsule()
        m = <const ModelC*>PyCapsule_GetPointer(self._capsule, b"nlmfeature.ModelC")
        if m.src_window:
            raise ValueError("cached sessions take target-only models; score a joint model "
                             "with JointModel or the C API (nlm_joint_score)")
        err[0] = 0
        self.s = pc_session_new(m, <const unsigned char*><char*>cs, cs_hex, <const char*>mp,
                                cache_entries, ngram_entries, <const char*>d, max_bytes, quiet,
                                context_cache, pol, position_terms, err, sizeof(err))
        if self.s == NULL:
            raise OSError(err.decode("utf-8", "replace"))
        if self.s.store != NULL:
            (<PStore*>self.s.store).keep_class = class_normalisers
            (<PStore*>self.s.store).preload = preload

    def __dealloc__(self):
        if self.s != NULL:
            pc_session_free(self.s)
            self.s = NULL

    @property
    def directory(self):
        """The model's subdirectory of the persistent cache, or None (none given, or the
        policy skipped it)."""
        if self.s.store == NULL:
            return None
        return (<PStore*>self.s.store).dir.decode()

    @property
    def persistent(self) -> bool:
        """Whether the persistent cache is attached (a directory was given and the policy uses it)."""
        return self.s.store != NULL

    def begin(self, int64_t sentence_id) -> None:
        """Start sentence ``sentence_id`` (>= 0 to use the persistent cache).  Raises
        :class:`nlmfeature.errors.ModelFileError` if the model file was changed in place."""
        cdef int r
        with nogil:
            r = pc_begin(self.s, sentence_id)
        if r == -2:
            self.model.native.check_file()

    def ngram_table(self) -> tuple:
        """``(slots, entries)`` of the session's n-gram table now: after :meth:`begin`, the
        entries of the sentence's files (the base's unpacked into it, in its slots)."""
        return int(self.s.ngram_cache.capacity), int(self.s.ngram_cache.count)

    def end(self) -> None:
        """End the sentence: write what it computed to the persistent cache."""
        cdef int r
        with nogil:
            r = pc_end(self.s)

    def score_ids(self, const int32_t[::1] history not None, int32_t word) -> float:
        """Score ``word`` (id) after ``history`` (ids, oldest first; padded as the core does)."""
        cdef int32_t dummy = 0
        cdef int32_t ctx[NLM_MAX_ORDER]
        nlm_pad_context(self.s.model, &history[0] if history.shape[0] else &dummy, history.shape[0], ctx)
        if word < 0 or word >= self.s.model.vocab_size:
            word = self.s.model.unk
        return pc_lookup(self.s, ctx, word)

    def score(self, context, str word) -> float:
        """Natural-log score of ``word`` after the words ``context`` (oldest first)."""
        return self.score_ids(np.ascontiguousarray(self.model.ids(context), dtype=np.int32),
                              self.model.vocab.id(word))

    def score_padded(self, const int32_t[:, ::1] contexts not None, const int32_t[::1] words not None):
        """Scores of N n-grams (padded (N, n-1) contexts) through the caches; ids outside
        the vocabulary are scored as ``<unk>``."""
        cdef int64_t n = words.shape[0], i
        cdef int c = self.s.model.ctx_len, j
        cdef int32_t V = self.s.model.vocab_size, unk = self.s.model.unk, w
        cdef int32_t ctx[NLM_MAX_ORDER]
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
                for j in range(c):
                    ctx[j] = base[i * c + j]
                    if ctx[j] < 0 or ctx[j] >= V:
                        ctx[j] = unk
                o[i] = pc_lookup(self.s, ctx, w)
        return out

    def score_sentence(self, sentence):
        """Per-token scores of a sentence (words and ``</s>``), as :meth:`Model.score_sentence`."""
        ctx, words = self.model.sentence_ngrams(sentence)
        return self.score_padded(ctx, words)

    def stats(self) -> dict:
        """Counters since creation (lookups, n-gram/context/class/persistent cache hits, files)."""
        cdef int64_t out[NLM_VT_STAT_COUNT]
        pc_stats(self.s, out, NLM_VT_STAT_COUNT)
        return {name: int(out[i]) for i, name in enumerate(STAT_NAMES)}
