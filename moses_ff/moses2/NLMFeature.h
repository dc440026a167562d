// NLMFeature for Moses2: an nlmfeature neural language model as a stateful Moses2 feature.
//
//   [feature]
//   NLMFeature name=NLM0 path=/abs/model.nlm [order=5] [factor=0] [persistent-cache=DIR] [stats=true]
//              [oov-feature=true]
//   [weight]
//   NLM0= 0.1          (with oov-feature=true two weights: the log-probability, the OOV count)
//
// Phrase-based decoding.  Scores are natural logs.  The state of a hypothesis is the exact last
// n-1 model word ids (no hashes); phrase-internal words whose left context is not known yet get
// future-cost estimates with <null> padding and are rescored with the real context when the
// phrase is applied.  One scoring session per decoder thread (nlmfeature_client.h, shared with
// the Moses feature).  With `search-algorithm 4` (Moses2's NormalBatch, which moses2.patch
// implements) the decoder hands the feature a whole stack's new hypotheses at once and the
// feature scores them in one nlm_score_spans call.  See moses_ff/README.md.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "../FF/StatefulFeatureFunction.h"
#include "../FF/FFState.h"
#include "../TypeDef.h"
#include "../Word.h"
#include "../legacy/Factor.h"

// from nlmfeature.h and nlmfeature_client.h (included by NLMFeature.cpp only, so the files that
// include this header need no include path)
struct nlm_session;
namespace nlmfeature
{
class Client;
}

namespace Moses2
{

//! Exact LM state: the last n-1 model ids (fewer only right after <s>), oldest first.
class NLMFeatureState : public FFState
{
public:
  enum { MAX_CONTEXT = 15 };
  int32_t ids[MAX_CONTEXT];
  int32_t size;

  NLMFeatureState() : size(0) {}
  virtual size_t hash() const;              // nlmfeature::StateHash of the ids
  virtual bool operator==(const FFState &other) const;
  virtual std::string ToString() const;
};

class NLMFeature : public StatefulFeatureFunction
{
public:
  NLMFeature(size_t startInd, const std::string &line, const char *kind = "NLMFeature");
  virtual ~NLMFeature();

  virtual void Load(System &system);
  virtual void SetParameter(const std::string &key, const std::string &value);

  virtual FFState *BlankState(MemPool &pool, const System &sys) const;
  virtual void EmptyHypothesisState(FFState &state, const ManagerBase &mgr, const InputType &input,
                                    const Hypothesis &hypo) const;

  virtual void EvaluateInIsolation(MemPool &pool, const System &system, const Phrase<Moses2::Word> &source,
                                   const TargetPhraseImpl &targetPhrase, Scores &scores,
                                   SCORE &estimatedScore) const;
  virtual void EvaluateInIsolation(MemPool &pool, const System &system, const Phrase<SCFG::Word> &source,
                                   const TargetPhrase<SCFG::Word> &targetPhrase, Scores &scores,
                                   SCORE &estimatedScore) const;

  virtual void EvaluateWhenApplied(const ManagerBase &mgr, const Hypothesis &hypo, const FFState &prevState,
                                   Scores &scores, FFState &state) const;
  virtual void EvaluateWhenApplied(const SCFG::Manager &mgr, const SCFG::Hypothesis &hypo, int featureID,
                                   Scores &scores, FFState &state) const;
  //! all the expansions of `batch` in one nlm_score_spans call (search-algorithm 4)
  virtual void EvaluateWhenAppliedBatch(const System &system, const Batch &batch) const;

  virtual void InitializeForInput(const ManagerBase &mgr, const InputType &input);
  virtual void CleanUpAfterSentenceProcessing(const System &system, const InputType &input) const;

protected:
  //! the model id of a Moses2 word (0 = <unk> for words the model does not know)
  int32_t Id(const Word &word) const {
    size_t f = word[m_factorType]->GetId();
    return f < m_lookup.size() ? m_lookup[f] : 0;
  }
  nlm_session *Session() const;
  //! the ids an expansion of `hypo` from state `in` scores (the state's, then the phrase's)
  //! appended to `hist`; its count (words rescored) and final (</s> after them)
  void History(const NLMFeatureState &in, const Hypothesis &hypo, std::vector<int32_t> &hist,
               int *count, int *final) const;
  //! the state after `hist` (its last n-1 ids)
  void SetState(const int32_t *hist, int nhist, FFState &state) const;
  //! "NLMFeature NAME": how messages name this feature
  std::string Who() const { return m_kind + " " + GetName(); }
  //! load the model (`joint`: a joint model's session defaults) and map the vocabulary
  void LoadModel(System &system, bool joint);

  std::string m_kind;          // "NLMFeature" or "NLMJointFeature": how messages name it
  std::string m_who;           // Who() once the name is final (Load): Session() runs per expansion
  nlmfeature::Client *m_client;
  size_t m_order;             // 0: take the model's
  int m_context;              // n-1
  FactorType m_factorType;
  const Factor *m_bos;
  std::vector<int32_t> m_lookup;  // Moses2 factor id -> model word id
};

}  // namespace Moses2

namespace Moses2
{

//! A joint model (NNJM, Devlin et al. 2014) as a Moses2 feature: each target word scored
//! given its n-1 previous target words and the source window around its affiliated source
//! word (the phrase's word alignment, Devlin's heuristic: nlmfeature::Affiliations; the target
//! </s> with the source </s>).
//!
//!   [feature]
//!   NLMJointFeature name=NNJM0 path=/abs/joint.nlm [factor=0] [source-factor=0]
//!   [weight]
//!   NNJM0= 0.1
//!
//! Moses2 evaluates phrases in isolation without their source position, so every word of a
//! phrase gets a future-cost estimate there (the <null> source window) and its score when
//! the phrase is applied (its real source window and target history: one
//! nlm_joint_score_span call per expansion).  State: the exact last n-1 target ids.
class NLMJointFeature : public NLMFeature
{
public:
  NLMJointFeature(size_t startInd, const std::string &line);

  virtual void Load(System &system);
  virtual void SetParameter(const std::string &key, const std::string &value);

  virtual void EvaluateInIsolation(MemPool &pool, const System &system, const Phrase<Moses2::Word> &source,
                                   const TargetPhraseImpl &targetPhrase, Scores &scores,
                                   SCORE &estimatedScore) const;
  virtual void EvaluateWhenApplied(const ManagerBase &mgr, const Hypothesis &hypo, const FFState &prevState,
                                   Scores &scores, FFState &state) const;
  //! per hypothesis (the joint spans carry affiliations nlm_score_spans does not take)
  virtual void EvaluateWhenAppliedBatch(const System &system, const Batch &batch) const;

  virtual void InitializeForInput(const ManagerBase &mgr, const InputType &input);

private:
  FactorType m_sourceFactorType;
};

}  // namespace Moses2
