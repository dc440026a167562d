# Included by _scorer.pyx (one compilation unit): The network: context padding, first-layer branches (source window of joint models too), hidden layers.

# ---------------------------------------------------------------------------------------
# the network
# ---------------------------------------------------------------------------------------

cdef void source_forward(const ModelC* m, const BranchC* br, const int32_t* window, float* v) noexcept nogil:
    """Add the source-window positions' contributions (joint models) to ``v``."""
    cdef int j, o, H = br.hidden, E = m.embed_dim
    cdef int64_t Vs = m.src_vocab_size
    cdef const float* e
    if br.src_tables != NULL and m.use_tables:
        for j in range(m.src_window):
            addf(v, br.src_tables + (j * Vs + window[j]) * H, H)
    elif br.diagonal:
        for j in range(m.src_window):
            mulaccf(v, br.weights + j * E, m.src_embeddings + <int64_t>window[j] * E, E)
    else:
        for j in range(m.src_window):
            e = m.src_embeddings + <int64_t>window[j] * E
            for o in range(H):
                v[o] += dotf(br.weights + (<int64_t>j * H + o) * E, e, E)


cdef void source_part(const ModelC* m, const BranchC* br, const int32_t* window, float* v) noexcept nogil:
    """The start of a joint model's first-layer sum (``br.hidden`` floats): the bias plus the
    source-window positions.  :c:func:`branch_forward` adds the target positions to it, so it is
    the same for every target context with this window (sessions keep it: source_parts)."""
    if br.diagonal and not (br.tables != NULL and m.use_tables):
        if m.src_embeddings_h != NULL:
            nlm_diag_forward_h(br.bias, br.weights, m.src_embeddings_h, window, m.src_window, m.embed_dim, v)
        else:
            nlm_diag_forward(br.bias, br.weights, m.src_embeddings, window, m.src_window, m.embed_dim, v)
    else:
        init_bias(v, br.bias, br.hidden)
        source_forward(m, br, window, v)


cdef void branch_forward(const ModelC* m, const BranchC* br, const int32_t* ctx, float* v,
                         const float* part) noexcept nogil:
    """First-layer branch for a full context: [source window (joint models) | n-1 target ids].
    A joint model's sum starts from ``part``, the window's :c:func:`source_part` (NULL:
    computed here), and adds the target positions in order: the same bits either way."""
    cdef int j, o, H = br.hidden, E = m.embed_dim
    cdef int64_t V = m.vocab_size
    cdef const float* e
    cdef BranchC tb
    cdef int w0 = m.src_window
    if w0:
        if part == NULL:
            source_part(m, br, ctx, v)
            part = v
        ctx += w0
        tb = br[0]  # the target positions follow the source ones in the weights
        tb.weights = br.weights + <int64_t>w0 * (E if br.diagonal else <int64_t>H * E)
        br = &tb
    if br.diagonal and not (br.tables != NULL and m.use_tables):
        if m.embeddings_h != NULL:
            nlm_diag_forward_h(part if w0 else br.bias, br.weights, m.embeddings_h, ctx, m.ctx_len, E, v)
        else:
            nlm_diag_forward(part if w0 else br.bias, br.weights, m.embeddings, ctx, m.ctx_len, E, v)
        activate(v, H, br.activation)
        return
    if not w0:
        init_bias(v, br.bias, H)
    elif part != v:
        memcpy(v, part, H * sizeof(float))
    if br.tables != NULL and m.use_tables:
        for j in range(m.ctx_len):
            addf(v, br.tables + (j * V + ctx[j]) * H, H)
    else:
        for j in range(m.ctx_len):
            e = m.embeddings + <int64_t>ctx[j] * E
            for o in range(H):
                v[o] += dotf(br.weights + (<int64_t>j * H + o) * E, e, E)
    activate(v, H, br.activation)


cdef void layer_forward(const LayerC* L, const float* x, float* y) noexcept nogil:
    cdef int i, o, k, nnz = 0
    cdef int32_t idx[4096]
    if L.weight_t != NULL and L.n_in <= 4096:
        # column form over the non-zero inputs a ReLU leaves (exact); the indices are
        # gathered first without branches, so the zero pattern costs no mispredictions
        # (measured: 146k NPLM lookups/s against 104k branching and 118k dense)
        for i in range(L.n_in):
            idx[nnz] = i
            nnz += x[i] != 0
        init_bias(y, L.bias, L.n_out)
        for k in range(nnz):
            i = idx[k]
            axpyf(y, L.weight_t + <int64_t>i * L.n_out, x[i], L.n_out)
    else:
        for o in range(L.n_out):
            y[o] = dotf(L.weight + <int64_t>o * L.n_in, x, L.n_in) + (L.bias[o] if L.bias != NULL else 0)
    activate(y, L.n_out, L.activation)


cdef void nlm_compute_hidden(const ModelC* m, const int32_t* ctx, float* out,
                             float* b0, float* b1, float* b2, const float* parts=NULL) noexcept nogil:
    """Final hidden vector (out_dim floats) for a padded context; b0..b2 are work buffers.
    ``parts``: a joint model's :c:func:`source_part` of each branch for the context's window
    (branch k at ``k * max_width``), or NULL."""
    cdef int k, i, H = m.branches[0].hidden
    cdef float* cur = b0
    cdef float* tmp
    cdef const LayerC* L
    branch_forward(m, &m.branches[0], ctx, cur, parts)
    for k in range(1, m.n_branches):
        branch_forward(m, &m.branches[k], ctx, b1, parts + <int64_t>k * m.max_width if parts != NULL else NULL)
        if m.combine == COMBINE_MAX:
            for i in range(H):
                cur[i] = cur[i] if cur[i] >= b1[i] else b1[i]
        elif m.combine == COMBINE_MUL:
            for i in range(H):
                cur[i] = cur[i] * (b1[i] + 1)
        else:
            addf(cur, b1, H)
    if m.n_layers == 0:
        memcpy(out, cur, m.out_dim * sizeof(float))
        return
    for k in range(m.n_layers):
        L = &m.layers[k]
        if k == m.n_layers - 1:
            layer_forward(L, cur, out)
        else:
            tmp = b2 if cur == b0 else b0
            layer_forward(L, cur, tmp)
            cur = tmp
