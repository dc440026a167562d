# Included by _scorer.pyx (one compilation unit): Small vector kernels (written so that gcc vectorises them) and activations.

# ---------------------------------------------------------------------------------------
# small kernels (written so that gcc vectorises them)
# ---------------------------------------------------------------------------------------

cdef inline float dotf(const float* a, const float* b, int n) noexcept nogil:
    cdef float s = 0
    cdef int i
    for i in range(n):
        s += a[i] * b[i]
    return s


cdef inline void addf(float* acc, const float* x, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        acc[i] += x[i]


cdef inline void axpyf(float* acc, const float* x, float a, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        acc[i] += a * x[i]


cdef inline void mulaccf(float* acc, const float* x, const float* y, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        acc[i] += x[i] * y[i]


cdef inline void init_bias(float* v, const float* bias, int n) noexcept nogil:
    if bias != NULL:
        memcpy(v, bias, n * sizeof(float))
    else:
        memset(v, 0, n * sizeof(float))


cdef void activate(float* v, int n, int act) noexcept nogil:
    cdef int i
    if act == ACT_RELU:
        for i in range(n):
            v[i] = v[i] if v[i] > 0 else 0
    elif act == ACT_SIGMOID:
        for i in range(n):
            v[i] = 1.0 / (1.0 + expf(-v[i]))
    elif act == ACT_TANH:
        for i in range(n):
            v[i] = tanhf(v[i])
    elif act == ACT_HARDTANH:
        for i in range(n):
            v[i] = -1 if v[i] < -1 else (1 if v[i] > 1 else v[i])



# Vector kernels in C, written so that gcc vectorises them (-O3 -march=native
# -fassociative-math): several output rows per pass over the input vector, and a float
# exp by range reduction + a degree-6 polynomial for 2^f (relative error 1e-7, the
# precision of the float logits it sums).
cdef extern from *:
    """
    #include <math.h>
    #include <string.h>
    #if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__)) || defined(__F16C__)
    #include <immintrin.h>
    #endif
    /* Products of float rows and a double vector (the position terms of linear outputs), in
       one fixed order -- four lanes over d, then (l0 + l1) + (l2 + l3), then the tail -- so that
       an element of a term vector and the same product alone agree to the bit.  Compiled
       without -fassociative-math (which would let gcc reorder them differently where they
       are inlined). */
    #pragma GCC push_options
    #pragma GCC optimize ("no-associative-math")
    #ifdef __FMA__
    #define NLM_FMAD(x, y, a) __builtin_fma((x), (y), (a))
    #else
    #define NLM_FMAD(x, y, a) ((a) + (x) * (y))
    #endif
    /* each written once over the loaders of its rows' type (float rows, or float16 rows
       read as stored: a half converts to float, and so to double, exactly, so the twins give
       the same bits): L1 one value as double, L4 four as __m256d */
    #if defined(__F16C__)
    #define NLM_H1D(p) ((double)_cvtsh_ss(*(p)))
    #define NLM_H4D(p) _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i*)(p))))
    #else
    #define NLM_H1D(p) 0.0
    #define NLM_H4D(p) _mm256_setzero_pd()
    #endif
    #define NLM_F1D(p) ((double)*(p))
    #define NLM_F4D(p) _mm256_cvtps_pd(_mm_loadu_ps(p))
    #if defined(__AVX2__) && defined(__FMA__)
    #define NLM_DOT_D_VEC(L1, L4) \
        double l[4]; \
        __m256d a = _mm256_setzero_pd(); \
        for (; d + 4 <= D; d += 4) a = _mm256_fmadd_pd(L4(w + d), _mm256_loadu_pd(p + d), a); \
        _mm256_storeu_pd(l, a);
    #else
    #define NLM_DOT_D_VEC(L1, L4) \
        double l[4] = {0, 0, 0, 0}; \
        int k; \
        for (; d + 4 <= D; d += 4) \
            for (k = 0; k < 4; k++) l[k] = NLM_FMAD(L1(w + d + k), p[d + k], l[k]);
    #endif
    #define NLM_DOT_D(NAME, T, L1, L4) \
    static double NAME(const T* w, const double* p, int D) { \
        double s; \
        int d = 0; \
        NLM_DOT_D_VEC(L1, L4) \
        s = (l[0] + l[1]) + (l[2] + l[3]); \
        for (; d < D; d++) s = NLM_FMAD(L1(w + d), p[d], s); \
        return s; \
    }
    NLM_DOT_D(nlm_dot_fd, float, NLM_F1D, NLM_F4D)
    NLM_DOT_D(nlm_dot_hd, uint16_t, NLM_H1D, NLM_H4D)
    /* out[k] = W[idx[k]] . p (W[k] . p when idx is NULL) for k < n: the row dot (nlm_dot_fd,
       nlm_dot_hd) of each row, four rows at a time (the next four rows' first lines prefetched
       when gathered) */
    #if defined(__AVX2__) && defined(__FMA__)
    #define NLM_GEMV_D_VEC(T, L1, L4) \
        int d, k, q; \
        for (; r + 4 <= n; r += 4) { \
            const T* w[4]; \
            __m256d a[4]; \
            double l[4], s; \
            for (k = 0; k < 4; k++) { \
                w[k] = W + (size_t)(idx ? idx[r + k] : r + k) * D; \
                a[k] = _mm256_setzero_pd(); \
            } \
            if (idx) \
                for (k = r + 4; k < r + 8 && k < n; k++) { \
                    __builtin_prefetch(W + (size_t)idx[k] * D); \
                    __builtin_prefetch(W + (size_t)idx[k] * D + 64 / sizeof(T)); \
                } \
            for (d = 0; d + 4 <= D; d += 4) { \
                __m256d x = _mm256_loadu_pd(p + d); \
                a[0] = _mm256_fmadd_pd(L4(w[0] + d), x, a[0]); \
                a[1] = _mm256_fmadd_pd(L4(w[1] + d), x, a[1]); \
                a[2] = _mm256_fmadd_pd(L4(w[2] + d), x, a[2]); \
                a[3] = _mm256_fmadd_pd(L4(w[3] + d), x, a[3]); \
            } \
            for (k = 0; k < 4; k++) { \
                _mm256_storeu_pd(l, a[k]); \
                s = (l[0] + l[1]) + (l[2] + l[3]); \
                for (q = d; q < D; q++) s = NLM_FMAD(L1(w[k] + q), p[q], s); \
                out[r + k] = s; \
            } \
        }
    #else
    #define NLM_GEMV_D_VEC(T, L1, L4)
    #endif
    #define NLM_GEMV_D(NAME, T, DOT, L1, L4) \
    static void NAME(const T* W, const int32_t* idx, int n, int D, const double* p, double* out) { \
        int r = 0; \
        NLM_GEMV_D_VEC(T, L1, L4) \
        for (; r < n; r++) out[r] = DOT(W + (size_t)(idx ? idx[r] : r) * D, p, D); \
    }
    NLM_GEMV_D(nlm_gemv_rows_d, float, nlm_dot_fd, NLM_F1D, NLM_F4D)
    NLM_GEMV_D(nlm_gemv_rows_hd, uint16_t, nlm_dot_hd, NLM_H1D, NLM_H4D)
    /* a + (b - c) in that order: a class's log-probability plus the word's within-class one
       (b, c may be huge and nearly equal, e.g. a mutated bias, and must not swallow a) */
    static double nlm_add_diff(double a, double b, double c) {
        return a + (b - c);
    }
    #pragma GCC pop_options
    /* out[c] = bias[c] (none if NULL) + sum_d h[d] * WT[d, c] for c < n; WT is (D, npad), npad a multiple of
       128 (zero columns).  Each column's sum is fma(h[d], WT[d, c], sum) over d in order, so
       every version below gives the same bits.  With AVX-512: 8 x 16-float accumulators stay in
       registers (gcc vector extensions).  With AVX2 (16 registers of 8 floats) those 8 x 16
       floats did not fit: gcc kept the accumulators on the stack and built the broadcast of h[d]
       from 16 scalar stores, ~10x the arithmetic's cost (a class normaliser of 77 classes: the
       largest part of a class model's cost in Moses on such a machine); there, 8 x 8-float
       accumulators per 64 columns, with explicit FMA intrinsics. */
    typedef float nlm_v16 __attribute__((vector_size(64)));
    static inline nlm_v16 nlm_load16(const float* p) { nlm_v16 v; memcpy(&v, p, sizeof v); return v; }
    static inline void nlm_gemv_t(const float* WT, int D, int n, int npad, const float* h,
                                  const float* bias, float* out) {
        int c0, d, c;
    #if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
        for (c0 = 0; c0 < npad; c0 += 64) {
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
            for (d = 0; d < D; d++) {
                const float* r = WT + (size_t)d * npad + c0;
                __m256 x = _mm256_set1_ps(h[d]);
                a0 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r), a0);
                a1 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + 8), a1);
                a2 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + 16), a2);
                a3 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + 24), a3);
                a4 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + 32), a4);
                a5 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + 40), a5);
                a6 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + 48), a6);
                a7 = _mm256_fmadd_ps(x, _mm256_loadu_ps(r + 56), a7);
            }
            _mm256_storeu_ps(out + c0, a0);       _mm256_storeu_ps(out + c0 + 8, a1);
            _mm256_storeu_ps(out + c0 + 16, a2);  _mm256_storeu_ps(out + c0 + 24, a3);
            _mm256_storeu_ps(out + c0 + 32, a4);  _mm256_storeu_ps(out + c0 + 40, a5);
            _mm256_storeu_ps(out + c0 + 48, a6);  _mm256_storeu_ps(out + c0 + 56, a7);
        }
        if (bias) for (c = 0; c < n; c++) out[c] += bias[c];
        return;
    #endif
        for (c0 = 0; c0 < npad; c0 += 128) {
            nlm_v16 a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}, a4 = {0}, a5 = {0}, a6 = {0}, a7 = {0};
            for (d = 0; d < D; d++) {
                const float* r = WT + (size_t)d * npad + c0;
                nlm_v16 x = (nlm_v16){0} + h[d];
                a0 += x * nlm_load16(r);       a1 += x * nlm_load16(r + 16);
                a2 += x * nlm_load16(r + 32);  a3 += x * nlm_load16(r + 48);
                a4 += x * nlm_load16(r + 64);  a5 += x * nlm_load16(r + 80);
                a6 += x * nlm_load16(r + 96);  a7 += x * nlm_load16(r + 112);
            }
            memcpy(out + c0, &a0, 64);       memcpy(out + c0 + 16, &a1, 64);
            memcpy(out + c0 + 32, &a2, 64);  memcpy(out + c0 + 48, &a3, 64);
            memcpy(out + c0 + 64, &a4, 64);  memcpy(out + c0 + 80, &a5, 64);
            memcpy(out + c0 + 96, &a6, 64);  memcpy(out + c0 + 112, &a7, 64);
        }
        if (bias) for (c = 0; c < n; c++) out[c] += bias[c];
    }
    #ifdef __FMA__
    #define NLM_FMAF(x, y, a) fmaf((x), (y), (a))
    #else
    #define NLM_FMAF(x, y, a) ((a) + (x) * (y))
    #endif
    /* Float16 rows (models stored with `storage: float16`, ModelC.half): the same
       arithmetic as on their float32 widening -- a half converts to float exactly -- with half
       the bytes loaded from memory, where a decoder's lookups find the rows evicted.  Each
       kernel is written once over a row-loading macro, for half rows and for float rows (the
       twin a build without F16C, or a model made with half_rows=False, runs): both give the same bits. */
    #if defined(__F16C__)
    #define NLM_HAVE_HALF 1
    #define NLM_H1(p) _cvtsh_ss(*(p))
    #define NLM_H8(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p)))
    #define NLM_H16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p)))
    #else
    #define NLM_HAVE_HALF 0
    #define NLM_H1(p) 0.f
    #define NLM_H8(p) _mm256_setzero_ps()
    #define NLM_H16(p) _mm512_setzero_ps()
    #endif
    #define NLM_F1(p) (*(p))
    static inline float nlm_half_to_float(const uint16_t* p) { return NLM_H1(p); }
    #define NLM_F8(p) _mm256_loadu_ps(p)
    #define NLM_F16(p) _mm512_loadu_ps(p)
    /* diagonal log-bilinear context layer in one pass: v[i] = bias[i] + sum_j W[j, i] * emb[ctx[j], i],
       embedding rows of type T.  Each element gets the same fused multiply-adds in the same
       order as one pass per context position (which gcc contracts to FMA where the target has
       it), so the result is bit-identical to them; v is written once instead of read and
       written per position. */
    #if defined(__AVX512F__)
    #define NLM_DIAG_512(T, L16) \
        for (; i + 16 <= E; i += 16) { \
            __m512 a = bias ? _mm512_loadu_ps(bias + i) : _mm512_setzero_ps(); \
            for (j = 0; j < c; j++) \
                a = _mm512_fmadd_ps(_mm512_loadu_ps(W + (size_t)j * E + i), L16(emb + (size_t)ctx[j] * E + i), a); \
            _mm512_storeu_ps(v + i, a); \
        }
    #else
    #define NLM_DIAG_512(T, L16)
    #endif
    #if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    #define NLM_DIAG_256(T, L8) \
        for (; i + 8 <= E; i += 8) { \
            __m256 a = bias ? _mm256_loadu_ps(bias + i) : _mm256_setzero_ps(); \
            for (j = 0; j < c; j++) \
                a = _mm256_fmadd_ps(_mm256_loadu_ps(W + (size_t)j * E + i), L8(emb + (size_t)ctx[j] * E + i), a); \
            _mm256_storeu_ps(v + i, a); \
        }
    #else
    #define NLM_DIAG_256(T, L8)
    #endif
    #define NLM_DIAG(NAME, T, L1, L8, L16) \
    static inline void NAME(const float* bias, const float* W, const T* emb, const int32_t* ctx, int c, int E, \
                            float* v) { \
        int i = 0, j; \
        NLM_DIAG_512(T, L16) \
        NLM_DIAG_256(T, L8) \
        for (; i < E; i++) { \
            float a = bias ? bias[i] : 0.f; \
            for (j = 0; j < c; j++) a = NLM_FMAF(W[(size_t)j * E + i], L1(emb + (size_t)ctx[j] * E + i), a); \
            v[i] = a; \
        } \
    }
    NLM_DIAG(nlm_diag_forward, float, NLM_F1, NLM_F8, NLM_F16)
    NLM_DIAG(nlm_diag_forward_h, uint16_t, NLM_H1, NLM_H8, NLM_H16)
    /* a row . h in one fixed order: 16-lane (8-lane with AVX2, 8 scalar lanes elsewhere)
       partial sums (with AVX-512, an 8-lane one for a remainder of 8: D = 200), reduced, then
       the tail; rows of type T */
    #if defined(__AVX512F__)
    #define NLM_DOT_VEC(L1, L8, L16) \
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps(); \
        for (; i + 32 <= D; i += 32) { \
            a0 = _mm512_fmadd_ps(L16(r + i), _mm512_loadu_ps(h + i), a0); \
            a1 = _mm512_fmadd_ps(L16(r + i + 16), _mm512_loadu_ps(h + i + 16), a1); \
        } \
        for (; i + 16 <= D; i += 16) a0 = _mm512_fmadd_ps(L16(r + i), _mm512_loadu_ps(h + i), a0); \
        __m256 a2 = _mm256_setzero_ps(); \
        for (; i + 8 <= D; i += 8) a2 = _mm256_fmadd_ps(L8(r + i), _mm256_loadu_ps(h + i), a2); \
        s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_zextps256_ps512(a2)));
    #elif defined(__AVX2__) && defined(__FMA__)
    #define NLM_DOT_VEC(L1, L8, L16) \
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(); \
        float l[8]; int k; \
        for (; i + 16 <= D; i += 16) { \
            a0 = _mm256_fmadd_ps(L8(r + i), _mm256_loadu_ps(h + i), a0); \
            a1 = _mm256_fmadd_ps(L8(r + i + 8), _mm256_loadu_ps(h + i + 8), a1); \
        } \
        for (; i + 8 <= D; i += 8) a0 = _mm256_fmadd_ps(L8(r + i), _mm256_loadu_ps(h + i), a0); \
        _mm256_storeu_ps(l, _mm256_add_ps(a0, a1)); \
        for (k = 0; k < 8; k++) s += l[k];
    #else
    /* any other target: eight independent lanes (which the compiler maps onto its vectors) */
    #define NLM_DOT_VEC(L1, L8, L16) \
        float l[8] = {0, 0, 0, 0, 0, 0, 0, 0}; int k; \
        for (; i + 8 <= D; i += 8) \
            for (k = 0; k < 8; k++) l[k] = NLM_FMAF(L1(r + i + k), h[i + k], l[k]); \
        for (k = 0; k < 8; k++) s += l[k];
    #endif
    #define NLM_DOT(NAME, T, L1, L8, L16) \
    static inline float NAME(const T* r, const float* h, int D) { \
        int i = 0; \
        float s = 0.f; \
        NLM_DOT_VEC(L1, L8, L16) \
        for (; i < D; i++) s = NLM_FMAF(L1(r + i), h[i], s); \
        return s; \
    }
    NLM_DOT(nlm_dot_rh, uint16_t, NLM_H1, NLM_H8, NLM_H16)
    NLM_DOT(nlm_dot_rf, float, NLM_F1, NLM_F8, NLM_F16)
    /* out[k] = W[idx[k]] . h (W[k] . h when idx is NULL) for k < n: the normalisers' rows,
       each with the fixed-order row dot (nlm_dot_rh on a float16 model's half rows, nlm_dot_rf
       on float rows: the same bits on their widening, and for a float16 model the very value
       of that word's own logit); gathered rows four ahead prefetched.  One row at a time:
       the rows are independent, so their sums overlap in the pipeline; faster than four rows
       per pass over h (measured: a softmax normaliser over 8k words 1.5x, class rows as fast) */
    #define NLM_GEMV_R(NAME, T, DOT) \
    static void NAME(const T* W, const int32_t* idx, int n, int D, const float* h, float* out) { \
        int r; \
        for (r = 0; r < n; r++) { \
            if (idx && r + 4 < n) { \
                __builtin_prefetch(W + (size_t)idx[r + 4] * D); \
                __builtin_prefetch(W + (size_t)idx[r + 4] * D + 64 / sizeof(T)); \
            } \
            out[r] = DOT(W + (size_t)(idx ? idx[r] : r) * D, h, D); \
        } \
    }
    NLM_GEMV_R(nlm_gemv_rows_rh, uint16_t, nlm_dot_rh)
    NLM_GEMV_R(nlm_gemv_rows_rf, float, nlm_dot_rf)
    static inline float nlm_expf_neg(float x) {   /* e^x for x <= 0 */
        float t, fl, f, p;
        union { int i; float f; } u;
        x = x < -87.f ? -87.f : x;
        t = x * 1.4426950408889634f;
        fl = floorf(t);
        f = t - fl;
        p = 0.00021690620633307844f;
        p = p * f + 0.0012443091254681349f;
        p = p * f + 0.009678469970822334f;
        p = p * f + 0.05548352748155594f;
        p = p * f + 0.2402298003435135f;
        p = p * f + 0.6931470036506653f;
        p = p * f + 1.0f;
        u.i = ((int)fl + 127) << 23;
        return p * u.f;
    }
    #include <sys/stat.h>
    #include <unistd.h>
    static int nlm_fstat_identity(int fd, long long* size, long long* mtime_ns) {
        struct stat st;
        if (fstat(fd, &st) != 0) return -1;
        *size = (long long)st.st_size;
        *mtime_ns = (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec;
        return 0;
    }
    /* log sum exp in blocks of 256 terms: float sums inside a block (vectorised), blocks
       added in double.  A float running sum over a 40k-word vocabulary loses ~2e-6 of the
       total without -march=native's wide vectors (NLMFEATURE_PORTABLE=1 builds), which
       breaks sum-to-one; per block the float error stays ~1e-8. */
    /* sum over i < n of b[i] * p[0][i] * ... * p[np-1][i], the products and the sum in double */
    static double nlm_prod_sum_f(const float* b, const float* const* p, int np, int n) {
        double s = 0.0, v;
        int i, j;
        if (np == 2) {
            const float* p0 = p[0];
            const float* p1 = p[1];
            for (i = 0; i < n; i++) s += (double)b[i] * p0[i] * p1[i];
            return s;
        }
        for (i = 0; i < n; i++) {
            v = b[i];
            for (j = 0; j < np; j++) v *= p[j][i];
            s += v;
        }
        return s;
    }
    static double nlm_logsumexp_f(const float* x, int n) {
        float m = -INFINITY, b;
        double s = 0.0;
        int i, j, end;
        for (i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
        if (!(m > -INFINITY)) return -INFINITY;
        for (i = 0; i < n; i = end) {
            end = i + 256 < n ? i + 256 : n;
            b = 0.f;
            for (j = i; j < end; j++) b += nlm_expf_neg(x[j] - m);
            s += (double)b;
        }
        return (double)m + log(s);
    }
    """
    void nlm_gemv_rows_d(const float* W, const int32_t* idx, int n, int D, const double* p, double* out) nogil
    void nlm_gemv_rows_hd(const uint16_t* W, const int32_t* idx, int n, int D, const double* p, double* out) nogil
    double nlm_dot_fd(const float* w, const double* p, int D) nogil
    double nlm_dot_hd(const uint16_t* w, const double* p, int D) nogil
    double nlm_add_diff(double a, double b, double c) nogil
    int nlm_fstat_identity(int fd, long long* size, long long* mtime_ns) nogil
    void nlm_gemv_t(const float* WT, int D, int n, int npad, const float* h, const float* bias, float* out) nogil
    void nlm_diag_forward(const float* bias, const float* W, const float* emb, const int32_t* ctx, int c, int E,
                          float* v) nogil
    double nlm_logsumexp_f(const float* x, int n) nogil
    int NLM_HAVE_HALF
    void nlm_diag_forward_h(const float* bias, const float* W, const uint16_t* emb, const int32_t* ctx, int c,
                            int E, float* v) nogil
    float nlm_dot_rh(const uint16_t* r, const float* h, int D) nogil
    float nlm_dot_rf(const float* r, const float* h, int D) nogil
    void nlm_gemv_rows_rh(const uint16_t* W, const int32_t* idx, int n, int D, const float* h, float* out) nogil
    void nlm_gemv_rows_rf(const float* W, const int32_t* idx, int n, int D, const float* h, float* out) nogil
    float nlm_half_to_float(const uint16_t* p) nogil
    double nlm_prod_sum_f(const float* b, const float** p, int count, int n) nogil


cdef inline double log_sigmoid(double x) noexcept nogil:
    if x >= 0:
        return -log1p(exp(-x))
    return x - log1p(exp(x))
