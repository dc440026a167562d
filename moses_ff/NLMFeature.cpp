// NLMFeature: an nlmfeature neural language model as a stateful Moses feature (see NLMFeature.h).
#include "NLMFeature.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

#include <boost/functional/hash.hpp>

#include "moses/FactorCollection.h"
#include "moses/Hypothesis.h"
#include "moses/InputType.h"
#include "moses/Phrase.h"
#include "moses/ScoreComponentCollection.h"
#include "moses/TargetPhrase.h"
#include "moses/TranslationTask.h"
#include "moses/Util.h"
#include "util/exception.hh"

#include <nlmfeature.h>

namespace Moses
{

// ---- NLMClient -----------------------------------------------------------------------------

struct NLMClient::ThreadSession {
  nlm_session *session;
  nlm_stats last;   // counters at the previous sentence end (for per-sentence stats)
  ThreadSession() : session(NULL) {
    std::memset(&last, 0, sizeof last);
    last.struct_size = sizeof(nlm_stats);
  }
  ~ThreadSession() { nlm_session_free(session); }
};

//! persistent-cache-max: a size in bytes, by the rule of nlmfeature.io.sizes.parse_size
//! (tests/test_sizes.py compares them): digits with an optional decimal fraction, then optionally K, M, G or T (powers of
//! 1024, any case, optionally followed by B or iB) or B alone, spaces around; at most 2^62.
static int64_t ParseBytes(const std::string &value)
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
  if (!ok || p != end || v > 4611686018427387904.0)   // 2^62
    UTIL_THROW2("nlmfeature: bad size '" << value << "' (use e.g. 500M or 2G)");
  return static_cast<int64_t>(v);
}

NLMClient::NLMClient()
  : m_persistentMaxBytes(0), m_cacheEntries(-1), m_ngramCacheEntries(-1), m_spanMemoEntries(-1)
  , m_contextCache(-1), m_factorType(0), m_verify(true), m_stats(false), m_model(NULL)
{
}

NLMClient::~NLMClient()
{
  // sessions of other threads are freed with their threads; this thread's now
  m_sessions.reset();
  nlm_model_free(m_model);
}

bool NLMClient::SetParameter(const std::string &key, const std::string &value)
{
  if (key == "path") m_path = value;
  else if (key == "factor") m_factorType = Scan<FactorType>(value);
  else if (key == "persistent-cache") m_persistentCache = value;
  else if (key == "persistent-cache-max") m_persistentMaxBytes = ParseBytes(value);
  else if (key == "cache-entries") m_cacheEntries = Scan<int64_t>(value);
  else if (key == "ngram-cache-entries") m_ngramCacheEntries = Scan<int64_t>(value);
  else if (key == "span-memo-entries") m_spanMemoEntries = Scan<int64_t>(value);
  else if (key == "context-cache") m_contextCache = value == "auto" ? -1 : (Scan<bool>(value) ? 1 : 0);
  else if (key == "verify") m_verify = Scan<bool>(value);
  else if (key == "stats") m_stats = Scan<bool>(value);
  else return false;
  return true;
}

void NLMClient::Load(const std::string &who, bool joint)
{
  UTIL_THROW_IF2(nlm_abi_version() != NLM_ABI_VERSION,
                 who << ": libnlmfeature has ABI " << nlm_abi_version() << " but Moses was built with "
                 << NLM_ABI_VERSION << "; rebuild Moses against the installed nlmfeature");
  nlm_load_options lo;
  nlm_load_options_init(&lo);
  lo.verify = m_verify ? 1 : 0;
  int rc = nlm_model_load_ex(m_path.c_str(), &lo, &m_model);
  UTIL_THROW_IF2(rc != NLM_OK, who << ": cannot load " << m_path << ": " << nlm_last_error());
  FactorCollection &collection = FactorCollection::Instance();
  const int32_t V = nlm_model_vocab_size(m_model);
  for (int32_t v = 0; v < V; ++v) {
    size_t len = 0;
    const char *w = nlm_vocab_word(m_model, v, &len);
    if (v == NLM_NULL) continue;  // <null> is padding, never a real word
    size_t id = collection.AddFactor(StringPiece(w, len))->GetId();
    if (id >= m_lookup.size()) m_lookup.resize(id + 1, NLM_UNK);
    m_lookup[id] = v;
  }
  // A missed n-gram of an unnormalised joint model (joint models have no direct features)
  // adds its n-1 target rows to its source window's stored part; beside NLMFeature its n-gram
  // table crowds the other's out of the CPU caches: Moses, KenLM + NLM + joint 2-10% faster
  // without it (docs/joint.md).  (cdec asks its n-grams again and again: the
  // library's own default, which keeps the table, stays there.)
  if (joint && m_ngramCacheEntries < 0 && m_persistentCache.empty()
      && nlm_model_output_type(m_model) == NLM_OUTPUT_UNNORMALISED)
    m_ngramCacheEntries = 0;
  Session(who);
}

nlm_session *NLMClient::Session(const std::string &who) const
{
  ThreadSession *ts = m_sessions.get();
  if (!ts) {
    nlm_session_options o;
    nlm_session_options_init(&o);
    if (m_cacheEntries >= 0) o.cache_entries = m_cacheEntries;
    if (m_ngramCacheEntries >= 0) o.ngram_cache_entries = m_ngramCacheEntries;
    if (m_spanMemoEntries >= 0) o.span_memo_entries = m_spanMemoEntries;
    if (!m_persistentCache.empty()) o.persistent_cache = m_persistentCache.c_str();
    o.persistent_max_bytes = m_persistentMaxBytes;
    o.context_cache = m_contextCache;
    nlm_session *s = NULL;
    int rc = nlm_session_new(m_model, &o, &s);
    UTIL_THROW_IF2(rc != NLM_OK, who << ": " << nlm_last_error());
    ts = new ThreadSession();
    ts->session = s;
    m_sessions.reset(ts);
  }
  return ts->session;
}

void NLMClient::Begin(const std::string &who, long id, const std::vector<int32_t> *source) const
{
  nlm_session *s = Session(who);
  int rc = source ? nlm_session_begin_source(s, id, source->empty() ? NULL : &(*source)[0],
                                             static_cast<int>(source->size()))
                  : nlm_session_begin(s, id);
  if (rc != NLM_OK) {
    std::cerr << who << ": error: " << nlm_last_error() << "\n";
    std::exit(2);
  }
}

void NLMClient::End(const std::string &who, long id) const
{
  nlm_session *s = Session(who);
  if (nlm_session_end(s) != NLM_OK)
    std::cerr << who << ": warning: " << nlm_last_error() << "\n";
  if (!m_stats) return;
  ThreadSession *ts = m_sessions.get();
  nlm_stats now;
  now.struct_size = sizeof now;
  nlm_session_stats(s, &now);
  const nlm_stats &last = ts->last;
  std::ostringstream msg;
  msg << who << " sentence " << id
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

// ---- NLMFeature ----------------------------------------------------------------------------

namespace
{
// Freed states of this thread, kept for the next (at most kStatePoolMax: a pruned search
// holds far fewer at once; beyond it, or for a size other than the state's, plain new/delete).
// A state freed by another thread than the one that made it joins that thread's list.
struct StatePool {
  enum { kStatePoolMax = 1 << 16 };
  struct Block { Block *next; };
  Block *head;
  size_t count;
  StatePool() : head(NULL), count(0) {}
  ~StatePool() {
    while (head) {
      Block *next = head->next;
      ::operator delete(head);
      head = next;
    }
    count = kStatePoolMax;  // (a state deleted after this thread's pool: plain delete)
  }
};
thread_local StatePool t_statePool;

// The history NLMFeaturePrefetch built for the expansion it saw last (this thread), for the
// NLMFeature call that follows it on the same hypothesis (Moses evaluates a hypothesis's
// stateless features, then its stateful ones, in one go): the phrase's words are mapped to
// model ids once per expansion instead of twice.  Used once, then dropped.
struct HistoryStash {
  enum { kMax = 64 };
  const void *owner;          // the NLMFeature
  const Hypothesis *hypo;     // NULL: nothing stashed
  int total, rescored, final;
  int32_t ids[kMax];
  HistoryStash() : owner(NULL), hypo(NULL), total(0), rescored(0), final(0) {}
};
thread_local HistoryStash t_history;
}  // namespace

void *NLMFeatureState::operator new(size_t bytes)
{
  StatePool &pool = t_statePool;
  if (bytes == sizeof(NLMFeatureState) && pool.head) {
    StatePool::Block *b = pool.head;
    pool.head = b->next;
    --pool.count;
    return b;
  }
  return ::operator new(bytes);
}

void NLMFeatureState::operator delete(void *p, size_t bytes)
{
  if (!p) return;
  StatePool &pool = t_statePool;
  if (bytes == sizeof(NLMFeatureState) && pool.count < StatePool::kStatePoolMax) {
    StatePool::Block *b = static_cast<StatePool::Block *>(p);
    b->next = pool.head;
    pool.head = b;
    ++pool.count;
    return;
  }
  ::operator delete(p);
}

size_t NLMFeatureState::hash() const
{
  size_t seed = static_cast<size_t>(size);
  boost::hash_range(seed, ids, ids + size);
  return seed;
}

bool NLMFeatureState::operator==(const FFState& o) const
{
  const NLMFeatureState &other = static_cast<const NLMFeatureState&>(o);
  return size == other.size && std::memcmp(ids, other.ids, sizeof(int32_t) * size) == 0;
}

NLMFeature::NLMFeature(const std::string &line)
  : LanguageModel(line)
  , m_order(0)
  , m_context(0)
  , m_bosFactor(FactorCollection::Instance().AddFactor(BOS_))
  , m_prefetch(true)
  , m_stateIndex(0)
  , m_prefetcher(NULL)
{
  ReadParameters();
  UTIL_THROW_IF2(m_nlm.Path().empty(), "NLMFeature: the feature line needs path=/abs/model.nlm");
}

NLMFeature::~NLMFeature()
{
}

inline nlm_session *NLMFeature::Session() const
{
  return m_nlm.Session(GetScoreProducerDescription());
}

void NLMFeature::SetParameter(const std::string& key, const std::string& value)
{
  if (key == "order") {
    m_order = Scan<size_t>(value);
  } else if (key == "prefetch") {
    m_prefetch = Scan<bool>(value);
  } else if (!m_nlm.SetParameter(key, value)) {
    LanguageModel::SetParameter(key, value);
  }
}

void NLMFeature::Load(AllOptions::ptr const& opts)
{
  LanguageModel::Load(opts);
  m_nlm.Load("NLMFeature " + GetScoreProducerDescription());
  nlm_model *model = m_nlm.Model();
  m_context = nlm_model_state_size(model);
  UTIL_THROW_IF2(m_order && m_order != static_cast<size_t>(nlm_model_order(model)),
                 "NLMFeature: order=" << m_order << " on the feature line but " << m_nlm.Path() << " is an order-"
                 << nlm_model_order(model) << " model");
  UTIL_THROW_IF2(m_context > NLMFeatureState::MAX_CONTEXT, "NLMFeature: model order above 16");
  if (m_prefetch && !m_prefetcher) {
    const std::vector<const StatefulFeatureFunction*> &ffs = StatefulFeatureFunction::GetStatefulFeatureFunctions();
    for (size_t i = 0; i < ffs.size(); ++i)
      if (ffs[i] == this) {
        m_stateIndex = i;
        m_prefetcher = new NLMFeaturePrefetch(*this);  // joins Moses' stateless features
        break;
      }
  }
}

bool NLMFeature::IsUseable(const FactorMask &mask) const
{
  return mask[m_nlm.Factor()];
}

const FFState* NLMFeature::EmptyHypothesisState(const InputType &/*input*/) const
{
  NLMFeatureState *s = new NLMFeatureState();
  if (m_context > 0) {
    s->ids[0] = NLM_BOS;
    s->size = 1;
  }
  return s;
}

void NLMFeature::CalcScore(const Phrase &phrase, float &fullScore, float &ngramScore, size_t &oovCount) const
{
  fullScore = 0;
  ngramScore = 0;
  oovCount = 0;
  const size_t n = phrase.GetSize();
  if (!n) return;
  nlm_session *s = Session();
  std::vector<int32_t> ids;
  ids.reserve(n + 1);
  size_t start = 0;
  if (phrase.GetWord(0).GetFactor(m_nlm.Factor()) == m_bosFactor) {
    ids.push_back(NLM_BOS);  // a sentence start: context known to be <s>
    start = 1;
  }
  double full = 0, ngram = 0;
  for (size_t i = start; i < n; ++i) {
    const Word &word = phrase.GetWord(i);
    UTIL_THROW_IF2(word.IsNonTerminal(), "NLMFeature supports phrase-based decoding only");
    int32_t id = Id(word);
    if (id == NLM_UNK) ++oovCount;
    // the context is the phrase so far: complete once it has n-1 words (or starts with
    // <s>); otherwise <null>-padded, a future-cost estimate rescored when applied
    double v = nlm_score(s, ids.empty() ? NULL : &ids[0], static_cast<int>(ids.size()), id);
    full += v;
    if (i >= static_cast<size_t>(m_context)) ngram += v;  // full context inside the phrase
    ids.push_back(id);
  }
  fullScore = static_cast<float>(full);
  ngramScore = static_cast<float>(ngram);
}

const int32_t *NLMFeature::History(const NLMFeatureState &in, const Hypothesis &hypo, int32_t *stack,
                                   std::vector<int32_t> &heap, int *nhist, int *count, int *final) const
{
  const size_t len = hypo.GetCurrTargetLength();
  const bool complete = hypo.IsSourceCompleted();
  if (!len && !complete) return NULL;
  const TargetPhrase &phrase = hypo.GetCurrTargetPhrase();
  // history = the state's ids, then the phrase's words
  int32_t *hist = stack;
  const size_t total = in.size + len;
  if (total > 64) {
    heap.resize(total);
    hist = &heap[0];
  }
  std::memcpy(hist, in.ids, sizeof(int32_t) * in.size);
  for (size_t j = 0; j < len; ++j) hist[in.size + j] = Id(phrase.GetWord(j));
  // words whose in-phrase context was incomplete: EvaluateInIsolation gave them only an
  // estimate; they are scored with the real context now (the others are already in the
  // score), and </s> after the whole history when the sentence is complete: one
  // nlm_score_span call per expansion, exactly the sum of the per-word scores
  *nhist = static_cast<int>(total);
  *count = static_cast<int>(std::min(len, static_cast<size_t>(m_context)));
  *final = complete ? 1 : 0;
  return hist;
}

void NLMFeature::Prefetch(const Hypothesis &hypo) const
{
  HistoryStash &stash = t_history;
  stash.hypo = NULL;
  const Hypothesis *prev = hypo.GetPrevHypo();
  if (!prev) return;
  const FFState *ps = prev->GetFFState(static_cast<int>(m_stateIndex));
  if (!ps) return;
  const NLMFeatureState &in = static_cast<const NLMFeatureState&>(*ps);
  std::vector<int32_t> heap;
  int total, rescored, final;
  const int32_t *hist = History(in, hypo, stash.ids, heap, &total, &rescored, &final);
  if (!hist) return;
  nlm_prefetch_span(Session(), hist, total, in.size, rescored, final);
  if (hist == stash.ids) {  // (a history longer than kMax went to the heap: not kept)
    stash.owner = this;
    stash.hypo = &hypo;
    stash.total = total;
    stash.rescored = rescored;
    stash.final = final;
  }
}

NLMFeaturePrefetch::NLMFeaturePrefetch(const NLMFeature &owner)
  : StatelessFeatureFunction(0, "NLMFeaturePrefetch name=" + owner.GetScoreProducerDescription() + "-prefetch")
  , m_owner(owner)
{
}

void NLMFeaturePrefetch::EvaluateWhenApplied(const Hypothesis &hypo, ScoreComponentCollection *) const
{
  m_owner.Prefetch(hypo);
}

FFState* NLMFeature::EvaluateWhenApplied(const Hypothesis &hypo, const FFState *ps,
                                         ScoreComponentCollection *out) const
{
  const NLMFeatureState &in = static_cast<const NLMFeatureState&>(*ps);
  NLMFeatureState *ret = new NLMFeatureState(in);
  int32_t stack[64];
  std::vector<int32_t> heap;
  int total, rescored, final;
  const int32_t *hist;
  HistoryStash &stash = t_history;
  if (stash.hypo == &hypo && stash.owner == this) {  // the companion's, for this expansion
    hist = stash.ids;
    total = stash.total;
    rescored = stash.rescored;
    final = stash.final;
    stash.hypo = NULL;
  } else {
    hist = History(in, hypo, stack, heap, &total, &rescored, &final);
    if (!hist) return ret;
  }
  const double score = nlm_score_span(Session(), hist, total, in.size, rescored, final);

  const size_t keep = std::min(static_cast<size_t>(total), static_cast<size_t>(m_context));
  std::memcpy(ret->ids, hist + (total - keep), sizeof(int32_t) * keep);
  ret->size = static_cast<int32_t>(keep);

  if (OOVFeatureEnabled()) {
    std::vector<float> scores(2);
    scores[0] = static_cast<float>(score);
    scores[1] = 0.0f;
    out->PlusEquals(this, scores);
  } else {
    out->PlusEquals(this, static_cast<float>(score));
  }
  return ret;
}

FFState* NLMFeature::EvaluateWhenApplied(const ChartHypothesis &/*hypo*/, int /*featureID*/,
                                         ScoreComponentCollection * /*accumulator*/) const
{
  UTIL_THROW2("NLMFeature supports phrase-based decoding only (not moses_chart)");
}

void NLMFeature::InitializeForInput(ttasksptr const& ttask)
{
  m_nlm.Begin("NLMFeature " + GetScoreProducerDescription(), ttask->GetSource()->GetTranslationId());
}

void NLMFeature::CleanUpAfterSentenceProcessing(ttasksptr const& ttask)
{
  m_nlm.End("NLMFeature " + GetScoreProducerDescription(), ttask->GetSource()->GetTranslationId());
}

}  // namespace Moses
