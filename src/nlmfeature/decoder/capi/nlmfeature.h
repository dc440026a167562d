/*
 * nlmfeature.h -- C interface of libnlmfeature: feed-forward neural language models for
 * machine-translation decoders (Moses, cdec, your own).
 *
 * Build against it with
 *     cc $(nlmfeature config --cflags) my.c $(nlmfeature config --libs)
 * Plain C (C89 types plus <stdint.h>); usable from C++ (extern "C").  Only the nlm_*
 * functions below are exported.
 *
 * SCORES are natural logarithms (base e), as Moses and NPLM use; divide by log(10) for
 * KenLM-style log10.  For "unnormalised" models the score is the raw network output, which
 * training (NCE / self-normalisation) makes approximately a log-probability.
 *
 * WORDS are int32 ids of the model's vocabulary (0 <unk>, 1 <s>, 2 </s>, 3 <null>, then the
 * model's words).  Map your decoder's words to ids once, at load (nlm_word_id, or enumerate
 * with nlm_vocab_word), not per query.  Ids outside [0, vocab size) are scored as <unk>.
 *
 * CONTEXTS are arrays of ids, oldest first.  The model looks at the last n-1 of them
 * (n = nlm_model_order).  A shorter context is padded on the left: with <s> when its first
 * id is <s> (the sentence start is known), otherwise with <null> -- the padding for
 * future-cost estimates of words whose left context is not known yet.
 *
 * THREADS: a model is read-only and shared by all threads.  A session (per-sentence caches,
 * work buffers, persistent cache) belongs to one thread at a time.  Scoring and sessions
 * never take Python's GIL nor touch Python objects.
 *
 * PYTHON: loading a model runs the Python package nlmfeature.  If the process has no Python
 * interpreter, the library starts one itself on the first nlm_model_load (with the Python
 * that built the library; set NLMFEATURE_PYTHONHOME / PYTHONPATH only to override) and
 * releases its GIL, so a C program linking only -lnlmfeature needs no set-up.  If the
 * process already runs Python, the library uses that interpreter.
 *
 * ERRORS: functions return NLM_OK (0) or a negative nlm_status; the message of the last
 * failure on the calling thread is nlm_last_error().  Bad model paths or files are errors,
 * never aborts: a model file is validated completely at load (checksum, header, every
 * array and derived table), so nothing a file holds can make scoring read out of bounds.
 * Scoring functions return NaN and set nlm_last_error (status NLM_ERR_ARGUMENT) for a NULL
 * session, a NULL context/words/history array with a non-zero length, a negative length or
 * offset, or span words outside the history; they never crash on any id value.  Nothing is
 * clamped silently.
 *
 * SENTENCES: scoring needs no open sentence.  Before the first nlm_session_begin (Moses
 * scores phrases while it loads its phrase tables) and between nlm_session_end and the next
 * begin, a session scores exactly as inside a sentence, its caches as of its creation or
 * its last begin; only nlm_session_end without an open sentence is NLM_ERR_STATE.
 *
 * REPLACING A MODEL FILE: a loaded model is memory-mapped.  Write the new model next to the
 * old one and rename it over it (mv new.nlm live.nlm; nlmfeature's own writers do this):
 * running processes keep the old file until they reload.  Never overwrite a loaded file in
 * place (cp new.nlm live.nlm): nlm_session_begin notices it (file size or modification time
 * changed), returns NLM_ERR_MODEL, and the session scores NaN from then on -- but a process
 * that is inside a sentence when the file shrinks can still die of SIGBUS.
 */
#ifndef NLMFEATURE_H
#define NLMFEATURE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** Version of this interface; nlm_abi_version() returns the library's. */
#define NLM_ABI_VERSION 1

/** Default bound of the per-sentence context / normaliser caches (nlm_session_options
 *  cache_entries).  The one place this default is spelled: the Python package, the
 *  shims and the docs read it from here. */
#define NLM_DEFAULT_CACHE_ENTRIES 262144

/** Status codes (0 = success; failures are negative). */
typedef enum nlm_status {
    NLM_OK = 0,
    NLM_ERR_ARGUMENT = -1,   /**< a NULL or out-of-range argument */
    NLM_ERR_MODEL = -2,      /**< the model file is missing, unreadable, corrupt or inconsistent */
    NLM_ERR_PYTHON = -3,     /**< the embedded Python or the nlmfeature package could not start */
    NLM_ERR_MEMORY = -4,     /**< out of memory */
    NLM_ERR_IO = -5,         /**< a file or directory (e.g. the persistent cache) is unusable */
    NLM_ERR_STATE = -6,      /**< call out of order: nlm_session_end without an open sentence */
    NLM_ERR_ABI = -7         /**< library and package versions do not match: reinstall */
} nlm_status;

/** Output layer types (nlm_model_output_type). */
enum {
    NLM_OUTPUT_UNNORMALISED = 0, /**< raw scores, approximately log-probabilities */
    NLM_OUTPUT_SOFTMAX = 1,      /**< exact log-probabilities (full softmax) */
    NLM_OUTPUT_CLASS = 2,        /**< exact log-probabilities (class-factored softmax) */
    NLM_OUTPUT_TREE = 3          /**< exact log-probabilities (binary tree) */
};

/** Fixed ids of the special words (the same in every model). */
enum { NLM_UNK = 0, NLM_BOS = 1, NLM_EOS = 2, NLM_NULL = 3 };

typedef struct nlm_model nlm_model;     /**< a loaded model (opaque, thread-safe) */
typedef struct nlm_session nlm_session; /**< a per-thread scorer (opaque) */

/** Options of nlm_model_load_ex.  Initialise with nlm_load_options_init. */
typedef struct nlm_load_options {
    size_t struct_size;  /**< sizeof(nlm_load_options) */
    int verify;          /**< 1 (default): check the file's checksum at load (one read) */
    int use_tables;      /**< 1 (default): use precomputed first-layer tables when present */
} nlm_load_options;

/** Options of nlm_session_new.  Initialise with nlm_session_options_init. */
typedef struct nlm_session_options {
    size_t struct_size;           /**< sizeof(nlm_session_options) */
    int64_t cache_entries;        /**< bound of the per-sentence context / normaliser caches
                                       (default NLM_DEFAULT_CACHE_ENTRIES; tables grow with the sentence up to it; 0 turns them off) */
    int64_t ngram_cache_entries;  /**< bound of the per-sentence exact n-gram score cache.
                                       Default -1: on (4 * cache_entries) when a lookup costs
                                       more than a probe (normalised or tree outputs, dense
                                       layers, full context matrices without tables); for
                                       diagonal networks with unnormalised outputs (their
                                       hidden vectors come from the session's context memo)
                                       only from the first nlm_score_spans batch on, and not
                                       for tiny ones; 0 off.  With a persistent cache it is always on
                                       (default bound 1048576) */
    const char* persistent_cache; /**< directory of the persistent tuning cache, or NULL:
                                       sentence i's n-gram scores and context / class
                                       normalisers are kept in DIR/<checksum>/i.nlmc (and
                                       deltas i.<k>.nlmc), memory-mapped at begin.  Used
                                       where it pays: models that score an n-gram faster
                                       than a probe (unnormalised, no dense layers) skip it
                                       with one line on stderr, unless the environment has
                                       NLMFEATURE_PERSISTENT_CACHE=always (or =never: off
                                       for every model) */
    int64_t persistent_max_bytes; /**< disk bound of that directory (default 4 GiB).  A run
                                       writes only what fits: at the bound, sentences that have
                                       files get their working set in their place, the others
                                       none, and files unused for a day are deleted (a tuning
                                       loop reads its sentences in the same order every time) */
    int quiet;                    /**< 1: do not warn on stderr about ignored cache files */
    int context_cache;            /**< cache each context's hidden vector: -1 (default) when the
                                       model makes it pay (normalised outputs, dense layers),
                                       1 always, 0 never */
    int64_t span_memo_entries;    /**< slots of the per-sentence memo of nlm_score_span results, a
                                       direct-mapped cache of recent spans (rounded up to a power of
                                       two, 64 bytes each; default -1: NLM_SPAN_MEMO_DEFAULT = off; 0 off) */
} nlm_session_options;

/** Longest span nlm_score_span memoises (scored words plus, with `final`, the words after them). */
#define NLM_SPAN_MAX_WORDS 8
/** Default slots of the span memo: 0 (off).  Measured in Moses on Multi30k (docs/performance.md):
 *  only ~46% of expansions repeat a recent one and a hit saves ~1 lookup, so the probe cost
 *  (a growing table of all expansions: main-memory misses; a 16384-slot cache: L2 probes) was
 *  not recovered for the unnormalised or the class model.  Turn it on for models whose lookups
 *  cost much more than a probe (e.g. span_memo_entries = 16384 for dense NPLM-style networks). */
#define NLM_SPAN_MEMO_DEFAULT 0

/** Counters of a session (nlm_session_stats).  All count since the session was created. */
typedef struct nlm_stats {
    size_t struct_size;          /**< sizeof(nlm_stats), set by the caller */
    int64_t lookups;             /**< n-gram scores asked for */
    int64_t ngram_hits;          /**< answered by the exact n-gram cache (incl. persistent) */
    int64_t context_hits;        /**< hidden-layer / normaliser cache hits (per context; the
                                      context memo's too: unnormalised diagonal models) */
    int64_t context_misses;      /**< contexts computed */
    int64_t class_hits;          /**< within-class normaliser cache hits (class models) */
    int64_t class_misses;
    int64_t persistent_hits;     /**< answered by entries loaded from the persistent cache */
    int64_t persistent_loaded;   /**< entries in the persistent cache files mapped */
    int64_t persistent_written;  /**< entries written to persistent cache files */
    int64_t files_read;          /**< persistent cache files loaded */
    int64_t files_written;       /**< persistent cache files (re)written */
    int64_t files_ignored;       /**< corrupt or foreign cache files ignored (and rewritten) */
    int64_t files_pruned;        /**< cache files deleted to respect the disk bound */
    int64_t sentences;           /**< nlm_session_begin calls */
    int64_t persistent_context_hits; /**< context normalisers found in persistent cache files */
    int64_t persistent_class_hits;   /**< within-class normalisers found in persistent cache files */
    int64_t span_calls;          /**< nlm_score_span calls that could use the memo */
    int64_t span_hits;           /**< of those, answered by the per-sentence span memo */
    int64_t nlm_ns;              /**< with NLMFEATURE_TIMING=1 in the environment (at session
                                      creation): the thread's nanoseconds inside the
                                      scorer's calls (scoring calls sampled, one in 16 on
                                      average, by the monotonic clock, scaled by the
                                      sentence's CPU over wall time; sentence begin and end,
                                      the persistent cache's reads and writes, all, by its
                                      CPU clock), the clocks' own cost subtracted; 0
                                      otherwise.  What the feature costs apart from its effect
                                      on the decoder's search */
} nlm_stats;

/* ---- library ------------------------------------------------------------------------ */

/** The library's ABI version (NLM_ABI_VERSION it was built with). */
int nlm_abi_version(void);

/** Message of the last failure on the calling thread ("" if none).  Valid until the next
 *  failing call on this thread. */
const char* nlm_last_error(void);

/** Human-readable name of a status code. */
const char* nlm_status_string(int status);

/* ---- models ------------------------------------------------------------------------- */

void nlm_load_options_init(nlm_load_options* o);

/** Load (memory-map) a model file.  On success *out is the model and NLM_OK is returned;
 *  on failure *out is NULL and the status says why (NLM_ERR_MODEL for a missing or bad
 *  file; see nlm_last_error).  Thread-safe; the mapping is shared by all threads. */
int nlm_model_load(const char* path, nlm_model** out);
int nlm_model_load_ex(const char* path, const nlm_load_options* options, nlm_model** out);

/** Release a model.  NULL is ignored.  If sessions of the model are still alive, the model
 *  is released when the last of them is freed (they keep working until then). */
void nlm_model_free(nlm_model* model);

/** n: the model scores a word given the n-1 words before it. */
int nlm_model_order(const nlm_model* model);

/** Number of trailing context words that matter for recombination: n-1.  Two decoder
 *  states with the same last n-1 ids get the same future scores, so keep exactly these
 *  ids as the state (no hashes needed). */
int nlm_model_state_size(const nlm_model* model);

/** Vocabulary size V (ids 0..V-1, including the 4 special words). */
int32_t nlm_model_vocab_size(const nlm_model* model);

/** One of NLM_OUTPUT_*. */
int nlm_model_output_type(const nlm_model* model);

/** The model file's checksum (16 hex digits); keys the persistent cache. */
const char* nlm_model_checksum(const nlm_model* model);

/** Path the model was loaded from. */
const char* nlm_model_path(const nlm_model* model);

/** Id of a UTF-8 word of `len` bytes, or NLM_UNK if it is not in the vocabulary. */
int32_t nlm_word_id(const nlm_model* model, const char* word, size_t len);

/** Like nlm_word_id but returns -1 for unknown words. */
int32_t nlm_word_find(const nlm_model* model, const char* word, size_t len);

/** The word of id `id` (not NUL-terminated; *len gets its byte length), or NULL if the id
 *  is out of range.  Points into the model; valid while the model is loaded.  Enumerate
 *  the vocabulary with id = 0 .. nlm_model_vocab_size()-1. */
const char* nlm_vocab_word(const nlm_model* model, int32_t id, size_t* len);

/* ---- sessions ----------------------------------------------------------------------- */

void nlm_session_options_init(nlm_session_options* o);

/** A new per-thread session (options may be NULL for the defaults).  NLM_ERR_IO if the
 *  persistent cache directory cannot be created. */
int nlm_session_new(const nlm_model* model, const nlm_session_options* options, nlm_session** out);

/** Release a session (ends an open sentence first).  NULL is ignored. */
void nlm_session_free(nlm_session* session);

/** Start sentence `sentence_id`: empties the per-sentence caches and, with a persistent
 *  cache, loads that sentence's stored scores (ids >= 0 only).  A corrupt or foreign cache
 *  file is ignored with a warning on stderr and rewritten at the end.  Implicitly ends an
 *  open sentence.  Returns NLM_ERR_MODEL if the model file was overwritten in place since
 *  it was loaded (see REPLACING A MODEL FILE above): the session then scores NaN and
 *  stores nothing in the persistent cache.  NLM_ERR_ARGUMENT for a NULL session. */
int nlm_session_begin(nlm_session* session, int64_t sentence_id);

/** End the sentence: with a persistent cache, merges its new scores into the sentence's
 *  file (atomically; safe with other threads and processes sharing the directory).
 *  A write failure returns NLM_ERR_IO (the scores were fine). */
int nlm_session_end(nlm_session* session);

/** Natural-log score of `word` after `context` (n ids, oldest first).  With n >= order-1
 *  the last order-1 ids are used; shorter contexts are padded with <s> if context[0] is
 *  <s>, else with <null> (a future-cost estimate).  context may be NULL when n == 0. */
double nlm_score(nlm_session* session, const int32_t* context, int n, int32_t word);

/** Future-cost estimate for a word whose left context is only partly known: the `n` known
 *  words before it are `context` (oldest first, may be 0) and the words before those are
 *  unknown (<null> padding), unless `sentence_start` is 1, in which case `context` starts
 *  the sentence (<s> padding).  Equals nlm_score once n >= order-1. */
double nlm_score_partial(nlm_session* session, const int32_t* context, int n, int32_t word,
                         int sentence_start);

/** Score with an already padded context of exactly order-1 ids (no padding logic).  Ids
 *  outside [0, vocab size), in the context or as the word, are read as <unk>, as in every
 *  scoring function.  context may be NULL only for order-1 models. */
double nlm_score_padded(nlm_session* session, const int32_t* context, int32_t word);

/** Sum of the scores of `n` words after `context` (nctx ids, padded as nlm_score does): the
 *  score of appending words[0..n-1].  Writes per-word scores to `scores` if not NULL. */
double nlm_score_sequence(nlm_session* session, const int32_t* context, int nctx,
                          const int32_t* words, int n, double* scores);

/** The score a decoder adds when it appends words to a hypothesis: the sum, in order, of
 *  nlm_score(hist, i, hist[i]) for i = first .. first+count-1, plus nlm_score(hist, nhist,
 *  </s>) if `final` is 1 -- exactly the double those calls would sum (bit-identical).
 *  hist holds the state's ids followed by the new words (nhist ids, oldest first).  A
 *  phrase-based decoder calls it once per hypothesis expansion with first = the state's
 *  length and count = min(phrase length, order-1); the result is memoised per sentence
 *  (a beam search applies the same phrase to the same state many times), keyed by the ids
 *  it depends on.  Spans longer than NLM_SPAN_MAX_WORDS are computed without the memo.
 *  Arguments: hist may be NULL only when nhist is 0; 0 <= first <= nhist and 0 <= count <=
 *  nhist - first, else NaN and NLM_ERR_ARGUMENT; `final` non-zero counts as 1.  count 0 and
 *  final 0 score nothing: 0. */
double nlm_score_span(nlm_session* session, const int32_t* hist, int nhist, int first, int count,
                      int final);

/** One hypothesis expansion of nlm_score_spans: the arguments of one nlm_score_span call. */
typedef struct nlm_span {
    const int32_t* hist;  /* the state's ids, then the new words (nhist ids, oldest first) */
    int nhist;
    int first;            /* the first word scored (the state's length) */
    int count;            /* words scored from `first` on */
    int final;            /* 1: and </s> after all of hist */
} nlm_span;

/** The scores of a batch of hypothesis expansions in one call (a decoder that evaluates a
 *  whole stack's new hypotheses at once: Moses2's EvaluateWhenAppliedBatch):
 *  out[i] = nlm_score_span(session, spans[i].hist, spans[i].nhist, spans[i].first,
 *  spans[i].count, spans[i].final), the very double that call returns, for i < n.  The
 *  per-sentence memo is consulted first; then the remaining spans' n-gram keys are built
 *  and their cache slots' loads started a few spans ahead of the one being scored, so the
 *  cache misses of different hypotheses overlap.  Returns NLM_OK; NLM_ERR_ARGUMENT for a
 *  NULL session, n < 0 or a NULL spans/out with n > 0 (nothing scored), or when a span's
 *  arguments are invalid (as nlm_score_span checks them): its out[i] is NaN, the others are
 *  scored, and nlm_last_error names the first such span. */
int nlm_score_spans(nlm_session* session, const nlm_span* spans, int n, double* out);

/** Start the work of the nlm_score_span call with these arguments that comes next on this
 *  session (same thread): its lookups' keys are built and the loads of their n-gram cache
 *  slots started, so that they overlap what the decoder does in between (Moses: the
 *  stateful features evaluated before this one); that call then scores from those keys.
 *  Changes no score; any other call in between just makes it useless.  Target-only spans
 *  (not nlm_joint_score_span); does nothing for spans of more than 17 lookups (count plus
 *  final) or histories of more than 64 ids, or arguments nlm_score_span would refuse. */
void nlm_prefetch_span(nlm_session* session, const int32_t* hist, int nhist, int first, int count,
                       int final);

/** Copy the session's counters into *stats (set stats->struct_size first). */
int nlm_session_stats(nlm_session* session, nlm_stats* stats);

/* ---- joint models (NNJM) --------------------------------------------------------------
 * A joint model (trained with `nlmfeature train --source ... --alignment ...`) scores a
 * target word given its n-1 previous target words AND the w = 2m+1 source words around the
 * word's affiliated source position.  Source words have their own vocabulary (ids 0..3 are
 * <unk>, <s>, </s>, <null> there too).  Per sentence, give the source once with
 * nlm_session_begin_source; per word, give its affiliation: the source position (0-based)
 * it is affiliated with (Devlin et al. 2014: its aligned source word, the middle one of
 * several; an unaligned word takes its nearest aligned neighbour's, right first), or the
 * source length for the target </s>.  Positions beyond the sentence read <s> (left) and
 * </s> (right).  An affiliation < 0 means "unknown": the window is all <null> (a
 * future-cost estimate).  Exact decoder state: the last n-1 target ids plus, for the words
 * whose scores are not yet final, their affiliations -- no hashes needed.
 * nlm_score / nlm_score_partial / nlm_score_sequence on a joint model use the <null> window;
 * nlm_score_padded takes the full context: w source-window ids, then n-1 target ids.
 * The persistent cache works as for target-only models (its keys hold the window). */

/** w = 2m+1, the number of source words a joint model sees; 0 for a target-only model. */
int nlm_model_source_window(const nlm_model* model);

/** Source vocabulary size of a joint model (0 for a target-only model). */
int32_t nlm_model_source_vocab_size(const nlm_model* model);

/** Source-vocabulary id of a UTF-8 word, or the source <unk> (0) if unknown. */
int32_t nlm_source_word_id(const nlm_model* model, const char* word, size_t len);

/** nlm_session_begin plus the source sentence: `n` source-vocabulary ids (copied). */
int nlm_session_begin_source(nlm_session* session, int64_t sentence_id, const int32_t* source, int n);

/** Natural-log score of `word` after the target `context` (n ids, oldest first, padded as
 *  nlm_score does) given the source window around position `affiliation` of the sentence
 *  passed to nlm_session_begin_source (0..len: len is the source </s>; < 0: unknown). */
double nlm_joint_score(nlm_session* session, const int32_t* context, int n, int32_t word,
                       int affiliation);

/** The joint twin of nlm_score_span without its memo: the sum of nlm_joint_score(session, hist,
 *  first + i, hist[first + i], affiliations[i]) for i < count and, with `final`, of
 *  nlm_joint_score(session, hist, nhist, NLM_EOS, affiliations[count]), added in that order
 *  (bit-identical to those calls).  One call per hypothesis expansion: every word's key is
 *  built and its cache slot prefetched before the first is scored, so their cache misses
 *  overlap.  `affiliations` holds count + final positions. */
double nlm_joint_score_span(nlm_session* session, const int32_t* hist, int nhist, int first, int count,
                            int final, const int32_t* affiliations);

#ifdef __cplusplus
}
#endif
#endif /* NLMFEATURE_H */
