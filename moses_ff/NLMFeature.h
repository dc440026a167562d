// NLMFeature: an nlmfeature neural language model as a stateful Moses feature.
//
//   [feature]
//   NLMFeature name=NLM0 path=/abs/model.nlm order=5 factor=0 [persistent-cache=DIR] [oov-feature=true] [prefetch=false]
//   [weight]
//   NLM0= 0.1
//
// Phrase-based decoding (moses-cmd).  Scores are natural logs.  The state of a hypothesis is
// the exact last n-1 model word ids (no hashes); phrase-internal words whose left context is
// not known yet get future-cost estimates with <null> padding; they are rescored with the
// real context when the phrase is applied.  One scoring session per decoder thread;
// InitializeForInput / CleanUpAfterSentenceProcessing start and end the sentence's caches
// (and the persistent tuning cache).  See moses_ff/README.md.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "moses/LM/Base.h"
#include "moses/FF/StatelessFeatureFunction.h"
#include "moses/FF/FFState.h"
#include "moses/TypeDef.h"
#include "moses/Word.h"
#include "moses/Factor.h"

// from nlmfeature.h and nlmfeature_client.h (included by the .cpp files only, so Factory.cpp
// needs no include path)
struct nlm_model;
struct nlm_session;
namespace nlmfeature
{
class Client;
}

namespace Moses
{

//! What the two nlmfeature features (NLMFeature, NLMJointFeature) share: the model, one
//! session per decoder thread and the session options of the feature line (the package's
//! nlmfeature_client.h, which the Moses2 features use too), the Moses factor -> model word
//! table, the sentence start and end, and the per-sentence stats.  Defined in NLMFeature.cpp.
class NLMClient
{
public:
  NLMClient();
  ~NLMClient();
  //! the feature-line keys of every nlmfeature feature (path, factor, persistent-cache,
  //! persistent-cache-max, cache-entries, ngram-cache-entries, span-memo-entries,
  //! context-cache, verify, stats); false for a key it does not know
  bool SetParameter(const std::string &key, const std::string &value);
  //! load the model (ABI and file checked), map every model word to its Moses factor once
  //! (words Moses creates later are <unk>) and open this thread's session now, so that bad
  //! session options (an unwritable persistent cache) fail at load.  `joint`: the joint
  //! feature's defaults (an unnormalised joint model goes without the n-gram cache unless
  //! ngram-cache-entries or persistent-cache is on the line)
  void Load(const std::string &who, bool joint = false);
  nlm_model *Model() const;
  const std::string &Path() const;
  FactorType Factor() const { return m_factorType; }
  //! the model id of a Moses word (0 = <unk> for words the model does not know)
  int32_t Id(const Word &word) const {
    size_t f = word.GetFactor(m_factorType)->GetId();
    return f < m_lookup.size() ? m_lookup[f] : 0;
  }
  //! this decoder thread's session (opened on first use)
  nlm_session *Session(const std::string &who) const;
  //! start sentence `id` (a joint model: with its source ids).  A model file overwritten in
  //! place is fatal: its mapping no longer holds the model and every score would be NaN, so
  //! Moses stops with the reason rather than translate with garbage.
  void Begin(const std::string &who, long id, const std::vector<int32_t> *source = NULL) const;
  //! end the sentence (the persistent cache writes); with stats=true print its counters
  void End(const std::string &who, long id) const;

private:
  NLMClient(const NLMClient &);
  NLMClient &operator=(const NLMClient &);

  nlmfeature::Client *m_client;
  FactorType m_factorType;
  std::vector<int32_t> m_lookup;  // Moses factor id -> model word id
};

//! Exact LM state: the last n-1 ids (fewer only right after <s>), oldest first.
class NLMFeatureState : public FFState
{
public:
  enum { MAX_CONTEXT = 15 };
  int32_t ids[MAX_CONTEXT];
  int32_t size;

  NLMFeatureState() : size(0) {}
  virtual size_t hash() const;              // nlmfeature::StateHash of the ids
  virtual bool operator==(const FFState& other) const;

  //! Moses makes one state per hypothesis expansion and drops most of them soon after (a
  //! Multi30k sentence: ~200k); a free list per thread serves them without malloc/free
  static void *operator new(size_t bytes);
  static void operator delete(void *p, size_t bytes);
};

class NLMFeature;

//! What NLMFeature registers beside itself (no scores, not tuneable, not on any line): Moses
//! evaluates the stateless features of a hypothesis before the stateful ones, so this starts
//! the NLM's work for the expansion (its n-gram keys built, their cache slots' loads begun:
//! nlm_prefetch_span) while lexicalised reordering, distortion and KenLM do theirs; the
//! NLMFeature call that follows scores from those keys.  prefetch=false on the feature line
//! leaves it out.
class NLMFeaturePrefetch : public StatelessFeatureFunction
{
public:
  explicit NLMFeaturePrefetch(const NLMFeature &owner);
  bool IsUseable(const FactorMask &) const { return true; }
  bool IsTuneable() const { return false; }
  void EvaluateInIsolation(const Phrase &, const TargetPhrase &, ScoreComponentCollection &,
                           ScoreComponentCollection &) const {}
  void EvaluateWithSourceContext(const InputType &, const InputPath &, const TargetPhrase &,
                                 const StackVec *, ScoreComponentCollection &,
                                 ScoreComponentCollection *) const {}
  void EvaluateTranslationOptionListWithSourceContext(const InputType &,
                                                      const TranslationOptionList &) const {}
  void EvaluateWhenApplied(const Hypothesis &hypo, ScoreComponentCollection *) const;
  void EvaluateWhenApplied(const ChartHypothesis &, ScoreComponentCollection *) const {}

private:
  const NLMFeature &m_owner;
};

class NLMFeature : public LanguageModel
{
  friend class NLMFeaturePrefetch;

public:
  NLMFeature(const std::string &line);
  ~NLMFeature();

  void SetParameter(const std::string& key, const std::string& value);
  void Load(AllOptions::ptr const& opts);
  bool IsUseable(const FactorMask &mask) const;

  const FFState* EmptyHypothesisState(const InputType &input) const;
  void CalcScore(const Phrase &phrase, float &fullScore, float &ngramScore, size_t &oovCount) const;
  FFState* EvaluateWhenApplied(const Hypothesis &hypo, const FFState *ps,
                               ScoreComponentCollection *out) const;
  FFState* EvaluateWhenApplied(const ChartHypothesis &hypo, int featureID,
                               ScoreComponentCollection *accumulator) const;

  void InitializeForInput(ttasksptr const& ttask);
  void CleanUpAfterSentenceProcessing(ttasksptr const& ttask);

private:
  nlm_session *Session() const;
  int32_t Id(const Word &word) const { return m_nlm.Id(word); }
  //! the ids an expansion of `hypo` (from state `in`) scores: the state's, then the phrase's,
  //! in `stack` (64 ids) or `heap`; nhist, first (= in.size), count and final of its span
  const int32_t *History(const NLMFeatureState &in, const Hypothesis &hypo, int32_t *stack,
                         std::vector<int32_t> &heap, int *nhist, int *count, int *final) const;
  //! what NLMFeaturePrefetch does for `hypo`
  void Prefetch(const Hypothesis &hypo) const;

  NLMClient m_nlm;
  size_t m_order;            // 0: take the model's
  int m_context;             // n-1
  const Factor *m_bosFactor;
  bool m_prefetch;           // prefetch= on the feature line (default true)
  size_t m_stateIndex;       // this feature's place among Moses' stateful features
  NLMFeaturePrefetch *m_prefetcher;  // owned by Moses' feature list once made (never freed, as features)
};

}  // namespace Moses
