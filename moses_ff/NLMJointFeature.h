// NLMJointFeature: an nlmfeature joint model (NNJM, Devlin et al. 2014) as a stateful Moses
// feature: each target word is scored given its n-1 previous target words and the w = 2m+1
// source words around its affiliated source word.
//
//   [feature]
//   NLMJointFeature name=NNJM0 path=/abs/joint.nlm [factor=0] [source-factor=0]
//   [weight]
//   NNJM0= 0.1
//
// Phrase-based decoding (moses-cmd).  Scores are natural logs.
// * Affiliation: from the target phrase's word alignment (the phrase table's alignment
//   field), Devlin et al. 2014's heuristic inside the phrase: the aligned source word (the
//   middle one of several, the right one of two), an unaligned word takes the nearest aligned
//   word's affiliation (right first); a phrase without any alignment point spreads its words
//   proportionally over its source span.  The target </s> is affiliated with the source </s>.
//   This is what nlmfeature.joint.affiliations computes per phrase.
// * Exact state: the last n-1 target ids (no hashes).  A word's score depends only on the
//   target history and its own affiliation, which its phrase fixes.
// * Estimates: EvaluateWithSourceContext knows the phrase's source span, so every word gets
//   its real source window there; words whose target context lies inside the phrase get
//   their final score, the first n-1 words an estimate with <null> left padding, rescored
//   with the real history in EvaluateWhenApplied.  </s> is added when the source is covered.
#pragma once

#include <stdint.h>

#include <string>
#include <vector>

#include "moses/FF/StatefulFeatureFunction.h"
#include "moses/TypeDef.h"
#include "moses/Word.h"
#include "moses/Factor.h"
#include "NLMFeature.h"  // NLMFeatureState: the same exact state, the last n-1 target ids

namespace Moses
{

class TargetPhrase;

//! Exact joint-model state: the target-only feature's (the last n-1 target ids, oldest first).
typedef NLMFeatureState NLMJointState;

class NLMJointFeature : public StatefulFeatureFunction
{
public:
  NLMJointFeature(const std::string &line);
  ~NLMJointFeature();

  void SetParameter(const std::string& key, const std::string& value);
  void Load(AllOptions::ptr const& opts);
  bool IsUseable(const FactorMask &mask) const;

  const FFState* EmptyHypothesisState(const InputType &input) const;
  void EvaluateWithSourceContext(const InputType &input, const InputPath &inputPath,
                                 const TargetPhrase &targetPhrase, const StackVec *stackVec,
                                 ScoreComponentCollection &scoreBreakdown,
                                 ScoreComponentCollection *estimatedScores = NULL) const;
  FFState* EvaluateWhenApplied(const Hypothesis &hypo, const FFState *ps,
                               ScoreComponentCollection *out) const;
  FFState* EvaluateWhenApplied(const ChartHypothesis &hypo, int featureID,
                               ScoreComponentCollection *accumulator) const;

  void InitializeForInput(ttasksptr const& ttask);
  void CleanUpAfterSentenceProcessing(ttasksptr const& ttask);

  //! affiliated source position (in the sentence) of each word of a phrase at source span
  //! [start, start + srcLen) into ``out`` (phrase.GetSize() ints): Devlin et al. 2014
  //! inside the phrase; allocates nothing for phrases of up to 64 words
  static void Affiliations(const TargetPhrase &phrase, size_t start, size_t srcLen, int *out);
  //! the same, from this thread's memo of the sentence's phrase alignments (search only:
  //! every phrase of the sentence's translation options alive, none made)
  static void MemoAffiliations(const TargetPhrase &phrase, size_t start, size_t srcLen, int *out);

private:
  nlm_session *Session() const;
  int32_t Id(const Word &word) const { return m_nlm.Id(word); }

  NLMClient m_nlm;           // model, per-thread sessions, options, stats (NLMFeature.h)
  FactorType m_sourceFactorType;
  int m_context;             // n-1
};

}  // namespace Moses
