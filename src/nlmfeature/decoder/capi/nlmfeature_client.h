/*
 * nlmfeature_client.h -- what a C++ decoder feature needs around the C API of nlmfeature.h:
 * the feature-line options of a session, the model, one session per decoder thread, the
 * sentence start and end, and the per-sentence stats line.  Header-only C++ (Boost.Thread
 * for the per-thread sessions, as Moses and Moses2 use); the Moses and Moses2 features of
 * moses_ff/ share it, so a key means the same on both decoders' feature lines.
 *
 * With NLMFEATURE_CLIENT_PARSERS_ONLY defined before it is included, only the option rules
 * (ParseSize, ParseInt, ParseBool) and the affiliation heuristic: no Boost (the cdec
 * features, single-threaded, keep their own client and share these rules).
 *
 * Errors (a bad value on the feature line, a model that does not load, an unwritable
 * persistent cache) are thrown as std::runtime_error with a message naming the feature and
 * the file; the decoder's feature turns them into its own exception type.
 */
#ifndef NLMFEATURE_CLIENT_H
#define NLMFEATURE_CLIENT_H

#include <stdint.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#ifndef NLMFEATURE_CLIENT_PARSERS_ONLY
#include <boost/functional/hash.hpp>
#include <boost/thread/tss.hpp>
#endif

#include "nlmfeature.h"

namespace nlmfeature
{

/** "500M", "2G", "4096" as bytes, by the rule of nlmfeature.io.sizes.parse_size
 *  (tests/test_sizes.py compares them): digits with an optional decimal fraction, then
 *  optionally K, M, G or T (powers of 1024, any case, optionally followed by B or iB) or B
 *  alone, white space around; at most 2^62.  Throws std::runtime_error naming `key` for
 *  anything else. */
inline int64_t ParseSize(const std::string &key, const std::string &value)
{
  const char *p = value.c_str(), *end = p + value.size(), *num;
  double v = 0, mult = 1;
  bool ok;
  while (p < end && (*p == ' ' || (*p >= '\t' && *p <= '\r'))) ++p;
  for (num = p; p < end && *p >= '0' && *p <= '9'; ++p) {}
  ok = p > num;
  if (ok && p < end && *p == '.') {
    const char *frac = ++p;
    while (p < end && *p >= '0' && *p <= '9') ++p;
    ok = p > frac;
  }
  if (ok) v = std::strtod(std::string(num, p).c_str(), NULL);
  while (p < end && (*p == ' ' || (*p >= '\t' && *p <= '\r'))) ++p;
  if (ok && p < end && (*p | 0x20) != 'b') {
    switch (*p++ | 0x20) {
      case 'k': mult = 1024.0; break;
      case 'm': mult = 1048576.0; break;
      case 'g': mult = 1073741824.0; break;
      case 't': mult = 1099511627776.0; break;
      default: ok = false;
    }
    if (ok && p < end && (*p | 0x20) == 'i') ok = ++p < end && (*p | 0x20) == 'b';
  }
  if (ok && p < end && (*p | 0x20) == 'b') ++p;
  while (p < end && (*p == ' ' || (*p >= '\t' && *p <= '\r'))) ++p;
  v *= mult;
  if (!ok || p != end || v > 4611686018427387904.0)  // 2^62
    throw std::runtime_error(key + "=" + value + ": not a size (use a number with an optional K, M, G or T "
                             "suffix, e.g. 500M or 2G)");
  return static_cast<int64_t>(v);
}

/** End the decoder now with `status`, from any of its threads: the output written so far
 *  flushed, no static destructors run (std::exit on one decoder thread while others still
 *  decode tears objects down under them: seen as SIGSEGV in Moses2). */
inline void Stop(int status)
{
  std::cout.flush();
  std::cerr.flush();
  std::fflush(NULL);
  std::_Exit(status);
}

/** An integer option; throws std::runtime_error naming `key` unless all of `value` is one. */
inline int64_t ParseInt(const std::string &key, const std::string &value)
{
  char *end = NULL;
  errno = 0;
  long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || !end || *end || errno)
    throw std::runtime_error(key + "=" + value + ": not an integer");
  return static_cast<int64_t>(v);
}

/** true/false, 1/0, yes/no, on/off; throws std::runtime_error naming `key` otherwise. */
inline bool ParseBool(const std::string &key, const std::string &value)
{
  if (value == "true" || value == "1" || value == "yes" || value == "on") return true;
  if (value == "false" || value == "0" || value == "no" || value == "off") return false;
  throw std::runtime_error(key + "=" + value + ": not true or false");
}

/** The affiliations of a target phrase's n words (joint models, Devlin et al. 2014's heuristic,
 *  the same as nlmfeature.joint.affiliations): out[j] = the source position of word j, given the
 *  phrase's word alignment as (source, target) pairs in [begin, end) ordered by source position
 *  (Moses' and Moses2's AlignmentInfo), its source span's first position `start` and length
 *  `srcLen`.  The aligned source word (the middle one of several, the right one of two); an
 *  unaligned word takes the nearest aligned word's (right first); a phrase without any
 *  alignment point spreads its words proportionally over its source span.  No allocation for
 *  phrases of up to 64 words (it runs for every hypothesis expansion). */
template <class It>
void Affiliations(It begin, It end, size_t n, size_t start, size_t srcLen, int *out)
{
  const size_t kStack = 64;
  int stackBuf[3 * kStack];
  std::vector<int> heapBuf;
  int *buf = stackBuf;
  if (n > kStack) {
    heapBuf.resize(3 * n);
    buf = &heapBuf[0];
  }
  int *own = buf, *count = buf + n, *seen = buf + 2 * n;
  for (size_t j = 0; j < n; ++j) {
    own[j] = -1;
    count[j] = 0;
    seen[j] = 0;
  }
  // the k-th pair seen with target j holds j's k-th source position in increasing order
  for (It it = begin; it != end; ++it)
    if (it->second < n) ++count[it->second];
  bool any = false;
  for (It it = begin; it != end; ++it) {
    const size_t j = it->second;
    if (j >= n) continue;
    if (seen[j]++ == count[j] / 2) {  // the middle one; the right one of two middle ones
      own[j] = static_cast<int>(start + it->first);
      any = true;
    }
  }
  for (size_t j = 0; j < n; ++j) {
    out[j] = -1;
    if (!any) {  // no alignment point: proportional position in the source span
      size_t p = srcLen ? std::min(srcLen - 1, j * srcLen / n) : 0;
      out[j] = static_cast<int>(start + p);
    } else if (own[j] >= 0) {
      out[j] = own[j];
    } else {     // nearest aligned word, the right one on ties
      for (size_t d = 1; d < n; ++d) {
        if (j + d < n && own[j + d] >= 0) { out[j] = own[j + d]; break; }
        if (j >= d && own[j - d] >= 0) { out[j] = own[j - d]; break; }
      }
    }
  }
}

#ifndef NLMFEATURE_CLIENT_PARSERS_ONLY
/** The recombination state of a target-side NLM feature is the last n-1 target ids (the
 *  scorer's context of the next word): the Moses and Moses2 features' states hash and
 *  compare them with these two, so that two states recombine exactly when their ids do. */
inline size_t StateHash(const int32_t *ids, int32_t size)
{
  size_t seed = static_cast<size_t>(size);
  boost::hash_range(seed, ids, ids + size);
  return seed;
}

inline bool SameState(const int32_t *a, int32_t na, const int32_t *b, int32_t nb)
{
  return na == nb && std::memcmp(a, b, sizeof(int32_t) * na) == 0;
}

/** The model, the session options and one session per decoder thread of one feature (left
 *  out with NLMFEATURE_CLIENT_PARSERS_ONLY defined: the option rules alone, no Boost). */
class Client
{
public:
  Client()
    : m_persistentMaxBytes(0), m_cacheEntries(-1), m_ngramCacheEntries(-1), m_spanMemoEntries(-1)
    , m_contextCache(-1), m_verify(true), m_stats(false), m_model(NULL) {}

  ~Client() {
    // sessions of other threads are freed with their threads; this thread's now
    m_sessions.reset();
    nlm_model_free(m_model);
  }

  /** The session keys of a feature line (path, persistent-cache, persistent-cache-max,
   *  cache-entries, ngram-cache-entries, span-memo-entries, context-cache, verify, stats);
   *  false for a key it does not know. */
  bool SetParameter(const std::string &key, const std::string &value) {
    if (key == "path") m_path = value;
    else if (key == "persistent-cache") m_persistentCache = value;
    else if (key == "persistent-cache-max") m_persistentMaxBytes = ParseSize(key, value);
    else if (key == "cache-entries") m_cacheEntries = ParseInt(key, value);
    else if (key == "ngram-cache-entries") m_ngramCacheEntries = ParseInt(key, value);
    else if (key == "span-memo-entries") m_spanMemoEntries = ParseInt(key, value);
    else if (key == "context-cache") m_contextCache = value == "auto" ? -1 : (ParseBool(key, value) ? 1 : 0);
    else if (key == "verify") m_verify = ParseBool(key, value);
    else if (key == "stats") m_stats = ParseBool(key, value);
    else return false;
    return true;
  }

  /** Load the model (ABI and file checked) and open this thread's session now, so that bad
   *  session options (an unwritable persistent cache) fail at load.  `joint`: the joint
   *  feature's defaults (an unnormalised joint model goes without the n-gram cache unless
   *  ngram-cache-entries or persistent-cache is on the line: beside the target-only feature
   *  its table crowds the other's out of the CPU caches). */
  void Load(const std::string &who, bool joint = false) {
    if (m_path.empty()) throw std::runtime_error(who + ": the feature line needs path=/abs/model.nlm");
    if (nlm_abi_version() != NLM_ABI_VERSION) {
      std::ostringstream msg;
      msg << who << ": libnlmfeature has ABI " << nlm_abi_version() << " but the decoder was built with "
          << NLM_ABI_VERSION << "; rebuild it against the installed nlmfeature";
      throw std::runtime_error(msg.str());
    }
    nlm_load_options lo;
    nlm_load_options_init(&lo);
    lo.verify = m_verify ? 1 : 0;
    if (nlm_model_load_ex(m_path.c_str(), &lo, &m_model) != NLM_OK)
      throw std::runtime_error(who + ": cannot load " + m_path + ": " + nlm_last_error());
    if (joint && m_ngramCacheEntries < 0 && m_persistentCache.empty()
        && nlm_model_output_type(m_model) == NLM_OUTPUT_UNNORMALISED)
      m_ngramCacheEntries = 0;
    Session(who);
  }

  /** Call add(word, len) for every model word but <null> (padding, never a real word) and
   *  store the model id under the decoder's id it returns: lookup[decoder id] = model id,
   *  <unk> (0) for decoder words the model does not know. */
  template <class AddWord>
  void MapVocabulary(AddWord add, std::vector<int32_t> &lookup) const {
    const int32_t V = nlm_model_vocab_size(m_model);
    for (int32_t v = 0; v < V; ++v) {
      if (v == NLM_NULL) continue;
      size_t len = 0;
      const char *w = nlm_vocab_word(m_model, v, &len);
      size_t id = add(w, len);
      if (id >= lookup.size()) lookup.resize(id + 1, NLM_UNK);
      lookup[id] = v;
    }
  }

  nlm_model *Model() const { return m_model; }
  const std::string &Path() const { return m_path; }

  /** This decoder thread's session (opened on first use). */
  nlm_session *Session(const std::string &who) const { return Thread(who)->session; }

  /** Start sentence `id` on this thread's session (a joint model: with its source ids).  A
   *  model file overwritten in place is fatal: its mapping no longer holds the model and
   *  every score would be NaN, so the decoder stops with the reason rather than translate
   *  with garbage. */
  void Begin(const std::string &who, long id, const std::vector<int32_t> *source = NULL) const {
    ThreadSession *ts = Thread(who);
    int rc = source ? nlm_session_begin_source(ts->session, id, source->empty() ? NULL : &(*source)[0],
                                               static_cast<int>(source->size()))
                    : nlm_session_begin(ts->session, id);
    if (rc != NLM_OK) {
      std::cerr << who << ": error: " << nlm_last_error() << std::endl;
      Stop(2);
    }
    ts->sentence = id;
  }

  /** End this thread's sentence (the persistent cache writes); with stats=true print its
   *  counters on stderr, one line. */
  void End(const std::string &who) const {
    ThreadSession *ts = Thread(who);
    if (nlm_session_end(ts->session) != NLM_OK)
      std::cerr << who << ": warning: " << nlm_last_error() << "\n";
    if (!m_stats) return;
    nlm_stats now;
    std::memset(&now, 0, sizeof now);
    now.struct_size = sizeof now;
    nlm_session_stats(ts->session, &now);
    const nlm_stats &last = ts->last;
    std::ostringstream msg;
    msg << who << " sentence " << ts->sentence
        << " lookups=" << now.lookups - last.lookups
        << " ngram_hits=" << now.ngram_hits - last.ngram_hits
        << " context_hits=" << now.context_hits - last.context_hits
        << " context_misses=" << now.context_misses - last.context_misses
        << " class_hits=" << now.class_hits - last.class_hits
        << " class_misses=" << now.class_misses - last.class_misses
        << " persistent_hits=" << now.persistent_hits - last.persistent_hits
        << " persistent_loaded=" << now.persistent_loaded - last.persistent_loaded
        << " persistent_written=" << now.persistent_written - last.persistent_written
        << " files_ignored=" << now.files_ignored - last.files_ignored
        << " span_calls=" << now.span_calls - last.span_calls
        << " span_hits=" << now.span_hits - last.span_hits
        << " nlm_ns=" << now.nlm_ns - last.nlm_ns << "\n";
    std::cerr << msg.str();
    ts->last = now;
  }

private:
  struct ThreadSession {
    nlm_session *session;
    long sentence;    // the sentence Begin started last
    nlm_stats last;   // counters at the previous sentence end (for per-sentence stats)
    ThreadSession() : session(NULL), sentence(-1) {
      std::memset(&last, 0, sizeof last);
      last.struct_size = sizeof(nlm_stats);
    }
    ~ThreadSession() { nlm_session_free(session); }
  };

  ThreadSession *Thread(const std::string &who) const {
    ThreadSession *ts = m_sessions.get();
    if (ts) return ts;
    nlm_session_options o;
    nlm_session_options_init(&o);
    if (m_cacheEntries >= 0) o.cache_entries = m_cacheEntries;
    if (m_ngramCacheEntries >= 0) o.ngram_cache_entries = m_ngramCacheEntries;
    if (m_spanMemoEntries >= 0) o.span_memo_entries = m_spanMemoEntries;
    if (!m_persistentCache.empty()) o.persistent_cache = m_persistentCache.c_str();
    o.persistent_max_bytes = m_persistentMaxBytes;
    o.context_cache = m_contextCache;
    nlm_session *s = NULL;
    if (nlm_session_new(m_model, &o, &s) != NLM_OK)
      throw std::runtime_error(who + ": " + nlm_last_error());
    ts = new ThreadSession();
    ts->session = s;
    m_sessions.reset(ts);
    return ts;
  }

  Client(const Client &);
  Client &operator=(const Client &);

  std::string m_path;
  std::string m_persistentCache;
  int64_t m_persistentMaxBytes;
  int64_t m_cacheEntries;
  int64_t m_ngramCacheEntries;
  int64_t m_spanMemoEntries;  // -1: the library's default
  int m_contextCache;         // -1 auto, 0 off, 1 on
  bool m_verify;
  bool m_stats;
  nlm_model *m_model;
  mutable boost::thread_specific_ptr<ThreadSession> m_sessions;
};
#endif  // NLMFEATURE_CLIENT_PARSERS_ONLY

}  // namespace nlmfeature

#endif
