# Included by _scorer.pyx (one compilation unit): The one exact-key hash table (TableC in _scorer.pxd): per-sentence caches and the persistent cache's files.

# ---------------------------------------------------------------------------------------
# the exact-key table (see TableC in _scorer.pxd)
# ---------------------------------------------------------------------------------------

cdef void table_init(TableC* t, int key_len, int nd, int fval_len, int64_t limit,
                     int clear_when_full) noexcept nogil:
    """An empty table for at most ``limit`` keys of ``key_len`` ids with ``nd`` doubles per
    slot (and ``fval_len`` floats per entry).  Memory comes with the first insert and grows
    with the sentence, so probes stay within what a sentence really uses (a table sized for
    the bound would make every probe a cache miss)."""
    memset(t, 0, sizeof(TableC))
    t.key_len = key_len
    t.nd = nd
    t.fval_len = fval_len
    t.stride = 1 + key_len + 2 * nd + (1 if fval_len > 0 else 0)
    t.clear_when_full = clear_when_full
    t.limit = limit if limit > 0 else 1
    t.generation = 1


cdef void* alloc_huge(size_t nbytes, int zero) noexcept nogil:
    """Memory (zeroed with ``zero``) for what is probed at scattered places: a cache table,
    a vector arena, a persistent-cache file read into memory, a model's large arrays
    (NativeModel.hot).  From 2 MB up in transparent huge pages, so that the probes do not also
    miss the TLB (a Moses search keeps the TLB busy with its own data); freed with free()."""
    cdef size_t huge = NLM_HUGE_PAGE, size
    cdef void* p
    if nbytes < huge:
        if zero:
            return calloc(1, nbytes if nbytes else 1)
        return malloc(nbytes if nbytes else 1)
    size = (nbytes + huge - 1) & ~(huge - 1)
    p = aligned_alloc(huge, size)
    if p != NULL:
        madvise(p, size, MADV_HUGEPAGE)
        if zero:
            memset(p, 0, size)
    return p


cdef void* alloc_table(size_t nbytes) noexcept nogil:
    """Zeroed memory for a cache table (or a persistent-cache file read into memory):
    :c:func:`alloc_huge`."""
    return alloc_huge(nbytes, 1)


cdef int table_grow(TableC* t) noexcept nogil:
    """Rehash into twice the slots (1,024 at first), keeping entry numbers, flags and the
    dense values; -1 (table untouched) when out of memory.  An empty table with the memory
    (table_take gave it fewer slots than it has) only takes more of it."""
    cdef int64_t cap = t.capacity * 2 if t.capacity else 1024
    cdef int32_t* slots
    cdef int64_t room, had, i
    cdef uint64_t h
    cdef int32_t* src
    cdef float* fv
    if t.count == 0 and cap <= t.allocated and not t.fval_len:
        t.capacity = cap  # (slots past the old capacity hold older generations only)
        return 0
    slots = <int32_t*>alloc_table(cap * t.stride * sizeof(int32_t))
    if slots == NULL:
        return -1
    if t.fval_len:
        room = cap // 2 if cap // 2 < t.limit else t.limit
        had = t.capacity // 2 if t.capacity // 2 < t.limit else t.limit
        fv = <float*>alloc_table(room * t.fval_len * sizeof(float))
        if fv == NULL:
            free(slots)
            return -1
        if t.fvals != NULL:
            memcpy(fv, t.fvals, had * t.fval_len * sizeof(float))
            free(t.fvals)
        t.fvals = fv
    for i in range(t.capacity):
        src = t.slots + i * t.stride
        if table_live(t, src):
            h = nlm_home(key_hash(src + 1, t.key_len), cap)
            while slots[h * t.stride] != 0:
                h = 0 if h + 1 == <uint64_t>cap else h + 1
            memcpy(slots + h * t.stride, src, t.stride * sizeof(int32_t))
    # live entries keep generation and flag; empty slots are 0 (never a generation)
    free(t.slots)
    t.slots = slots
    t.capacity = cap
    t.allocated = cap
    return 0


cdef int table_take(TableC* t, int64_t slots) noexcept nogil:
    """Make ``t`` (a table without dense values) an empty table of exactly ``slots`` slots,
    for a persistent-cache file's region of that size to be unpacked into it in slot order
    (nlmfeature._pcache.unpack_file): the memory it has where that is enough (emptied in
    O(1)), else new memory; -1 (``t`` untouched) when out of memory."""
    cdef int32_t* mem
    if t.fval_len:
        return -1
    if slots > t.allocated:
        mem = <int32_t*>alloc_table(slots * t.stride * sizeof(int32_t))
        if mem == NULL:
            return -1
        free(t.slots)
        t.slots = mem
        t.allocated = slots
    t.capacity = slots
    table_clear(t)
    return 0


cdef void table_free(TableC* t) noexcept nogil:
    free(t.slots)
    free(t.fvals)
    t.slots = NULL
    t.fvals = NULL
    t.capacity = 0
    t.allocated = 0
    t.count = 0


cdef void table_clear(TableC* t) noexcept nogil:
    """Forget every entry in O(1)."""
    t.count = 0
    t.fresh = 0
    t.generation += 1
    if t.generation > 0x3fffffffu:  # 30 bits used up after 2^30 clears: really wipe
        memset(t.slots, 0, t.allocated * t.stride * sizeof(int32_t))
        t.generation = 1


cdef inline int key_same(const int32_t* p, const int32_t* key, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if p[1 + i] != key[i]:
            return 0
    return 1


cdef int64_t table_find(const TableC* t, const int32_t* key, uint64_t h) noexcept nogil:
    """Slot of ``key`` (whose :c:func:`key_hash` is ``h``), or -1; a table with a filter (a
    file view) is probed only where the filter lets the key pass."""
    cdef uint64_t slot
    cdef const int32_t* p
    cdef int64_t probes = t.max_probe if t.max_probe > 0 else t.capacity
    if t.capacity == 0:
        return -1
    if t.filter != NULL and not nlm_filter_has(t.filter, <uint64_t>t.filter_blocks, h):
        return -1
    slot = nlm_home(h, t.capacity)
    while probes > 0:
        p = table_at(t, slot)
        if not table_live(t, p):
            return -1
        if key_same(p, key, t.key_len):
            return <int64_t>slot
        slot = table_next(t, slot)
        probes -= 1
    return -1


cdef uint64_t table_prefetch(const TableC* t, const int32_t* key) noexcept nogil:
    """:c:func:`key_hash` of ``key``, the load of its home slot started (for
    :c:func:`table_insert_h` a little later: the probes of several tables overlap); the
    prefetch is kept even where a caller drops the hash (``nlm_prefetch_kept``)."""
    cdef uint64_t h = key_hash(key, t.key_len)
    if t.capacity:
        nlm_prefetch_kept(table_at(t, nlm_home(h, t.capacity)))
    return h


cdef int64_t table_insert(TableC* t, const int32_t* key, int* found) noexcept nogil:
    """Slot of ``key``; inserted (values undefined, disk bit clear, ``found`` = 0) when
    absent.  A full table is cleared first (``clear_when_full``) or takes no new key (-1);
    -1 also when out of memory."""
    return table_insert_h(t, key, key_hash(key, t.key_len), found)


cdef int64_t table_insert_h(TableC* t, const int32_t* key, uint64_t h, int* found) noexcept nogil:
    """:c:func:`table_insert` of ``key`` whose :c:func:`key_hash` is ``h``."""
    cdef uint64_t slot
    cdef int32_t* p
    found[0] = 0
    if t.capacity:
        slot = nlm_home(h, t.capacity)
        while True:
            p = table_at(t, slot)
            if not table_live(t, p):
                break
            if key_same(p, key, t.key_len):
                found[0] = 1
                t.hits += 1
                return <int64_t>slot
            slot = table_next(t, slot)
    t.misses += 1
    if t.count >= t.limit:
        if not t.clear_when_full:
            return -1
        table_clear(t)
        t.clears += 1
    if 2 * (t.count + 1) > t.capacity:
        if table_grow(t) != 0:
            if t.capacity == 0 or not t.clear_when_full:
                return -1
            table_clear(t)  # out of memory: start the table again
            t.clears += 1
    slot = nlm_home(h, t.capacity)
    while table_live(t, table_at(t, slot)):
        slot = table_next(t, slot)
    p = table_at(t, slot)
    p[0] = <int32_t>t.generation
    memcpy(p + 1, key, t.key_len * sizeof(int32_t))
    if t.fval_len:
        p[1 + t.key_len + 2 * t.nd] = <int32_t>t.count
    t.count += 1
    return <int64_t>slot


# ---------------------------------------------------------------------------------------
# the direct-mapped memo (see MemoC in _scorer.pxd)
# ---------------------------------------------------------------------------------------

cdef int memo_init(MemoC* t, int64_t slots, int key_len, int64_t val_len) noexcept nogil:
    """A memo of ``slots`` slots (a power of 2) for keys of ``key_len`` ids and ``val_len``
    floats each, every slot empty; -1 (an empty memo that is off) when out of memory."""
    memset(t, 0, sizeof(MemoC))
    t.keys = <int32_t*>nlm_alloc_lines(slots * key_len * sizeof(int32_t))
    t.vals = <float*>nlm_alloc_lines(slots * val_len * sizeof(float))
    if t.keys == NULL or t.vals == NULL:
        memo_free(t)
        return -1
    memset(t.keys, 0xff, slots * key_len * sizeof(int32_t))
    t.slots = slots
    t.key_len = key_len
    t.val_len = val_len
    return 0


cdef void memo_free(MemoC* t) noexcept nogil:
    free(t.keys)
    free(t.vals)
    t.keys = NULL
    t.vals = NULL
    t.slots = 0


cdef float* memo_get(MemoC* t, const int32_t* key, int* found) noexcept nogil:
    """The values of ``key`` (ids >= 0) in its slot (``found`` = 1), else that slot given to
    ``key`` (``found`` = 0: the caller writes its values there before the next call).  The
    slot: a sum of the ids times odd constants, mixed by one multiply (independent products,
    a few cycles, where :c:func:`key_hash`'s chain of steps showed in a Moses profile)."""
    cdef uint64_t h = 0
    cdef int j, n = t.key_len
    cdef int64_t slot
    cdef int32_t* k
    for j in range(n):
        h += <uint64_t><uint32_t>key[j] * (0x9E3779B97F4A7C15ULL + 2 * <uint64_t>j)
    slot = <int64_t>(((h * 0xBF58476D1CE4E5B9ULL) >> 32) & <uint64_t>(t.slots - 1))
    k = t.keys + slot * n
    found[0] = 1
    for j in range(n):  # (a few ids: compared in place, no call)
        if k[j] != key[j]:
            found[0] = 0
            break
    if found[0]:
        t.hits += 1
    else:
        t.misses += 1
        memcpy(k, key, n * sizeof(int32_t))
    t.window_hits += found[0]
    t.window += 1
    if t.window == NLM_MEMO_WINDOW:
        if t.window_hits * 16 < NLM_MEMO_WINDOW:
            t.closed = 15 * NLM_MEMO_WINDOW
        t.window = 0
        t.window_hits = 0
    return t.vals + slot * t.val_len


cdef int memo_open(MemoC* t) noexcept nogil:
    """Whether to ask the memo (on) now: after a window of NLM_MEMO_WINDOW asks of which fewer
    than 1 in 16 hit (text scored once, where a decoder's search repeats its contexts), it is
    left alone for the next 15 windows' worth of lookups, then sampled again, so that a miss's
    extra work (the key compared and copied, the vector written to the memo's block instead of
    a work buffer in L1) is paid on a sixteenth of such a stream."""
    if t.closed > 0:
        t.closed -= 1
        return 0
    return t.slots > 0
