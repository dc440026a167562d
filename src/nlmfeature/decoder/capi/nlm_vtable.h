/*
 * Internal interface between libnlmfeature (nlmfeature.c) and the Cython module
 * nlmfeature._capi.  NOT part of the public API: decoders include nlmfeature.h only.
 *
 * The Cython module exposes a PyCapsule named "nlmfeature._capi.vtable" holding a pointer
 * to one static nlm_vtable.  Every function in it runs without the GIL and touches no
 * Python object; the library calls them directly from decoder threads.
 */
#ifndef NLM_VTABLE_H
#define NLM_VTABLE_H

#include <stddef.h>
#include <stdint.h>

#define NLM_VTABLE_VERSION 6
#define NLM_VT_ERRLEN 1024
#define NLM_VT_MAX_ORDER 16 /* NLM_MAX_ORDER of the scorer */

/* What the loader (nlmfeature._capi.load_model) hands back: plain C data describing a
 * loaded model.  Owned by the Cython module; stays valid until free_model is called. */
typedef struct nlm_vt_model {
    const void* model_c;          /* ModelC* of nlmfeature._scorer */
    int32_t order;
    int32_t vocab_size;
    int32_t unk, bos, eos, null_id;
    int32_t output_type;          /* 0 unnormalised, 1 softmax, 2 class, 3 tree */
    const int64_t* vocab_offsets; /* (V+1,) byte offsets into vocab_bytes */
    const unsigned char* vocab_bytes;
    const int32_t* vocab_hash;    /* open-addressing table of word ids, -1 = empty */
    int64_t vocab_hash_size;
    unsigned char checksum[8];    /* model checksum (raw) */
    char checksum_hex[17];
    char path[4096];
    /* joint models (NNJM): source window and vocabulary; src_window = 0 for target-only */
    int32_t src_window;
    int32_t src_vocab_size;
    int32_t src_unk;
    const int64_t* src_vocab_offsets;
    const unsigned char* src_vocab_bytes;
    const int32_t* src_vocab_hash;
    int64_t src_vocab_hash_size;
} nlm_vt_model;

/* Options of a session (see nlm_session_options in nlmfeature.h). */
typedef struct nlm_vt_session_opts {
    int64_t cache_entries;        /* per-sentence context/normaliser cache bound; 0 = off */
    int64_t ngram_cache_entries;  /* per-sentence exact n-gram score cache bound; 0 = off */
    const char* persistent_dir;   /* NULL or "" = no persistent cache */
    int64_t persistent_max_bytes; /* disk bound of persistent_dir; <= 0 = default */
    int quiet;                    /* 1: no warnings on stderr */
    int context_cache;            /* -1 auto, 0 off, 1 on */
    int persistent_policy;        /* -1 NLMFEATURE_PERSISTENT_CACHE (default auto), 0 never, 1 auto, 2 always */
} nlm_vt_session_opts;

/* Counters, in this order (see nlm_stats in nlmfeature.h). */
enum {
    NLM_VT_STAT_LOOKUPS = 0,
    NLM_VT_STAT_NGRAM_HITS,
    NLM_VT_STAT_CONTEXT_HITS,
    NLM_VT_STAT_CONTEXT_MISSES,
    NLM_VT_STAT_CLASS_HITS,
    NLM_VT_STAT_CLASS_MISSES,
    NLM_VT_STAT_PERSISTENT_HITS,
    NLM_VT_STAT_PERSISTENT_LOADED,
    NLM_VT_STAT_PERSISTENT_WRITTEN,
    NLM_VT_STAT_FILES_READ,
    NLM_VT_STAT_FILES_WRITTEN,
    NLM_VT_STAT_FILES_IGNORED,
    NLM_VT_STAT_FILES_PRUNED,
    NLM_VT_STAT_SENTENCES,
    NLM_VT_STAT_PERSISTENT_CONTEXT_HITS,
    NLM_VT_STAT_PERSISTENT_CLASS_HITS,
    NLM_VT_STAT_COUNT
};

/* One target-only span of score_spans (the arguments of one score_span call; the same layout
 * as nlm_span of nlmfeature.h). */
typedef struct nlm_vt_span {
    const int32_t* hist;
    int nhist;
    int first;
    int count;
    int final;
} nlm_vt_span;

typedef struct nlm_vtable {
    int32_t version;              /* NLM_VTABLE_VERSION */
    int32_t stat_count;           /* NLM_VT_STAT_COUNT */
    /* sessions: NULL on failure, with a message in err */
    void* (*session_new)(const nlm_vt_model* m, const nlm_vt_session_opts* o, char* err, size_t errlen);
    void (*session_free)(void* s);
    /* 0 on success; warnings (ignored cache files) are not failures */
    int (*begin)(void* s, int64_t sentence_id);
    int (*end)(void* s);
    /* natural-log scores */
    double (*score)(void* s, const int32_t* ctx, int n, int32_t word);
    double (*score_padded)(void* s, const int32_t* ctx, int32_t word);
    void (*stats)(void* s, int64_t* out, int n);
    int32_t (*vocab_find)(const nlm_vt_model* m, const char* word, size_t len);
    /* joint models: source-vocabulary lookup (-1 if absent) and the score of `word` after the
       target history ctx[0..n-1] with the source window around `affiliation` in src[0..nsrc-1] */
    int32_t (*source_find)(const nlm_vt_model* m, const char* word, size_t len);
    double (*joint_score)(void* s, const int32_t* src, int nsrc, int affiliation,
                          const int32_t* ctx, int n, int32_t word);
    /* the sum of the scores of hist[first+i] after hist[0..first+i-1], i < count, then (final)
       of </s> after all of hist, added in that order; keys built and their cache slots
       prefetched first (nlm_score_span without the memo).  Joint models: aff holds the
       affiliations of those count (+ final) words in src[0..nsrc-1] (past nsrc: the source
       </s>, as joint_score; NULL: unknown, the <null> window, as score) */
    double (*score_span)(void* s, const int32_t* hist, int nhist, int first, int count, int final,
                         const int32_t* src, int nsrc, const int32_t* aff);
    /* a target-only span's keys built and their cache slots' loads started, kept by the
       session: the next score_span with the same arguments (aff NULL) scores from them */
    void (*prefetch_span)(void* s, const int32_t* hist, int nhist, int first, int count, int final);
    /* out[i] = score_span of spans[i] (target-only, arguments checked) for i < n, each the very
       double score_span gives; the keys of the spans a few places ahead are built and their
       cache slots' loads started while a span is scored (nlm_score_spans) */
    void (*score_spans)(void* s, const nlm_vt_span* spans, int n, double* out);
} nlm_vtable;

#endif
