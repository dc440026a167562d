# Included by _scorer.pyx (one compilation unit): Sessions: the per-sentence caches and the one scoring path (nlm_score_padded) behind every entry.

# ---------------------------------------------------------------------------------------
# sessions
# ---------------------------------------------------------------------------------------

cdef int context_cache_pays(const ModelC* m) noexcept nogil:
    """Whether caching a context's hidden vector is cheaper than recomputing it: for
    normalised outputs (it also holds the normalisers) and for networks with dense layers
    or full context matrices without tables.  A few vector additions are not worth a probe."""
    cdef int k
    if m.output_type == OUT_SOFTMAX or m.output_type == OUT_CLASS or m.n_layers > 0:
        return 1
    for k in range(m.n_branches):
        if not m.branches[k].diagonal and not (m.use_tables and m.branches[k].tables != NULL):
            return 1
    return 0


cdef int64_t context_memo_slots(const ModelC* m) noexcept nogil:
    """Slots of a session's context memo (SessionC.ctx_memo): the largest power of 2 whose
    hidden vectors fit NLM_CONTEXT_MEMO_BYTES (an L2 cache's size), from 64 to 1024."""
    cdef int64_t n = 1024
    while n > 64 and n * (m.max_width + m.key_len) * 4 > NLM_CONTEXT_MEMO_BYTES:
        n //= 2
    return n


cdef void* nlm_alloc_lines(size_t n) noexcept nogil:
    """Zeroed memory in whole 64-byte cache lines: what one thread writes on every lookup
    (its session, work buffers, counters) never shares a line with another thread's."""
    cdef size_t size = (n + 63) & ~(<size_t>63)
    cdef void* p = aligned_alloc(64, size if size else 64)
    if p != NULL:
        memset(p, 0, size)
    return p


cdef int nlm_costly_lookup(const ModelC* m) noexcept nogil:
    """Whether scoring one n-gram costs more than a lookup in a table that misses the CPU
    caches (a mapped file): normalised outputs, dense layers, full matrices without tables.
    A joint model counts as its target side does: its w source positions are summed once per
    window (source_parts), not per lookup (Moses, KenLM + a self-normalised LBL 200 joint
    model, 40 sentences: with the persistent cache the scorer took 1.08-1.20x of its time
    without it in the first run and 0.56-0.90x with unchanged weights, the decode 0.95-1.01x:
    docs/joint.md).  The persistent cache's automatic policy (nlmfeature._pcache) uses it."""
    return m.output_type == OUT_TREE or context_cache_pays(m)


cdef int nlm_ngram_cache_pays(const ModelC* m, int batched) noexcept nogil:
    """Whether the exact per-sentence (context, word) -> score cache beats recomputing: for
    costly lookups (:c:func:`nlm_costly_lookup`); with ``batched`` (a batch of spans,
    nlm_score_spans, whose slots' loads start several spans ahead so that the probes
    overlap), also for unnormalised models with direct features or at least 512
    multiply-adds per lookup.  Span by span such a model goes without it: its hidden vectors
    come from the session's context memo (SessionC.ctx_memo), so a lookup costs its output
    row and direct weights, about what a probe of the per-sentence table costs once that
    table outgrows the CPU caches (Moses2's normal search and cube pruning spent less CPU
    without it, its batch search more: docs/performance.md).  A tiny model computes faster
    than it probes."""
    if nlm_costly_lookup(m):
        return 1
    return batched and m.output_type == OUT_UNNORMALISED and \
        (m.direct_order > 0 or m.ctx_len * m.embed_dim + m.out_dim >= 512)


cdef SessionC* nlm_session_new(const ModelC* m, int64_t cache_entries, int64_t ngram_entries,
                               int terms) noexcept nogil:
    """A new per-thread session; ``cache_entries`` <= 0 disables the context/normaliser
    caches; ``ngram_entries`` bounds the exact n-gram cache (0 off, < 0: ``4 * cache_entries``
    when :c:func:`nlm_ngram_cache_pays`, for some models from the first batch of spans on).
    NULL on OOM."""
    cdef SessionC* s = <SessionC*>nlm_alloc_lines(sizeof(SessionC))
    cdef int64_t nscratch = m.vocab_size, npos
    if s == NULL:
        return NULL
    s.model = m
    s.buf0 = <float*>nlm_alloc_lines(m.max_width * sizeof(float))
    s.buf1 = <float*>nlm_alloc_lines(m.max_width * sizeof(float))
    s.buf2 = <float*>nlm_alloc_lines(m.max_width * sizeof(float))
    s.hidden = <float*>nlm_alloc_lines(m.max_width * sizeof(float))
    if m.n_classes_padded > nscratch:
        nscratch = m.n_classes_padded
    s.fscratch = <float*>nlm_alloc_lines(nscratch * sizeof(float))
    s.vscratch = <double*>nlm_alloc_lines(nscratch * sizeof(double))
    s.dacc = <double*>nlm_alloc_lines(nscratch * sizeof(double))
    s.hscratch = <uint64_t*>nlm_alloc_lines(nscratch * sizeof(uint64_t))
    s.pbuf = <double*>nlm_alloc_lines(m.max_width * sizeof(double))
    s.ebuf = <float*>nlm_alloc_lines(m.max_width * sizeof(float))
    s.clbuf = <double*>nlm_alloc_lines((m.n_classes + 1) * sizeof(double))
    s.linear = m.linear_out and terms
    if s.linear:
        s.pos_ids = m.vocab_size if m.vocab_size > m.src_vocab_size else m.src_vocab_size
        npos = (m.key_len + 1) * s.pos_ids
        s.pos_q = <int32_t*>calloc(npos, sizeof(int32_t))
        s.pos_stamp = <uint32_t*>calloc(npos, sizeof(uint32_t))
        s.term_cols = m.n_classes + 1 if m.output_type == OUT_CLASS else 1
    if s.buf0 == NULL or s.buf1 == NULL or s.buf2 == NULL or s.hidden == NULL or s.fscratch == NULL \
            or s.vscratch == NULL or s.dacc == NULL or s.hscratch == NULL or s.pbuf == NULL or s.ebuf == NULL \
            or s.clbuf == NULL \
            or (s.linear and (s.pos_q == NULL or s.pos_stamp == NULL)):
        nlm_session_free(s)
        return NULL
    if m.src_window > 0 and memo_init(&s.src_memo, NLM_SOURCE_SLOTS, m.src_window,
                                      m.n_branches * m.max_width) != 0:
        nlm_session_free(s)
        return NULL
    s.cache_enabled = cache_entries > 0
    s.ctx_cache_enabled = s.cache_enabled and context_cache_pays(m)
    if s.cache_enabled and not s.ctx_cache_enabled and not s.linear and m.key_len > 0 and \
            memo_init(&s.ctx_memo, context_memo_slots(m), m.key_len, m.max_width) != 0:
        nlm_session_free(s)
        return NULL
    s.sentence_id = -1
    # context key: the full padded context (one dummy id for unigram models)
    # (linear outputs keep the class logits of a context there, not its hidden vector)
    table_init(&s.ctx_cache, m.key_len if m.key_len > 0 else 1, 2,
               (2 * (m.n_classes + 1) if m.output_type == OUT_CLASS else 0) if s.linear else m.out_dim,
               cache_entries, 1)
    table_init(&s.class_cache, m.key_len + 1, 1, 0, cache_entries, 1)
    if ngram_entries < 0:
        ngram_entries = 4 * cache_entries if cache_entries > 0 and nlm_ngram_cache_pays(m, 1) else 0
        # a model whose table pays only in batches gets it at the first batch of spans
        s.ngram_cache_batched = ngram_entries > 0 and not nlm_ngram_cache_pays(m, 0)
    s.ngram_cache_enabled = ngram_entries > 0 and not s.ngram_cache_batched
    table_init(&s.ngram_cache, m.key_len + 1, 1, 0, ngram_entries, 0)
    # the normalisers' vectors (direct features; linear outputs' position terms)
    s.vec_cache_enabled = s.cache_enabled and (m.direct_order > 0 or s.linear) and \
        (m.output_type == OUT_SOFTMAX or m.output_type == OUT_CLASS)
    if s.linear and m.output_type == OUT_CLASS and m.key_len >= 2:
        # the base vector holds the last two ids' terms (and the direct features' ids)
        s.fact_k = 2 if m.direct_order - 1 <= 2 else m.direct_order - 1
        s.fact_k = m.key_len if s.fact_k > m.key_len else s.fact_k
        s.escratch_stride = nscratch + (nscratch + 1) // 2 + 2
        s.escratch = <double*>nlm_alloc_lines((m.key_len + 1) * s.escratch_stride * sizeof(double))
        if s.escratch == NULL:
            nlm_session_free(s)
            return NULL
    table_init(&s.vec_cache, m.direct_order + 1, 1, 0, cache_entries, 0)
    table_init(&s.base_cache, s.fact_k + 1, 1, 0, cache_entries, 0)
    s.stamp = 1
    s.vec_limit = 32 * cache_entries if cache_entries > 32768 else 1 << 20
    s.term_limit = s.vec_limit
    return s


cdef void nlm_session_free(SessionC* s) noexcept nogil:
    """Free a session (a persistent store attached to it belongs to nlmfeature._pcache,
    which detaches it first)."""
    if s == NULL:
        return
    free(s.buf0)
    free(s.buf1)
    free(s.buf2)
    free(s.hidden)
    free(s.fscratch)
    free(s.vscratch)
    free(s.dacc)
    free(s.hscratch)
    free(s.escratch)
    free(s.pbuf)
    free(s.ebuf)
    free(s.vec_arena)
    free(s.term_arena)
    free(s.clbuf)
    free(s.pos_q)
    free(s.pos_stamp)
    free(s.term_off)
    memo_free(&s.src_memo)
    memo_free(&s.ctx_memo)
    table_free(&s.vec_cache)
    table_free(&s.base_cache)
    table_free(&s.ctx_cache)
    table_free(&s.class_cache)
    table_free(&s.ngram_cache)
    free(s)


cdef int nlm_model_file_changed(const ModelC* m) noexcept nogil:
    """1 if the model file was changed in place since it was mapped (its size or modification
    time differ from the load's: ``cp new.nlm live.nlm``), else 0.  One fstat of the file
    descriptor kept at load (~0.3 us).  A file replaced by rename (the safe way) is not a
    change: the mapping keeps the old inode.  Models without a file (built in memory): 0."""
    cdef long long size = 0, mtime = 0
    if m.file_fd < 0:
        return 0
    if nlm_fstat_identity(m.file_fd, &size, &mtime) != 0:
        return 1
    return size != m.file_size or mtime != m.file_mtime_ns


cdef int nlm_session_begin(SessionC* s, int64_t sentence_id) noexcept nogil:
    """Start a sentence: the per-sentence caches are emptied.  Checks the model file first
    (:c:func:`nlm_model_file_changed`): if it changed in place, returns -1 and the session
    scores NaN from then on, without touching the (possibly truncated) mapping."""
    s.sentence_id = sentence_id
    s.sentences += 1
    s.pend_k = 0
    if s.cache_enabled:
        table_clear(&s.ctx_cache)
        table_clear(&s.class_cache)
    if s.ngram_cache_enabled:
        table_clear(&s.ngram_cache)
    if s.vec_cache_enabled:
        table_clear(&s.vec_cache)
        s.vec_used = 0
        if s.term_used > s.term_limit - s.term_limit // 4 or \
                s.base_cache.count > s.base_cache.limit - s.base_cache.limit // 4:
            # leave a sentence room: empty the terms (and the base vectors among them)
            s.term_used = 0
            s.n_terms = 0
            table_clear(&s.base_cache)
            s.stamp += 1
            if s.stamp == 0 and s.pos_stamp != NULL:  # 2^32 emptyings: really forget
                memset(s.pos_stamp, 0, (s.model.key_len + 1) * s.pos_ids * sizeof(uint32_t))
                s.stamp = 1
    if nlm_model_file_changed(s.model):
        s.model_changed = 1
    return -1 if s.model_changed else 0


cdef inline int store_probe(const TableC* files, int n, const int32_t* key, int i, double* out) noexcept nogil:
    """Value ``i`` of ``key`` in the first of ``n`` persistent-cache file tables holding it
    (and not NaN); 0 if none does."""
    cdef int f
    cdef int64_t slot
    cdef double v
    cdef uint64_t h
    if n <= 0:
        return 0
    h = key_hash(key, files[0].key_len)  # every file's region has the same key length
    for f in range(n):
        slot = table_find(&files[f], key, h)
        if slot >= 0:
            v = tv_get(&files[f], table_at(&files[f], slot), i)
            if not isnan(v):
                out[0] = v
                return 1
    return 0


cdef uint64_t nlm_prefetch_clean(SessionC* s, const int32_t* key) noexcept nogil:
    """The load of the n-gram cache slot that :c:func:`nlm_score_clean` of ``key`` (a cleaned
    key: the full context, then the word, every id in range) will probe first, started; its
    hash in that table returned (0 when the cache is off), for that call.  A decoder scoring
    several words at once (a phrase applied to a hypothesis) so overlaps their cache misses
    (the per-sentence table is megabytes; a probe that misses the CPU caches was most of its
    cost in Moses), and each key is hashed once.  Changes nothing else."""
    if not s.ngram_cache_enabled:
        return 0
    return table_prefetch(&s.ngram_cache, key)


cdef double nlm_score_padded(SessionC* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """Natural-log score of word ``w`` after the padded context ``ctx`` (n-1 ids; for a joint
    model the full context: the source window, then the n-1 target ids; ids outside their
    vocabulary are read as ``<unk>``).  The one scoring path of every entry.

    Through the session's n-gram cache, then the persistent cache's files (if attached),
    then the context and normaliser caches (each also backed by the files)."""
    cdef int32_t key[NLM_MAX_KEY + 1]
    nlm_clean_ngram(s.model, ctx, w, key)
    return nlm_score_clean(s, key, key_hash(key, s.ngram_cache.key_len) if s.ngram_cache_enabled else 0)


cdef double nlm_score_clean(SessionC* s, int32_t* key, uint64_t h) noexcept nogil:
    """:c:func:`nlm_score_padded` of the key ``nlm_clean_ngram`` made (the full context, then
    the word), whose :c:func:`key_hash` in the n-gram cache is ``h`` (any value when that
    cache is off): :c:func:`nlm_prefetch_clean` gives it."""
    cdef int found = 0
    cdef int64_t slot
    cdef int32_t* p
    cdef double v
    cdef int32_t w
    if s.model_changed:
        return NAN
    w = key[s.model.key_len]
    if not s.ngram_cache_enabled:
        return score_uncached_ngram(s, key, w)
    slot = table_insert_h(&s.ngram_cache, key, h, &found)
    if found:
        s.lookups += 1
        p = table_at(&s.ngram_cache, slot)
        if s.store != NULL and tv_disk(p):  # an entry that came from the persistent cache
            s.store.ngram_hits += 1
            if not tv_seen(p):  # (copied at sentence begin, asked for the first time)
                tv_mark_seen(p)
                s.store.ngram_found += 1
                s.store.ngram_copied -= 1
        return tv_get(&s.ngram_cache, p, 0)
    if s.store != NULL and not s.store.ngram_in_table and store_probe(s.store.ngram, s.store.nfiles, key, 0, &v):
        s.lookups += 1
        s.store.ngram_hits += 1
        s.store.ngram_found += 1
        s.ngram_cache.misses -= 1
        s.ngram_cache.hits += 1
        if slot >= 0:
            p = table_at(&s.ngram_cache, slot)
            tv_set(&s.ngram_cache, p, 0, v)
            tv_mark(p, 1)
            tv_mark_seen(p)
        return v
    v = score_uncached_ngram(s, key, w)
    if slot >= 0:
        tv_set(&s.ngram_cache, table_at(&s.ngram_cache, slot), 0, v)
        if not isnan(v):
            s.ngram_cache.fresh += 1
    return v


cdef int64_t arena_alloc(double** arena, int64_t* used, int64_t* capacity, int64_t limit,
                         int64_t n) noexcept nogil:
    """Room for ``n`` doubles in an arena of at most ``limit``: their offset, or -1 (the
    limit, or no memory).  Offsets stay valid until the arena is emptied; it may move as it
    grows, so read it only after the last call."""
    cdef int64_t need = used[0] + n, cap, off
    cdef double* grown
    if capacity[0] < need <= limit:  # doubling, within the limit
        cap = capacity[0] * 2 if capacity[0] else 65536
        cap = need if cap < need else cap
        cap = limit if cap > limit else cap
        grown = <double*>alloc_huge(cap * sizeof(double), 0)
        if grown != NULL:
            if arena[0] != NULL:
                memcpy(grown, arena[0], used[0] * sizeof(double))
                free(arena[0])
            arena[0] = grown
            capacity[0] = cap
    if need > capacity[0]:
        return -1
    off = used[0]
    used[0] = need
    return off


cdef inline int64_t vec_alloc(SessionC* s, int64_t n) noexcept nogil:
    """Room for ``n`` doubles in the sentence's arena (:c:func:`arena_alloc`)."""
    return arena_alloc(&s.vec_arena, &s.vec_used, &s.vec_cap, s.vec_limit, n)


cdef int64_t vec_slot(SessionC* s, const int32_t* key, uint64_t h, int32_t n, int* fill) noexcept nogil:
    """Offset in ``vec_arena`` of the ``n``-double vector of ``key`` in the sentence's vector
    cache: of its stored values (``fill`` = 0), or of room to compute them into (``fill`` =
    1); -1 when there is no room (a full cache, no memory).  ``h``: the key's
    :c:func:`key_hash`."""
    cdef int found = 0
    cdef int64_t slot, off
    fill[0] = 1
    if not s.vec_cache_enabled:
        return -1
    slot = table_insert_h(&s.vec_cache, key, h, &found)
    if slot < 0:
        return -1
    if found:
        off = <int64_t>tv_get(&s.vec_cache, table_at(&s.vec_cache, slot), 0)
        fill[0] = off < 0
        return off
    off = vec_alloc(s, n)
    # -1: no room, the vector is computed again each time
    tv_set(&s.vec_cache, table_at(&s.vec_cache, slot), 0, <double>off)
    return off


DEF NO_WEIGHT = 0xFFFFFFFFFFFFFFFF  # (direct_level: a target whose feature has no weight)


cdef void direct_places(const ModelC* m, const uint64_t* states, int k0, int nk, const int32_t* targets,
                        int32_t a, int32_t b, uint64_t* out) noexcept nogil:
    """``out[(i - a) * nk + k]``: where in ``direct_packed`` the weight of target ``i``'s
    order-``k0 + k`` feature is (``NO_WEIGHT``: none), for targets ``a <= i < b``
    (``targets[i]``, or ``i`` when NULL) after the context whose hash states are ``states``.
    Every index first, their loads started together (the store's lines, then any spilled
    weights), so that the caller's sum waits for one round of cache misses instead of one
    per feature."""
    cdef int32_t i
    cdef int k
    cdef int64_t q
    cdef uint64_t j, tt
    for i in range(a, b):
        tt = (<uint64_t>(targets[i] if targets != NULL else i)) << 32
        for k in range(nk):
            j = direct_index(m, splitmix64(states[k0 + k] ^ tt))
            out[(i - a) * nk + k] = j
            __builtin_prefetch(direct_lookup_place(m, j))
    for q in range((b - a) * nk):  # each index becomes its packed weight's place (or none)
        j = out[q]
        if direct_nonzero(m, j):
            out[q] = direct_rank_of(m, j)
            __builtin_prefetch(direct_packed_place(m, out[q]))
        else:
            out[q] = <uint64_t>NO_WEIGHT


cdef int64_t direct_level(SessionC* s, int kind, const uint64_t* states, const int32_t* ctx, int32_t tag,
                          const int32_t* targets, int32_t n, int level) noexcept nogil:
    """Offset in ``vec_arena`` of the direct values of ``n`` targets of ``kind``
    (``targets[i]``, or ``i`` when NULL; ``tag`` names them) after the last ``level`` ids of
    ``ctx`` (kind-``kind`` hash ``states``), summed through order ``level``: the partial sums
    of :c:func:`direct_value_kind`, in double, term for term; at the model's last order the
    values are rounded to float, as the normalisers add them.  Each level of a sentence's
    (ids, targets) is computed once from the level below it: a Moses sentence of a class
    model asks 2.4k (last word, class) and 15k (last two words, class) vectors for its 71k
    (context, class) normalisers.  -1: no room."""
    cdef const ModelC* m = s.model
    cdef int32_t key[NLM_MAX_ORDER + 2]
    cdef int fill = 0, k, last = level == m.direct_order - 1, own
    cdef int32_t i, t
    cdef int64_t off, below = -1, j
    cdef uint64_t tt
    cdef double x
    cdef const double* first = m.direct_first[kind]
    key[0] = tag
    key[1] = level
    for k in range(1, m.direct_order):
        key[k + 1] = ctx[m.key_len - k] if k <= level else 0
    off = vec_slot(s, key, key_hash(key, s.vec_cache.key_len), n, &fill)
    if off < 0 or not fill:
        return off
    if level > 0:
        below = direct_level(s, kind, states, ctx, tag, targets, n, level - 1)
    own = level > 0 or first == NULL
    if own:  # this level's features of every target, their loads started together
        direct_places(m, states, level, 1, targets, 0, n, s.hscratch)
    for i in range(n):
        t = targets[i] if targets != NULL else i
        tt = (<uint64_t>t) << 32
        if below >= 0:
            x = s.vec_arena[below + i]
        else:  # (level 0, or no room below: the sum through level - 1 here)
            x = first[t] if first != NULL else 0.0
            for k in range(0 if first == NULL else 1, level):
                j = direct_index(m, splitmix64(states[k] ^ tt))
                if direct_nonzero(m, j):
                    x += direct_weight_at(m, j)
        if own and s.hscratch[i] != <uint64_t>NO_WEIGHT:
            x += direct_packed_weight(m, s.hscratch[i])
        s.vec_arena[off + i] = <float>x if last else x
    return off


cdef const double* direct_vector(SessionC* s, int kind, const uint64_t* states, const int32_t* ctx,
                                 int32_t tag, const int32_t* targets, int32_t n) noexcept nogil:
    """``(float) direct_value`` of ``n`` targets of ``kind`` (``targets[i]``, or ``i`` when
    NULL) after the padded context ``ctx`` (whose kind-``kind`` hash states are ``states``):
    the direct-feature part of a normaliser's logits, from the sentence's cache
    (:c:func:`direct_level`), else computed into ``vscratch``.  Valid until the next call."""
    cdef const ModelC* m = s.model
    cdef int64_t off = direct_level(s, kind, states, ctx, tag, targets, n, m.direct_order - 1)
    cdef const double* first = m.direct_first[kind]
    cdef int k0 = 1 if first != NULL else 0
    cdef int nk = m.direct_order - k0, k
    cdef int64_t block, scratch = m.vocab_size if m.vocab_size > m.n_classes_padded else m.n_classes_padded
    cdef int32_t a, b, i, t
    cdef uint64_t j
    cdef double x
    if off >= 0:
        return s.vec_arena + off
    # no room in the sentence's cache (a normaliser over a large vocabulary asks for
    # vectors of V doubles): computed here, :c:func:`direct_value_kind` term for term, in
    # blocks of targets whose weights' loads start together (:c:func:`direct_places`)
    block = scratch // nk if nk > 0 else n
    block = 256 if block > 256 else (1 if block < 1 else block)
    a = 0
    while a < n:
        b = a + <int32_t>block if a + block < n else n
        direct_places(m, states, k0, nk, targets, a, b, s.hscratch)
        for i in range(a, b):
            t = targets[i] if targets != NULL else i
            x = first[t] if first != NULL else 0.0
            for k in range(nk):
                j = s.hscratch[(i - a) * nk + k]
                if j != <uint64_t>NO_WEIGHT:
                    x += direct_packed_weight(m, j)
            s.vscratch[i] = <float>x
        a = b
    return s.vscratch


# ---------------------------------------------------------------------------------------
# linear outputs (ModelC.linear_out): log-bilinear models' normalisers from position terms
# ---------------------------------------------------------------------------------------
# With one first-layer branch, the identity activation and no further layers, the hidden
# vector is h = b + sum_j p_j(u_j), p_j(u) the contribution of context position j holding
# id u (diagonal: weights_j * e(u); full: M_j e(u), a table row when precomputed; joint
# models: source positions first), so every logit is q . h = q . b + sum_j q . p_j(u_j).
# The terms q . p_j(u) of a class's members (of every class, of every word) are one vector per
# (position, id, class), computed once and kept across the session's sentences (they depend
# on the model alone; SessionC.term_arena): a Moses sentence of a class LBL with 77
# Brown classes asks 71k within-class normalisers (3.7M output rows times a hidden vector)
# and 26k class normalisers, but its contexts hold only 70-90 distinct ids per position:
# 9.2k (position, id, class) vectors (0.6M rows) and 310 (position, id) class vectors.  A
# logit is then a sum of n-1 terms (n with a bias) in double, each term q . p_j(u) computed in
# double from the float parameters (nlm_dot_fd): not bit-identical to the hidden-vector path
# (float arithmetic), and closer to the exact value (docs/performance.md).  The same sums
# whether a term comes from a stored vector or is computed alone (no room, caches off).


cdef const double* position_vector(SessionC* s, int j, int32_t u) noexcept nogil:
    """p_j(u): the contribution of context position ``j`` (joint models: the source window
    first) holding id ``u`` to the (only) branch's hidden vector, in double (a diagonal
    branch's products of two floats exactly); ``j`` < 0: the branch bias."""
    cdef const ModelC* m = s.model
    cdef const BranchC* br = &m.branches[0]
    cdef int H = br.hidden, E = m.embed_dim, w0 = m.src_window, i, k
    cdef const float* e
    cdef const uint16_t* eh
    cdef const float* r
    cdef double x
    if j < 0:
        r = br.bias
    elif br.tables != NULL and m.use_tables:
        r = br.src_tables + (<int64_t>j * m.src_vocab_size + u) * H if j < w0 else \
            br.tables + (<int64_t>(j - w0) * m.vocab_size + u) * H
    else:
        r = NULL
    if r != NULL:
        for i in range(H):
            s.pbuf[i] = r[i]
        return s.pbuf
    eh = (m.src_embeddings_h if j < w0 else m.embeddings_h)
    if eh != NULL:      # a float16 model's half rows: each value widened exactly
        eh += <int64_t>u * E
        for i in range(E):
            s.ebuf[i] = nlm_half_to_float(eh + i)
        e = s.ebuf
    else:
        e = (m.src_embeddings if j < w0 else m.embeddings) + <int64_t>u * E
    if br.diagonal:
        for i in range(E):
            s.pbuf[i] = <double>br.weights[<int64_t>j * E + i] * e[i]
    else:
        for i in range(H):
            r = br.weights + (<int64_t>j * H + i) * E
            x = 0
            for k in range(E):
                x += <double>r[k] * e[k]
            s.pbuf[i] = x
    return s.pbuf


cdef inline int32_t term_rows(const ModelC* m, int what, int32_t c, const int32_t** idx) noexcept nogil:
    """The output rows of a term vector: their number and index list (NULL: consecutive) in
    the class matrix (``what`` 2) or the output matrix."""
    if what == 2:
        idx[0] = NULL
        return m.n_classes
    if c < 0:
        idx[0] = NULL
        return m.vocab_size
    idx[0] = m.class_members + m.class_start[c]
    return m.class_start[c + 1] - m.class_start[c]


cdef inline void term_dots(const ModelC* m, int what, const int32_t* idx, int32_t n,
                           const double* p, double* out) noexcept nogil:
    """``out[k]`` = row k of :c:func:`term_rows` (``what``, ``idx``) times ``p``, in double (a
    float16 model's output rows read as stored where it keeps them so: the same bits)."""
    if what == 2:
        nlm_gemv_rows_d(m.class_weight, idx, n, m.out_dim, p, out)
    elif m.out_weight_h != NULL:
        nlm_gemv_rows_hd(m.out_weight_h, idx, n, m.out_dim, p, out)
    else:
        nlm_gemv_rows_d(m.out_weight, idx, n, m.out_dim, p, out)


cdef inline double term_dot(const ModelC* m, int what, int64_t row, const double* p) noexcept nogil:
    """Row ``row`` of the class (``what`` 2) or output matrix times ``p``: one element of
    :c:func:`term_dots`, the same value."""
    if what == 2:
        return nlm_dot_fd(m.class_weight + row * m.out_dim, p, m.out_dim)
    if m.out_weight_h != NULL:
        return nlm_dot_hd(m.out_weight_h + row * m.out_dim, p, m.out_dim)
    return nlm_dot_fd(m.out_weight + row * m.out_dim, p, m.out_dim)


cdef int64_t term_vector(SessionC* s, int what, int32_t c, int j, int32_t u, int make) noexcept nogil:
    """Offset in ``term_arena`` of the terms q . p_j(u) of a normaliser's logits: of the
    members of class ``c`` (``what`` 1, ``c`` >= 0), of every word (``what`` 1, ``c`` < 0),
    of every class (``what`` 2); computed on first use (since the terms were last emptied)
    when ``make``.  -1:
    not stored (not made, no room, caches off)."""
    cdef const ModelC* m = s.model
    cdef int64_t at, q, off
    cdef int32_t n
    cdef const int32_t* idx
    cdef int64_t* grown
    cdef int64_t k
    cdef int fact
    if not s.vec_cache_enabled:
        return -1
    at = <int64_t>(j + 1) * s.pos_ids + u
    if s.pos_stamp[at] == s.stamp:
        q = s.pos_q[at]
    elif not make:
        return -1
    else:  # a new (position, id): a row of term offsets
        if s.n_terms == s.terms_cap:
            k = s.terms_cap * 2 if s.terms_cap else 256
            grown = <int64_t*>realloc(s.term_off, k * s.term_cols * sizeof(int64_t))
            if grown == NULL:
                return -1
            s.term_off = grown
            s.terms_cap = k
        q = s.n_terms
        s.n_terms += 1
        for k in range(s.term_cols):
            s.term_off[q * s.term_cols + k] = -1
        s.pos_q[at] = <int32_t>q
        s.pos_stamp[at] = s.stamp
    k = q * s.term_cols + (s.term_cols - 1 if what == 2 else (c if c >= 0 else 0))
    off = s.term_off[k]
    if off >= 0 or not make:
        return off
    n = term_rows(m, what, c, &idx)
    fact = s.fact_k > 0 and what == 1  # room for the exponentials (exp_terms), not filled yet
    off = arena_alloc(&s.term_arena, &s.term_used, &s.term_cap, s.term_limit,
                      n + (n + 1) // 2 + 2 if fact else n)
    if off < 0:
        return -1
    term_dots(m, what, idx, n, position_vector(s, j, u), s.term_arena + off)
    if fact:
        s.term_arena[off + n] = NAN
    s.term_off[k] = off
    return off


cdef void lin_logits(SessionC* s, const int32_t* ctx, int what, int32_t c, double* acc, int lo=0) noexcept nogil:
    """``acc[i]`` = q_i . h for the logits of :c:func:`term_vector` (``what``, ``c``) after the
    padded context ``ctx``: the bias's term, then each position's from ``lo`` on, added in
    double."""
    cdef const ModelC* m = s.model
    cdef const int32_t* idx
    cdef int32_t n = term_rows(m, what, c, &idx), i
    cdef int j, first = 1
    cdef int64_t off
    cdef const double* v
    for j in range(-1 if m.branches[0].bias != NULL else lo, m.key_len):
        if 0 <= j < lo:
            continue
        off = term_vector(s, what, c, j, ctx[j] if j >= 0 else 0, 1)
        if off >= 0:
            v = s.term_arena + off
        else:  # not stored: the same terms, computed here
            term_dots(m, what, idx, n, position_vector(s, j, ctx[j] if j >= 0 else 0), s.vscratch)
            v = s.vscratch
        if first:
            for i in range(n):
                acc[i] = v[i]
            first = 0
        else:
            for i in range(n):
                acc[i] += v[i]
    if first:  # no term at all (a unigram model without bias)
        for i in range(n):
            acc[i] = 0


cdef double lin_logit(SessionC* s, const int32_t* ctx, int what, int32_t c, int32_t i) noexcept nogil:
    """Element ``i`` of :c:func:`lin_logits` alone: the same terms added in the same order,
    each from a stored vector or computed alone (:c:func:`nlm_dot_fd`, the same value)."""
    cdef const ModelC* m = s.model
    cdef const int32_t* idx
    cdef int32_t n = term_rows(m, what, c, &idx)
    cdef int j, first = 1
    cdef int64_t off
    cdef double x = 0, t
    for j in range(-1 if m.branches[0].bias != NULL else 0, m.key_len):
        off = term_vector(s, what, c, j, ctx[j] if j >= 0 else 0, 0)
        if off >= 0:
            t = s.term_arena[off + i]
        else:
            t = term_dot(m, what, idx[i] if idx != NULL else i,
                         position_vector(s, j, ctx[j] if j >= 0 else 0))
        x = t if first else x + t
        first = 0
    return x


# factorised within-class normalisers (SessionC.fact_k): with J = key_len - fact_k, a class's
# logits after a context are l_i = B_i + sum_{j<J} T_j(u_j)_i, B the base vector of the last
# fact_k ids (bias term, those positions' terms, output bias, direct values: the sums of
# lin_logits and score_linear, in the same order) and T_j the term vectors of the others, so
# Z = sum_i exp(l_i) = exp(M) sum_i b_i prod_j t_ji with b = exp(B - max B), t_j = exp(T_j -
# max T_j) (floats in [exp(-range), 1]) and M the sum of the maxima: one pass over J + 1
# stored vectors per (context, class) instead of every term vector summed and exponentiated.
# A Moses sentence asks ~67k such normalisers of ~12k base vectors.  Each vector's
# exponentials are floats, so a vector whose values span more than FACT_RANGE (where they
# would leave float's normal range) sends its normalisers to the summed path.

DEF FACT_RANGE = 80.0


cdef inline void prefetch_bytes(const void* p, int64_t nbytes) noexcept nogil:
    """Start loading the cache lines of ``nbytes`` bytes from ``p``."""
    cdef int64_t k
    for k in range(0, nbytes, 64):
        __builtin_prefetch(<const char*>p + k)


cdef void exp_fill(const double* v, float* e, int32_t n, double* mr) noexcept nogil:
    """``e[i]`` = exp(``v[i]`` - max v) for i < ``n``; ``mr`` = [max v, max v - min v] (the
    range infinite when a value is NaN)."""
    cdef double mx = v[0], mn = v[0]
    cdef int32_t i
    cdef int bad = 0
    for i in range(n):
        bad |= isnan(v[i])
        mx = v[i] if v[i] > mx else mx
        mn = v[i] if v[i] < mn else mn
    for i in range(n):
        e[i] = <float>exp(v[i] - mx)
    mr[0] = mx
    mr[1] = INFINITY if bad else mx - mn


cdef const double* exp_terms(SessionC* s, int32_t c, int j, int32_t u, int32_t n, int64_t off,
                            double* scratch) noexcept nogil:
    """The member terms of class ``c`` for position ``j`` holding ``u`` (``off``: their
    :c:func:`term_vector` offset, -1 none), laid out [T (n doubles), max, range, exp (n
    floats)] (the maximum read first, on the exponentials' first line), the exponentials
    filled: in ``term_arena``, else computed into ``scratch``.  Valid until the arena grows."""
    cdef const ModelC* m = s.model
    cdef double* v
    cdef const int32_t* idx
    if off >= 0:
        v = s.term_arena + off
        if isnan(v[n]):
            exp_fill(v, <float*>(v + n + 2), n, v + n)
        return v
    term_rows(m, 1, c, &idx)
    term_dots(m, 1, idx, n, position_vector(s, j, u), scratch)
    exp_fill(scratch, <float*>(scratch + n + 2), n, scratch + n)
    return scratch


cdef inline void base_key(const SessionC* s, const int32_t* ctx, int32_t c, int32_t* key) noexcept nogil:
    """The base_cache key of the base vector of class ``c`` after ``ctx``."""
    cdef int k
    key[0] = c
    for k in range(s.fact_k):
        key[k + 1] = ctx[s.model.key_len - s.fact_k + k]


cdef int64_t base_vector(SessionC* s, const int32_t* ctx, int32_t c, int32_t n,
                         const uint64_t* states, const int32_t* key, uint64_t h) noexcept nogil:
    """Offset in ``term_arena`` of the base vector of class ``c`` after ``ctx`` (its last
    ``fact_k`` ids; base_cache ``key`` from :c:func:`base_key`, hash ``h``), laid out [max,
    range, exp (n floats)]; -1: not stored, computed into ``escratch``.  Like the terms, base
    vectors are functions of the model and outlive the sentence (a Moses sentence finds ~45%
    of its ~12k made before it)."""
    cdef const ModelC* m = s.model
    cdef int32_t a = m.class_start[c], i
    cdef int found = 0
    cdef int64_t off = -1, slot = -1, ne = (n + 1) // 2
    cdef double* acc = s.dacc
    cdef const double* dv = NULL
    cdef double* v
    if s.vec_cache_enabled:
        slot = table_insert_h(&s.base_cache, key, h, &found)
    if slot >= 0 and found:
        off = <int64_t>tv_get(&s.base_cache, table_at(&s.base_cache, slot), 0)
        if off >= 0:
            prefetch_bytes(s.term_arena + off, 16 + 4 * n)
            return off
    elif slot >= 0:
        off = arena_alloc(&s.term_arena, &s.term_used, &s.term_cap, s.term_limit, ne + 2)
        tv_set(&s.base_cache, table_at(&s.base_cache, slot), 0, <double>off)  # (-1: no room, computed each time)
    lin_logits(s, ctx, 1, c, acc, m.key_len - s.fact_k)
    if m.direct_order:
        dv = direct_vector(s, 0, states, ctx, c, m.class_members + a, n)
    for i in range(n):
        acc[i] += m.out_bias[m.class_members[a + i]]
        if dv != NULL:
            acc[i] += dv[i]
    v = s.term_arena + off if off >= 0 else s.escratch  # (the arena's address after the last call)
    exp_fill(acc, <float*>(v + 2), n, v)
    return off


cdef int fact_lognorm(SessionC* s, const int32_t* ctx, int32_t c, int32_t n, const uint64_t* states,
                      const int32_t* bkey, uint64_t bh, double* lz) noexcept nogil:
    """The within-class normaliser of class ``c`` (``n`` > 1 members) after ``ctx``, factorised
    (above; the base vector's key and hash ``bkey``, ``bh``): 1, else 0 (a vector's range too
    wide: the summed path)."""
    cdef const ModelC* m = s.model
    cdef int J = m.key_len - s.fact_k, j, ok
    cdef int64_t boff
    cdef int64_t offs[NLM_MAX_KEY]
    cdef const float* p[NLM_MAX_KEY]
    cdef const double* v
    cdef const float* b
    cdef double mx
    boff = base_vector(s, ctx, c, n, states, bkey, bh)
    for j in range(J):  # the stored vectors' lines start loading together
        offs[j] = term_vector(s, 1, c, j, ctx[j], 1)
        if offs[j] >= 0:
            prefetch_bytes(s.term_arena + offs[j] + n, 16 + 4 * n)
    v = s.term_arena + boff if boff >= 0 else s.escratch  # (the arena allocates no more below)
    b = <const float*>(v + 2)
    mx = v[0]
    ok = v[1] <= FACT_RANGE
    for j in range(J):  # their exponentials filled, or computed where there was no room
        v = exp_terms(s, c, j, ctx[j], n, offs[j], s.escratch + (j + 1) * s.escratch_stride)
        p[j] = <const float*>(v + n + 2)
        mx += v[n]
        ok = ok and v[n + 1] <= FACT_RANGE
    if not ok:
        return 0
    lz[0] = mx + log(nlm_prod_sum_f(b, p, J, n))
    return 1


cdef int ctx_norm_from_store(SessionC* s, int32_t* cp, const int32_t* ckey, int which, double* lz) noexcept nogil:
    """Normaliser ``which`` (0 softmax, 1 class) of the context entry ``cp`` (key ``ckey``)
    from the persistent cache's files into the entry (disk bit set): 1, else 0."""
    if cp == NULL or s.store == NULL or not s.store.probe_context or \
            not store_probe(s.store.ctx, s.store.nfiles, ckey, which, lz):
        return 0
    s.store.ctx_hits += 1
    tv_set(&s.ctx_cache, cp, which, lz[0])
    tv_mark(cp, 1)
    tv_mark_seen(cp)  # (asked for: the sentence's working set, _pcache.write_sentence)
    return 1


cdef int32_t* class_norm_entry(SessionC* s, const int32_t* class_key, uint64_t h, double* lz) noexcept nogil:
    """The class-normaliser cache entry of ``class_key`` (the context, then the class; its
    :c:func:`key_hash` ``h``; NULL: no room) and in ``lz`` its within-class normaliser:
    cached, else from the persistent cache's files, else NaN (compute it and
    :c:func:`norm_keep` it)."""
    cdef int found = 0
    cdef int64_t slot = table_insert_h(&s.class_cache, class_key, h, &found)
    cdef int32_t* kp
    lz[0] = NAN
    if slot < 0:
        return NULL
    kp = table_at(&s.class_cache, slot)
    if found:
        lz[0] = tv_get(&s.class_cache, kp, 0)
    elif s.store != NULL and s.store.probe_context and \
            store_probe(s.store.cls, s.store.nfiles, class_key, 0, lz):
        s.store.class_hits += 1
        tv_set(&s.class_cache, kp, 0, lz[0])
        tv_mark(kp, 1)
        tv_mark_seen(kp)
    return kp


cdef inline void norm_keep(TableC* t, int32_t* p, int i, double lz) noexcept nogil:
    """Keep normaliser ``i`` computed here in entry ``p`` (disk bit clear; a new entry for
    the sentence's file unless NaN)."""
    tv_set(t, p, i, lz)
    tv_mark(p, 0)
    t.fresh += not isnan(lz)


cdef double score_linear(SessionC* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """The score of one n-gram of a linear output (class or softmax) through the context,
    class-normaliser and persistent caches, the logits summed from position terms.  A
    context's cache entry holds its class logits beside their normaliser (doubles in its
    floats, then 1 once they are filled); a new normaliser (of a class's members or of the
    vocabulary) gives the word's logit as its element, a cached one lets :c:func:`lin_logit`
    sum the word's terms alone: the same double either way."""
    cdef const ModelC* m = s.model
    cdef int32_t class_key[NLM_MAX_KEY + 1]
    cdef uint64_t states[NLM_MAX_ORDER]
    cdef uint64_t cstates[NLM_MAX_ORDER]
    cdef int found = 0, which = 0 if m.output_type == OUT_SOFTMAX else 1, filled = 0
    cdef int64_t slot = -1
    cdef int32_t* cp = NULL
    cdef int32_t* kp = NULL
    cdef double* cl = s.clbuf
    cdef float* x = s.fscratch
    cdef double* acc = s.dacc
    cdef const double* dv = NULL
    cdef double lz = NAN, lzw = NAN, score = 0, logit
    cdef int32_t c = -2, pos = w, n = m.vocab_size, a = 0, i
    cdef int32_t none = 0
    cdef const int32_t* ckey = ctx if m.key_len > 0 else &none  # (a unigram model: one key)
    cdef int32_t bkey[NLM_MAX_KEY + 2]
    cdef uint64_t ch = 0, kh = 0, bh = 0
    # the keys of the context's, the class normaliser's and the base vector's entries first,
    # their slots' loads started together (each a cache miss in a decoder)
    if s.ctx_cache_enabled:
        ch = table_prefetch(&s.ctx_cache, ckey)
    if which:
        c = m.word_class[w]
        if s.cache_enabled:
            for i in range(m.key_len):
                class_key[i] = ctx[i]
            class_key[m.key_len] = c
            kh = table_prefetch(&s.class_cache, class_key)
        if s.fact_k:
            base_key(s, ctx, c, bkey)
            bh = table_prefetch(&s.base_cache, bkey)
    if m.direct_order:
        direct_states(m, ctx, 0, states)
        if which:
            direct_states(m, ctx, 1, cstates)
    if s.ctx_cache_enabled:
        slot = table_insert_h(&s.ctx_cache, ckey, ch, &found)
    if slot >= 0:
        cp = table_at(&s.ctx_cache, slot)
        if not found:
            tv_set(&s.ctx_cache, cp, 0, NAN)
            tv_set(&s.ctx_cache, cp, 1, NAN)
        lz = tv_get(&s.ctx_cache, cp, which)
        if which:
            cl = <double*>table_fvals(&s.ctx_cache, cp)
            if not found:
                cl[m.n_classes] = 0
            filled = cl[m.n_classes] == 1.0
    if which and not filled:  # the class logits of the context
        lin_logits(s, ctx, 2, -1, cl)
        if m.direct_order:
            dv = direct_vector(s, 1, cstates, ctx, -1, NULL, m.n_classes)
        for i in range(m.n_classes):
            cl[i] += m.class_bias[i]
            if dv != NULL:
                cl[i] += dv[i]
        if cp != NULL:
            cl[m.n_classes] = 1.0
    if isnan(lz) and not ctx_norm_from_store(s, cp, ckey, which, &lz) and which:
        # the context's class normaliser, not on disk either
        for i in range(m.n_classes):
            x[i] = <float>cl[i]
        lz = nlm_logsumexp_f(x, m.n_classes)
        if cp != NULL:
            norm_keep(&s.ctx_cache, cp, 1, lz)
    if which:
        pos = m.class_pos[w]
        a = m.class_start[c]
        n = m.class_start[c + 1] - a
        score = cl[c] - lz
        if s.cache_enabled:
            kp = class_norm_entry(s, class_key, kh, &lzw)
        if n == 1:  # p(w | c) = 1; the normaliser (the word's logit) is kept as for any class
            if kp != NULL and isnan(lzw):
                lzw = lin_logit(s, ctx, 1, c, 0) + m.out_bias[w]
                if m.direct_order:
                    lzw += <double><float>direct_value_kind(m, 0, states, w)
                norm_keep(&s.class_cache, kp, 0, lzw)
            return score
    else:
        lzw = lz
    if isnan(lzw) and which and s.fact_k and fact_lognorm(s, ctx, c, n, states, bkey, bh, &lzw):
        if kp != NULL:  # (a finite normaliser: the word's logit is summed alone below)
            norm_keep(&s.class_cache, kp, 0, lzw)
    if isnan(lzw):
        # a new normaliser (of the class's members, or of the vocabulary): its logits, the
        # word's among them
        lin_logits(s, ctx, 1, c, acc)
        if m.direct_order:
            dv = direct_vector(s, 0, states, ctx, c, m.class_members + a if which else NULL, n)
        for i in range(n):
            acc[i] += m.out_bias[m.class_members[a + i] if which else i]
            if dv != NULL:
                acc[i] += dv[i]
            x[i] = <float>acc[i]
        logit = acc[pos]
        lzw = nlm_logsumexp_f(x, n)
        if kp != NULL:
            norm_keep(&s.class_cache, kp, 0, lzw)
        elif not which and cp != NULL:
            norm_keep(&s.ctx_cache, cp, 0, lzw)
    else:
        logit = lin_logit(s, ctx, 1, c, pos) + m.out_bias[w]
        if m.direct_order:
            logit += <double><float>direct_value_kind(m, 0, states, w)
    return nlm_add_diff(score, logit, lzw)


cdef double within_class_lz(SessionC* s, const float* h, int32_t c, const int32_t* ctx,
                            const uint64_t* states) noexcept nogil:
    """The within-class normaliser of class ``c`` after ``ctx`` (hidden vector ``h``)."""
    cdef const ModelC* m = s.model
    cdef int32_t a = m.class_start[c], n = m.class_start[c + 1] - m.class_start[c]
    cdef const double* dv = NULL
    if m.direct_order and n > 1:
        dv = direct_vector(s, 0, states, ctx, c, m.class_members + a, n)
    return within_class_lognorm(m, h, c, states, dv, s.fscratch)


cdef const float* source_parts(SessionC* s, const int32_t* window) noexcept nogil:
    """A joint model's :c:func:`source_part` of each branch for the source ``window`` (ids in
    their vocabulary), from the session's slot for it, else computed into that slot.  A Moses
    sentence scores every target context against the few windows of its source words, so a
    missed n-gram adds its n-1 target rows to a stored start instead of summing all w + n - 1
    rows; the same bits as computing it (:c:func:`branch_forward`)."""
    cdef const ModelC* m = s.model
    cdef int k, found = 0
    cdef float* parts = memo_get(&s.src_memo, window, &found)
    if not found:
        for k in range(m.n_branches):
            source_part(m, &m.branches[k], window, parts + <int64_t>k * m.max_width)
    return parts


cdef inline void session_hidden(SessionC* s, const int32_t* ctx, float* h) noexcept nogil:
    """:c:func:`nlm_compute_hidden` in the session's work buffers, a joint model's start of the
    first layer from the session's source windows (:c:func:`source_parts`)."""
    nlm_compute_hidden(s.model, ctx, h, s.buf0, s.buf1, s.buf2,
                       source_parts(s, ctx) if s.model.src_window else NULL)


cdef double score_uncached_ngram(SessionC* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """The score of one n-gram through the context and class-normaliser caches."""
    cdef const ModelC* m = s.model
    cdef float* h = NULL
    cdef int32_t* cp = NULL
    cdef int32_t* kp
    cdef int found = 0, i, which
    cdef int64_t slot = -1
    cdef int32_t c
    cdef int32_t key[NLM_MAX_KEY + 1]
    cdef int32_t class_key[NLM_MAX_KEY + 1]
    cdef uint64_t states[NLM_MAX_ORDER]
    cdef uint64_t cstates[NLM_MAX_ORDER]
    cdef double lz, score
    cdef const int32_t* ckey = ctx
    cdef uint64_t kh = 0
    s.lookups += 1
    if s.linear:
        return score_linear(s, ctx, w)
    if m.output_type == OUT_CLASS and s.cache_enabled:
        # the within-class normaliser's key (context, class of w): its slot loads while the
        # context is looked up and the class probability computed
        for i in range(m.key_len):
            class_key[i] = ctx[i]
        class_key[m.key_len] = m.word_class[w]
        kh = table_prefetch(&s.class_cache, class_key)
    if m.direct_order:
        # hashes first: the weights they address load while the hidden layer is computed
        direct_states(m, ctx, 0, states)
        direct_prefetch(m, states, w)
    if s.ctx_cache_enabled:
        if m.key_len <= 0:
            key[0] = 0
            ckey = key
        slot = table_insert(&s.ctx_cache, ckey, &found)
    if slot >= 0 and s.ctx_cache_enabled:
        cp = table_at(&s.ctx_cache, slot)
        if not found:
            tv_set(&s.ctx_cache, cp, 0, NAN)
            tv_set(&s.ctx_cache, cp, 1, NAN)
        if not s.linear:  # (a linear output's entry holds no hidden vector)
            h = table_fvals(&s.ctx_cache, cp)
            if not found:
                session_hidden(s, ctx, h)
    if h == NULL and memo_open(&s.ctx_memo):
        h = memo_get(&s.ctx_memo, ckey, &found)
        if not found:
            session_hidden(s, ctx, h)
    if h == NULL:
        h = s.hidden
        session_hidden(s, ctx, h)
    if m.output_type == OUT_UNNORMALISED:
        return word_logit(m, h, w, states)
    if m.output_type == OUT_TREE:
        return tree_logprob(m, h, w)
    # normalised outputs: the context's normaliser (value 0: softmax, 1: class), from the
    # context cache, else the persistent cache, else computed (the disk bit says which)
    which = 0 if m.output_type == OUT_SOFTMAX else 1
    if which and m.direct_order:
        direct_states(m, ctx, 1, cstates)
    if cp != NULL and not isnan(tv_get(&s.ctx_cache, cp, which)):
        lz = tv_get(&s.ctx_cache, cp, which)
    elif not ctx_norm_from_store(s, cp, ckey, which, &lz):
        if which == 0:
            lz = softmax_lognorm(m, h, direct_vector(s, 0, states, ctx, -2, NULL, m.vocab_size)
                                 if m.direct_order else NULL, s.fscratch)
        else:
            lz = class_lognorm(m, h, direct_vector(s, 1, cstates, ctx, -1, NULL, m.n_classes)
                               if m.direct_order else NULL, s.fscratch)
        if cp != NULL:
            norm_keep(&s.ctx_cache, cp, which, lz)
    if which == 0:
        return word_logit(m, h, w, states) - lz
    # class-factored: p(c | context) p(w | context, c)
    c = m.word_class[w]
    score = class_logit(m, h, c, cstates) - lz
    lz = NAN
    kp = class_norm_entry(s, class_key, kh, &lz) if s.cache_enabled else NULL  # (class_key: built above)
    if isnan(lz):
        lz = within_class_lz(s, h, c, ctx, states)
        if kp != NULL:
            norm_keep(&s.class_cache, kp, 0, lz)
    return score + word_logit(m, h, w, states) - lz


cdef double nlm_score(SessionC* s, const int32_t* ids, int n, int32_t w) noexcept nogil:
    """Score ``w`` after an unpadded history of ``n`` ids (see :c:func:`nlm_pad_context`).
    A joint model sees a window of source ``<null>`` (affiliation unknown)."""
    cdef int32_t ctx[NLM_MAX_KEY]
    cdef int j
    for j in range(s.model.src_window):
        ctx[j] = s.model.src_null
    nlm_pad_context(s.model, ids, n, ctx + s.model.src_window)
    if w < 0 or w >= s.model.vocab_size:
        w = s.model.unk
    return nlm_score_padded(s, ctx, w)

