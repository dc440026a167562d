# Cached scoring sessions: the core SessionC plus an exact n-gram score cache that can be
# persisted per (model checksum, sentence id) in a directory (the persistent tuning cache).
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t
from nlmfeature._scorer cimport ModelC, SessionC, NgramTable

cdef extern from "../../nlmfeature/capi/nlm_vtable.h":
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
        NLM_VT_STAT_COUNT

ctypedef struct CSession:
    SessionC* core
    const ModelC* model
    int key_len               # order (n-1 context ids + the word)
    int ngram_on
    NgramTable table
    char* root                # persistent cache directory, or NULL
    char* dir                 # root/<model checksum hex>, or NULL
    unsigned char checksum[8]
    int64_t max_bytes
    int64_t sentence_id
    int active                # between begin and end
    int dirty                 # the sentence's file must be (re)written at end
    int64_t new_entries
    int quiet
    int64_t est_bytes         # estimate of the directory's size (-1: unknown)
    int64_t written_since_scan
    int64_t stats[NLM_VT_STAT_COUNT]
    void* query_log           # FILE* recording every lookup (NLMFEATURE_QUERY_LOG), or NULL

cdef CSession* cs_new(const ModelC* m, const unsigned char* checksum, const char* checksum_hex,
                      int64_t cache_entries, int64_t ngram_entries, const char* persistent_dir,
                      int64_t max_bytes, int quiet, int context_cache, char* err,
                      size_t errlen) noexcept nogil
cdef void cs_free(CSession* s) noexcept nogil
cdef int cs_begin(CSession* s, int64_t sentence_id) noexcept nogil
cdef int cs_end(CSession* s) noexcept nogil
cdef double cs_score_padded(CSession* s, const int32_t* ctx, int32_t word) noexcept nogil
cdef double cs_score(CSession* s, const int32_t* ids, int n, int32_t word) noexcept nogil
cdef void cs_stats(CSession* s, int64_t* out, int n) noexcept nogil
