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
    caches (a mapped file): normalised outputs, dense layers, full matrices without tables, and
    joint models, whose w source positions add w more rows per lookup.  The persistent cache's
    automatic policy (nlmfeature._pcache) uses it."""
    return m.output_type == OUT_TREE or m.src_window > 0 or context_cache_pays(m)


cdef int nlm_ngram_cache_pays(const ModelC* m) noexcept nogil:
    """Whether the exact per-sentence (context, word) -> score cache beats recomputing:
    costly lookups (:c:func:`nlm_costly_lookup`), and unnormalised models with direct features
    or at least 512 multiply-adds per lookup ((n-1) context rows and the output row).  Decoders
    repeat most n-grams (a Moses sentence: ~76% of lookups are exact repeats; 73% for the joint
    feature, where the cache took Moses from 2.55x to 2.44x of KenLM alone's CPU time:
    docs/joint.md); with the span's slots prefetched (vt_score_span) the cache took an
    unnormalised LBL 200 with direct features from 1.95x to 1.86-1.90x in Moses
    (docs/decoder-speed.md), identical translations.  A tiny model computes faster than it
    probes."""
    if nlm_costly_lookup(m):
        return 1
    return m.output_type == OUT_UNNORMALISED and (m.direct_order > 0 or m.ctx_len * m.embed_dim + m.out_dim >= 512)


cdef SessionC* nlm_session_new(const ModelC* m, int64_t cache_entries, int64_t ngram_entries) noexcept nogil:
    """A new per-thread session; ``cache_entries`` <= 0 disables the context/normaliser
    caches; ``ngram_entries`` bounds the exact n-gram cache (0 off, < 0: ``4 * cache_entries``
    when :c:func:`nlm_ngram_cache_pays`).  NULL on OOM."""
    cdef SessionC* s = <SessionC*>nlm_alloc_lines(sizeof(SessionC))
    cdef int64_t nscratch = m.vocab_size
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
    s.dscratch = <float*>nlm_alloc_lines(nscratch * sizeof(float))
    if s.buf0 == NULL or s.buf1 == NULL or s.buf2 == NULL or s.hidden == NULL or s.fscratch == NULL \
            or s.dscratch == NULL:
        nlm_session_free(s)
        return NULL
    s.cache_enabled = cache_entries > 0
    s.ctx_cache_enabled = s.cache_enabled and context_cache_pays(m)
    s.sentence_id = -1
    # context key: the full padded context (one dummy id for unigram models)
    table_init(&s.ctx_cache, m.key_len if m.key_len > 0 else 1, 2, m.out_dim, cache_entries, 1)
    table_init(&s.class_cache, m.key_len + 1, 1, 0, cache_entries, 1)
    if ngram_entries < 0:
        ngram_entries = 4 * cache_entries if (cache_entries > 0 and nlm_ngram_cache_pays(m)) else 0
    s.ngram_cache_enabled = ngram_entries > 0
    table_init(&s.ngram_cache, m.key_len + 1, 1, 0, ngram_entries, 0)
    # direct-feature vectors of the normalisers: key [tag, last direct_order-1 ids]
    s.direct_cache_enabled = s.cache_enabled and m.direct_order > 0 and \
        (m.output_type == OUT_SOFTMAX or m.output_type == OUT_CLASS)
    table_init(&s.direct_cache, m.direct_order if m.direct_order > 0 else 1, 1, 0, cache_entries, 0)
    s.direct_limit = 32 * cache_entries if cache_entries > 32768 else 1 << 20
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
    free(s.dscratch)
    free(s.direct_arena)
    table_free(&s.direct_cache)
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
    if s.cache_enabled:
        table_clear(&s.ctx_cache)
        table_clear(&s.class_cache)
    if s.ngram_cache_enabled:
        table_clear(&s.ngram_cache)
    if s.direct_cache_enabled:
        table_clear(&s.direct_cache)
        s.direct_used = 0
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


cdef void nlm_prefetch_padded(SessionC* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """Start loading the n-gram cache slot that :c:func:`nlm_score_padded` will probe first for
    (``ctx``, ``w``): a decoder scoring several words at once (a phrase applied to a
    hypothesis) overlaps their cache misses (the per-sentence table is megabytes; a probe
    that misses the CPU caches was most of its cost in Moses).  Changes nothing else."""
    cdef int32_t key[NLM_MAX_KEY + 1]
    cdef const TableC* t = &s.ngram_cache
    if not s.ngram_cache_enabled or t.capacity == 0:
        return
    nlm_clean_ngram(s.model, ctx, w, key)
    __builtin_prefetch(table_at(t, nlm_home(key_hash(key, t.key_len), t.capacity)))


cdef double nlm_score_padded(SessionC* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """Natural-log score of word ``w`` after the padded context ``ctx`` (n-1 ids; for a joint
    model the full context: the source window, then the n-1 target ids; ids outside their
    vocabulary are read as ``<unk>``).  The one scoring path of every entry.

    Through the session's n-gram cache, then the persistent cache's files (if attached),
    then the context and normaliser caches (each also backed by the files)."""
    cdef int32_t key[NLM_MAX_KEY + 1]
    cdef int found = 0
    cdef int64_t slot
    cdef int32_t* p
    cdef double v
    nlm_clean_ngram(s.model, ctx, w, key)
    if s.model_changed:
        return NAN
    w = key[s.model.key_len]
    if not s.ngram_cache_enabled:
        return score_uncached_ngram(s, key, w)
    slot = table_insert(&s.ngram_cache, key, &found)
    if found:
        s.lookups += 1
        p = table_at(&s.ngram_cache, slot)
        if s.store != NULL and tv_disk(p):  # an entry that came from the persistent cache
            s.store.ngram_hits += 1
        return tv_get(&s.ngram_cache, p, 0)
    if s.store != NULL and store_probe(s.store.ngram, s.store.nfiles, key, 0, &v):
        s.lookups += 1
        s.store.ngram_hits += 1
        s.store.ngram_found += 1
        s.ngram_cache.misses -= 1
        s.ngram_cache.hits += 1
        if slot >= 0:
            p = table_at(&s.ngram_cache, slot)
            tv_set(&s.ngram_cache, p, 0, v)
            tv_mark(p, 1)
        return v
    v = score_uncached_ngram(s, key, w)
    if slot >= 0:
        tv_set(&s.ngram_cache, table_at(&s.ngram_cache, slot), 0, v)
        if not isnan(v):
            s.ngram_cache.fresh += 1
    return v


cdef const float* direct_vector(SessionC* s, int kind, const uint64_t* states, const int32_t* ctx,
                                int32_t tag, const int32_t* targets, int32_t n) noexcept nogil:
    """``(float) direct_value`` of ``n`` targets of ``kind`` (``targets[i]``, or ``i`` when
    NULL) after the padded context ``ctx`` (whose kind-``kind`` hash states are ``states``):
    the direct-feature part of a normaliser's logits.  The values depend only on the last
    direct_order-1 ids of the context, which the contexts of a sentence share far more than
    whole contexts (a Moses sentence of a class model: 2.4k (last word, class) pairs against
    71k (context, class) pairs), so each vector is computed once per sentence (key: ``tag``,
    those ids) into the session's arena; without room, into ``dscratch``.  Valid until the
    next call."""
    cdef const ModelC* m = s.model
    cdef int32_t key[NLM_MAX_ORDER + 1]
    cdef int found = 0, k
    cdef int64_t slot = -1, off = -1, need, cap
    cdef int32_t i
    cdef float* out = s.dscratch
    cdef float* grown
    if s.direct_cache_enabled:
        key[0] = tag
        for k in range(1, m.direct_order):
            key[k] = ctx[m.key_len - k]
        slot = table_insert(&s.direct_cache, key, &found)
        if slot >= 0 and found:
            off = <int64_t>tv_get(&s.direct_cache, table_at(&s.direct_cache, slot), 0)
            if off >= 0:
                return s.direct_arena + off
        elif slot >= 0:
            need = s.direct_used + n
            if s.direct_cap < need <= s.direct_limit:  # grow the arena: doubling, within the limit
                cap = s.direct_cap * 2 if s.direct_cap else 65536
                cap = need if cap < need else cap
                cap = s.direct_limit if cap > s.direct_limit else cap
                grown = <float*>realloc(s.direct_arena, cap * sizeof(float))
                if grown != NULL:
                    s.direct_arena = grown
                    s.direct_cap = cap
            if need <= s.direct_cap:
                off = s.direct_used
                out = s.direct_arena + off
                s.direct_used = need
            # -1: no room, the vector is computed again each time
            tv_set(&s.direct_cache, table_at(&s.direct_cache, slot), 0, <double>off)
    if targets != NULL:
        for i in range(n):
            out[i] = <float>direct_value_kind(m, kind, states, targets[i])
    else:
        for i in range(n):
            out[i] = <float>direct_value_kind(m, kind, states, i)
    return out


cdef double within_class_lz(SessionC* s, const float* h, int32_t c, const int32_t* ctx,
                            const uint64_t* states) noexcept nogil:
    """The within-class normaliser of class ``c`` after ``ctx`` (hidden vector ``h``)."""
    cdef const ModelC* m = s.model
    cdef int32_t a = m.class_start[c], n = m.class_start[c + 1] - m.class_start[c]
    cdef const float* dv = NULL
    if m.direct_order and n > 1:
        dv = direct_vector(s, 0, states, ctx, c, m.class_members + a, n)
    return within_class_lognorm(m, h, c, states, dv, s.fscratch)


cdef double score_uncached_ngram(SessionC* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """The score of one n-gram through the context and class-normaliser caches."""
    cdef const ModelC* m = s.model
    cdef float* h
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
    s.lookups += 1
    if m.output_type == OUT_CLASS and s.cache_enabled:
        # the within-class normaliser's key (context, class of w): its slot loads while the
        # context is looked up and the class probability computed
        for i in range(m.key_len):
            class_key[i] = ctx[i]
        class_key[m.key_len] = m.word_class[w]
        if s.class_cache.capacity:
            __builtin_prefetch(table_at(&s.class_cache, nlm_home(key_hash(class_key, s.class_cache.key_len),
                                                                 s.class_cache.capacity)))
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
        h = table_fvals(&s.ctx_cache, cp)
        if not found:
            nlm_compute_hidden(m, ctx, h, s.buf0, s.buf1, s.buf2)
            tv_set(&s.ctx_cache, cp, 0, NAN)
            tv_set(&s.ctx_cache, cp, 1, NAN)
    else:
        h = s.hidden
        nlm_compute_hidden(m, ctx, h, s.buf0, s.buf1, s.buf2)
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
    elif cp != NULL and s.store != NULL and s.store.probe_context and \
            store_probe(s.store.ctx, s.store.nfiles, ckey, which, &lz):
        s.store.ctx_hits += 1
        tv_set(&s.ctx_cache, cp, which, lz)
        tv_mark(cp, 1)
    else:
        if which == 0:
            lz = softmax_lognorm(m, h, direct_vector(s, 0, states, ctx, -2, NULL, m.vocab_size)
                                 if m.direct_order else NULL, s.fscratch)
        else:
            lz = class_lognorm(m, h, direct_vector(s, 1, cstates, ctx, -1, NULL, m.n_classes)
                               if m.direct_order else NULL, s.fscratch)
        if cp != NULL:
            tv_set(&s.ctx_cache, cp, which, lz)
            tv_mark(cp, 0)
            if not isnan(lz):
                s.ctx_cache.fresh += 1
    if which == 0:
        return word_logit(m, h, w, states) - lz
    # class-factored: p(c | context) p(w | context, c)
    c = m.word_class[w]
    score = class_logit(m, h, c, cstates) - lz
    if s.cache_enabled:  # class_key: built above
        slot = table_insert(&s.class_cache, class_key, &found)
        kp = table_at(&s.class_cache, slot)
        if slot < 0:  # out of memory
            lz = within_class_lz(s, h, c, ctx, states)
        elif found:
            lz = tv_get(&s.class_cache, kp, 0)
        elif s.store != NULL and s.store.probe_context and \
                store_probe(s.store.cls, s.store.nfiles, class_key, 0, &lz):
            s.store.class_hits += 1
            tv_set(&s.class_cache, kp, 0, lz)
            tv_mark(kp, 1)
        else:
            lz = within_class_lz(s, h, c, ctx, states)
            tv_set(&s.class_cache, kp, 0, lz)
            if not isnan(lz):
                s.class_cache.fresh += 1
    else:
        lz = within_class_lz(s, h, c, ctx, states)
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


cdef void nlm_source_window(const ModelC* m, const int32_t* src, int n, int affiliation,
                            int32_t* out) noexcept nogil:
    """The w = 2m+1 source ids around ``affiliation`` in a source sentence of ``n`` ids.

    Position ``n`` is the sentence end (``</s>``, the affiliation of the target ``</s>``);
    positions before 0 are ``<s>``, after ``n`` ``</s>``.  A negative affiliation (unknown:
    future-cost estimates) gives a window of ``<null>``.  Ids outside the source vocabulary
    become ``<unk>``.
    """
    cdef int j, p, half = m.src_window // 2
    cdef int32_t x
    for j in range(m.src_window):
        p = affiliation - half + j
        if affiliation < 0:
            out[j] = m.src_null
        elif p < 0:
            out[j] = m.src_bos
        elif p >= n:
            out[j] = m.src_eos
        else:
            x = src[p]
            out[j] = x if 0 <= x < m.src_vocab_size else m.src_unk

