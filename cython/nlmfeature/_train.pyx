# cython: language_level=3
"""Native loops of the trainer: alias sampling, sparse gathers and scatters, AdaGrad.

Everything here works on float32 or float64 arrays (fused type ``real``): training runs in
float32, the gradient checks in float64.  Loops run without the GIL; ``threads`` sets the
OpenMP team of the parallel ones.  Parallel scatters split the *rows* between threads
(row % threads), so each row is summed in the same order whatever the thread count and
results are reproducible.
"""
import numpy as np
cimport numpy as cnp
from cython.parallel cimport prange, parallel
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t, uint32_t
from libc.math cimport sqrt, exp, log, log1p, fabs
from libc.stdlib cimport malloc, calloc, free

from nlmfeature._scorer cimport hash_bucket, splitmix64

cnp.import_array()

ctypedef fused real:
    float
    double


cdef extern from *:
    """
    #include <math.h>
    /* reductions that gcc may vectorise (omp simd allows the reassociation) */
    static inline float nlt_dotf(const float* a, const float* b, int n) {
        float s = 0;
        #pragma omp simd reduction(+:s)
        for (int i = 0; i < n; i++) s += a[i] * b[i];
        return s;
    }
    static inline double nlt_dotd(const double* a, const double* b, int n) {
        double s = 0;
        #pragma omp simd reduction(+:s)
        for (int i = 0; i < n; i++) s += a[i] * b[i];
        return s;
    }
    static inline void nlt_adagradf(float* p, float* acc, float* g, int n, float lr, float l2, float eps) {
        #pragma omp simd
        for (int i = 0; i < n; i++) {
            float gd = g[i] + l2 * p[i];
            float a = acc[i] + gd * gd;
            acc[i] = a;
            p[i] -= lr * gd / (sqrtf(a) + eps);
            g[i] = 0;
        }
    }
    static inline void nlt_adagradd(double* p, double* acc, double* g, int n, double lr, double l2, double eps) {
        #pragma omp simd
        for (int i = 0; i < n; i++) {
            double gd = g[i] + l2 * p[i];
            double a = acc[i] + gd * gd;
            acc[i] = a;
            p[i] -= lr * gd / (sqrt(a) + eps);
            g[i] = 0;
        }
    }
    /* row-wise AdaGrad: one sum per row, of the mean squared gradient of its coordinates */
    static inline void nlt_adagrad_rowf(float* p, float* acc, float* g, int n, float lr, float l2, float eps) {
        float ss = 0;
        #pragma omp simd reduction(+:ss)
        for (int i = 0; i < n; i++) { float gd = g[i] + l2 * p[i]; ss += gd * gd; }
        float a = acc[0] + ss / (float)n;
        acc[0] = a;
        float scale = lr / (sqrtf(a) + eps);
        #pragma omp simd
        for (int i = 0; i < n; i++) { float gd = g[i] + l2 * p[i]; p[i] -= scale * gd; g[i] = 0; }
    }
    """
    float nlt_dotf(const float* a, const float* b, int n) noexcept nogil
    double nlt_dotd(const double* a, const double* b, int n) noexcept nogil
    void nlt_adagradf(float* p, float* acc, float* g, int n, float lr, float l2, float eps) noexcept nogil
    void nlt_adagradd(double* p, double* acc, double* g, int n, double lr, double l2, double eps) noexcept nogil
    void nlt_adagrad_rowf(float* p, float* acc, float* g, int n, float lr, float l2, float eps) noexcept nogil


cdef inline real dot(const real* a, const real* b, int n) noexcept nogil:
    if real is float:
        return nlt_dotf(a, b, n)
    else:
        return nlt_dotd(a, b, n)


cdef inline void axpy(real* y, const real* x, real a, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        y[i] += a * x[i]


cdef inline void adagrad_row(real* p, real* acc, real* g, int n, real lr, real l2, real eps) noexcept nogil:
    if real is float:
        nlt_adagradf(p, acc, g, n, lr, l2, eps)
    else:
        nlt_adagradd(p, acc, g, n, lr, l2, eps)


# ---------------------------------------------------------------------------------------
# alias method (Walker 1977; Vose 1991)
# ---------------------------------------------------------------------------------------

def alias_blocks(const double[::1] probs, const int64_t[::1] starts):
    """Alias tables of several distributions stored back to back.

    Block b covers ``probs[starts[b]:starts[b+1]]`` (non-negative weights, normalised per
    block here).  Returns (accept float64 (M,), alias int32 (M,)), ``alias`` holding
    positions *within* the block.  An all-zero block becomes uniform.
    """
    cdef int64_t M = probs.shape[0], B = starts.shape[0] - 1, b, a, z, n, i, s, l, ns, nl
    accept = np.zeros(M, dtype=np.float64)
    alias = np.zeros(M, dtype=np.int32)
    cdef double[::1] acc = accept
    cdef int32_t[::1] al = alias
    cdef double tot
    small_arr = np.empty(M, dtype=np.int64)
    large_arr = np.empty(M, dtype=np.int64)
    scaled_arr = np.empty(M, dtype=np.float64)
    cdef int64_t[::1] small = small_arr, large = large_arr
    cdef double[::1] sc = scaled_arr
    with nogil:
        for b in range(B):
            a = starts[b]
            z = starts[b + 1]
            n = z - a
            if n <= 0:
                continue
            tot = 0
            for i in range(a, z):
                tot += probs[i]
            ns = 0
            nl = 0
            for i in range(a, z):
                sc[i] = probs[i] * n / tot if tot > 0 else 1.0
                if sc[i] < 1.0:
                    small[a + ns] = i
                    ns += 1
                else:
                    large[a + nl] = i
                    nl += 1
            while ns > 0 and nl > 0:
                ns -= 1
                s = small[a + ns]
                l = large[a + nl - 1]
                acc[s] = sc[s]
                al[s] = <int32_t>(l - a)
                sc[l] = (sc[l] + sc[s]) - 1.0
                if sc[l] < 1.0:
                    nl -= 1
                    small[a + ns] = l
                    ns += 1
            while nl > 0:
                nl -= 1
                acc[large[a + nl]] = 1.0
                al[large[a + nl]] = <int32_t>(large[a + nl] - a)
            while ns > 0:  # rounding leftovers
                ns -= 1
                acc[small[a + ns]] = 1.0
                al[small[a + ns]] = <int32_t>(small[a + ns] - a)
    return accept, alias


cdef inline uint64_t stream_base(uint64_t seed, uint64_t step) noexcept nogil:
    return splitmix64(splitmix64(seed ^ 0x5851F42D4C957F2DULL) ^ step)


cdef inline void alias_row(const double* accept, const int32_t* alias, const int32_t* values, int64_t a,
                           int64_t size, uint64_t base, int64_t n, int k, int32_t* out) noexcept nogil:
    """Row n's k draws from the alias table of positions a .. a+size-1 (stream ``base``).  An
    alias outside the table draws -1 (no word: the callers refuse it), so a bad table costs a
    compare per draw instead of a pass over the table per call."""
    cdef int j
    cdef uint64_t r
    cdef int64_t pos
    cdef double u
    for j in range(k):
        r = splitmix64(base + <uint64_t>(n * k + j))
        pos = <int64_t>(((r >> 32) * <uint64_t>size) >> 32)
        u = <double>(r & 0xFFFFFFFFULL) * (1.0 / 4294967296.0)
        if u >= accept[a + pos]:
            pos = alias[a + pos]
            if pos < 0 or pos >= size:
                out[j] = -1
                continue
        out[j] = values[a + pos]


def sample_blocks(const double[::1] accept, const int32_t[::1] alias, const int32_t[::1] values,
                  const int64_t[::1] starts, const int32_t[::1] block_of_row, int k,
                  uint64_t seed, uint64_t step, int threads=1):
    """Draw ``k`` samples per row: row n samples from block ``block_of_row[n]`` of the alias
    tables (see :func:`alias_blocks`) and gets ``values`` of the chosen positions.

    Counter-based random numbers (seed, step, row, sample): the draw does not depend on the
    thread count, and a resumed run draws what an uninterrupted one would.
    Returns (N, k) int32.
    """
    cdef int64_t N = block_of_row.shape[0], n, a, size
    cdef uint64_t base = stream_base(seed, step)
    out = np.empty((N, k), dtype=np.int32)
    cdef int32_t[:, ::1] o = out
    if N == 0 or k == 0:
        return out
    for n in prange(N, nogil=True, num_threads=threads, schedule="static"):
        a = starts[block_of_row[n]]
        size = starts[block_of_row[n] + 1] - a
        alias_row(&accept[0], &alias[0], &values[0], a, size, base, n, k, &o[n, 0])
    return out


# ---------------------------------------------------------------------------------------
# sparse output rows: gather logits, back-propagate, scatter gradients
# ---------------------------------------------------------------------------------------

def gather_logits(const real[:, ::1] W, const real[::1] b, const real[:, ::1] H,
                  const int32_t[:, :] cand, double[:, ::1] out, int threads=1):
    """out[n, j] = W[cand[n, j]] . H[n] + b[cand[n, j]]."""
    cdef int64_t N = cand.shape[0], n, r
    cdef int K = cand.shape[1], j, d, D = H.shape[1]
    for n in prange(N, nogil=True, num_threads=threads, schedule="static"):
        for j in range(K):
            r = cand[n, j]
            out[n, j] = <double>dot(&W[r, 0], &H[n, 0], D) + b[r]


def backprop_rows(const real[:, ::1] W, const int32_t[:, :] cand, const double[:, ::1] G,
                  real[:, ::1] dH, int threads=1):
    """dH[n] += sum_j G[n, j] * W[cand[n, j]]."""
    cdef int64_t N = cand.shape[0], n, r
    cdef int K = cand.shape[1], j, d, D = dH.shape[1]
    cdef real g
    for n in prange(N, nogil=True, num_threads=threads, schedule="static"):
        for j in range(K):
            g = <real>G[n, j]
            if g == 0:
                continue
            r = cand[n, j]
            axpy(&dH[n, 0], &W[r, 0], g, D)


cdef int64_t mark_rows(uint8_t[::1] mark, int32_t[::1] touched, int64_t n_touched,
                       const int32_t* idx, int64_t M, int64_t stride) noexcept nogil:
    cdef int64_t i, r
    for i in range(M):
        r = idx[i * stride]
        if not mark[r]:
            mark[r] = 1
            touched[n_touched] = <int32_t>r
            n_touched += 1
    return n_touched


def scatter_outer(real[:, ::1] grad, uint8_t[::1] mark, int32_t[::1] touched, int64_t n_touched,
                  const int32_t[:, ::1] cand, const double[:, ::1] G, const real[:, ::1] H,
                  int threads=1):
    """grad[cand[n, j]] += G[n, j] * H[n] (rows marked and listed in ``touched``).
    Returns the new number of touched rows."""
    cdef int64_t N = cand.shape[0], n, r
    cdef int K = cand.shape[1], j, d, D = H.shape[1], t, T = max(1, threads)
    cdef real g
    if N == 0 or K == 0:
        return n_touched
    with nogil:
        n_touched = mark_rows(mark, touched, n_touched, &cand[0, 0], N * K, 1)
    for t in prange(T, nogil=True, num_threads=T, schedule="static"):
        for n in range(N):
            for j in range(K):
                r = cand[n, j]
                if r % T != t:
                    continue
                g = <real>G[n, j]
                if g == 0:
                    continue
                axpy(&grad[r, 0], &H[n, 0], g, D)
    return n_touched


def scatter_rows(real[:, ::1] grad, uint8_t[::1] mark, int32_t[::1] touched, int64_t n_touched,
                 const int32_t[::1] idx, const real[:, ::1] rows, int threads=1):
    """grad[idx[i]] += rows[i] (rows marked and listed).  Returns the new touched count."""
    cdef int64_t M = idx.shape[0], i, r
    cdef int d, D = rows.shape[1], t, T = max(1, threads)
    if M == 0:
        return n_touched
    with nogil:
        n_touched = mark_rows(mark, touched, n_touched, &idx[0], M, 1)
    for t in prange(T, nogil=True, num_threads=T, schedule="static"):
        for i in range(M):
            r = idx[i]
            if r % T != t:
                continue
            axpy(&grad[r, 0], &rows[i, 0], 1, D)
    return n_touched


def scatter_values(real[::1] grad, uint8_t[::1] mark, int32_t[::1] touched, int64_t n_touched,
                   const int32_t[::1] idx, const double[::1] vals):
    """grad[idx[i]] += vals[i] for a vector parameter (biases).  Returns the touched count."""
    cdef int64_t M = idx.shape[0], i, r
    with nogil:
        for i in range(M):
            r = idx[i]
            if vals[i] == 0:
                continue
            grad[r] += <real>vals[i]
            if not mark[r]:
                mark[r] = 1
                touched[n_touched] = <int32_t>r
                n_touched += 1
    return n_touched


# ---------------------------------------------------------------------------------------
# direct n-gram features (hashed exactly as the scorer's direct_feature_indices)
# ---------------------------------------------------------------------------------------

cdef inline void context_states(const int32_t[:, ::1] ctx, int64_t n, int kind, int order,
                                uint64_t* states) noexcept nogil:
    cdef int k, c = ctx.shape[1]
    states[0] = splitmix64(<uint64_t>kind)
    for k in range(1, order):
        states[k] = splitmix64(states[k - 1] ^ <uint64_t>ctx[n, c - k])


def direct_add(const real[::1] w, const int32_t[:, ::1] ctx, const int32_t[:, :] cand, int kind,
               int order, int64_t hash_space, double[:, ::1] out, int threads=1):
    """out[n, j] += sum_k w[index_k(ctx[n], cand[n, j])] (the direct-feature part of a logit)."""
    cdef int64_t N = cand.shape[0], n
    cdef int K = cand.shape[1], j, k
    cdef uint64_t* states
    cdef uint64_t t
    cdef double s
    if order > 16:
        raise ValueError("direct order above 16")
    with nogil, parallel(num_threads=threads):
        states = <uint64_t*>malloc(16 * sizeof(uint64_t))
        for n in prange(N, schedule="static"):
            context_states(ctx, n, kind, order, states)
            for j in range(K):
                t = (<uint64_t>cand[n, j]) << 32
                s = 0
                for k in range(order):
                    s = s + w[hash_bucket(splitmix64(states[k] ^ t), <uint64_t>hash_space)]
                out[n, j] += s
        free(states)


def direct_scatter(real[::1] grad, uint8_t[::1] mark, int32_t[::1] touched, int64_t n_touched,
                   const int32_t[:, ::1] ctx, const int32_t[:, :] cand, const double[:, ::1] G,
                   int kind, int order, int64_t hash_space, const uint8_t[::1] allowed):
    """grad[index_k(ctx[n], cand[n, j])] += G[n, j] for every order k, skipping buckets with
    ``allowed[b] == 0`` (the --min-ngram-freq filter; pass an empty array to allow all).
    Returns the new touched count."""
    cdef int64_t N = cand.shape[0], n, b
    cdef int K = cand.shape[1], j, k
    cdef uint64_t states[16]
    cdef uint64_t t
    cdef double g
    cdef bint filt = allowed.shape[0] > 0
    if order > 16:
        raise ValueError("direct order above 16")
    with nogil:
        for n in range(N):
            context_states(ctx, n, kind, order, states)
            for j in range(K):
                g = G[n, j]
                if g == 0:
                    continue
                t = (<uint64_t>cand[n, j]) << 32
                for k in range(order):
                    b = <int64_t>hash_bucket(splitmix64(states[k] ^ t), <uint64_t>hash_space)
                    if filt and not allowed[b]:
                        continue
                    grad[b] += <real>g
                    if not mark[b]:
                        mark[b] = 1
                        touched[n_touched] = <int32_t>b
                        n_touched += 1
    return n_touched


def direct_keys(const int32_t[:, ::1] ctx, const int32_t[::1] targets, int kind, int order):
    """64-bit n-gram keys (before the modulo) of each (context, target) for every order:
    (N, order) uint64.  Distinct n-grams have distinct keys up to 64-bit collisions; used
    to count n-gram frequencies for --min-ngram-freq."""
    cdef int64_t N = ctx.shape[0], n
    cdef int k
    cdef uint64_t states[16]
    cdef uint64_t t
    out = np.empty((N, order), dtype=np.uint64)
    cdef uint64_t[:, ::1] o = out
    with nogil:
        for n in range(N):
            context_states(ctx, n, kind, order, states)
            t = (<uint64_t>targets[n]) << 32
            for k in range(order):
                o[n, k] = splitmix64(states[k] ^ t)
    return out


# ---------------------------------------------------------------------------------------
# AdaGrad (Duchi et al. 2011)
# ---------------------------------------------------------------------------------------

def adagrad_rows(real[:, ::1] p, real[:, ::1] acc, real[:, ::1] g, uint8_t[::1] mark,
                 const int32_t[::1] touched, int64_t n_touched, double lr, double l2, double eps,
                 int threads=1):
    """AdaGrad on the touched rows of a matrix (gradient + l2 * row), then zero those
    gradient rows and their marks."""
    cdef int64_t i, r
    cdef int D = p.shape[1]
    for i in prange(n_touched, nogil=True, num_threads=threads, schedule="static"):
        r = touched[i]
        adagrad_row(&p[r, 0], &acc[r, 0], &g[r, 0], D, <real>lr, <real>l2, <real>eps)
        mark[r] = 0


def adagrad_values(real[::1] p, real[::1] acc, real[::1] g, uint8_t[::1] mark,
                   const int32_t[::1] touched, int64_t n_touched, double lr, double l2, double eps):
    """AdaGrad on the touched entries of a vector; zeroes their gradients and marks."""
    cdef int64_t i, r
    cdef double gd, a
    with nogil:
        for i in range(n_touched):
            r = touched[i]
            gd = g[r] + l2 * p[r]
            a = acc[r] + gd * gd
            acc[r] = <real>a
            p[r] -= <real>(lr * gd / (sqrt(a) + eps))
            g[r] = 0
            mark[r] = 0


def adagrad_dense(real[::1] p, real[::1] acc, real[::1] g, double lr, double l2, double eps,
                  int threads=1):
    """AdaGrad on a whole (flattened) parameter; zeroes the gradient."""
    cdef int64_t i, n = p.shape[0], chunk = 4096, nchunks = (n + 4095) // 4096, a, z
    for i in prange(nchunks, nogil=True, num_threads=threads, schedule="static"):
        a = i * chunk
        z = a + chunk
        if z > n:
            z = n
        adagrad_row(&p[a], &acc[a], &g[a], <int>(z - a), <real>lr, <real>l2, <real>eps)


# ---------------------------------------------------------------------------------------
# compiled corpora: n-grams built on the fly from the id stream
# ---------------------------------------------------------------------------------------

def stream_stats(const uint32_t[::1] ids):
    """(largest id, number of sentence ends (zeros)) of a compiled corpus's id stream."""
    cdef int64_t i, n = ids.shape[0], ends = 0
    cdef uint32_t mx = 0, v
    with nogil:
        for i in range(n):
            v = ids[i]
            if v > mx:
                mx = v
            if v == 0:
                ends += 1
    return int(mx), int(ends)


def stream_ngrams(const uint32_t[::1] ids, const int64_t[::1] starts, const int64_t[::1] ends,
                  const int32_t[::1] remap, int32_t bos, bint reverse,
                  int32_t[:, ::1] ctx, int32_t[::1] words, uint8_t[::1] depth=None):
    """The n-grams of the sentence-aligned spans ``ids[starts[b]:ends[b]]``, written one after
    another into ``ctx`` (N, n-1) and ``words`` (N,): every word and every sentence end (id 0)
    of the span, each after the n-1 previous ids of its sentence, left-padded with ``bos``; ids
    go through ``remap``.  With ``reverse`` each sentence's words are read backwards (its end
    stays last).  With ``depth`` (N,), each n-gram's position in its sentence, capped at n-1,
    is written there, and ``ctx`` may have no rows (shape (0, n-1)): then the contexts are
    not written, and :func:`gather_contexts` builds any of them from ``words`` and ``depth``.
    Returns the number of n-grams written."""
    cdef int64_t B = starts.shape[0], b, p, s, e, L, k, q, out = 0, pos
    cdef int c = ctx.shape[1], j
    cdef int64_t nmax = words.shape[0]
    cdef uint32_t nids = <uint32_t>remap.shape[0]
    cdef bint has_depth = depth is not None, has_ctx = ctx.shape[0] > 0
    if has_depth and depth.shape[0] < nmax:
        raise ValueError("output arrays too small")
    if not has_depth and not has_ctx and nmax > 0:
        raise ValueError("no contexts and no depths to write")
    if has_ctx and ctx.shape[0] < nmax:
        raise ValueError("output arrays too small")
    for b in range(B):
        if starts[b] < 0 or ends[b] > ids.shape[0] or starts[b] > ends[b]:
            raise ValueError("span outside the id stream")
    with nogil:
        for b in range(B):
            s = starts[b]
            e = ends[b]
            while s < e:
                p = s
                while p < e and ids[p] != 0:
                    p += 1
                L = p - s          # words of the sentence; ids[p] is its end (or the span ended)
                for k in range(L + 1 if p < e else L):
                    if out >= nmax:
                        with gil:
                            raise ValueError("output arrays too small")
                    if k < L:
                        pos = s + (L - 1 - k if reverse else k)
                        words[out] = remap[ids[pos]] if ids[pos] < nids else remap[0]
                    else:
                        words[out] = remap[0]
                    if has_depth:
                        depth[out] = <uint8_t>(k if k < c else c)
                    if has_ctx:
                        for j in range(c):
                            q = k - c + j
                            if q < 0:
                                ctx[out, j] = bos
                            else:
                                pos = s + (L - 1 - q if reverse else q)
                                ctx[out, j] = remap[ids[pos]]
                    out += 1
                s = p + 1
    return out


def gather_contexts(const int32_t[::1] words, const uint8_t[::1] depth, const int64_t[::1] idx,
                    int32_t bos, int32_t[:, ::1] ctx, int32_t[::1] targets):
    """The n-grams ``idx`` of a stream written by :func:`stream_ngrams` as ``words`` and
    ``depth``: row r of ``ctx`` (len(idx), n-1) and ``targets`` gets n-gram ``idx[r]``, its
    context the n-1 words before it in ``words`` that belong to its sentence (its depth),
    left-padded with ``bos``: what ``stream_ngrams`` would have written as its context row."""
    cdef int64_t R = idx.shape[0], r, i, N = words.shape[0]
    cdef int c = ctx.shape[1], j, d
    if ctx.shape[0] != R or targets.shape[0] != R or depth.shape[0] != N:
        raise ValueError("inconsistent shapes")
    for r in range(R):
        i = idx[r]
        if i < 0 or i >= N or depth[i] > c or depth[i] > i:
            raise ValueError("n-gram index outside the stream, or a depth beyond its start")
    with nogil:
        for r in range(R):
            i = idx[r]
            d = depth[i]
            targets[r] = words[i]
            for j in range(c - d):
                ctx[r, j] = bos
            for j in range(c - d, c):
                ctx[r, j] = words[i - c + j]
    return None


def direct_count(const int32_t[:, ::1] ctx, const int32_t[::1] targets, int kind, int order,
                 uint8_t[::1] sketch, int min_freq, uint8_t[::1] allowed, uint64_t modulus):
    """Count the direct-feature n-grams (the keys of :func:`direct_keys`, every order) of a
    chunk of text in ``sketch``, a two-row count-min sketch of saturating 8-bit counters
    (conservative update; its length a power of two), so that memory stays fixed however long
    the text.  An n-gram whose estimated count reaches ``min_freq`` for the first time marks
    bucket ``key % modulus`` of ``allowed`` (when ``allowed`` is not empty) and is counted.
    Returns the number of n-grams that became frequent in this chunk: over a whole text, the
    number of distinct n-grams seen at least ``min_freq`` times (over-estimated a little by
    sketch collisions)."""
    cdef int64_t N = ctx.shape[0], n, fresh = 0
    cdef int k
    cdef uint64_t states[16]
    cdef uint64_t t, key, half = <uint64_t>(sketch.shape[0] // 2), i1, i2
    cdef uint8_t a1, a2, m
    cdef bint mark = allowed.shape[0] > 0
    if order > 16:
        raise ValueError("direct order above 16")
    if half == 0 or (half & (half - 1)) != 0:
        raise ValueError("the sketch length must be a power of two >= 2")
    if min_freq < 1 or min_freq > 255:
        raise ValueError("min_freq must be in 1..255")
    if mark and <uint64_t>allowed.shape[0] < modulus:
        raise ValueError("allowed is shorter than the modulus")
    with nogil:
        for n in range(N):
            context_states(ctx, n, kind, order, states)
            t = (<uint64_t>targets[n]) << 32
            for k in range(order):
                key = splitmix64(states[k] ^ t)
                i1 = splitmix64(key ^ 0x9E3779B97F4A7C15ULL) & (half - 1)
                i2 = half + (splitmix64(key ^ 0xC2B2AE3D27D4EB4FULL) & (half - 1))
                a1 = sketch[i1]
                a2 = sketch[i2]
                m = a1 if a1 < a2 else a2
                if m == 255:
                    continue
                if a1 == m:
                    sketch[i1] = m + 1
                if a2 == m:
                    sketch[i2] = m + 1
                if m + 1 == min_freq:
                    fresh += 1
                    if mark:
                        allowed[hash_bucket(key, modulus)] = 1
    return fresh


# ---------------------------------------------------------------------------------------
# the fused minibatch step of the default recipe: diagonal LBL + NCE + direct features
# ---------------------------------------------------------------------------------------

cdef inline double nce_term(double x, bint data, double* loss) noexcept nogil:
    """NCE's d(loss)/dx for a candidate of logit ``x`` (sigmoid(x) - 1 for the data word,
    sigmoid(x) for a noise word), adding its loss (-log sigmoid(x), resp. -log sigmoid(-x)) to
    ``loss``.  Both come from one t = exp(-|x|), in the forms that cannot overflow."""
    cdef double t = exp(-fabs(x)), l1 = log1p(t)
    cdef double sg = 1.0 / (1.0 + t) if x >= 0 else t / (1.0 + t)
    if data:
        loss[0] = loss[0] - (-l1 if x >= 0 else x - l1)
        return sg - 1.0
    loss[0] = loss[0] - (-l1 if x <= 0 else -x - l1)
    return sg


cdef inline void adagrad_scalar(float* p, float* acc, float* g, double lr, double l2, double eps) noexcept nogil:
    cdef double gd = g[0] + l2 * p[0]
    cdef double a = acc[0] + gd * gd
    acc[0] = <float>a
    p[0] -= <float>(lr * gd / (sqrt(a) + eps))
    g[0] = 0


cdef extern from "nlmfeature/dense.h":
    void nlt_gemm_nn(int64_t i0, int64_t i1, int64_t N, int64_t K, const float* A, int64_t lda,
                     const float* B, int64_t ldb, float* C, int64_t ldc) noexcept nogil
    float nlt_nce_noise_row(const float* z, const float* add, float* g, int64_t n) noexcept nogil
    void nlt_prefetch_row(const float* p, int64_t n) noexcept nogil
    void nlt_prefetch_row_w(const float* p, int64_t n) noexcept nogil

#: examples (or rows) ahead whose parameter rows are prefetched
DEF AHEAD = 2

#: rows of a matrix product one thread takes at a time (fixed, so that results do not depend
#: on the thread count)
# The updates of a minibatch go row by row: the positions that name each distinct row are
# grouped first (a counting sort, stable), then one thread sums a row's contributions in
# position order in a buffer of its own and takes the AdaGrad step at once.  No gradient
# matrix is read or written, every row is summed in the same order whatever the thread count
# (results do not depend on it), and threads share the rows, not the scan.

cdef struct Groups:
    int64_t n            # distinct rows
    int32_t* rows        # (n,) the rows, in order of first appearance
    int64_t* start       # (n + 1,) row u's positions are order[start[u]:start[u + 1]]
    int32_t* order       # (M,) positions, ascending within a row


cdef inline void free_groups(Groups* g) noexcept nogil:
    free(g.rows); free(g.start); free(g.order)
    g.rows = NULL; g.start = NULL; g.order = NULL


cdef int group_rows(const int32_t* rows, int64_t M, Groups* g) noexcept nogil:
    """Group positions 0..M-1 by ``rows[i]`` (non-negative).  The distinct rows are found in
    an open-addressing table of at least 2M slots (cache-resident for a minibatch), so the cost
    is O(M) whatever the vocabulary.  Returns -1 when out of memory."""
    cdef int64_t cap = 16, mask, i, u, nu = 0, h
    cdef int32_t r
    cdef int32_t* key
    cdef int32_t* slot
    cdef int64_t* fill = <int64_t*>malloc((M + 1) * sizeof(int64_t))
    cdef int32_t* at = <int32_t*>malloc((M + 1) * sizeof(int32_t))
    while cap < 2 * M:
        cap = cap * 2
    mask = cap - 1
    key = <int32_t*>malloc(cap * sizeof(int32_t))
    slot = <int32_t*>malloc(cap * sizeof(int32_t))
    g.rows = <int32_t*>malloc((M + 1) * sizeof(int32_t))
    g.start = <int64_t*>malloc((M + 2) * sizeof(int64_t))
    g.order = <int32_t*>malloc((M + 1) * sizeof(int32_t))
    if key == NULL or slot == NULL or fill == NULL or at == NULL or g.rows == NULL or g.start == NULL \
            or g.order == NULL:
        free(key); free(slot); free(fill); free(at); free_groups(g)
        return -1
    for i in range(cap):
        key[i] = -1
    for i in range(M):
        r = rows[i]
        h = <int64_t>((<uint32_t>r * <uint32_t>2654435761u) & <uint32_t>mask)
        while key[h] != r and key[h] >= 0:
            h = (h + 1) & mask
        if key[h] < 0:
            key[h] = r
            slot[h] = <int32_t>nu
            g.rows[nu] = r
            fill[nu] = 0
            nu += 1
        u = slot[h]
        at[i] = <int32_t>u
        fill[u] += 1
    g.start[0] = 0
    for u in range(nu):
        g.start[u + 1] = g.start[u] + fill[u]
        fill[u] = g.start[u]
    for i in range(M):
        u = at[i]
        g.order[fill[u]] = <int32_t>i
        fill[u] += 1
    g.n = nu
    free(key); free(slot); free(fill); free(at)
    return 0


cdef int direct_owner_step(float* D, float* aD, const int64_t* buckets, const float* G, int64_t rows,
                           int DO, double lr, double eps, int t, int T) noexcept nogil:
    """:func:`direct_step` for the buckets b with b % T == t: their entries grouped by bucket
    (:func:`group_rows`, a table in the CPU caches whatever the hash space), each bucket's
    gradient summed in row order, then one AdaGrad step per bucket in order of first
    appearance.  Returns -1 when out of memory."""
    cdef int64_t n, b, M = 0, u, p
    cdef int o
    cdef Groups g
    cdef float s
    cdef int32_t* eb = <int32_t*>malloc(max(1, rows * DO) * sizeof(int32_t))
    cdef float* eg = <float*>malloc(max(1, rows * DO) * sizeof(float))
    if eb == NULL or eg == NULL:
        free(eb); free(eg)
        return -1
    for n in range(rows):
        for o in range(DO):
            b = buckets[n * DO + o]
            if b >= 0 and (T == 1 or b % T == t):
                eb[M] = <int32_t>b
                eg[M] = G[n]
                M = M + 1
    if group_rows(eb, M, &g) != 0:
        free(eb); free(eg)
        return -1
    for u in range(g.n):
        if u + 8 < g.n:
            nlt_prefetch_row_w(&D[g.rows[u + 8]], 1)
            nlt_prefetch_row_w(&aD[g.rows[u + 8]], 1)
        s = 0
        for p in range(g.start[u], g.start[u + 1]):
            s = s + eg[g.order[p]]
        adagrad_scalar(&D[g.rows[u]], &aD[g.rows[u]], &s, lr, 0.0, eps)
    free_groups(&g); free(eb); free(eg)
    return 0


cdef int direct_step(float[::1] D, float[::1] aD, const int64_t* buckets, const float* G, int64_t rows,
                     int DO, double lr, double eps, int T) noexcept nogil:
    """AdaGrad on the direct-feature weights ``D`` (sums ``aD``): row r (0..rows-1) adds its
    gradient ``G[r]`` to the buckets ``buckets[r*DO .. r*DO+DO-1]`` that are not negative (a
    negative bucket is a feature the frequency filter does not train).

    The gradients are summed in a table of the minibatch's buckets, not in a buffer the size
    of the hash space (whose scattered writes and marks missed the CPU caches).  With T > 1
    threads, thread t owns the buckets b with b % T == t; each bucket's gradient is summed in
    row order whatever T (results do not depend on the thread count).  Returns 0, or -1 when
    memory runs out."""
    cdef int t, bad = 0
    if T == 1:
        return direct_owner_step(&D[0], &aD[0], buckets, G, rows, DO, lr, eps, 0, 1)
    with parallel(num_threads=T):
        for t in prange(T, schedule="static"):
            if direct_owner_step(&D[0], &aD[0], buckets, G, rows, DO, lr, eps, t, T) != 0:
                bad += 1
    return -1 if bad else 0


cdef int sparse_rows_step(float[:, ::1] P, float[:, ::1] A, float* pb, float* ab,
                          const int32_t* rows, int64_t M, const float* const* x, const float* const* y,
                          const float* a, const float* b, double lr, double l2, double eps, int T) noexcept nogil:
    """AdaGrad on the rows of ``P`` (sums ``A``) named at positions 0..M-1 of ``rows``: row r's
    gradient is the sum over its positions i of ``x[i] * y[i]`` (elementwise, E-vectors) when
    ``y`` is given, else of ``a[i] * x[i]``; L2 ``l2`` on the rows.  ``A`` of one column: row-wise
    AdaGrad (one sum per row).  With ``pb`` (biases, sums ``ab``) the bias of row r takes the sum
    of ``b[i]`` (no L2).  Returns -1 when out of memory."""
    cdef Groups g
    cdef int64_t u, p, i, r
    cdef int E = P.shape[1], e, EA = A.shape[1]
    cdef bint rowwise = EA != E
    cdef float* buf
    cdef float bsum, af
    cdef const float* xrow
    cdef const float* yrow
    cdef int bad = 0
    if group_rows(rows, M, &g) != 0:
        return -1
    with parallel(num_threads=T):
        buf = <float*>calloc(E, sizeof(float))
        for u in prange(g.n, schedule="dynamic", chunksize=16):
            if buf == NULL:
                bad += 1
                continue
            if u + AHEAD < g.n:
                nlt_prefetch_row_w(&P[g.rows[u + AHEAD], 0], E)
                nlt_prefetch_row_w(&A[g.rows[u + AHEAD], 0], EA)
            r = g.rows[u]
            bsum = 0
            for p in range(g.start[u], g.start[u + 1]):
                i = g.order[p]
                xrow = x[i]
                if y != NULL:
                    yrow = y[i]
                    for e in range(E):
                        buf[e] = buf[e] + xrow[e] * yrow[e]
                else:
                    af = a[i]
                    for e in range(E):
                        buf[e] = buf[e] + af * xrow[e]
                if pb != NULL:
                    bsum = bsum + b[i]
            if rowwise:
                nlt_adagrad_rowf(&P[r, 0], &A[r, 0], buf, E, <float>lr, <float>l2, <float>eps)
            else:
                adagrad_row(&P[r, 0], &A[r, 0], buf, E, <float>lr, <float>l2, <float>eps)
            if pb != NULL:
                adagrad_scalar(&pb[r], &ab[r], &bsum, lr, 0.0, eps)
        free(buf)
    free_groups(&g)
    return -1 if bad else 0


cdef int lbl_context_step(float[:, ::1] R, float[:, ::1] W, float[::1] bias,
                          float[:, ::1] aR, float[:, ::1] aW, float[::1] abias,
                          const int32_t[:, ::1] ctx, int64_t n0, int64_t N, const float* dH,
                          bint has_bias, double lr, double l2, double eps, int T) noexcept nogil:
    """The context side of a diagonal LBL minibatch (the N n-grams of ``ctx`` from row ``n0``),
    given d(loss)/dh (``dH``, N x E): the gradient of W_j, sum_n dH_n * R[ctx_nj] (with the old
    R), and of each embedding, the sum of dH_n * W_j over its positions (n, j); then AdaGrad on
    the embeddings, W and the bias.  Returns -1 when out of memory."""
    cdef int64_t n, i
    cdef int c = ctx.shape[1], E = R.shape[1], j, e, bad = 0
    cdef float* gW = <float*>calloc((c + 1) * E, sizeof(float))
    cdef const float** xs = <const float**>malloc(max(1, N * c) * sizeof(float*))
    cdef const float** ys = <const float**>malloc(max(1, N * c) * sizeof(float*))
    cdef float* wrow
    cdef const float* drow
    cdef const float* xrow
    if gW == NULL or xs == NULL or ys == NULL:
        free(gW); free(xs); free(ys)
        return -1
    for i in range(N * c):
        xs[i] = dH + (i // c) * E
        ys[i] = &W[i % c, 0]
    with parallel(num_threads=T):
        for j in prange(c + 1, schedule="static"):
            wrow = gW + j * E
            if j < c:
                for n in range(N):
                    drow = dH + n * E
                    xrow = &R[ctx[n0 + n, j], 0]
                    for e in range(E):
                        wrow[e] = wrow[e] + drow[e] * xrow[e]
            elif has_bias:
                for n in range(N):
                    drow = dH + n * E
                    for e in range(E):
                        wrow[e] = wrow[e] + drow[e]
    # (the embeddings' step reads W, so W's waits)
    bad = sparse_rows_step(R, aR, NULL, NULL, &ctx[n0, 0], N * c, xs, ys, NULL, NULL, lr, l2, eps, T)
    for j in range(c):
        adagrad_row(&W[j, 0], &aW[j, 0], gW + j * E, E, <float>lr, <float>l2, <float>eps)
    if has_bias:
        adagrad_row(&bias[0], &abias[0], gW + c * E, E, <float>lr, 0.0, <float>eps)
    free(gW); free(xs); free(ys)
    return bad


DEF GEMM_ROWS = 64


cdef inline void lbl_hidden(float* h, float[:, ::1] R, float[:, ::1] W, float[::1] bias, bint has_bias,
                            const int32_t[:, ::1] ctx, int64_t n) noexcept nogil:
    """h = bias + sum_j W_j * R[ctx[n, j]] (a diagonal LBL's hidden layer for n-gram n)."""
    cdef int E = R.shape[1], e, j
    cdef const float* wrow
    cdef const float* xrow
    if has_bias:
        for e in range(E):
            h[e] = bias[e]
    else:
        for e in range(E):
            h[e] = 0
    for j in range(ctx.shape[1]):
        wrow = &W[j, 0]
        xrow = &R[ctx[n, j], 0]
        for e in range(E):
            h[e] = h[e] + wrow[e] * xrow[e]


cdef check_sums(float[:, ::1] R, float[:, ::1] aR, float[:, ::1] Q, float[:, ::1] aQ):
    """ValueError unless the AdaGrad sums of the embeddings and the output rows have a row per
    row, and one column per coordinate or one per row (row-wise)."""
    if (aR.shape[0] != R.shape[0] or aQ.shape[0] != Q.shape[0] or aR.shape[1] not in (1, R.shape[1])
            or aQ.shape[1] not in (1, Q.shape[1])):
        raise ValueError("AdaGrad sums inconsistent with their parameters")


cdef check_ngrams(const int32_t[:, ::1] ctx, const int32_t[::1] target, const int32_t* noise,
                  int64_t n_noise, int64_t V, int64_t VR):
    """ValueError unless every target and noise word is in [0, V) and every context word in
    [0, VR)."""
    cdef int64_t n
    cdef int j
    for n in range(n_noise):
        if noise[n] < 0 or noise[n] >= V:
            raise ValueError("noise word out of range")
    for n in range(ctx.shape[0]):
        if target[n] < 0 or target[n] >= V:
            raise ValueError("target word out of range")
        for j in range(ctx.shape[1]):
            if ctx[n, j] < 0 or ctx[n, j] >= VR:
                raise ValueError("context word out of range")


def nce_lbl_shared_step(float[:, ::1] R, float[:, ::1] W, float[::1] bias, float[:, ::1] Q, float[::1] qb,
                        float[:, ::1] aR, float[:, ::1] aW, float[::1] abias, float[:, ::1] aQ, float[::1] aqb,
                        const int32_t[:, ::1] ctx, const int32_t[::1] target, const int32_t[::1] noise,
                        const double[::1] logq, double lr, double l2, double eps, int threads=1):
    """One AdaGrad minibatch of a diagonal log-bilinear model trained by NCE with the S noise
    words ``noise`` shared by every n-gram of the minibatch (Zoph et al. 2016): the noise
    logits, their gradient with respect to h and the noise rows' gradients are three matrix
    products (N x E by E x S, N x S by S x E, S x N by N x E) instead of N x S row gathers.

    s(w) = Q_w . h_n + qb_w; each n-gram's NCE loss takes its target as the data word and all S
    noise words as its noise (k = S).  No direct features.  Threads take fixed blocks of rows
    of each product and whole rows of the updates, so results do not depend on ``threads``.
    Returns the summed loss."""
    cdef int64_t N = ctx.shape[0], n, r, V = Q.shape[0], VR = R.shape[0], S = noise.shape[0], s, ib, i0, i1
    cdef int c = ctx.shape[1], E = R.shape[1], j, e, T = max(1, threads), i
    cdef bint has_bias = bias.shape[0] > 0
    cdef double logS = log(<double>S) if S > 0 else 0.0, loss = 0, x, acc
    cdef int64_t nbN = (N + GEMM_ROWS - 1) // GEMM_ROWS, nbS = (S + GEMM_ROWS - 1) // GEMM_ROWS
    cdef float* H
    cdef float* dH
    cdef float* Z
    cdef float* GT
    cdef float* QS
    cdef float* QT
    cdef float* gQS
    cdef float* add
    cdef float* coef
    cdef float* bcoef
    cdef const float** xs
    cdef int32_t* rows
    cdef double* lossv
    cdef float* hrow
    cdef float* drow
    cdef const float* wrow
    cdef const float* xrow
    cdef float gf
    if W.shape[0] != c or W.shape[1] != E or Q.shape[1] != E or target.shape[0] != N:
        raise ValueError("inconsistent shapes")
    if S < 1:
        raise ValueError("no noise words")
    check_sums(R, aR, Q, aQ)
    check_ngrams(ctx, target, &noise[0], S, V, VR)
    if N == 0:
        return 0.0
    H = <float*>malloc(N * E * sizeof(float))
    dH = <float*>calloc(N * E, sizeof(float))
    Z = <float*>calloc(N * S, sizeof(float))
    GT = <float*>malloc(N * S * sizeof(float))
    QS = <float*>malloc(S * E * sizeof(float))
    QT = <float*>malloc(S * E * sizeof(float))
    gQS = <float*>calloc(S * E, sizeof(float))
    add = <float*>malloc(S * sizeof(float))
    coef = <float*>malloc((N + S) * sizeof(float))
    bcoef = <float*>malloc((N + S) * sizeof(float))
    xs = <const float**>malloc((N + S) * sizeof(float*))
    rows = <int32_t*>malloc((N + S) * sizeof(int32_t))
    lossv = <double*>malloc(N * sizeof(double))
    if (H == NULL or dH == NULL or Z == NULL or GT == NULL or QS == NULL or QT == NULL or gQS == NULL
            or add == NULL or coef == NULL or bcoef == NULL or xs == NULL or rows == NULL or lossv == NULL):
        free(H); free(dH); free(Z); free(GT); free(QS); free(QT); free(gQS); free(add); free(coef)
        free(bcoef); free(xs); free(rows); free(lossv)
        raise MemoryError()
    with nogil:
        # the noise rows, row-major (S x E) and transposed (E x S); their logit offsets
        for s in range(S):
            r = noise[s]
            for e in range(E):
                QS[s * E + e] = Q[r, e]
                QT[e * S + s] = Q[r, e]
            add[s] = <float>(qb[r] - logq[r] - logS)
    with nogil, parallel(num_threads=T):
        # 1. h_n
        for n in prange(N, schedule="static"):
            hrow = H + n * E
            lbl_hidden(hrow, R, W, bias, has_bias, ctx, n)
    with nogil, parallel(num_threads=T):
        # 2. noise logits Z = H QT
        for ib in prange(nbN, schedule="static"):
            i0 = ib * GEMM_ROWS
            i1 = min(N, i0 + GEMM_ROWS)
            nlt_gemm_nn(i0, i1, S, E, H, E, QT, S, Z, S)
    with nogil, parallel(num_threads=T):
        # 3. NCE gradients of the logits (Z becomes G), the data words' part of dH
        for n in prange(N, schedule="static"):
            lossv[n] = nlt_nce_noise_row(Z + n * S, add, Z + n * S, S)
            r = target[n]
            hrow = H + n * E
            x = <double>nlt_dotf(&Q[r, 0], hrow, E) + qb[r] - logq[r] - logS
            gf = <float>nce_term(x, True, &lossv[n])
            coef[n] = gf
            bcoef[n] = gf
            xs[n] = hrow
            rows[n] = <int32_t>r
            drow = dH + n * E
            wrow = &Q[r, 0]
            for e in range(E):
                drow[e] = gf * wrow[e]
    with nogil, parallel(num_threads=T):
        # 4. dH += G QS
        for ib in prange(nbN, schedule="static"):
            i0 = ib * GEMM_ROWS
            i1 = min(N, i0 + GEMM_ROWS)
            nlt_gemm_nn(i0, i1, E, S, Z, S, QS, E, dH, E)
        # 5. GT = G transposed; the noise biases' gradients
        for s in prange(S, schedule="static"):
            acc = 0
            for n in range(N):
                GT[s * N + n] = Z[n * S + s]
                acc = acc + Z[n * S + s]
            coef[N + s] = 1.0
            bcoef[N + s] = <float>acc
            xs[N + s] = gQS + s * E
            rows[N + s] = noise[s]
    with nogil, parallel(num_threads=T):
        # 6. the noise rows' gradients gQS = GT H
        for ib in prange(nbS, schedule="static"):
            i0 = ib * GEMM_ROWS
            i1 = min(S, i0 + GEMM_ROWS)
            nlt_gemm_nn(i0, i1, E, N, GT, N, H, E, gQS, E)
    for n in range(N):
        loss += lossv[n]
    with nogil:
        # 7. the output rows (data words, then noise words), 8. the context side
        i = sparse_rows_step(Q, aQ, &qb[0], &aqb[0], rows, N + S, xs, NULL, coef, bcoef, lr, l2, eps, T)
        if i == 0:
            i = lbl_context_step(R, W, bias, aR, aW, abias, ctx, 0, N, dH, has_bias, lr, l2, eps, T)
    free(H); free(dH); free(Z); free(GT); free(QS); free(QT); free(gQS); free(add); free(coef)
    free(bcoef); free(xs); free(rows); free(lossv)
    if i != 0:
        raise MemoryError()
    return loss


cdef int nce_lbl_core(float[:, ::1] R, float[:, ::1] W, float[::1] bias, float[:, ::1] Q, float[::1] qb,
                      float[::1] D, float[:, ::1] aR, float[:, ::1] aW, float[::1] abias, float[:, ::1] aQ,
                      float[::1] aqb, float[::1] aD,
                      const int32_t[:, ::1] ctx, const int32_t[::1] target, const int32_t* noise, int k,
                      int64_t n0, int64_t N, const double[::1] logq, int DO, int64_t hash_space,
                      const uint8_t[::1] allowed, double lr, double l2, double eps, int T,
                      double* loss_out) noexcept nogil:
    """:func:`nce_lbl_step` on the N n-grams from row ``n0`` of ``ctx`` and ``target``, whose
    k noise words each are ``noise`` (N x k, row-major; all checked by the caller), with T
    threads; the summed loss in ``*loss_out``.  Returns 0, or -1 when out of memory."""
    cdef int64_t n, r, b
    cdef int c = ctx.shape[1], K = k + 1, E = R.shape[1], j, e, o, i
    cdef bint has_bias = bias.shape[0] > 0, filt = allowed.shape[0] > 0
    cdef double logk = log(<double>(K - 1)) if K > 1 else 0.0, x, s, loss = 0
    cdef uint64_t* st
    cdef uint64_t tk
    cdef int64_t* buckets
    cdef float* H
    cdef float* dH
    cdef float* G
    cdef const float** xs
    cdef double* lossv
    cdef int32_t* cand
    cdef float* hrow
    cdef float* drow
    cdef float* wrow
    cdef float gf
    loss_out[0] = 0.0
    if N <= 0:
        return 0
    H = <float*>malloc(N * E * sizeof(float))
    dH = <float*>calloc(N * E, sizeof(float))
    G = <float*>malloc(N * K * sizeof(float))
    xs = <const float**>malloc(N * K * sizeof(float*))
    lossv = <double*>malloc(N * sizeof(double))
    cand = <int32_t*>malloc(N * K * sizeof(int32_t))
    buckets = <int64_t*>malloc(max(1, N * K * DO) * sizeof(int64_t))
    if H == NULL or dH == NULL or G == NULL or xs == NULL or lossv == NULL or cand == NULL or buckets == NULL:
        free(H); free(dH); free(G); free(xs); free(lossv); free(cand); free(buckets)
        return -1
    with parallel(num_threads=T):
        # 0. candidates and their direct-feature buckets
        st = <uint64_t*>malloc(16 * sizeof(uint64_t))
        for n in prange(N, schedule="static"):
            cand[n * K] = target[n0 + n]
            for j in range(1, K):
                cand[n * K + j] = noise[n * k + j - 1]
            if DO:
                st[0] = splitmix64(<uint64_t>0)
                for o in range(1, DO):
                    st[o] = splitmix64(st[o - 1] ^ <uint64_t>ctx[n0 + n, c - o])
                for j in range(K):
                    tk = (<uint64_t>cand[n * K + j]) << 32
                    for o in range(DO):
                        buckets[(n * K + j) * DO + o] = <int64_t>hash_bucket(splitmix64(st[o] ^ tk), <uint64_t>hash_space)
                if filt:   # features the filter does not train: -1, neither read nor updated
                    for o in range(n * K * DO, (n + 1) * K * DO):
                        b = buckets[o]
                        buckets[o] = b if (allowed[b >> 3] >> (b & 7)) & 1 else -1
        free(st)
    with parallel(num_threads=T):
        # 1. forward, logits, NCE gradient of the logits, d(loss)/dh -- by example
        for n in prange(N, schedule="static"):
            if n + AHEAD < N:
                for j in range(c):
                    nlt_prefetch_row(&R[ctx[n0 + n + AHEAD, j], 0], E)
                for j in range(K):
                    nlt_prefetch_row(&Q[cand[(n + AHEAD) * K + j], 0], E)
                for o in range(K * DO):
                    b = buckets[(n + AHEAD) * K * DO + o]
                    if b >= 0:
                        nlt_prefetch_row(&D[b], 1)
            hrow = H + n * E
            lbl_hidden(hrow, R, W, bias, has_bias, ctx, n0 + n)
            lossv[n] = 0
            drow = dH + n * E
            for j in range(K):
                r = cand[n * K + j]
                s = <double>nlt_dotf(&Q[r, 0], hrow, E) + qb[r]
                for o in range(DO):
                    b = buckets[(n * K + j) * DO + o]
                    if b >= 0:
                        s = s + D[b]
                x = s - logq[r] - logk
                gf = <float>nce_term(x, j == 0, &lossv[n])
                G[n * K + j] = gf
                xs[n * K + j] = hrow
                wrow = &Q[r, 0]
                for e in range(E):
                    drow[e] = drow[e] + gf * wrow[e]
    for n in range(N):
        loss += lossv[n]
    i = 0
    if DO:  # 2. direct features
        i = direct_step(D, aD, buckets, G, N * K, DO, lr, eps, T)
    if i == 0:
        # 3. the output rows and biases, 4. the context side: embeddings, W and the bias
        i = sparse_rows_step(Q, aQ, &qb[0], &aqb[0], cand, N * K, xs, NULL, G, G, lr, l2, eps, T)
    if i == 0:
        i = lbl_context_step(R, W, bias, aR, aW, abias, ctx, n0, N, dH, has_bias, lr, l2, eps, T)
    free(H); free(dH); free(G); free(xs); free(lossv); free(cand); free(buckets)
    loss_out[0] = loss
    return i


cdef check_lbl_step(float[:, ::1] R, float[:, ::1] W, float[:, ::1] Q, float[::1] D, float[:, ::1] aR,
                    float[:, ::1] aQ, const int32_t[:, ::1] ctx, const int32_t[::1] target,
                    const int32_t* noise, int64_t n_noise, int direct_order, int64_t hash_space,
                    const uint8_t[::1] allowed):
    """ValueError unless the arrays of :func:`nce_lbl_step` fit together (``noise``: its
    ``n_noise`` noise words, or NULL)."""
    cdef int64_t N = ctx.shape[0]
    if direct_order > 16:
        raise ValueError("direct order above 16")
    if (W.shape[0] != ctx.shape[1] or W.shape[1] != R.shape[1] or Q.shape[1] != R.shape[1]
            or target.shape[0] != N):
        raise ValueError("inconsistent shapes")
    check_sums(R, aR, Q, aQ)
    if direct_order and D.shape[0] < hash_space:
        raise ValueError("direct weights shorter than the hash space")
    if direct_order and hash_space > 0x7FFFFFFF:
        raise ValueError("hash space above 2^31 - 1 (buckets are grouped as int32)")
    if direct_order and allowed.shape[0] > 0 and allowed.shape[0] * 8 < hash_space:
        raise ValueError("the feature filter is shorter than the hash space")
    check_ngrams(ctx, target, noise, n_noise, Q.shape[0], R.shape[0])


def nce_lbl_step(float[:, ::1] R, float[:, ::1] W, float[::1] bias, float[:, ::1] Q, float[::1] qb,
                 float[::1] D,
                 float[:, ::1] aR, float[:, ::1] aW, float[::1] abias, float[:, ::1] aQ, float[::1] aqb,
                 float[::1] aD,
                 const int32_t[:, ::1] ctx, const int32_t[::1] target, const int32_t[:, ::1] noise,
                 const double[::1] logq, int direct_order, int64_t hash_space, const uint8_t[::1] allowed,
                 double lr, double l2, double eps, int threads=1):
    """One AdaGrad minibatch of a diagonal log-bilinear model trained by NCE, in one call
    without the GIL: the numpy path of :class:`nlmfeature.training.objective.Objective` and
    :class:`nlmfeature.training.optim.AdaGrad` for this architecture, fused.

    h_n = bias + sum_j W_j * R[ctx_nj]; s(w) = Q_w . h_n + qb_w + direct(ctx_n, w); NCE loss
    with the k noise words ``noise[n]`` (log q from ``logq``).  Gradients are summed over the
    minibatch, then every touched row of R, Q, qb, D and the dense W (and ``bias``, when it
    has entries) take an AdaGrad step (L2 ``l2`` on R, Q, W).

    ``allowed`` (when not empty) is the frequency filter of the direct features as a bitmap
    (``numpy.packbits(filter, bitorder="little")``, a bit per bucket, so that its lookups stay in
    the CPU caches): a bucket whose bit is 0 is neither trained nor read (it counts as 0, which
    its weight is in every model the trainer makes: the filter allows each non-zero weight of an
    initial model), so the many unseen n-grams of noise words cost one bit's lookup, not a
    weight's.

    Threads split the examples for the forward and backward passes, then the rows for the
    updates, and every row's gradient is summed in example order whatever the thread count:
    results do not depend on ``threads``.  Returns the summed loss."""
    cdef double loss = 0
    cdef int rc
    cdef const int32_t* nz = &noise[0, 0] if noise.shape[0] and noise.shape[1] else NULL
    if noise.shape[0] != ctx.shape[0]:
        raise ValueError("inconsistent shapes")
    check_lbl_step(R, W, Q, D, aR, aQ, ctx, target, nz, noise.shape[0] * noise.shape[1], direct_order,
                   hash_space, allowed)
    with nogil:
        rc = nce_lbl_core(R, W, bias, Q, qb, D, aR, aW, abias, aQ, aqb, aD,
                          ctx, target, nz, noise.shape[1], 0, ctx.shape[0], logq, direct_order, max(1, hash_space), allowed,
                          lr, l2, eps, max(1, threads), &loss)
    if rc != 0:
        raise MemoryError()
    return loss


def nce_lbl_rounds(float[:, ::1] R, float[:, ::1] W, float[::1] bias, float[:, ::1] Q, float[::1] qb,
                   float[::1] D,
                   float[:, ::1] aR, float[:, ::1] aW, float[::1] abias, float[:, ::1] aQ, float[::1] aqb,
                   float[::1] aD,
                   const int32_t[:, ::1] ctx, const int32_t[::1] target, const int64_t[::1] bounds,
                   const double[::1] accept, const int32_t[::1] alias, const int32_t[::1] values, int k,
                   uint64_t seed, const uint64_t[::1] steps,
                   const double[::1] logq, int direct_order, int64_t hash_space,
                   const uint8_t[::1] allowed, double lr, double l2, double eps):
    """Hogwild! (Recht et al. 2011): the M = len(bounds) - 1 minibatches ``bounds[m] ..
    bounds[m + 1] - 1`` of the rows of ``ctx`` and ``target``, trained at once, each by
    :func:`nce_lbl_step` on a thread of its own (M threads), all reading and updating the
    shared parameters and AdaGrad sums without locks.  Each thread first draws its minibatch's
    k noise words per n-gram from one alias table (``accept``, ``alias``, ``values``: one block
    of :func:`alias_blocks`) as :func:`sample_blocks` would with ``seed`` and ``steps[m]``, so
    that nothing of a round but fetching its n-grams is serial.  An update may overwrite
    another thread's concurrent update of the same weight, so the result depends on the
    threads' timing.  Returns the M summed losses (float64)."""
    cdef int64_t M = bounds.shape[0] - 1, m, i, size = values.shape[0], V = Q.shape[0]
    cdef int rc = 0, bad = 0, ok
    cdef int32_t* noise
    cdef uint64_t base
    if M < 1:
        raise ValueError("no minibatch")
    if bounds[0] != 0 or bounds[M] != ctx.shape[0]:
        raise ValueError("the minibatch bounds do not cover the rows")
    for m in range(M):
        if bounds[m + 1] < bounds[m]:
            raise ValueError("the minibatch bounds decrease")
    if steps.shape[0] < M:
        raise ValueError("fewer noise steps than minibatches")
    if k < 1 or size < 1 or accept.shape[0] < size or alias.shape[0] < size:
        raise ValueError("no noise table, or no noise words")
    check_lbl_step(R, W, Q, D, aR, aQ, ctx, target, NULL, 0, direct_order, hash_space, allowed)
    out = np.zeros(M, dtype=np.float64)
    cdef double[::1] losses = out
    for m in prange(M, nogil=True, num_threads=M, schedule="static", chunksize=1):
        noise = <int32_t*>malloc(max(1, (bounds[m + 1] - bounds[m]) * k) * sizeof(int32_t))
        if noise == NULL:
            rc += 1
            continue
        base = stream_base(seed, steps[m])
        for i in range(bounds[m + 1] - bounds[m]):
            alias_row(&accept[0], &alias[0], &values[0], 0, size, base, i, k, noise + i * k)
        ok = 1
        for i in range((bounds[m + 1] - bounds[m]) * k):
            if noise[i] < 0 or noise[i] >= V:
                ok = 0
                break
        if not ok:
            bad += 1
        else:
            rc += nce_lbl_core(R, W, bias, Q, qb, D, aR, aW, abias, aQ, aqb, aD,
                               ctx, target, noise, k, bounds[m], bounds[m + 1] - bounds[m], logq, direct_order,
                               max(1, hash_space), allowed, lr, l2, eps, 1, &losses[m])
        free(noise)
    if bad:
        raise ValueError("noise word out of range")
    if rc != 0:
        raise MemoryError()
    return out
