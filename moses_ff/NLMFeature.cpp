// NLMFeature: an nlmfeature neural language model as a stateful Moses feature (see NLMFeature.h).
#include "NLMFeature.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>

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
#include <nlmfeature_client.h>

namespace Moses
{

// ---- NLMClient -----------------------------------------------------------------------------

NLMClient::NLMClient() : m_client(new nlmfeature::Client()), m_factorType(0)
{
}

NLMClient::~NLMClient()
{
  delete m_client;
}

bool NLMClient::SetParameter(const std::string &key, const std::string &value)
{
  try {
    if (key == "factor") {
      m_factorType = static_cast<FactorType>(nlmfeature::ParseInt(key, value));
      return true;
    }
    return m_client->SetParameter(key, value);
  } catch (const std::runtime_error &e) {
    UTIL_THROW2("nlmfeature: " << e.what());
  }
}

void NLMClient::Load(const std::string &who, bool joint)
{
  try {
    m_client->Load(who, joint);
  } catch (const std::runtime_error &e) {
    UTIL_THROW2(e.what());
  }
  FactorCollection &collection = FactorCollection::Instance();
  struct AddWord {
    FactorCollection &collection;
    size_t operator()(const char *w, size_t len) const {
      return collection.AddFactor(StringPiece(w, len))->GetId();
    }
  } add = {collection};
  m_client->MapVocabulary(add, m_lookup);
}

nlm_model *NLMClient::Model() const
{
  return m_client->Model();
}

const std::string &NLMClient::Path() const
{
  return m_client->Path();
}

nlm_session *NLMClient::Session(const std::string &who) const
{
  try {
    return m_client->Session(who);
  } catch (const std::runtime_error &e) {
    UTIL_THROW2(e.what());
  }
}

void NLMClient::Begin(const std::string &who, long id, const std::vector<int32_t> *source) const
{
  m_client->Begin(who, id, source);
}

void NLMClient::End(const std::string &who, long /*id*/) const
{
  m_client->End(who);
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
  return nlmfeature::StateHash(ids, size);
}

bool NLMFeatureState::operator==(const FFState& o) const
{
  const NLMFeatureState &other = static_cast<const NLMFeatureState&>(o);
  return nlmfeature::SameState(ids, size, other.ids, other.size);
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
