# cython: language_level=3
"""Glue between the C library ``libnlmfeature`` and the Cython scorer.

``libnlmfeature`` (``nlmfeature/decoder/capi/nlmfeature.c``) embeds or joins a Python interpreter
only to *load* a model: it calls :func:`load_model` and :func:`free_model` under the GIL.
Everything a decoder does per sentence and per n-gram goes through :data:`VTABLE`, a
PyCapsule holding a C struct of pointers to ``nogil`` functions (see
``nlmfeature/decoder/capi/nlm_vtable.h``), so decoder threads never take the GIL.
"""
from libc.stdint cimport int32_t, int64_t, uint64_t, uintptr_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcmp, memcpy, strncpy
from cpython.pycapsule cimport PyCapsule_New, PyCapsule_GetPointer

cimport numpy as cnp
import numpy as np

from nlmfeature._scorer cimport (ModelC, SessionC, nlm_vocab_find, nlm_pad_context,
                                 nlm_source_window, nlm_prefetch_clean, NLM_MAX_KEY,
                                 NLM_MAX_WINDOW, NLM_SPAN_BATCH, NLM_PEND_HIST)
from nlmfeature._pcache cimport (pc_session_new, pc_session_free, pc_begin, pc_end, pc_stats,
                                 pc_lookup, pc_lookup_clean)

cnp.import_array()

cdef extern from "../../src/nlmfeature/decoder/capi/nlm_vtable.h":
    enum:
        NLM_VTABLE_VERSION
        NLM_VT_STAT_COUNT
    ctypedef struct nlm_vt_model:
        const void* model_c
        int32_t order
        int32_t vocab_size
        int32_t unk, bos, eos, null_id
        int32_t output_type
        const int64_t* vocab_offsets
        const unsigned char* vocab_bytes
        const int32_t* vocab_hash
        int64_t vocab_hash_size
        unsigned char checksum[8]
        char checksum_hex[17]
        char path[4096]
        int32_t src_window
        int32_t src_vocab_size
        int32_t src_unk
        const int64_t* src_vocab_offsets
        const unsigned char* src_vocab_bytes
        const int32_t* src_vocab_hash
        int64_t src_vocab_hash_size
    ctypedef struct nlm_vt_session_opts:
        int64_t cache_entries
        int64_t ngram_cache_entries
        const char* persistent_dir
        int64_t persistent_max_bytes
        int quiet
        int context_cache
        int persistent_policy
    ctypedef struct nlm_vt_span:
        const int32_t* hist
        int nhist
        int first
        int count
        int final
    ctypedef struct nlm_vtable:
        int32_t version
        int32_t stat_count
        void* (*session_new)(const nlm_vt_model*, const nlm_vt_session_opts*, char*, size_t) noexcept nogil
        void (*session_free)(void*) noexcept nogil
        int (*begin)(void*, int64_t) noexcept nogil
        int (*end)(void*) noexcept nogil
        double (*score)(void*, const int32_t*, int, int32_t) noexcept nogil
        double (*score_padded)(void*, const int32_t*, int32_t) noexcept nogil
        void (*stats)(void*, int64_t*, int) noexcept nogil
        int32_t (*vocab_find)(const nlm_vt_model*, const char*, size_t) noexcept nogil
        int32_t (*source_find)(const nlm_vt_model*, const char*, size_t) noexcept nogil
        double (*joint_score)(void*, const int32_t*, int, int, const int32_t*, int, int32_t) noexcept nogil
        double (*score_span)(void*, const int32_t*, int, int, int, int, const int32_t*, int, const int32_t*) noexcept nogil
        void (*prefetch_span)(void*, const int32_t*, int, int, int, int) noexcept nogil
        void (*score_spans)(void*, const nlm_vt_span*, int, double*) noexcept nogil

cdef enum:
    # spans whose keys vt_score_spans builds (and whose cache slots it starts to load) ahead
    # of the one it scores
    SPANS_AHEAD = 4

OUTPUT_CODES = {"unnormalised": 0, "softmax": 1, "class": 2, "tree": 3}

# ---------------------------------------------------------------------------------------
# nogil entry points
# ---------------------------------------------------------------------------------------

cdef void* vt_session_new(const nlm_vt_model* m, const nlm_vt_session_opts* o, char* err,
                          size_t errlen) noexcept nogil:
    cdef SessionC* s = pc_session_new(<const ModelC*>m.model_c, m.checksum, m.checksum_hex, m.path,
                                      o.cache_entries, o.ngram_cache_entries, o.persistent_dir,
                                      o.persistent_max_bytes, o.quiet, o.context_cache,
                                      o.persistent_policy, o.cache_entries > 0, err, errlen)
    # (a decoder's session: normalisers from position terms, which its caches keep; with the
    # caches off each would be computed again at every use, and the hidden-vector path is faster)
    return <void*>s


cdef void vt_session_free(void* s) noexcept nogil:
    pc_session_free(<SessionC*>s)


cdef int vt_begin(void* s, int64_t sid) noexcept nogil:
    return pc_begin(<SessionC*>s, sid)


cdef int vt_end(void* s) noexcept nogil:
    return pc_end(<SessionC*>s)


cdef inline int32_t lookup_key(const ModelC* m, const int32_t* src, int nsrc, int affiliation,
                               const int32_t* ids, int n, int32_t w, int32_t* key) noexcept nogil:
    """The full context of one C-API lookup into ``key`` (a joint model's source window around
    ``affiliation``, clamped to the source ``</s>`` at ``nsrc``, then the padded target
    history); returns the word, ``<unk>`` when out of range."""
    if m.src_window:
        nlm_source_window(m, src, nsrc, affiliation if affiliation <= nsrc else nsrc, key)
    nlm_pad_context(m, ids, n, key + m.src_window)
    return w if 0 <= w < m.vocab_size else m.unk


cdef double joint_lookup(SessionC* c, const int32_t* src, int nsrc, int affiliation,
                        const int32_t* ids, int n, int32_t w) noexcept nogil:
    """The one C-API scoring step: the full context (:c:func:`lookup_key`) and the word,
    through the core."""
    cdef int32_t key[NLM_MAX_KEY]
    cdef int32_t dummy = 0
    if src == NULL or nsrc < 0:
        src = &dummy
        nsrc = 0
    w = lookup_key(c.model, src, nsrc, affiliation, ids, n, w, key)
    return pc_lookup(c, key, w)


cdef double vt_score(void* s, const int32_t* ids, int n, int32_t w) noexcept nogil:
    # a joint model with the affiliation unknown sees a window of source <null>
    return joint_lookup(<SessionC*>s, NULL, 0, -1, ids, n, w)


cdef double vt_joint_score(void* s, const int32_t* src, int nsrc, int affiliation,
                           const int32_t* ids, int n, int32_t w) noexcept nogil:
    return joint_lookup(<SessionC*>s, src, nsrc, affiliation, ids, n, w)


cdef void span_keys(SessionC* c, const int32_t* hist, int nhist, int first, int count, int final,
                    const int32_t* src, int nsrc, const int32_t* aff, int32_t* keys,
                    uint64_t* hashes) noexcept nogil:
    """The lookups of a span (at most NLM_SPAN_BATCH words: ``count`` + ``final``), as
    :c:func:`joint_lookup` makes them, as keys (rows of NLM_MAX_KEY + 1 in ``keys``: the padded
    context, then the word; :c:func:`lookup_key` gives ids in range, so they are already
    cleaned) and their hashes, every word's n-gram cache slot prefetched."""
    cdef const ModelC* m = c.model
    cdef int j, end
    cdef int32_t* kp
    for j in range(count + (1 if final else 0)):
        end = first + j if j < count else nhist
        kp = keys + j * (NLM_MAX_KEY + 1)
        kp[m.key_len] = lookup_key(m, src, nsrc, aff[j] if aff != NULL else -1, hist, end,
                                   hist[end] if j < count else m.eos, kp)
        hashes[j] = nlm_prefetch_clean(c, kp)


cdef inline int span_pending(const SessionC* c, const int32_t* hist, int nhist, int first, int count,
                             int final) noexcept nogil:
    """Whether the session's prefetched span (nlm_prefetch_span) is this one."""
    return (c.pend_k != 0 and c.pend_nhist == nhist and c.pend_first == first and
            c.pend_count == count and c.pend_final == final and
            memcmp(c.pend_hist, hist, nhist * sizeof(int32_t)) == 0)


cdef double vt_score_span(void* s, const int32_t* hist, int nhist, int first, int count,
                          int final, const int32_t* src, int nsrc, const int32_t* aff) noexcept nogil:
    """Sum of the scores of ``hist[first + i]`` after ``hist[:first + i]`` for i < ``count``
    and, with ``final``, of ``</s>`` after all of ``hist`` (nlm_score_span without its memo),
    added in that order: each word exactly as :c:func:`joint_lookup` scores it (a joint model:
    with the source window around its affiliation ``aff[i]`` in ``src``, past the sentence
    its ``</s>``; ``aff`` NULL: the ``<null>`` window).  Every word's key is built and its
    n-gram cache slot prefetched before the first is scored, so the words' cache misses
    overlap instead of queueing; a span that :c:func:`vt_prefetch_span` prepared (same
    arguments, target-only) is scored from its keys (arguments checked by the library)."""
    cdef SessionC* c = <SessionC*>s
    cdef const ModelC* m = c.model
    cdef int32_t lkey[NLM_SPAN_BATCH][NLM_MAX_KEY + 1]
    cdef uint64_t lhash[NLM_SPAN_BATCH]
    cdef int32_t* keys = &lkey[0][0]
    cdef uint64_t* hashes = lhash
    cdef int32_t dummy = 0
    cdef int k = count + (1 if final else 0), j, end
    cdef double total = 0
    if src == NULL or nsrc < 0:
        src = &dummy
        nsrc = 0
    if k > NLM_SPAN_BATCH:  # longer than any decoder's span: word by word
        c.pend_k = 0
        for j in range(k):
            end = first + j if j < count else nhist
            total += joint_lookup(c, src, nsrc, aff[j] if aff != NULL else -1, hist, end,
                                  hist[end] if j < count else m.eos)
        return total
    if aff == NULL and nsrc == 0 and span_pending(c, hist, nhist, first, count, final):
        keys = &c.pend_key[0][0]
        hashes = c.pend_hash
    else:
        span_keys(c, hist, nhist, first, count, final, src, nsrc, aff, keys, hashes)
    c.pend_k = 0
    for j in range(k):
        total += pc_lookup_clean(c, keys + j * (NLM_MAX_KEY + 1), hashes[j])
    return total


cdef void vt_prefetch_span(void* s, const int32_t* hist, int nhist, int first, int count,
                           int final) noexcept nogil:
    """Build the keys of a target-only span and start loading their n-gram cache slots; the
    next :c:func:`vt_score_span` with the same arguments scores from them (nlm_prefetch_span;
    arguments checked by the library)."""
    cdef SessionC* c = <SessionC*>s
    cdef int32_t dummy = 0
    cdef int k = count + (1 if final else 0)
    c.pend_k = 0
    if k == 0 or k > NLM_SPAN_BATCH or nhist > NLM_PEND_HIST:
        return
    span_keys(c, hist, nhist, first, count, final, &dummy, 0, NULL,
              &c.pend_key[0][0], c.pend_hash)
    memcpy(c.pend_hist, hist, nhist * sizeof(int32_t))
    c.pend_nhist = nhist
    c.pend_first = first
    c.pend_count = count
    c.pend_final = final
    c.pend_k = k


cdef void vt_score_spans(void* s, const nlm_vt_span* spans, int n, double* out) noexcept nogil:
    """``out[i]`` = :c:func:`vt_score_span` of the target-only span ``spans[i]`` for i < ``n``
    (arguments checked by the library), each the very double that call returns: the words
    of a batch of hypothesis expansions through the same keys and caches.  The keys of the
    span SPANS_AHEAD places on are built and their n-gram cache slots' loads started before
    a span is scored, so the cache misses of several expansions overlap instead of queueing
    (a key's hash does not depend on what the table holds, so keys built early stay valid)."""
    cdef SessionC* c = <SessionC*>s
    cdef int32_t lkey[SPANS_AHEAD][NLM_SPAN_BATCH][NLM_MAX_KEY + 1]
    cdef uint64_t lhash[SPANS_AHEAD][NLM_SPAN_BATCH]
    cdef int32_t dummy = 0
    cdef int i, j, k, r, a
    cdef double total
    cdef const nlm_vt_span* sp
    c.pend_k = 0
    if c.ngram_cache_batched:  # (the session's n-gram cache, kept for batches: on from now)
        c.ngram_cache_enabled = 1
        c.ngram_cache_batched = 0
    for i in range(n if n < SPANS_AHEAD else SPANS_AHEAD):
        sp = &spans[i]
        if sp.count + (1 if sp.final else 0) <= NLM_SPAN_BATCH:
            span_keys(c, sp.hist, sp.nhist, sp.first, sp.count, sp.final, &dummy, 0, NULL,
                      &lkey[i][0][0], &lhash[i][0])
    for i in range(n):
        sp = &spans[i]
        r = i % SPANS_AHEAD
        k = sp.count + (1 if sp.final else 0)
        if k > NLM_SPAN_BATCH:
            out[i] = vt_score_span(s, sp.hist, sp.nhist, sp.first, sp.count, sp.final, NULL, 0, NULL)
        else:
            total = 0
            for j in range(k):
                total += pc_lookup_clean(c, &lkey[r][j][0], lhash[r][j])
            out[i] = total
        a = i + SPANS_AHEAD
        if a < n:
            sp = &spans[a]
            if sp.count + (1 if sp.final else 0) <= NLM_SPAN_BATCH:
                span_keys(c, sp.hist, sp.nhist, sp.first, sp.count, sp.final, &dummy, 0, NULL,
                          &lkey[r][0][0], &lhash[r][0])


cdef int32_t vt_source_find(const nlm_vt_model* m, const char* word, size_t n) noexcept nogil:
    cdef int64_t w
    if m.src_window == 0:
        return -1
    w = nlm_vocab_find(m.src_vocab_offsets, m.src_vocab_bytes, m.src_vocab_hash, m.src_vocab_hash_size,
                       word, n)
    return <int32_t>w if w >= 0 else -1


cdef double vt_score_padded(void* s, const int32_t* ctx, int32_t w) noexcept nogil:
    """A padded full context: n-1 target ids (a joint model: its w source-window ids first).
    Ids outside their vocabulary are cleaned by the core (nlm_clean_ngram)."""
    return pc_lookup(<SessionC*>s, ctx, w)


cdef void vt_stats(void* s, int64_t* out, int n) noexcept nogil:
    pc_stats(<SessionC*>s, out, n)


cdef int32_t vt_vocab_find(const nlm_vt_model* m, const char* word, size_t n) noexcept nogil:
    cdef int64_t w = nlm_vocab_find(m.vocab_offsets, m.vocab_bytes, m.vocab_hash, m.vocab_hash_size,
                                    word, n)
    return <int32_t>w if w >= 0 else -1


cdef nlm_vtable _vtable
_vtable.version = NLM_VTABLE_VERSION
_vtable.stat_count = NLM_VT_STAT_COUNT
_vtable.session_new = vt_session_new
_vtable.session_free = vt_session_free
_vtable.begin = vt_begin
_vtable.end = vt_end
_vtable.score = vt_score
_vtable.score_padded = vt_score_padded
_vtable.stats = vt_stats
_vtable.vocab_find = vt_vocab_find
_vtable.source_find = vt_source_find
_vtable.joint_score = vt_joint_score
_vtable.score_span = vt_score_span
_vtable.prefetch_span = vt_prefetch_span
_vtable.score_spans = vt_score_spans

#: PyCapsule "nlmfeature._capi.vtable" holding the ``nlm_vtable*``
VTABLE = PyCapsule_New(<void*>&_vtable, b"nlmfeature._capi.vtable", NULL)

# ---------------------------------------------------------------------------------------
# loading (called by libnlmfeature under the GIL)
# ---------------------------------------------------------------------------------------

#: address of each nlm_vt_model handed out -> the Model (and capsule) keeping it alive
_registry = {}


cdef const void* _data(a):
    return <const void*>cnp.PyArray_DATA(a)


def load_model(str path, bint verify=True, bint use_tables=True) -> int:
    """Load ``path`` and return the address of an ``nlm_vt_model`` describing it.

    Raises the loader's exception (e.g. :class:`nlmfeature.ModelFileError`) on failure; the
    C library turns it into an error code and message.
    """
    from nlmfeature.core.model import load
    model = load(path, verify=verify, use_tables=use_tables)
    if model.target_to_source:
        from nlmfeature.errors import NLMFeatureError
        raise NLMFeatureError(f"{path}: an inverse joint model (train --target-to-source) "
                              "predicts the source sentence from the whole translation: it is "
                              "for k-best rescoring (nlmfeature-rescore), not for decoders")
    cap = model.native.capsule()
    offsets = np.ascontiguousarray(model.arrays["vocab.offsets"], dtype=np.int64)
    data = np.ascontiguousarray(model.arrays["vocab.bytes"], dtype=np.uint8)
    if data.size == 0:
        data = np.zeros(1, dtype=np.uint8)
    table = np.ascontiguousarray(model.arrays["vocab.hash"], dtype=np.int32)
    cdef nlm_vt_model* vm = <nlm_vt_model*>calloc(1, sizeof(nlm_vt_model))
    if vm == NULL:
        raise MemoryError("out of memory loading a model")
    cdef bytes cs = bytes.fromhex(model.checksum)
    cdef bytes cs_hex = model.checksum.encode()
    cdef bytes bpath = path.encode("utf-8", "replace")
    sp = model.header["special"]
    vm.model_c = PyCapsule_GetPointer(cap, b"nlmfeature.ModelC")
    vm.order = model.order
    vm.vocab_size = int(model.header["vocab_size"])
    vm.unk, vm.bos, vm.eos, vm.null_id = sp["<unk>"], sp["<s>"], sp["</s>"], sp["<null>"]
    vm.output_type = OUTPUT_CODES.get(model.output_type, -1)
    vm.vocab_offsets = <const int64_t*>_data(offsets)
    vm.vocab_bytes = <const unsigned char*>_data(data)
    vm.vocab_hash = <const int32_t*>_data(table)
    vm.vocab_hash_size = table.shape[0]
    memcpy(vm.checksum, <const char*>cs, 8)
    strncpy(vm.checksum_hex, cs_hex, 16)
    strncpy(vm.path, bpath, 4095)
    keep = (model, cap, offsets, data, table)
    src = model.header.get("source")
    if src:
        soff = np.ascontiguousarray(model.arrays["source.vocab.offsets"], dtype=np.int64)
        sdata = np.ascontiguousarray(model.arrays["source.vocab.bytes"], dtype=np.uint8)
        if sdata.size == 0:
            sdata = np.zeros(1, dtype=np.uint8)
        stable = np.ascontiguousarray(model.arrays["source.vocab.hash"], dtype=np.int32)
        vm.src_window = int(src["window"])
        vm.src_vocab_size = int(src["vocab_size"])
        vm.src_unk = int(src["special"]["<unk>"])
        vm.src_vocab_offsets = <const int64_t*>_data(soff)
        vm.src_vocab_bytes = <const unsigned char*>_data(sdata)
        vm.src_vocab_hash = <const int32_t*>_data(stable)
        vm.src_vocab_hash_size = stable.shape[0]
        keep = keep + (soff, sdata, stable)
    _registry[<uintptr_t>vm] = keep
    return <uintptr_t>vm


def free_model(uintptr_t address) -> None:
    """Release a model returned by :func:`load_model` (its sessions must be freed first)."""
    if _registry.pop(address, None) is not None:
        free(<void*>address)


def loaded_models() -> int:
    """Number of models currently loaded through the C library."""
    return len(_registry)
