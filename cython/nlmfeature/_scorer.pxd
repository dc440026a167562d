# C-level view of a loaded model and of a per-thread scoring session.
#
# Everything here is plain C data: the decoder-facing C ABI (``libnlmfeature``) and the
# Python API both drive the same ``nogil`` functions declared at the bottom.
from libc.stdint cimport int8_t, int32_t, int64_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy

cdef enum:
    NLM_MAX_ORDER = 16
    NLM_MAX_BRANCHES = 8
    NLM_MAX_LAYERS = 8
    NLM_MAX_WINDOW = 31      # joint models: most source-window positions (2m+1)
    NLM_MAX_KEY = NLM_MAX_ORDER + NLM_MAX_WINDOW  # ids in a full context (window + n-1)
    NLM_SPAN_BATCH = 17       # words of one span call scored as a batch (n-1 <= 15, and </s>)
    NLM_PEND_HIST = 64        # longest history a prefetched span keeps (nlm_prefetch_span)
    NLM_SOURCE_SLOTS = 256   # a session's source windows (SessionC.src_memo; a power of 2)
    NLM_CONTEXT_MEMO_BYTES = 1 << 20  # bound of a session's context memo (SessionC.ctx_memo)
    NLM_MEMO_WINDOW = 1024   # a memo's asks per sample of its hit rate (memo_open)
    NLM_MAX_COPIES = 4 + 2 * NLM_MAX_BRANCHES  # a model's arrays copied into huge pages (NativeModel.hot)
    NLM_HUGE_PAGE = 2 << 20  # bytes of a transparent huge page: alloc_huge's unit, and the least array NativeModel.hot copies

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
    const uint64_t* direct_lines  # the direct weights by line (per process; NULL without direct
                                  # features): 64-byte lines, each for 2^direct_gshift indices:
                                  # their non-zero bits (direct_words uint64 words), the line's
                                  # spill base (uint32), then its first direct_cap non-zero
                                  # weights in index order; the rest of a line's weights
                                  # (rare) spilled after the lines, from item direct_spill
    int direct_gshift             # log2 of the indices per line (4 .. 8), chosen from the data
    int direct_words              # bitmap words per line
    int direct_cap                # weights a line holds
    int direct_line_items         # items (weights' size) per line: 32 halves or 16 floats
    int direct_head_items         # items of a line's header (bitmap and spill base)
    int64_t direct_spill          # item place of the first spilled weight
    const float* direct_packed    # the store as items: a weight at its place (direct_rank_of)
    const uint16_t* direct_packed_h  # or its halves, a float16 model's as stored (direct_packed NULL)
    const double* direct_first[2]   # the order-0 term of every target's direct value, words (kind 0,
                                    # V) and classes (kind 1, C; class outputs only), per process:
                                    # the same double direct_value's sum starts from, read from a
                                    # small array instead of a random place in the weights; or NULL
    int use_tables                # 1: use branch tables when present
    # identity of the mapped model file when it was loaded (nlm_model_file_changed); fd -1: none
    int file_fd
    int64_t file_dev
    int64_t file_ino
    int64_t file_size
    int64_t file_mtime_ns
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
    # 1: the output logits are a sum of one term per context position (one first-layer branch
    # with the identity activation, no further layers: log-bilinear models) and the output is
    # normalised (softmax, class): a normaliser adds up per-sentence vectors of those terms
    # (session vec_cache) instead of multiplying the output rows by each context's hidden vector,
    # in sessions that ask for it (SessionC.linear)
    int linear_out
    # float16 rows (a model stored with `storage: float16`): its word logits take the dot
    # product in one fixed order (nlm_dot_rh / nlm_dot_rf), reading the half rows where the
    # build has F16C (unless the model was made with half_rows=False), as the diagonal context layer reads
    # half embeddings: the same bits as on the float32 widening, half the bytes from memory
    int half
    const uint16_t* embeddings_h       # (V, E) or NULL: read the float32 embeddings
    const uint16_t* src_embeddings_h   # (Vs, E) or NULL
    const uint16_t* out_weight_h       # (V, D) or NULL
    const int32_t* class_pos      # (V,) each word's place among its class's members (class outputs)

cdef enum:
    NLM_STORE_MAX_FILES = 8   # mapped persistent-cache files per sentence (a base + deltas)

# The one exact-key hash table of the package (context, class-normaliser and n-gram caches,
# and the persistent cache's files, which are these slot arrays on disk).  Open addressing
# with linear probing in one interleaved array, so a probe touches one place in memory.
# Each slot is ``stride = 1 + key_len + 2 * nd + (fval_len > 0)`` int32:
#     [generation | disk << 31, key..., nd doubles, (entry index)]
# The disk bit marks values that came from the persistent cache.  ``fval_len`` > 0 adds a
# dense float array of ``fval_len`` per entry (hidden vectors), indexed by the entry number
# kept in the slot and handed out in insertion order, so one sentence's vectors stay together.
# A key's home slot is ``nlm_home(key_hash(key), capacity)``.  In memory, tables start
# small and double while a sentence fills them (load <= 1/2) up to ``limit``
# entries; then they are cleared (``clear_when_full``) or stop taking new keys.  Clearing is
# O(1): the (31-bit) generation is bumped.  A read-only view of a file (``max_probe`` > 0)
# has generation 1 and stops probing after the longest probe its writer made.
ctypedef struct TableC:
    int key_len
    int nd                    # doubles per slot
    int fval_len              # floats per entry in ``fvals`` (0: none)
    int stride                # int32 words per slot
    int clear_when_full
    int64_t capacity          # slots (0: not allocated yet); powers of two in memory
    int64_t allocated         # slots of memory at ``slots`` (>= capacity: table_take may use less)
    int64_t limit             # entries allowed
    int64_t count
    int64_t fresh             # entries given a value computed here (disk bit clear) since the last clear
    int64_t max_probe         # > 0: longest probe sequence (read-only file views)
    uint32_t generation
    int32_t* slots            # (capacity, stride)
    float* fvals              # (min(capacity / 2, limit), fval_len) or NULL
    const uint64_t* filter    # file views: membership filter of the keys (nlm_filter_has), or NULL
    int64_t filter_blocks     # its 64-byte blocks
    int64_t hits
    int64_t misses
    int64_t clears

ctypedef struct MemoC:
    # A direct-mapped memo: each of ``slots`` slots holds the values of the last key that
    # fell in it (memo_get).  Lossy and without probing: a small block that stays in the
    # CPU's caches, for values that are functions of the model alone and that a decoder asks
    # again soon after (the exact-key TableC grows with the sentence, so its probes miss).
    int64_t slots             # a power of 2; 0: off
    int key_len
    int64_t val_len           # floats per slot
    int32_t* keys             # slots x key_len ids (an empty slot: -1)
    float* vals               # slots x val_len
    int64_t hits
    int64_t misses
    int window                # asks in the current window of NLM_MEMO_WINDOW, and hits among them
    int window_hits
    int closed                # asks still to skip (memo_open): the last window hit too rarely


# The persistent cache of one session (nlmfeature._pcache): read-only views of the current
# sentence's files, probed where the in-memory tables miss, for each level: n-gram scores,
# context normalisers ([logZ softmax, logZ class]) and within-class normalisers.
ctypedef struct StoreC:
    int nfiles
    int probe_context         # context-level entries are stored (normalised outputs)
    TableC ngram[NLM_STORE_MAX_FILES]
    TableC ctx[NLM_STORE_MAX_FILES]
    TableC cls[NLM_STORE_MAX_FILES]
    int64_t ngram_hits        # lookups answered by entries from the files (also repeats)
    int64_t ngram_found       # distinct n-grams of the sentence found in the files
    int64_t ctx_hits          # context normalisers found in the files
    int64_t class_hits        # within-class normalisers found in the files
    int ngram_in_table        # the files' n-grams were copied into the session's n-gram table at
                              # sentence begin (a lookup it misses is on no file: no probe; the
                              # table never clears itself: a full one takes no new key)
    int64_t ngram_copied      # of them not asked for yet (the table's count less these: the sentence's n-grams)

ctypedef struct SessionC:
    const ModelC* model
    float* buf0
    float* buf1
    float* buf2
    float* hidden             # out_dim, used when the context cache is off
    float* fscratch           # max(V, C) logits for normalisers
    int cache_enabled
    int ctx_cache_enabled     # the context cache pays off (normalised output or a costly network)
    TableC ctx_cache          # key: padded context; values [logZ softmax, logZ class]; fvals: hidden vector
    TableC class_cache        # key: padded context + class; value: logZ within the class
    int ngram_cache_enabled   # exact (context, word) -> score cache (when a lookup costs more than a probe)
    int ngram_cache_batched   # the n-gram cache turns on at the first batch of spans (nlm_score_spans)
    TableC ngram_cache        # key: padded context + word; value: score
    # the sentence's vectors of a normaliser's logits (normalised outputs), in one arena: the
    # direct-feature values after the last direct_order-1 ids (of every member of a class,
    # every class or every word; key [tag, level, ids...] in vec_cache); for linear outputs
    # (ModelC.linear_out) each context position's term of the logits, per (position, id) and
    # class, is in term_arena (indexed directly: pos_q, term_off)
    int vec_cache_enabled
    # normalisers from position terms (ModelC.linear_out, asked for at creation: decoder
    # sessions, whatever their caches, so that every cache path gives the same bits), whose searches ask for the same few words at each position
    # thousands of times a sentence (a Moses sentence: 38 normalisers per term vector); a
    # sentence scored once reuses a term a few times and the hidden-vector path is ~5x faster
    int linear
    int64_t pos_ids           # ids per position in pos_q / pos_stamp (the larger vocabulary)
    TableC vec_cache          # value: offset of the vector in vec_arena (-1: no room, computed again)
    double* vec_arena         # (doubles: the position terms are computed and summed in double)
    int64_t vec_used          # doubles of vec_arena in use
    int64_t vec_cap           # doubles allocated
    int64_t vec_limit         # most doubles (the caches stop taking vectors beyond)
    double* vscratch          # a vector the caches had no room for (max(V, padded classes))
    double* dacc              # a normaliser's logits summed in double (max(V, padded classes))
    uint64_t* hscratch        # a direct-feature vector's indices, then their packed weights'
                              # places (max(V, padded classes))
    double* pbuf              # one context position's contribution to the hidden vector (max_width)
    float* ebuf               # a float16 model's embedding row widened (max_width)
    double* clbuf             # a context's class logits when the context cache has no entry for it
    # the position terms are functions of the model alone, so they outlive the sentence: their
    # own arena, kept across sentences (a Moses sentence finds ~70% of its term vectors made by
    # the sentences before it) and emptied at a sentence's begin once past term_limit
    int32_t* pos_q            # ((key_len + 1) x max(V, Vs)): the number of (position, id),
    uint32_t* pos_stamp       # valid where pos_stamp is the stamp; position 0 is the bias
    uint32_t stamp
    int64_t* term_off         # (n_terms, term_cols): term_arena offset of each term vector, -1 none yet
    int64_t n_terms           # (position, id) numbers given out since the terms were emptied
    double* term_arena
    int64_t term_used         # doubles of term_arena in use
    int64_t term_cap          # doubles allocated
    int64_t term_limit        # most doubles (beyond, terms are computed where they are used)
    # factorised within-class normalisers (class outputs of linear sessions): the logits after a
    # context are a sum of a base vector of its last fact_k ids (bias, output bias, direct
    # features and those positions' terms) and the terms of the other positions, so the
    # normaliser is the sum of the products of their exponentials (float vectors, each scaled
    # by its largest value): a product of key_len - fact_k + 1 stored vectors instead of every
    # term vector summed and exponentiated per (context, class)
    int fact_k                # 0: off
    TableC base_cache         # key: class, the last fact_k ids; value: term_arena offset of the base
                              # vector (kept across sentences with the terms, emptied with them)
    double* escratch          # (key_len + 1) vectors of the factorisation the caches had no room for
    int64_t escratch_stride   # doubles per vector in escratch
    int64_t terms_cap         # rows of term_off allocated
    int term_cols             # classes + 1 (the last: the class vector), 1 for softmax
    # joint models: each source window's first-layer start per branch (source_part: the bias
    # plus the w source positions, 7 of a 5-gram NNJM's 11 rows), which every target context
    # with that window shares (key: the window; values: n_branches x max_width)
    MemoC src_memo
    # the hidden vectors of recent contexts where the context cache does not keep them
    # (diagonal networks with unnormalised or tree outputs): a decoder scores many words
    # after each context, most within a few hundred lookups of each other (context_memo_slots)
    MemoC ctx_memo
    StoreC* store             # persistent cache attached by nlmfeature._pcache, or NULL
    void* query_log           # FILE* recording every C-API lookup (NLMFEATURE_QUERY_LOG), or NULL
    int64_t lookups
    int64_t sentences         # nlm_session_begin calls
    int64_t sentence_id
    int model_changed         # the model file changed in place under us: every score is NaN
    # a span whose keys nlm_prefetch_span built and whose n-gram cache slots it started to load
    # (a Moses feature evaluated before the decoder's stateful features calls it, so the loads
    # overlap their work); the next score_span call with the same arguments takes its keys
    int pend_k                # words pending (0: none)
    int pend_nhist, pend_first, pend_count, pend_final
    int32_t pend_hist[NLM_PEND_HIST]
    int32_t pend_key[NLM_SPAN_BATCH][NLM_MAX_KEY + 1]  # the cleaned keys (context, word)
    uint64_t pend_hash[NLM_SPAN_BATCH]

cdef inline uint64_t splitmix64(uint64_t x) noexcept nogil:
    # the one 64-bit mixer of the package (direct-feature buckets, counter-based random
    # numbers); inline here so that every module that cimports it compiles it in place
    x += 0x9E3779B97F4A7C15ULL
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL
    return x ^ (x >> 31)

cdef inline uint64_t hash_bucket(uint64_t h, uint64_t hash_space) noexcept nogil:
    # h mod hash_space, the bucket of a direct feature's hash (scorer and trainer alike): a
    # mask when hash_space is a power of two (the usual case: the same bucket without a 64-bit
    # division, ~25 cycles per feature)
    if (hash_space & (hash_space - 1)) == 0:
        return h & (hash_space - 1)
    return h % hash_space
cdef int64_t nlm_vocab_find(const int64_t* offsets, const unsigned char* data, const int32_t* table,
                            int64_t table_size, const char* word, int64_t length) noexcept nogil
cdef void nlm_compute_hidden(const ModelC* m, const int32_t* ctx, float* out,
                             float* b0, float* b1, float* b2, const float* parts=*) noexcept nogil
cdef SessionC* nlm_session_new(const ModelC* m, int64_t cache_entries, int64_t ngram_entries,
                               int terms) noexcept nogil
cdef int nlm_ngram_cache_pays(const ModelC* m, int batched) noexcept nogil
cdef int nlm_costly_lookup(const ModelC* m) noexcept nogil
cdef void* nlm_alloc_lines(size_t n) noexcept nogil
cdef void nlm_session_free(SessionC* s) noexcept nogil
cdef int nlm_model_file_changed(const ModelC* m) noexcept nogil
cdef int nlm_session_begin(SessionC* s, int64_t sentence_id) noexcept nogil
cdef double nlm_score_padded(SessionC* s, const int32_t* ctx, int32_t word) noexcept nogil
cdef uint64_t nlm_prefetch_clean(SessionC* s, const int32_t* key) noexcept nogil
cdef double nlm_score_clean(SessionC* s, int32_t* key, uint64_t h) noexcept nogil
cdef double nlm_score(SessionC* s, const int32_t* ctx, int n, int32_t word) noexcept nogil
# (inline here: the C API builds every key of a decoder's spans with them)
cdef inline int nlm_pad_context(const ModelC* m, const int32_t* ids, int n, int32_t* out) noexcept nogil:
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


# joint models
cdef inline void nlm_source_window(const ModelC* m, const int32_t* src, int n, int affiliation,
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


cdef inline void nlm_clean_ngram(const ModelC* m, const int32_t* ctx, int32_t w, int32_t* key) noexcept nogil:
    """key[0..key_len-1] = the full padded context (joint models: the source window first),
    key[key_len] = the word, ids outside their vocabulary mapped to its <unk> (the contract of
    nlm_score_padded in nlmfeature.h): every scoring entry goes through this before an id
    indexes an array."""
    cdef int i, w0 = m.src_window
    cdef int32_t x
    for i in range(w0):
        x = ctx[i]
        key[i] = x if (0 <= x < m.src_vocab_size) else m.src_unk
    for i in range(w0, m.key_len):
        x = ctx[i]
        key[i] = x if (0 <= x < m.vocab_size) else m.unk
    key[m.key_len] = w if (0 <= w < m.vocab_size) else m.unk

# the one exact-key table
cdef uint64_t key_hash(const int32_t* key, int n) noexcept nogil
cdef void table_init(TableC* t, int key_len, int nd, int fval_len, int64_t limit,
                     int clear_when_full) noexcept nogil
cdef void table_free(TableC* t) noexcept nogil
cdef void* alloc_table(size_t nbytes) noexcept nogil
cdef void* alloc_huge(size_t nbytes, int zero) noexcept nogil
cdef void table_clear(TableC* t) noexcept nogil
cdef int table_take(TableC* t, int64_t slots) noexcept nogil
cdef int64_t table_find(const TableC* t, const int32_t* key, uint64_t h) noexcept nogil
cdef int64_t table_insert(TableC* t, const int32_t* key, int* found) noexcept nogil
cdef int64_t table_insert_h(TableC* t, const int32_t* key, uint64_t h, int* found) noexcept nogil
cdef uint64_t table_prefetch(const TableC* t, const int32_t* key) noexcept nogil
cdef int table_grow(TableC* t) noexcept nogil
# its lossy, fixed-size companion
cdef int memo_init(MemoC* t, int64_t slots, int key_len, int64_t val_len) noexcept nogil
cdef void memo_free(MemoC* t) noexcept nogil
cdef float* memo_get(MemoC* t, const int32_t* key, int* found) noexcept nogil
cdef int memo_open(MemoC* t) noexcept nogil

cdef extern from *:
    """
    /* home slot of hash h in a table of n slots (any n, not only powers of two): the high
       64 bits of h * n (Lemire's fast range reduction) */
    static inline unsigned long long nlm_home(unsigned long long h, unsigned long long n) {
        return (unsigned long long)(((unsigned __int128)h * n) >> 64);
    }
    /* A blocked Bloom filter over key hashes (the persistent cache's files): a key sets 4
       bits in one 64-byte block, chosen by a remix of its hash that is independent of its
       home slot.  ~10 bits per key: ~1% of absent keys pass, and an absent key costs one
       cache line of the filter instead of a probe of the table. */
    static inline unsigned long long nlm_filter_mix(unsigned long long h) {
        h ^= h >> 33; h *= 0xff51afd7ed558ccdULL; h ^= h >> 33; h *= 0xc4ceb9fe1a85ec53ULL;
        return h ^ (h >> 33);
    }
    static inline void nlm_filter_add(uint64_t* f, unsigned long long nblocks, unsigned long long h) {
        unsigned long long g = nlm_filter_mix(h);
        uint64_t *b = f + 8 * nlm_home(g, nblocks);
        int k;
        for (k = 0; k < 4; k++) { unsigned bit = (unsigned)(g >> (9 * k)) & 511u; b[bit >> 6] |= 1ULL << (bit & 63); }
    }
    static inline int nlm_filter_has(const uint64_t* f, unsigned long long nblocks, unsigned long long h) {
        unsigned long long g = nlm_filter_mix(h);
        const uint64_t *b = f + 8 * nlm_home(g, nblocks);
        int k;
        for (k = 0; k < 4; k++) { unsigned bit = (unsigned)(g >> (9 * k)) & 511u; if (!((b[bit >> 6] >> (bit & 63)) & 1)) return 0; }
        return 1;
    }
    /* Start loading the cache line at p, in a way no optimiser drops: gcc counts a bare
       __builtin_prefetch as no side effect, so it may infer a function whose only effect is
       a prefetch pure and delete its calls where the result is unused (vt_score_span's
       prefetch of the span's n-gram slots compiled to a bare `ret` that way for a while
       after b3b7d08).  The empty volatile asm taking p is an effect of its own. */
    static inline void nlm_prefetch_kept(const void* p) {
        __builtin_prefetch(p);
        __asm__ __volatile__("" : : "r"(p));
    }
    """
    uint64_t nlm_home(uint64_t h, uint64_t n) nogil
    void nlm_prefetch_kept(const void* p) nogil
    void nlm_filter_add(uint64_t* f, uint64_t nblocks, uint64_t h) nogil
    int nlm_filter_has(const uint64_t* f, uint64_t nblocks, uint64_t h) nogil


cdef inline uint64_t table_next(const TableC* t, uint64_t slot) noexcept nogil:
    """The slot after ``slot`` (linear probing, wrapping around)."""
    slot += 1
    return 0 if slot == <uint64_t>t.capacity else slot


cdef inline int32_t* table_at(const TableC* t, int64_t slot) noexcept nogil:
    return t.slots + slot * <int64_t>t.stride


cdef inline int table_live(const TableC* t, const int32_t* p) noexcept nogil:
    # word 0 of a slot: the generation (30 bits), the "seen" bit (30), the disk bit (31)
    return (<uint32_t>p[0] & 0x3fffffffu) == t.generation


cdef inline double tv_get(const TableC* t, const int32_t* p, int i) noexcept nogil:
    cdef double v
    memcpy(&v, p + 1 + t.key_len + 2 * i, 8)
    return v


cdef inline void tv_set(const TableC* t, int32_t* p, int i, double v) noexcept nogil:
    memcpy(p + 1 + t.key_len + 2 * i, &v, 8)


cdef inline int tv_disk(const int32_t* p) noexcept nogil:
    return <int>((<uint32_t>p[0]) >> 31)


cdef inline int tv_seen(const int32_t* p) noexcept nogil:
    """An entry copied from the files at sentence begin has been asked for since."""
    return <int>((<uint32_t>p[0] >> 30) & 1u)


cdef inline void tv_mark_seen(int32_t* p) noexcept nogil:
    p[0] = <int32_t>(<uint32_t>p[0] | 0x40000000u)


cdef inline void tv_mark(int32_t* p, int disk) noexcept nogil:
    if disk:
        p[0] = <int32_t>(<uint32_t>p[0] | 0x80000000u)
    else:
        p[0] = <int32_t>(<uint32_t>p[0] & 0x7fffffffu)


cdef inline float* table_fvals(const TableC* t, const int32_t* p) noexcept nogil:
    return t.fvals + <int64_t>p[1 + t.key_len + 2 * t.nd] * t.fval_len
