/* Dense kernels of the trainer's shared-noise NCE step (nlmfeature/_train.pyx).
 *
 * nlt_gemm_nn: C (M x N) += A (M x K) . B (K x N), all row-major with leading dimensions,
 * register-blocked (4 rows x 16 columns of C in eight 8-wide accumulators) with GCC vector
 * extensions: AVX2 + FMA under -march=native, two SSE halves otherwise.  Each element of C
 * is summed over k in the same order whatever rows a caller gives a thread, so callers that
 * split the rows of C between threads get results independent of the thread count.
 *
 * nlt_expf / nlt_logf: Cephes' single-precision exp and log (relative error about 1e-7),
 * written without branches so that loops calling them vectorise.
 */
#ifndef NLMFEATURE_DENSE_H
#define NLMFEATURE_DENSE_H

#include <stdint.h>
#include <string.h>
#include <math.h>

typedef float nlt_v8 __attribute__((vector_size(32)));
typedef float nlt_v8u __attribute__((vector_size(32), aligned(4)));

static inline nlt_v8 nlt_load8(const float* p) { return *(const nlt_v8u*)p; }
static inline void nlt_store8(float* p, nlt_v8 v) { *(nlt_v8u*)p = v; }
static inline nlt_v8 nlt_bcast8(float x) { nlt_v8 v = {x, x, x, x, x, x, x, x}; return v; }

/* C[i, j0:j0+16] += sum_k A[i, k] B[k, j0:j0+16] for rows i0 <= i < i1 (i1 - i0 <= 4) */
static inline void nlt_gemm_block16(int64_t i0, int64_t i1, int64_t K, const float* A, int64_t lda,
                                    const float* B, int64_t ldb, float* C, int64_t ldc, int64_t j0) {
    nlt_v8 c00 = nlt_bcast8(0), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
    int64_t rows = i1 - i0, k;
    const float* a0 = A + i0 * lda;
    const float* a1 = rows > 1 ? a0 + lda : a0;
    const float* a2 = rows > 2 ? a0 + 2 * lda : a0;
    const float* a3 = rows > 3 ? a0 + 3 * lda : a0;
    for (k = 0; k < K; k++) {
        const float* b = B + k * ldb + j0;
        nlt_v8 b0 = nlt_load8(b), b1 = nlt_load8(b + 8), x;
        x = nlt_bcast8(a0[k]); c00 += x * b0; c01 += x * b1;
        x = nlt_bcast8(a1[k]); c10 += x * b0; c11 += x * b1;
        x = nlt_bcast8(a2[k]); c20 += x * b0; c21 += x * b1;
        x = nlt_bcast8(a3[k]); c30 += x * b0; c31 += x * b1;
    }
    float* c = C + i0 * ldc + j0;
    nlt_store8(c, nlt_load8(c) + c00); nlt_store8(c + 8, nlt_load8(c + 8) + c01);
    if (rows > 1) { c += ldc; nlt_store8(c, nlt_load8(c) + c10); nlt_store8(c + 8, nlt_load8(c + 8) + c11); }
    if (rows > 2) { c += ldc; nlt_store8(c, nlt_load8(c) + c20); nlt_store8(c + 8, nlt_load8(c + 8) + c21); }
    if (rows > 3) { c += ldc; nlt_store8(c, nlt_load8(c) + c30); nlt_store8(c + 8, nlt_load8(c + 8) + c31); }
}

/* C (rows i0..i1 of an M x N matrix) += A . B; i0 and i1 multiples of 4 (or i1 == M). */
static inline void nlt_gemm_nn(int64_t i0, int64_t i1, int64_t N, int64_t K,
                               const float* A, int64_t lda, const float* B, int64_t ldb,
                               float* C, int64_t ldc) {
    int64_t j0, i, k, j, N16 = N - N % 16;
    /* column panels of B (K x 16) stay in cache while the row blocks of A stream past them */
    for (j0 = 0; j0 < N16; j0 += 16)
        for (i = i0; i < i1; i += 4)
            nlt_gemm_block16(i, i + 4 < i1 ? i + 4 : i1, K, A, lda, B, ldb, C, ldc, j0);
    if (N16 < N) {
        for (i = i0; i < i1; i++) {
            float* c = C + i * ldc;
            const float* a = A + i * lda;
            for (k = 0; k < K; k++) {
                const float* b = B + k * ldb;
                float x = a[k];
                for (j = N16; j < N; j++) c[j] += x * b[j];
            }
        }
    }
}

/* ask for the cache lines of an n-float row ahead of its use (random rows of big matrices) */
static inline void nlt_prefetch_row(const float* p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 0, 3);
}
static inline void nlt_prefetch_row_w(const float* p, int64_t n) {
    for (int64_t i = 0; i < n; i += 16) __builtin_prefetch(p + i, 1, 3);
}

static inline float nlt_bits_float(int32_t i) { float f; memcpy(&f, &i, 4); return f; }
static inline int32_t nlt_float_bits(float f) { int32_t i; memcpy(&i, &f, 4); return i; }

/* exp(x), x clamped to [-87, 88] */
static inline float nlt_expf(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * nlt_bits_float(((int32_t)n + 127) << 23);
}

/* log(x) for normal x > 0 */
static inline float nlt_logf(float x) {
    int32_t i = nlt_float_bits(x);
    float e = (float)(((i >> 23) & 0xff) - 126);
    float m = nlt_bits_float((i & 0x807fffff) | 0x3f000000);   /* x = m 2^e, m in [0.5, 1) */
    int small = m < 0.707106781186547524f;
    e = small ? e - 1.0f : e;
    m = small ? m + m - 1.0f : m - 1.0f;
    float z = m * m;
    float y = 7.0376836292e-2f;
    y = y * m - 1.1514610310e-1f;
    y = y * m + 1.1676998740e-1f;
    y = y * m - 1.2420140846e-1f;
    y = y * m + 1.4249322787e-1f;
    y = y * m - 1.6668057665e-1f;
    y = y * m + 2.0000714765e-1f;
    y = y * m - 2.4999993993e-1f;
    y = y * m + 3.3333331174e-1f;
    y = y * m * z;
    y += -2.12194440e-4f * e;
    y += -0.5f * z;
    return m + y + 0.693359375f * e;
}

/* NCE on a row of logits: g[j] = sigmoid(x[j]) - label, returns sum_j -log P(label | x[j])
 * (label 0: softplus(x); label 1: softplus(-x)); x[j] = z[j] + add[j] */
static inline float nlt_nce_noise_row(const float* z, const float* add, float* g, int64_t n) {
    float loss = 0;
    int64_t j;
    #pragma omp simd reduction(+:loss)
    for (j = 0; j < n; j++) {
        float x = z[j] + add[j];
        float t = nlt_expf(-fabsf(x));
        float inv = 1.0f / (1.0f + t);
        g[j] = x >= 0 ? inv : t * inv;
        loss += (x > 0 ? x : 0.0f) + nlt_logf(1.0f + t);
    }
    return loss;
}

#endif
