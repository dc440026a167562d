# Included by _scorer.pyx (one compilation unit): Output layers: word and class logits, softmax / class / within-class normalisers, binary tree.

# ---------------------------------------------------------------------------------------
# output layers
# ---------------------------------------------------------------------------------------

cdef inline double word_logit(const ModelC* m, const float* h, int32_t w, const uint64_t* states) noexcept nogil:
    cdef double s
    if not m.half:
        s = dotf(m.out_weight + <int64_t>w * m.out_dim, h, m.out_dim) + m.out_bias[w]
    elif m.out_weight_h != NULL:
        s = nlm_dot_rh(m.out_weight_h + <int64_t>w * m.out_dim, h, m.out_dim) + m.out_bias[w]
    else:
        s = nlm_dot_rf(m.out_weight + <int64_t>w * m.out_dim, h, m.out_dim) + m.out_bias[w]
    if m.direct_order:
        s += direct_value_kind(m, 0, states, w)
    return s


cdef inline double class_logit(const ModelC* m, const float* h, int32_t c, const uint64_t* states) noexcept nogil:
    cdef double s = dotf(m.class_weight + <int64_t>c * m.out_dim, h, m.out_dim) + m.class_bias[c]
    if m.direct_order:
        s += direct_value_kind(m, 1, states, c)
    return s

# The normalisers take the direct-feature values of their targets as one vector ``dv``
# (NULL: the model has no direct features): ``(float) direct_value`` of every word,
# class or member of the class, from the session's per-sentence cache
# (:c:func:`direct_vector`).  Adding them in the same order as before keeps every logit
# bit-identical.


cdef inline void output_rows(const ModelC* m, int32_t first, const int32_t* idx, int32_t n,
                             const float* h, float* out) noexcept nogil:
    """``out[k]`` = the output row ``idx[k]`` (``first + k`` when ``idx`` is NULL) times ``h``,
    without the bias, with the fixed-order row dot (a float16 model's: that of its word
    logits, :c:func:`word_logit`, the same bits from its half rows and from their float32
    widening)."""
    if m.out_weight_h != NULL:
        nlm_gemv_rows_rh(m.out_weight_h + (<int64_t>first * m.out_dim if idx == NULL else 0),
                         idx, n, m.out_dim, h, out)
    else:
        nlm_gemv_rows_rf(m.out_weight + (<int64_t>first * m.out_dim if idx == NULL else 0),
                         idx, n, m.out_dim, h, out)


cdef double softmax_lognorm(const ModelC* m, const float* h, const double* dv, float* scratch) noexcept nogil:
    cdef int32_t w
    output_rows(m, 0, NULL, m.vocab_size, h, scratch)
    for w in range(m.vocab_size):
        scratch[w] += m.out_bias[w]
        if dv != NULL:
            scratch[w] += <float>dv[w]
    return nlm_logsumexp_f(scratch, m.vocab_size)


cdef double class_lognorm(const ModelC* m, const float* h, const double* dv, float* scratch) noexcept nogil:
    cdef int32_t c
    nlm_gemv_t(m.class_weight_t, m.out_dim, m.n_classes, m.n_classes_padded, h, m.class_bias, scratch)
    if dv != NULL:
        for c in range(m.n_classes):
            scratch[c] += <float>dv[c]
    return nlm_logsumexp_f(scratch, m.n_classes)


cdef double within_class_lognorm(const ModelC* m, const float* h, int32_t c, const uint64_t* states,
                                 const double* dv, float* scratch) noexcept nogil:
    """log of the sum of exp(word logit) over class ``c``; rows of a class whose members are
    consecutive ids (frequency-binned classes) are one block of the output matrix.  ``dv``:
    the members' direct values (unused, may be NULL, for a class of one word)."""
    cdef int32_t i, w, a = m.class_start[c], b = m.class_start[c + 1]
    cdef int32_t first = m.class_members[a]
    if b - a == 1:  # p(w | c) = 1
        return word_logit(m, h, first, states)
    if m.class_members[b - 1] - first == b - 1 - a:
        output_rows(m, first, NULL, b - a, h, scratch)
        for i in range(b - a):
            scratch[i] += m.out_bias[first + i]
    else:
        # Brown classes: rows scattered over megabytes, each prefetched four rows ahead
        output_rows(m, 0, m.class_members + a, b - a, h, scratch)
        for i in range(a, b):
            scratch[i - a] += m.out_bias[m.class_members[i]]
    if dv != NULL:
        for i in range(b - a):
            scratch[i] += <float>dv[i]
    return nlm_logsumexp_f(scratch, b - a)


cdef double tree_logprob(const ModelC* m, const float* h, int32_t w) noexcept nogil:
    cdef double s = 0, x
    cdef int64_t p
    cdef int32_t node
    for p in range(m.path_start[w], m.path_start[w + 1]):
        node = m.path_node[p]
        x = dotf(m.tree_weight + <int64_t>node * m.out_dim, h, m.out_dim) + m.tree_bias[node]
        s += log_sigmoid(m.path_sign[p] * x)
    return s
