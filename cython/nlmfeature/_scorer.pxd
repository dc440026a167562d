# C-level view of a loaded model and of a per-thread scoring session.
#
# Everything here is plain C data: the decoder-facing C ABI (``libnlmfeature``) and the
# Python API both drive the same ``nogil`` functions declared at the bottom.
from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef enum:
    NLM_MAX_ORDER = 16
    NLM_MAX_BRANCHES = 8
    NLM_MAX_LAYERS = 8
    NLM_MAX_WINDOW = 31      # joint models: most source-window positions (2m+1)
    NLM_MAX_KEY = NLM_MAX_ORDER + NLM_MAX_WINDOW  # ids in a full context (window + n-1)

# activation functions
cdef enum:
    ACT_IDENTITY = 0
    ACT_SIGMOID = 1
    ACT_RELU = 2
    ACT_TANH = 3
    ACT_HARDTANH = 4

# how lateral branches are combined
cdef enum:
    COMBINE_NONE = 0
    COMBINE_MAX = 1
    COMBINE_ADD = 2
    COMBINE_MUL = 3

# output layers
cdef enum:
    OUT_UNNORMALISED = 0
    OUT_SOFTMAX = 1
    OUT_CLASS = 2
    OUT_TREE = 3

ctypedef struct BranchC:
    int hidden               # H
    int diagonal             # 1: weights are (n-1, E) and H == E
    int activation
    const float* weights     # (n-1, H, E) or (n-1, E)
    const float* bias        # (H,) or NULL
    const float* tables      # (n-1, V, H) precomputed position contributions, or NULL
    const float* src_tables  # joint models: (w, Vs, H) precomputed source positions, or NULL

ctypedef struct LayerC:
    int n_in
    int n_out
    int activation
    const float* weight      # (n_out, n_in)
    const float* weight_t    # (n_in, n_out): lets a sparse (ReLU) input skip its zeros; or NULL
    const float* bias        # (n_out,)

ctypedef struct ModelC:
    int order
    int ctx_len              # order - 1
    int vocab_size
    int embed_dim
    int unk
    int bos
    int eos
    int null
    const float* embeddings  # (V, E)
    int n_branches
    int combine
    BranchC branches[NLM_MAX_BRANCHES]
    int n_layers
    LayerC layers[NLM_MAX_LAYERS]
    int out_dim
    int max_width            # widest vector on the way (for work buffers)
    int output_type
    const float* out_weight  # (V, D)
    const float* out_bias    # (V,)
    int n_classes
    const float* class_weight     # (C, D)
    const float* class_weight_t   # (D, n_classes_padded) transposed copy (per process), zero-padded
    int n_classes_padded
    const float* class_bias       # (C,)
    const int32_t* word_class     # (V,)
    const int32_t* class_start    # (C+1,) offsets into class_members
    const int32_t* class_members  # (V,) word ids grouped by class
    int n_nodes
    const float* tree_weight      # (N, D)
    const float* tree_bias        # (N,)
    const int64_t* path_start     # (V+1,)
    const int32_t* path_node      # (P,)
    const int8_t* path_sign       # (P,) +1 / -1
    int direct_order              # number of direct n-gram orders (0 = none)
    int64_t hash_space
    const float* direct_weights   # (hash_space,)
    int use_tables                # 1: use branch tables when present
    # joint models (NNJM): a full context is [w source-window ids | n-1 target ids]; the
    # branch weights hold the w source positions first.  w = 0 for a target-only model.
    int src_window                # w = 2m+1 (0: no source)
    int src_vocab_size            # Vs
    const float* src_embeddings   # (Vs, E)
    int src_unk
    int src_bos
    int src_eos
    int src_null
    int key_len                   # w + n-1: ids in a full context (the caches' keys)

# Exact-key hash table with O(1) clearing (generation counter) and bounded size.
# Each hash slot is ``stride = key_len + 2`` int32: [generation, entry, key...]; values live
# in dense arrays indexed by entry, handed out in insertion order, so the values of one
# sentence stay together in memory (a cleared table starts again at entry 0).  The table
# starts small and doubles while a sentence fills it (load <= 1/2), up to ``limit`` entries.
ctypedef struct TableC:
    int key_len
    int stride
    int fval_len
    int dval_len
    int64_t capacity          # hash slots, a power of two (grows up to >= 2 * limit)
    int64_t limit             # entries allowed before the table is cleared
    int64_t count
    uint32_t generation
    int32_t* slots            # (capacity, stride)
    float* fvals              # (min(capacity / 2, limit), fval_len)
    double* dvals             # (min(capacity / 2, limit), dval_len)
    int64_t hits
    int64_t misses
    int64_t clears

# Exact n-gram score table (the per-sentence n-gram cache and the persistent tuning cache):
# open addressing in one interleaved array, so a probe touches one place in memory; each
# slot is ``stride = key_len + 3`` int32 (32 bytes at order 5, one cache line in a table of
# huge pages): [generation | flag << 31, key..., score (double, 2 words)].  The flag marks
# entries loaded from disk.  Grows by doubling up to ``limit`` entries; cleared in O(1) by
# bumping the (31-bit) generation.
ctypedef struct NgramTable:
    int key_len
    int stride
    int64_t capacity          # power of two (0 = not allocated)
    int64_t count
    int64_t limit             # most entries kept per sentence (then no more inserts)
    uint32_t generation
    int32_t* slots
    int64_t hits
    int64_t misses

ctypedef struct SessionC:
    const ModelC* model
    float* buf0
    float* buf1
    float* buf2
    float* hidden             # out_dim, used when the context cache is off
    float* fscratch           # max(V, C) logits for normalisers
    int cache_enabled
    int ctx_cache_enabled     # the context cache pays off (normalised output or a costly network)
    TableC ctx_cache          # key: padded context; fvals: hidden vector; dvals: [logZ softmax, logZ class]
    TableC class_cache        # key: padded context + class; dvals: [logZ within class]
    int ngram_cache_enabled   # exact (context, word) -> score cache (when a lookup costs more than a probe)
    NgramTable ngram_cache
    int64_t lookups
    int64_t sentence_id

cdef uint64_t splitmix64(uint64_t x) noexcept nogil
cdef int64_t nlm_vocab_find(const int64_t* offsets, const unsigned char* data, const int32_t* table,
                            int64_t table_size, const char* word, int64_t length) noexcept nogil
cdef int nlm_pad_context(const ModelC* m, const int32_t* ids, int n, int32_t* out) noexcept nogil
cdef void nlm_compute_hidden(const ModelC* m, const int32_t* ctx, float* out,
                             float* b0, float* b1, float* b2) noexcept nogil
cdef SessionC* nlm_session_new(const ModelC* m, int64_t cache_entries, int64_t ngram_entries) noexcept nogil
cdef int nlm_ngram_cache_pays(const ModelC* m) noexcept nogil
cdef void* nlm_alloc_lines(size_t n) noexcept nogil
cdef void nlm_session_free(SessionC* s) noexcept nogil
cdef void nlm_session_begin(SessionC* s, int64_t sentence_id) noexcept nogil
cdef double nlm_score_padded(SessionC* s, const int32_t* ctx, int32_t word) noexcept nogil
cdef double nlm_score(SessionC* s, const int32_t* ctx, int n, int32_t word) noexcept nogil
# joint models
cdef void nlm_source_window(const ModelC* m, const int32_t* src, int n, int affiliation,
                            int32_t* out) noexcept nogil
cdef double nlm_joint_score(SessionC* s, const int32_t* window, const int32_t* ids, int n,
                            int32_t word) noexcept nogil

# exact-key tables (also used by the persistent cache)
cdef int table_init(TableC* t, int key_len, int fval_len, int dval_len, int64_t entries) noexcept nogil
cdef void table_free(TableC* t) noexcept nogil
cdef void table_clear(TableC* t) noexcept nogil
cdef int64_t table_slot(TableC* t, const int32_t* key, int* found) noexcept nogil  # returns the entry index

# exact n-gram tables
cdef int nt_alloc(NgramTable* t, int64_t capacity) noexcept nogil
cdef void nt_free(NgramTable* t) noexcept nogil
cdef void nt_clear(NgramTable* t) noexcept nogil
cdef int64_t nt_find(const NgramTable* t, const int32_t* key) noexcept nogil
cdef int64_t nt_insert(NgramTable* t, const int32_t* key, int* found) noexcept nogil

cdef inline int32_t* nt_slot(const NgramTable* t, uint64_t slot) noexcept nogil:
    return t.slots + slot * <uint64_t>t.stride


cdef inline double nt_value(const int32_t* slot, int key_len) noexcept nogil:
    cdef double v
    memcpy(&v, slot + 1 + key_len, 8)
    return v


cdef inline void nt_set(int32_t* slot, int key_len, double v, int disk) noexcept nogil:
    memcpy(slot + 1 + key_len, &v, 8)
    if disk:
        slot[0] = <int32_t>(<uint32_t>slot[0] | 0x80000000u)
    else:
        slot[0] = <int32_t>(<uint32_t>slot[0] & 0x7fffffffu)


cdef inline int nt_disk(const int32_t* slot, int key_len) noexcept nogil:
    return <int>((<uint32_t>slot[0]) >> 31)


cdef inline int nt_live(const NgramTable* t, const int32_t* slot) noexcept nogil:
    return (<uint32_t>slot[0] & 0x7fffffffu) == t.generation


cdef inline int nt_same(const int32_t* slot, const int32_t* key, int n) noexcept nogil:
    cdef int i
    for i in range(n):
        if slot[1 + i] != key[i]:
            return 0
    return 1
