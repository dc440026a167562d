# The persistent tuning cache: a disk bit on the core session's tables.  A SessionC gets a
# StoreC attached (read-only views of the sentence's cache files, probed where its
# in-memory tables miss); these functions create such sessions, map the files at sentence
# begin and write what is new at sentence end.
from libc.stdint cimport int32_t, int64_t, uint64_t
from nlmfeature._scorer cimport ModelC, SessionC

cdef extern from "../../src/nlmfeature/decoder/capi/nlm_vtable.h":
    enum:
        NLM_VT_STAT_LOOKUPS
        NLM_VT_STAT_NGRAM_HITS
        NLM_VT_STAT_CONTEXT_HITS
        NLM_VT_STAT_CONTEXT_MISSES
        NLM_VT_STAT_CLASS_HITS
        NLM_VT_STAT_CLASS_MISSES
        NLM_VT_STAT_PERSISTENT_HITS
        NLM_VT_STAT_PERSISTENT_LOADED
        NLM_VT_STAT_PERSISTENT_WRITTEN
        NLM_VT_STAT_FILES_READ
        NLM_VT_STAT_FILES_WRITTEN
        NLM_VT_STAT_FILES_IGNORED
        NLM_VT_STAT_FILES_PRUNED
        NLM_VT_STAT_SENTENCES
        NLM_VT_STAT_PERSISTENT_CONTEXT_HITS
        NLM_VT_STAT_PERSISTENT_CLASS_HITS
        NLM_VT_STAT_COUNT

# persistent-cache policy (nlm_session_options.persistent_policy / NLMFEATURE_PERSISTENT_CACHE)
cdef enum:
    PC_POLICY_ENV = -1        # read NLMFEATURE_PERSISTENT_CACHE (default auto)
    PC_POLICY_NEVER = 0
    PC_POLICY_AUTO = 1        # used where a lookup costs more than a probe
    PC_POLICY_ALWAYS = 2

cdef SessionC* pc_session_new(const ModelC* m, const unsigned char* checksum, const char* checksum_hex,
                              const char* model_path, int64_t cache_entries, int64_t ngram_entries,
                              const char* persistent_dir, int64_t max_bytes, int quiet,
                              int context_cache, int policy, int terms, char* err,
                              size_t errlen) noexcept nogil
cdef void pc_session_free(SessionC* s) noexcept nogil
cdef int pc_begin(SessionC* s, int64_t sentence_id) noexcept nogil
cdef int pc_end(SessionC* s) noexcept nogil
cdef void pc_stats(SessionC* s, int64_t* out, int n) noexcept nogil
cdef double pc_lookup(SessionC* s, const int32_t* ctx, int32_t w) noexcept nogil
cdef double pc_lookup_clean(SessionC* s, int32_t* key, uint64_t h) noexcept nogil
