# Included by _scorer.pyx (one compilation unit): Hashing: the vocabulary lookup table, direct n-gram feature hashes, cache-key hashes.

# ---------------------------------------------------------------------------------------
# hashing: vocabulary lookup, direct n-gram features, cache keys
# ---------------------------------------------------------------------------------------

cdef inline uint64_t fnv1a(const char* s, int64_t n) noexcept nogil:
    cdef uint64_t h = 0xcbf29ce484222325ULL
    cdef int64_t i
    for i in range(n):
        h = (h ^ <unsigned char>s[i]) * 0x100000001b3ULL
    return h


cdef int64_t nlm_vocab_find(const int64_t* offsets, const unsigned char* data, const int32_t* table,
                            int64_t table_size, const char* word, int64_t length) noexcept nogil:
    """Id of ``word`` (``length`` bytes) in the vocabulary hash table, or -1."""
    cdef uint64_t mask = <uint64_t>table_size - 1
    cdef uint64_t slot = fnv1a(word, length) & mask
    cdef int32_t wid
    cdef int64_t start, i
    while True:
        wid = table[slot]
        if wid < 0:
            return -1
        start = offsets[wid]
        if offsets[wid + 1] - start == length:
            i = 0
            while i < length and data[start + i] == <unsigned char>word[i]:
                i += 1
            if i == length:
                return wid
        slot = (slot + 1) & mask


def vocab_hash_table(const int64_t[::1] offsets not None, const unsigned char[::1] data not None):
    """Open-addressing table (FNV-1a 64, linear probing, -1 = empty) over the vocabulary."""
    cdef int64_t n = offsets.shape[0] - 1
    cdef int64_t size = 1
    while size < 2 * n + 2:
        size *= 2
    table = np.full(size, -1, dtype=np.int32)
    cdef int32_t[::1] t = table
    cdef uint64_t mask = size - 1, slot
    cdef int64_t w
    for w in range(n):
        slot = fnv1a(<const char*>&data[offsets[w]] if offsets[w + 1] > offsets[w] else <const char*>"",
                     offsets[w + 1] - offsets[w]) & mask
        while t[slot] >= 0:
            slot = (slot + 1) & mask
        t[slot] = <int32_t>w
    return table


def vocab_find(const int64_t[::1] offsets not None, const unsigned char[::1] data not None, const int32_t[::1] table not None,
               bytes word):
    """Look ``word`` (UTF-8 bytes) up in a table made by :func:`vocab_hash_table`; -1 if absent."""
    cdef const char* w = word
    cdef const unsigned char* d = <const unsigned char*>b""
    if data.shape[0]:
        d = &data[0]
    return nlm_vocab_find(&offsets[0], d, &table[0], table.shape[0], w, len(word))


cdef inline uint64_t direct_state0(int kind) noexcept nogil:
    return splitmix64(<uint64_t>kind)


cdef inline void direct_states(const ModelC* m, const int32_t* ctx, int kind, uint64_t* states) noexcept nogil:
    """states[k] is the hash of the last k context words (k = 0 .. direct_order-1)."""
    cdef int k
    states[0] = direct_state0(kind)
    for k in range(1, m.direct_order):
        states[k] = splitmix64(states[k - 1] ^ <uint64_t>ctx[m.key_len - k])


cdef inline uint64_t direct_index(const ModelC* m, uint64_t h) noexcept nogil:
    """The model's bucket of the direct-feature hash ``h`` (:c:func:`hash_bucket`)."""
    return hash_bucket(h, <uint64_t>m.hash_space)


cdef extern from *:
    int __builtin_popcountll(unsigned long long x) nogil


cdef inline float direct_packed_weight(const ModelC* m, uint64_t r) noexcept nogil:
    """The direct weight at place ``r`` of the store (:c:func:`direct_rank_of`; a float16
    model's half, widened exactly)."""
    if m.direct_packed_h != NULL:
        return nlm_half_to_float(m.direct_packed_h + r)
    return m.direct_packed[r]


cdef inline const void* direct_packed_place(const ModelC* m, uint64_t r) noexcept nogil:
    """Where the direct weight at place ``r`` of the store is (to prefetch it)."""
    if m.direct_packed_h != NULL:
        return m.direct_packed_h + r
    return m.direct_packed + r


cdef inline const uint64_t* direct_line(const ModelC* m, uint64_t i) noexcept nogil:
    """The 64-byte line of the direct-feature store that holds index ``i``'s bit (and,
    unless it spilled, its weight): :attr:`ModelC.direct_lines` (a store by lines)."""
    return m.direct_lines + ((i >> m.direct_gshift) << 3)


cdef inline const void* direct_lookup_place(const ModelC* m, uint64_t i) noexcept nogil:
    """What a lookup of the direct weight at index ``i`` reads first (to prefetch it): its
    line, or in a dense store the weight."""
    if m.direct_lines == NULL:
        return direct_packed_place(m, i)
    return direct_line(m, i)


cdef inline int direct_nonzero(const ModelC* m, uint64_t i) noexcept nogil:
    """Whether the direct weight at index ``i`` is non-zero (its bit in its line; a dense
    store's zeros are +0.0 and read like the others)."""
    cdef uint64_t b
    if m.direct_lines == NULL:
        return 1
    b = i & ((<uint64_t>1 << m.direct_gshift) - 1)
    return <int>((direct_line(m, i)[b >> 6] >> (b & 63)) & 1)


cdef inline uint64_t direct_rank_of(const ModelC* m, uint64_t i) noexcept nogil:
    """The place (in items of the store, :c:func:`direct_packed_weight`) of the direct
    weight at index ``i``, for an ``i`` whose bit is set (a dense store: ``i``): its rank
    among its line's non-zero weights (popcounts of the line's bitmap words before it) after
    the line's header, or, past the line's room, its place among the spilled weights (the
    line's spill base).  The bit and the weight share one cache line: a lookup waits for one
    miss, not two."""
    cdef const uint64_t* line
    cdef uint64_t b, r
    cdef int w, k
    if m.direct_lines == NULL:  # (a dense store)
        return i
    line = direct_line(m, i)
    b = i & ((<uint64_t>1 << m.direct_gshift) - 1)
    w = <int>(b >> 6)
    r = <uint64_t>__builtin_popcountll(line[w] & ((<uint64_t>1 << (b & 63)) - 1))
    for k in range(w):
        r += <uint64_t>__builtin_popcountll(line[k])
    if r < <uint64_t>m.direct_cap:
        return (i >> m.direct_gshift) * <uint64_t>m.direct_line_items + <uint64_t>m.direct_head_items + r
    return (<uint64_t>m.direct_spill + (<const uint32_t*>(line + m.direct_words))[0]
            + r - <uint64_t>m.direct_cap)


cdef inline float direct_weight_at(const ModelC* m, uint64_t i) noexcept nogil:
    """The (non-zero) direct weight at index ``i``: :c:func:`direct_rank_of`."""
    return direct_packed_weight(m, direct_rank_of(m, i))


cdef inline double direct_value(const ModelC* m, const uint64_t* states, int32_t target) noexcept nogil:
    """Sum of the hashed direct-feature weights of ``target`` after the context whose hash
    states are ``states``.  Zero weights (untrained n-grams, most of the table) are skipped
    by their line's bits (a dense store adds its +0.0): adding +-0.0 to a sum that is never
    -0.0 leaves it unchanged, so the value is bit-identical."""
    cdef double s = 0
    cdef int k
    cdef uint64_t t = (<uint64_t>target) << 32, i
    for k in range(m.direct_order):
        i = direct_index(m, splitmix64(states[k] ^ t))
        if direct_nonzero(m, i):
            s += direct_weight_at(m, i)
    return s


cdef inline double direct_value_kind(const ModelC* m, int kind, const uint64_t* states,
                                    int32_t target) noexcept nogil:
    """:c:func:`direct_value` of ``target`` (a word for kind 0, a class for kind 1; ``states``
    of that kind), its order-0 term read from ``direct_first``: the same sum, bit for bit
    (it starts from 0 and adds that term first), without the random access into the
    weights that the order-0 term of every word of a class normaliser cost."""
    cdef double s
    cdef int k
    cdef uint64_t t = (<uint64_t>target) << 32, i
    if m.direct_first[kind] == NULL:
        return direct_value(m, states, target)
    s = m.direct_first[kind][target]
    for k in range(1, m.direct_order):
        i = direct_index(m, splitmix64(states[k] ^ t))
        if direct_nonzero(m, i):
            s += direct_weight_at(m, i)
    return s


cdef void direct_first_fill(const ModelC* m, int kind, int32_t n, double* out) noexcept nogil:
    """``out[t]`` = the order-0 term of :c:func:`direct_value` for targets ``t`` < ``n`` of
    ``kind``: the weight it adds (as a double), or 0 where it adds none."""
    cdef uint64_t s0 = direct_state0(kind), i
    cdef int32_t t
    for t in range(n):
        i = direct_index(m, splitmix64(s0 ^ ((<uint64_t>t) << 32)))
        out[t] = direct_weight_at(m, i) if direct_nonzero(m, i) else 0.0


cdef inline void direct_prefetch(const ModelC* m, const uint64_t* states, int32_t target) noexcept nogil:
    """Start loading the direct-feature weights of ``target`` (a word: kind-0 ``states``;
    random lines of a store of megabytes, each bit beside its weight) so that the forward
    pass overlaps their cache misses (the order-0 weight comes from ``direct_first`` when
    there is one)."""
    cdef int k
    cdef uint64_t t = (<uint64_t>target) << 32
    cdef uint64_t i
    for k in range(1 if m.direct_first[0] != NULL else 0, m.direct_order):
        i = direct_index(m, splitmix64(states[k] ^ t))
        __builtin_prefetch(direct_lookup_place(m, i))


def direct_feature_indices(const int32_t[:, ::1] contexts not None, const int32_t[::1] targets not None, int kind,
                           int direct_order, int64_t hash_space):
    """Indices into the direct-feature store for each (context, target): shape (N, direct_order).

    ``contexts`` are padded contexts of n-1 ids; ``kind`` is 0 for word and 1 for class features.
    Used by the batched scorer and by training, so both index exactly as the native scorer does.
    """
    cdef int64_t n = contexts.shape[0], i
    cdef int ctx_len = contexts.shape[1], k
    out = np.empty((n, direct_order), dtype=np.int64)
    cdef int64_t[:, ::1] o = out
    cdef uint64_t state, t
    with nogil:
        for i in range(n):
            state = direct_state0(kind)
            t = (<uint64_t>targets[i]) << 32
            for k in range(direct_order):
                if k > 0:
                    state = splitmix64(state ^ <uint64_t>contexts[i, ctx_len - k])
                o[i, k] = <int64_t>hash_bucket(splitmix64(state ^ t), <uint64_t>hash_space)
    return out


cdef uint64_t key_hash(const int32_t* key, int n) noexcept nogil:
    """Hash of an exact key of ``n`` ids: one multiply-xorshift step per id, then a
    splitmix64 finaliser (the hash of every cache table and of the persistent cache files)."""
    cdef uint64_t h = 0x9E3779B97F4A7C15ULL
    cdef int i
    for i in range(n):
        h = (h + <uint32_t>key[i]) * 0xBF58476D1CE4E5B9ULL
        h ^= h >> 31
    return splitmix64(h)
