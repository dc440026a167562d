# cython: language_level=3
"""Native scorer: computes n-gram log-probabilities of a loaded model.

The model is a read-only :c:type:`ModelC` of pointers into the memory-mapped model file;
each thread owns a :c:type:`SessionC` holding its work buffers and per-sentence caches.
All scoring functions are ``nogil`` and touch no Python object.  Scores are natural logs.
"""
cimport cython
from libc.math cimport exp, expf, log, log1p, tanhf, INFINITY, NAN, isnan
from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
from posix.unistd cimport close
from cpython.pycapsule cimport PyCapsule_New

cdef extern from "<stdlib.h>" nogil:
    void* aligned_alloc(size_t alignment, size_t size)

cdef extern from * nogil:
    void __builtin_prefetch(const void* p)

cdef extern from "<sys/mman.h>" nogil:
    int madvise(void* addr, size_t length, int advice)
    int MADV_HUGEPAGE

cdef extern from "../../src/nlmfeature/decoder/capi/nlmfeature.h":
    enum:
        NLM_DEFAULT_CACHE_ENTRIES

#: default bound of the per-sentence context / normaliser caches (NLM_DEFAULT_CACHE_ENTRIES
#: of nlmfeature.h, the one place it is spelled)
DEFAULT_CACHE_ENTRIES = NLM_DEFAULT_CACHE_ENTRIES

import numpy as np
cimport numpy as cnp

cnp.import_array()

ACTIVATIONS = {"identity": ACT_IDENTITY, "sigmoid": ACT_SIGMOID, "relu": ACT_RELU,
               "rectifier": ACT_RELU, "tanh": ACT_TANH, "hardtanh": ACT_HARDTANH}
COMBINERS = {"none": COMBINE_NONE, "max": COMBINE_MAX, "add": COMBINE_ADD, "mul": COMBINE_MUL}
OUTPUTS = {"unnormalised": OUT_UNNORMALISED, "softmax": OUT_SOFTMAX, "class": OUT_CLASS,
           "tree": OUT_TREE}

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
    static inline void nlm_gemv_rows(const float* W, int n, int D, const float* h, float* out) {
        int r = 0, d;
        for (; r + 4 <= n; r += 4) {
            const float* w0 = W + (size_t)r * D; const float* w1 = w0 + D;
            const float* w2 = w1 + D; const float* w3 = w2 + D;
            float a0 = 0.f, a1 = 0.f, a2 = 0.f, a3 = 0.f;
            for (d = 0; d < D; d++) {
                float x = h[d];
                a0 += w0[d] * x; a1 += w1[d] * x; a2 += w2[d] * x; a3 += w3[d] * x;
            }
            out[r] = a0; out[r + 1] = a1; out[r + 2] = a2; out[r + 3] = a3;
        }
        for (; r < n; r++) {
            const float* w0 = W + (size_t)r * D;
            float a0 = 0.f;
            for (d = 0; d < D; d++) a0 += w0[d] * h[d];
            out[r] = a0;
        }
    }
    /* out[c] = bias[c] + sum_d h[d] * WT[d, c] for c < n; WT is (D, npad), npad a multiple of
       128 (zero columns): 8 x 16-float accumulators stay in registers (gcc vector extensions,
       lowered to whatever SIMD the target has) */
    typedef float nlm_v16 __attribute__((vector_size(64)));
    static inline nlm_v16 nlm_load16(const float* p) { nlm_v16 v; memcpy(&v, p, sizeof v); return v; }
    static inline void nlm_gemv_t(const float* WT, int D, int n, int npad, const float* h,
                                  const float* bias, float* out) {
        int c0, d, c;
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
        for (c = 0; c < n; c++) out[c] += bias[c];
    }
    /* diagonal log-bilinear context layer in one pass: v[i] = bias[i] + sum_j W[j, i] * emb[ctx[j], i].
       Each element gets the same fused multiply-adds in the same order as one pass per context
       position (which gcc contracts to FMA where the target has it), so the result is
       bit-identical to them; v is written once instead of read and written per position. */
    #if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    #include <immintrin.h>
    #endif
    #ifdef __FMA__
    #define NLM_FMAF(x, y, a) fmaf((x), (y), (a))
    #else
    #define NLM_FMAF(x, y, a) ((a) + (x) * (y))
    #endif
    static inline void nlm_diag_forward(const float* bias, const float* W, const float* emb,
                                        const int32_t* ctx, int c, int E, float* v) {
        int i = 0, j;
    #if defined(__AVX512F__)
        for (; i + 16 <= E; i += 16) {
            __m512 a = bias ? _mm512_loadu_ps(bias + i) : _mm512_setzero_ps();
            for (j = 0; j < c; j++)
                a = _mm512_fmadd_ps(_mm512_loadu_ps(W + (size_t)j * E + i),
                                    _mm512_loadu_ps(emb + (size_t)ctx[j] * E + i), a);
            _mm512_storeu_ps(v + i, a);
        }
    #endif
    #if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
        for (; i + 8 <= E; i += 8) {
            __m256 a = bias ? _mm256_loadu_ps(bias + i) : _mm256_setzero_ps();
            for (j = 0; j < c; j++)
                a = _mm256_fmadd_ps(_mm256_loadu_ps(W + (size_t)j * E + i),
                                    _mm256_loadu_ps(emb + (size_t)ctx[j] * E + i), a);
            _mm256_storeu_ps(v + i, a);
        }
    #endif
        for (; i < E; i++) {
            float a = bias ? bias[i] : 0.f;
            for (j = 0; j < c; j++) a = NLM_FMAF(W[(size_t)j * E + i], emb[(size_t)ctx[j] * E + i], a);
            v[i] = a;
        }
    }
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
    void nlm_gemv_rows(const float* W, int n, int D, const float* h, float* out) nogil
    int nlm_fstat_identity(int fd, long long* size, long long* mtime_ns) nogil
    void nlm_gemv_t(const float* WT, int D, int n, int npad, const float* h, const float* bias, float* out) nogil
    void nlm_diag_forward(const float* bias, const float* W, const float* emb, const int32_t* ctx, int c, int E,
                          float* v) nogil
    double nlm_logsumexp_f(const float* x, int n) nogil


cdef inline double log_sigmoid(double x) noexcept nogil:
    if x >= 0:
        return -log1p(exp(-x))
    return x - log1p(exp(x))


# ---------------------------------------------------------------------------------------
# hashing: vocabulary lookup, direct n-gram features, cache keys
# ---------------------------------------------------------------------------------------

cdef uint64_t splitmix64(uint64_t x) noexcept nogil:
    x += 0x9E3779B97F4A7C15ULL
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL
    return x ^ (x >> 31)


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


def vocab_hash_table(const int64_t[::1] offsets, const unsigned char[::1] data):
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


def vocab_find(const int64_t[::1] offsets, const unsigned char[::1] data, const int32_t[::1] table,
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
    """h mod hash_space; a mask when hash_space is a power of two (the usual case: the same
    index without a 64-bit division, ~25 cycles per feature)."""
    cdef uint64_t hs = <uint64_t>m.hash_space
    if (hs & (hs - 1)) == 0:
        return h & (hs - 1)
    return h % hs


cdef inline int direct_nonzero(const ModelC* m, uint64_t i) noexcept nogil:
    return m.direct_nonzero == NULL or <int>((m.direct_nonzero[i >> 6] >> (i & 63)) & 1)


cdef inline double direct_value(const ModelC* m, const uint64_t* states, int32_t target) noexcept nogil:
    """Sum of the hashed direct-feature weights of ``target`` after the context whose hash
    states are ``states``.  Zero weights (untrained n-grams, most of the table) are skipped
    through the bitmap without touching the table: adding +-0.0 to a sum that is never
    -0.0 leaves it unchanged, so the value is bit-identical."""
    cdef double s = 0
    cdef int k
    cdef uint64_t t = (<uint64_t>target) << 32, i
    for k in range(m.direct_order):
        i = direct_index(m, splitmix64(states[k] ^ t))
        if direct_nonzero(m, i):
            s += m.direct_weights[i]
    return s


cdef inline void lines_prefetch(const void* p, size_t nbytes) noexcept nogil:
    cdef size_t i
    for i in range(0, nbytes, 64):
        __builtin_prefetch(<const char*>p + i)


cdef inline void direct_prefetch(const ModelC* m, const uint64_t* states, int32_t target) noexcept nogil:
    """Start loading the direct-feature weights of ``target`` (random places in a table of
    megabytes) so that the forward pass overlaps their cache misses."""
    cdef int k
    cdef uint64_t t = (<uint64_t>target) << 32
    cdef uint64_t i
    for k in range(m.direct_order):
        i = direct_index(m, splitmix64(states[k] ^ t))
        if direct_nonzero(m, i):
            __builtin_prefetch(&m.direct_weights[i])


def direct_feature_indices(const int32_t[:, ::1] contexts, const int32_t[::1] targets, int kind,
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
                o[i, k] = <int64_t>(splitmix64(state ^ t) % <uint64_t>hash_space)
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


cdef void* alloc_table(size_t nbytes) noexcept nogil:
    """Zeroed memory for a cache table; from 2 MB up in transparent huge pages, so probes
    scattered over a sentence's table do not also miss the TLB."""
    cdef size_t huge = 2 << 20, size
    cdef void* p
    if nbytes < huge:
        return calloc(1, nbytes if nbytes else 1)
    size = (nbytes + huge - 1) & ~(huge - 1)
    p = aligned_alloc(huge, size)
    if p != NULL:
        madvise(p, size, MADV_HUGEPAGE)
        memset(p, 0, size)
    return p


cdef int table_grow(TableC* t) noexcept nogil:
    """Rehash into twice the slots (1,024 at first), keeping entry numbers, flags and the
    dense values; -1 (table untouched) when out of memory."""
    cdef int64_t cap = t.capacity * 2 if t.capacity else 1024
    cdef int32_t* slots = <int32_t*>alloc_table(cap * t.stride * sizeof(int32_t))
    cdef int64_t room, had, i
    cdef uint64_t h
    cdef int32_t* src
    cdef float* fv
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
    return 0


cdef void table_free(TableC* t) noexcept nogil:
    free(t.slots)
    free(t.fvals)
    t.slots = NULL
    t.fvals = NULL
    t.capacity = 0
    t.count = 0


cdef void table_clear(TableC* t) noexcept nogil:
    """Forget every entry in O(1)."""
    t.count = 0
    t.generation += 1
    if t.generation > 0x7fffffffu:  # 31 bits used up after 2^31 clears: really wipe
        memset(t.slots, 0, t.capacity * t.stride * sizeof(int32_t))
        t.generation = 1


cdef inline int key_same(const int32_t* p, const int32_t* key, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if p[1 + i] != key[i]:
            return 0
    return 1


cdef int64_t table_find(const TableC* t, const int32_t* key) noexcept nogil:
    """Slot of ``key``, or -1."""
    cdef uint64_t slot
    cdef const int32_t* p
    cdef int64_t probes = t.max_probe if t.max_probe > 0 else t.capacity
    if t.capacity == 0:
        return -1
    slot = nlm_home(key_hash(key, t.key_len), t.capacity)
    while probes > 0:
        p = table_at(t, slot)
        if not table_live(t, p):
            return -1
        if key_same(p, key, t.key_len):
            return <int64_t>slot
        slot = table_next(t, slot)
        probes -= 1
    return -1


cdef int64_t table_insert(TableC* t, const int32_t* key, int* found) noexcept nogil:
    """Slot of ``key``; inserted (values undefined, disk bit clear, ``found`` = 0) when
    absent.  A full table is cleared first (``clear_when_full``) or takes no new key (-1);
    -1 also when out of memory."""
    cdef uint64_t slot
    cdef int32_t* p
    found[0] = 0
    if t.capacity:
        slot = nlm_home(key_hash(key, t.key_len), t.capacity)
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
    slot = nlm_home(key_hash(key, t.key_len), t.capacity)
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
# the network
# ---------------------------------------------------------------------------------------

cdef int nlm_pad_context(const ModelC* m, const int32_t* ids, int n, int32_t* out) noexcept nogil:
    """Write the n-1 context ids for a history of ``n`` ids (oldest first).

    Longer histories keep their last n-1 ids.  Shorter ones are padded on the left with
    ``<s>`` when they start with ``<s>`` and with ``<null>`` otherwise (also when empty).
    Ids outside the vocabulary become ``<unk>``.  Returns the number of padding ids.
    """
    cdef int c = m.ctx_len, i, pad
    cdef int32_t fill, w
    if n >= c:
        ids += n - c
        n = c
    pad = c - n
    fill = m.bos if (n > 0 and ids[0] == m.bos) else m.null
    for i in range(pad):
        out[i] = fill
    for i in range(n):
        w = ids[i]
        out[pad + i] = w if (0 <= w < m.vocab_size) else m.unk
    return pad


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


cdef void branch_forward(const ModelC* m, const BranchC* br, const int32_t* ctx, float* v) noexcept nogil:
    """First-layer branch for a full context: [source window (joint models) | n-1 target ids]."""
    cdef int j, o, H = br.hidden, E = m.embed_dim
    cdef int64_t V = m.vocab_size
    cdef const float* e
    cdef BranchC tb
    cdef int w0 = m.src_window
    if w0:  # joint models: the target positions follow the source ones in the weights
        tb = br[0]
        tb.weights = br.weights + <int64_t>w0 * (E if br.diagonal else <int64_t>H * E)
    if br.diagonal and not (br.tables != NULL and m.use_tables):
        nlm_diag_forward(br.bias, tb.weights if w0 else br.weights, m.embeddings, ctx + w0,
                         m.ctx_len, E, v)
        if w0:
            source_forward(m, br, ctx, v)
        activate(v, H, br.activation)
        return
    init_bias(v, br.bias, H)
    if m.src_window:
        source_forward(m, br, ctx, v)
        ctx += m.src_window
        tb = br[0]  # target positions follow the source ones in the weights
        tb.weights = br.weights + <int64_t>m.src_window * (E if br.diagonal else <int64_t>H * E)
        br = &tb
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
                             float* b0, float* b1, float* b2) noexcept nogil:
    """Final hidden vector (out_dim floats) for a padded context; b0..b2 are work buffers."""
    cdef int k, i, H = m.branches[0].hidden
    cdef float* cur = b0
    cdef float* tmp
    cdef const LayerC* L
    branch_forward(m, &m.branches[0], ctx, cur)
    for k in range(1, m.n_branches):
        branch_forward(m, &m.branches[k], ctx, b1)
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


cdef inline double word_logit(const ModelC* m, const float* h, int32_t w, const uint64_t* states) noexcept nogil:
    cdef double s = dotf(m.out_weight + <int64_t>w * m.out_dim, h, m.out_dim) + m.out_bias[w]
    if m.direct_order:
        s += direct_value(m, states, w)
    return s


cdef inline double class_logit(const ModelC* m, const float* h, int32_t c, const uint64_t* states) noexcept nogil:
    cdef double s = dotf(m.class_weight + <int64_t>c * m.out_dim, h, m.out_dim) + m.class_bias[c]
    if m.direct_order:
        s += direct_value(m, states, c)
    return s


cdef double softmax_lognorm(const ModelC* m, const float* h, const uint64_t* states, float* scratch) noexcept nogil:
    cdef int32_t w
    nlm_gemv_rows(m.out_weight, m.vocab_size, m.out_dim, h, scratch)
    for w in range(m.vocab_size):
        scratch[w] += m.out_bias[w]
        if m.direct_order:
            scratch[w] += <float>direct_value(m, states, w)
    return nlm_logsumexp_f(scratch, m.vocab_size)


cdef double class_lognorm(const ModelC* m, const float* h, const uint64_t* cstates, float* scratch) noexcept nogil:
    cdef int32_t c
    nlm_gemv_t(m.class_weight_t, m.out_dim, m.n_classes, m.n_classes_padded, h, m.class_bias, scratch)
    if m.direct_order:
        for c in range(m.n_classes):
            scratch[c] += <float>direct_value(m, cstates, c)
    return nlm_logsumexp_f(scratch, m.n_classes)


cdef double within_class_lognorm(const ModelC* m, const float* h, int32_t c, const uint64_t* states,
                                 float* scratch) noexcept nogil:
    """log of the sum of exp(word logit) over class ``c``; rows of a class whose members are
    consecutive ids (frequency-binned classes) are one block of the output matrix."""
    cdef int32_t i, w, a = m.class_start[c], b = m.class_start[c + 1]
    cdef int32_t first = m.class_members[a]
    if b - a == 1:  # p(w | c) = 1
        return word_logit(m, h, first, states)
    if m.class_members[b - 1] - first == b - 1 - a:
        nlm_gemv_rows(m.out_weight + <int64_t>first * m.out_dim, b - a, m.out_dim, h, scratch)
        for i in range(b - a):
            scratch[i] += m.out_bias[first + i]
    else:
        # Brown classes: rows scattered over megabytes; the row two members ahead is loaded
        # while this one is multiplied (the arithmetic is unchanged)
        for i in range(a, b):
            w = m.class_members[i]
            if i + 2 < b:
                lines_prefetch(m.out_weight + <int64_t>m.class_members[i + 2] * m.out_dim, m.out_dim * sizeof(float))
            scratch[i - a] = dotf(m.out_weight + <int64_t>w * m.out_dim, h, m.out_dim) + m.out_bias[w]
    if m.direct_order:
        for i in range(a, b):
            scratch[i - a] += <float>direct_value(m, states, m.class_members[i])
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


cdef int nlm_ngram_cache_pays(const ModelC* m) noexcept nogil:
    """Whether an exact (context, word) -> score cache beats recomputing: when a lookup costs
    more than a probe (normalised outputs, dense layers, full matrices without tables).
    Decoders repeat most n-grams (a Moses sentence: ~70% of lookups are exact repeats)."""
    return m.output_type == OUT_TREE or context_cache_pays(m)


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
    if s.buf0 == NULL or s.buf1 == NULL or s.buf2 == NULL or s.hidden == NULL or s.fscratch == NULL:
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
    if nlm_model_file_changed(s.model):
        s.model_changed = 1
    return -1 if s.model_changed else 0


cdef inline int store_probe(const TableC* files, int n, const int32_t* key, int i, double* out) noexcept nogil:
    """Value ``i`` of ``key`` in the first of ``n`` persistent-cache file tables holding it
    (and not NaN); 0 if none does."""
    cdef int f
    cdef int64_t slot
    cdef double v
    for f in range(n):
        slot = table_find(&files[f], key)
        if slot >= 0:
            v = tv_get(&files[f], table_at(&files[f], slot), i)
            if not isnan(v):
                out[0] = v
                return 1
    return 0


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
    return v


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
    cdef uint64_t states[NLM_MAX_ORDER]
    cdef uint64_t cstates[NLM_MAX_ORDER]
    cdef double lz, score
    cdef const int32_t* ckey = ctx
    s.lookups += 1
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
            lz = softmax_lognorm(m, h, states, s.fscratch)
        else:
            lz = class_lognorm(m, h, cstates, s.fscratch)
        if cp != NULL:
            tv_set(&s.ctx_cache, cp, which, lz)
            tv_mark(cp, 0)
    if which == 0:
        return word_logit(m, h, w, states) - lz
    # class-factored: p(c | context) p(w | context, c)
    c = m.word_class[w]
    score = class_logit(m, h, c, cstates) - lz
    if s.cache_enabled:
        for i in range(m.key_len):
            key[i] = ctx[i]
        key[m.key_len] = c
        slot = table_insert(&s.class_cache, key, &found)
        kp = table_at(&s.class_cache, slot)
        if slot < 0:  # out of memory
            lz = within_class_lognorm(m, h, c, states, s.fscratch)
        elif found:
            lz = tv_get(&s.class_cache, kp, 0)
        elif s.store != NULL and s.store.probe_context and \
                store_probe(s.store.cls, s.store.nfiles, key, 0, &lz):
            s.store.class_hits += 1
            tv_set(&s.class_cache, kp, 0, lz)
            tv_mark(kp, 1)
        else:
            lz = within_class_lognorm(m, h, c, states, s.fscratch)
            tv_set(&s.class_cache, kp, 0, lz)
    else:
        lz = within_class_lognorm(m, h, c, states, s.fscratch)
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


cdef double nlm_joint_score(SessionC* s, const int32_t* window, const int32_t* ids, int n,
                            int32_t w) noexcept nogil:
    """Joint models: score ``w`` given a source window (from :c:func:`nlm_source_window`)
    and an unpadded target history of ``n`` ids (padded as :c:func:`nlm_pad_context`)."""
    cdef int32_t key[NLM_MAX_KEY]
    cdef const ModelC* m = s.model
    cdef int j
    for j in range(m.src_window):
        key[j] = window[j]
    nlm_pad_context(m, ids, n, key + m.src_window)
    if w < 0 or w >= m.vocab_size:
        w = m.unk
    return nlm_score_padded(s, key, w)

# ---------------------------------------------------------------------------------------
# Python wrappers
# ---------------------------------------------------------------------------------------

cdef const float* fptr(arrays, name, required=True) except? NULL:
    a = arrays.get(name)
    if a is None:
        if required:
            raise ValueError(f"model has no array {name!r}")
        return NULL
    _check(a, name, np.float32)
    return <const float*>cnp.PyArray_DATA(a)


cdef _check(a, name, dtype):
    if not isinstance(a, np.ndarray) or a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"array {name!r} must be a C-contiguous {np.dtype(dtype).name} array")


cdef const void* rawptr(arrays, name, dtype) except? NULL:
    a = arrays.get(name)
    if a is None:
        raise ValueError(f"model has no array {name!r}")
    _check(a, name, dtype)
    return <const void*>cnp.PyArray_DATA(a)


cdef class NativeModel:
    """The C view of a model's arrays.  Keeps the arrays (and so the mmap) alive.

    ``header`` is the parsed model-file header; ``arrays`` maps array names to numpy arrays
    whose shapes :mod:`nlmfeature.core.modelfile` has already validated.
    """
    cdef ModelC m
    cdef object _arrays
    cdef object _extra
    cdef readonly object path

    def __cinit__(self, *args, **kwargs):
        self.m.file_fd = -1

    def __dealloc__(self):
        if self.m.file_fd >= 0:
            close(self.m.file_fd)
            self.m.file_fd = -1

    def __init__(self, dict header, dict arrays, bint use_tables=True):
        cdef int k
        cdef ModelC* m = &self.m
        self._arrays = arrays
        self._extra = []
        self.path = None
        if m.file_fd >= 0:
            close(m.file_fd)
        memset(m, 0, sizeof(ModelC))
        m.file_fd = -1
        m.order = header["order"]
        if not 1 <= m.order <= NLM_MAX_ORDER:
            raise ValueError(f"order {m.order} is outside 1..{NLM_MAX_ORDER}")
        m.ctx_len = m.order - 1
        m.vocab_size = header["vocab_size"]
        m.embed_dim = header["embed_dim"]
        sp = header["special"]
        m.unk, m.bos, m.eos, m.null = sp["<unk>"], sp["<s>"], sp["</s>"], sp["<null>"]
        m.embeddings = fptr(arrays, "embeddings")
        branches = header["branches"]
        if not 1 <= len(branches) <= NLM_MAX_BRANCHES:
            raise ValueError(f"between 1 and {NLM_MAX_BRANCHES} first-layer branches are supported")
        m.n_branches = len(branches)
        m.combine = COMBINERS[header.get("combine", "none")]
        m.max_width = m.embed_dim
        for k, br in enumerate(branches):
            m.branches[k].hidden = br["hidden"]
            m.branches[k].diagonal = br["diagonal"]
            m.branches[k].activation = ACTIVATIONS[br["activation"]]
            m.branches[k].weights = fptr(arrays, f"branch{k}.weights")
            m.branches[k].bias = fptr(arrays, f"branch{k}.bias", False)
            m.branches[k].tables = fptr(arrays, f"branch{k}.tables", False)
            m.max_width = max(m.max_width, br["hidden"])
        layers = header["layers"]
        if len(layers) > NLM_MAX_LAYERS:
            raise ValueError(f"at most {NLM_MAX_LAYERS} extra hidden layers are supported")
        m.n_layers = len(layers)
        for k, ly in enumerate(layers):
            m.layers[k].n_in = ly["n_in"]
            m.layers[k].n_out = ly["n_out"]
            m.layers[k].activation = ACTIVATIONS[ly["activation"]]
            m.layers[k].weight = fptr(arrays, f"layer{k}.weight")
            m.layers[k].bias = fptr(arrays, f"layer{k}.bias", False)
            # inputs that a ReLU produced are sparse: keep a transposed copy to skip zeros
            prev_act = branches[0]["activation"] if k == 0 else layers[k - 1]["activation"]
            if ACTIVATIONS[prev_act] == ACT_RELU and header.get("combine", "none") != "mul":
                wt = np.ascontiguousarray(arrays[f"layer{k}.weight"].T)
                self._extra.append(wt)
                m.layers[k].weight_t = <const float*>cnp.PyArray_DATA(wt)
            m.max_width = max(m.max_width, ly["n_out"], ly["n_in"])
        out = header["output"]
        m.out_dim = out["dim"]
        m.max_width = max(m.max_width, m.out_dim)
        m.output_type = OUTPUTS[out["type"]]
        m.out_weight = fptr(arrays, "output.weight")
        m.out_bias = fptr(arrays, "output.bias")
        if m.output_type == OUT_CLASS:
            m.n_classes = out["classes"]
            m.class_weight = fptr(arrays, "class.weight")
            # (D, C) copy padded to 128 columns: the class logits in one register-blocked pass
            m.n_classes_padded = (m.n_classes + 127) // 128 * 128
            cwt = np.zeros((m.out_dim, m.n_classes_padded), dtype=np.float32)
            cwt[:, :m.n_classes] = arrays["class.weight"].T
            self._extra.append(cwt)
            m.class_weight_t = <const float*>cnp.PyArray_DATA(cwt)
            m.class_bias = fptr(arrays, "class.bias")
            m.word_class = <const int32_t*>rawptr(arrays, "class.of_word", np.int32)
            m.class_start = <const int32_t*>rawptr(arrays, "class.start", np.int32)
            m.class_members = <const int32_t*>rawptr(arrays, "class.members", np.int32)
        elif m.output_type == OUT_TREE:
            m.n_nodes = out["nodes"]
            m.tree_weight = fptr(arrays, "tree.weight")
            m.tree_bias = fptr(arrays, "tree.bias")
            m.path_start = <const int64_t*>rawptr(arrays, "tree.path_start", np.int64)
            m.path_node = <const int32_t*>rawptr(arrays, "tree.path_node", np.int32)
            m.path_sign = <const int8_t*>rawptr(arrays, "tree.path_sign", np.int8)
        direct = header.get("direct")
        if direct:
            m.direct_order = direct["order"]
            m.hash_space = direct["hash_space"]
            m.direct_weights = fptr(arrays, "direct.weights")
            if not 1 <= m.direct_order <= m.order:
                raise ValueError("direct feature order must be between 1 and the model order")
            # which hashed weights are non-zero (most are: only trained n-grams get a weight)
            bits = np.packbits(np.asarray(arrays["direct.weights"]) != 0, bitorder="little")
            nz = np.zeros((m.hash_space + 63) // 64, dtype=np.uint64)
            nz.view(np.uint8)[:bits.shape[0]] = bits
            self._extra.append(nz)
            m.direct_nonzero = <const uint64_t*>cnp.PyArray_DATA(nz)
        m.use_tables = use_tables
        m.key_len = m.ctx_len
        source = header.get("source")
        if source:
            m.src_window = source["window"]
            if not 1 <= m.src_window <= NLM_MAX_WINDOW or m.src_window % 2 == 0:
                raise ValueError(f"source window {m.src_window} is not an odd number in 1..{NLM_MAX_WINDOW}")
            m.src_vocab_size = source["vocab_size"]
            ssp = source["special"]
            m.src_unk, m.src_bos, m.src_eos, m.src_null = ssp["<unk>"], ssp["<s>"], ssp["</s>"], ssp["<null>"]
            m.src_embeddings = fptr(arrays, "source.embeddings")
            for k in range(m.n_branches):
                m.branches[k].src_tables = fptr(arrays, f"branch{k}.source.tables", False)
                if (m.branches[k].tables == NULL) != (m.branches[k].src_tables == NULL):
                    raise ValueError("a joint model has tables for all positions or none")
            m.key_len = m.ctx_len + m.src_window

    def watch_file(self, str path, int fd, tuple identity) -> None:
        """Take ownership of ``fd``, an open descriptor of the mapped model file, whose
        (st_dev, st_ino, size, mtime_ns) were ``identity`` when it was mapped: each sentence
        start then checks that the file was not changed in place (``nlm_model_file_changed``)."""
        if self.m.file_fd >= 0:
            close(self.m.file_fd)
        self.m.file_dev, self.m.file_ino, self.m.file_size, self.m.file_mtime_ns = identity
        self.m.file_fd = fd
        self.path = path

    def file_changed(self) -> bool:
        """Whether the model file was changed in place since it was loaded."""
        return bool(nlm_model_file_changed(&self.m))

    def check_file(self) -> None:
        """Raise :class:`nlmfeature.errors.ModelFileError` if the model file was changed in place."""
        if nlm_model_file_changed(&self.m):
            raise _changed_error(self.path)

    @property
    def order(self) -> int:
        return self.m.order

    @property
    def vocab_size(self) -> int:
        return self.m.vocab_size

    @property
    def source_window(self) -> int:
        """Joint models: source-window width w (0 for a target-only model)."""
        return self.m.src_window

    @property
    def key_len(self) -> int:
        """Ids in a full context: w source-window ids, then n-1 target ids."""
        return self.m.key_len

    def source_window_ids(self, const int32_t[::1] source, int affiliation):
        """The w source ids around ``affiliation`` (see ``nlm_source_window``): position
        ``len(source)`` is ``</s>``, a negative affiliation gives ``<null>``s."""
        if self.m.src_window == 0:
            raise ValueError("not a joint model: it has no source window")
        out = np.empty(self.m.src_window, dtype=np.int32)
        cdef int32_t[::1] o = out
        cdef int32_t dummy = 0
        nlm_source_window(&self.m, &source[0] if source.shape[0] else &dummy, source.shape[0],
                          affiliation, &o[0])
        return out

    @property
    def uses_tables(self) -> bool:
        return bool(self.m.use_tables and self.m.branches[0].tables != NULL)

    def capsule(self):
        """A PyCapsule holding the ``ModelC*`` (for the C ABI library)."""
        return PyCapsule_New(<void*>&self.m, b"nlmfeature.ModelC", NULL)

    def pad_context(self, const int32_t[::1] ids):
        """Padded n-1 context ids for a history (see the C function ``nlm_pad_context``)."""
        out = np.empty(max(self.m.ctx_len, 0), dtype=np.int32)
        cdef int32_t[::1] o = out
        cdef int32_t dummy = 0
        nlm_pad_context(&self.m, &ids[0] if ids.shape[0] else &dummy, ids.shape[0],
                        &o[0] if o.shape[0] else &dummy)
        return out

    def hidden(self, const int32_t[::1] padded):
        """Final hidden vector for a padded context (testing and the batched path)."""
        if padded.shape[0] != self.m.key_len:
            raise ValueError(f"a padded context has {self.m.key_len} ids")
        _check_context_ids(&self.m, padded, "the context")
        out = np.empty(self.m.out_dim, dtype=np.float32)
        b = np.empty(3 * self.m.max_width, dtype=np.float32)
        cdef float[::1] o = out, bb = b
        cdef int32_t dummy = 0
        cdef int W = self.m.max_width
        nlm_compute_hidden(&self.m, &padded[0] if padded.shape[0] else &dummy, &o[0], &bb[0], &bb[W], &bb[2 * W])
        return out

    def session(self, int64_t cache_entries=NLM_DEFAULT_CACHE_ENTRIES, int64_t ngram_entries=-1):
        """A new scoring session (one per thread); ``cache_entries=0`` disables caching;
        ``ngram_entries`` bounds the exact n-gram cache (-1: automatic, 0: off)."""
        return Session(self, cache_entries, ngram_entries)


def _changed_error(path):
    """The error for a model file overwritten in place under a running process."""
    from .errors import ModelFileError
    return ModelFileError(
        f"{path}: the model file was changed in place after it was loaded (its size or "
        "modification time differ); its memory mapping now holds other bytes, so this process "
        "stops scoring with it.  Replace a model by writing the new file next to it and "
        "renaming it over the old one (mv new.nlm live.nlm; nlmfeature's writers do this), "
        "never by copying over it; then reload.")


cdef _check_context_ids(const ModelC* m, a, what):
    """Like :func:`_check_ids` for full contexts: the first ``src_window`` columns hold
    source ids (joint models), the rest target ids."""
    arr = np.asarray(a)
    w = m.src_window
    if w == 0:
        _check_ids(arr, m.vocab_size, what)
        return
    if arr.ndim == 1:
        arr = arr[None, :]
    _check_ids(arr[:, :w], m.src_vocab_size, what + " (source window)")
    _check_ids(arr[:, w:], m.vocab_size, what)


cdef _check_ids(a, int64_t vocab_size, what):
    """Reject ids outside the vocabulary before they reach nogil code (no out-of-bounds reads)."""
    arr = np.asarray(a)
    if arr.size and (arr.min() < 0 or arr.max() >= vocab_size):
        raise ValueError(f"{what} hold ids outside 0..{vocab_size - 1}; map words with the "
                         "model's vocabulary (unknown words -> <unk>)")


cdef class Session:
    """Per-thread scorer state: work buffers and the bounded per-sentence caches.

    One session must not be used by two threads at once; the model may be shared freely.
    """
    cdef SessionC* s
    cdef readonly NativeModel model

    def __cinit__(self, NativeModel model, int64_t cache_entries=NLM_DEFAULT_CACHE_ENTRIES, int64_t ngram_entries=-1):
        self.model = model
        self.s = nlm_session_new(&model.m, cache_entries, ngram_entries)
        if self.s == NULL:
            raise MemoryError("could not allocate a scoring session")

    def __dealloc__(self):
        nlm_session_free(self.s)

    def begin_sentence(self, int64_t sentence_id=-1) -> None:
        """Start a new sentence: empties the per-sentence caches.  Raises
        :class:`nlmfeature.errors.ModelFileError` if the model file was changed in place
        since it was loaded (the session then refuses to score: NaN)."""
        if nlm_session_begin(self.s, sentence_id) != 0:
            raise _changed_error(self.model.path)

    def score(self, const int32_t[::1] history, int32_t word) -> float:
        """Natural-log score of ``word`` after ``history`` (ids, oldest first, padded as needed)."""
        cdef int32_t dummy = 0
        return nlm_score(self.s, &history[0] if history.shape[0] else &dummy, history.shape[0], word)

    def score_padded(self, const int32_t[:, ::1] contexts, const int32_t[::1] words):
        """Score N n-grams one lookup at a time (through the caches); contexts are padded, (N, n-1)."""
        cdef int64_t n = words.shape[0], i
        cdef int c = self.model.m.key_len
        if contexts.shape[0] != n or (n and contexts.shape[1] != c):
            raise ValueError(f"contexts must have shape ({n}, {c})")
        _check_context_ids(&self.model.m, contexts, "contexts")
        out = np.empty(n, dtype=np.float64)
        cdef double[::1] o = out
        cdef int32_t V = self.model.m.vocab_size, unk = self.model.m.unk, w
        cdef int32_t dummy = 0
        cdef const int32_t* base = &contexts[0, 0] if (n and c) else &dummy
        with nogil:
            for i in range(n):
                w = words[i]
                if w < 0 or w >= V:
                    w = unk
                o[i] = nlm_score_padded(self.s, base + i * c, w)
        return out

    def score_stream(self, const int32_t[:, ::1] contexts, const int32_t[::1] words,
                     const int64_t[::1] sentence_starts):
        """Like :meth:`score_padded`, but begins a new sentence at each index in ``sentence_starts``.

        Returns the sum of the scores (the benchmark's hot loop; runs without the GIL).
        """
        cdef int64_t n = words.shape[0], i, k = 0, ns = sentence_starts.shape[0]
        cdef int c = self.model.m.key_len
        cdef double total = 0
        if contexts.shape[0] != n or (n and contexts.shape[1] != c):
            raise ValueError(f"contexts must have shape ({n}, {c})")
        _check_context_ids(&self.model.m, contexts, "contexts")
        _check_ids(words, self.model.m.vocab_size, "words")
        cdef int32_t dummy = 0
        cdef const int32_t* base = &contexts[0, 0] if (n and c) else &dummy
        with nogil:
            for i in range(n):
                while k < ns and sentence_starts[k] == i:
                    nlm_session_begin(self.s, k)
                    k += 1
                total += nlm_score_padded(self.s, base + i * c, words[i])
        return total

    def stats(self) -> dict:
        """Counters: lookups, and hits/misses/clears of the context and class caches."""
        return {
            "lookups": self.s.lookups,
            "context_hits": self.s.ctx_cache.hits,
            "context_misses": self.s.ctx_cache.misses,
            "class_hits": self.s.class_cache.hits,
            "class_misses": self.s.class_cache.misses,
            "ngram_hits": self.s.ngram_cache.hits,
            "ngram_misses": self.s.ngram_cache.misses,
            "ngram_cache_enabled": bool(self.s.ngram_cache_enabled),
            "cache_clears": self.s.ctx_cache.clears + self.s.class_cache.clears,
            "cache_enabled": bool(self.s.cache_enabled),
            "context_cache_enabled": bool(self.s.ctx_cache_enabled),
        }
