// NLMJointFeature: an nlmfeature joint model as a stateful Moses feature (see NLMJointFeature.h).
#include "NLMJointFeature.h"

#include <algorithm>
#include <cstring>
#include <iostream>
#include <sstream>

#include "moses/AlignmentInfo.h"
#include "moses/FactorCollection.h"
#include "moses/Hypothesis.h"
#include "moses/InputPath.h"
#include "moses/InputType.h"
#include "moses/Phrase.h"
#include "moses/Range.h"
#include "moses/ScoreComponentCollection.h"
#include "moses/Sentence.h"
#include "moses/TargetPhrase.h"
#include "moses/TranslationTask.h"
#include "moses/Util.h"
#include "util/exception.hh"

#include <nlmfeature.h>
#include <nlmfeature_client.h>

namespace Moses
{

namespace
{
// Affiliations of the phrases this thread's search applies, relative to the phrase's source
// start, by (alignment, phrase length, source length): Moses applies a few thousand distinct
// phrase alignments ~200k times per sentence, and each walk of an alignment's std::set
// touched its nodes again (2% of a KenLM + NLM + joint decode).  Filled only during the
// search (EvaluateWhenApplied), when every phrase and alignment of the sentence's
// translation options is alive and none is made, and emptied at each sentence's start (a
// generation), so an entry's alignment address cannot have been reused for another.
struct AffiliationMemo {
  enum { kSlots = 1024, kWords = 14 };
  struct Slot {
    const AlignmentInfo *alignment;
    uint32_t generation;
    uint8_t n, srcLen;
    uint8_t rel[kWords];
  };
  Slot slots[kSlots];
  uint32_t generation;
  AffiliationMemo() : generation(1) { std::memset(slots, 0, sizeof slots); }
  Slot &At(const AlignmentInfo *a, size_t n, size_t srcLen) {
    uint64_t h = (reinterpret_cast<uintptr_t>(a) >> 3) + (n << 20) + (srcLen << 28);
    h *= 0x9E3779B97F4A7C15ULL;
    return slots[(h >> 40) & (kSlots - 1)];
  }
};
thread_local AffiliationMemo t_affiliations;
}  // namespace

NLMJointFeature::NLMJointFeature(const std::string &line)
  : StatefulFeatureFunction(1, line)
  , m_sourceFactorType(0)
  , m_context(0)
{
  ReadParameters();
  UTIL_THROW_IF2(m_nlm.Path().empty(), "NLMJointFeature: the feature line needs path=/abs/joint.nlm");
}

NLMJointFeature::~NLMJointFeature()
{
}

void NLMJointFeature::SetParameter(const std::string& key, const std::string& value)
{
  if (key == "source-factor") {
    m_sourceFactorType = Scan<FactorType>(value);
  } else if (!m_nlm.SetParameter(key, value)) {
    StatefulFeatureFunction::SetParameter(key, value);
  }
}

void NLMJointFeature::Load(AllOptions::ptr const& opts)
{
  m_options = opts;
  m_nlm.Load("NLMJointFeature " + GetScoreProducerDescription(), true);
  UTIL_THROW_IF2(nlm_model_source_window(m_nlm.Model()) <= 0, "NLMJointFeature: " << m_nlm.Path()
                 << " is a target-only model: use NLMFeature for it");
  m_context = nlm_model_state_size(m_nlm.Model());
  UTIL_THROW_IF2(m_context > NLMJointState::MAX_CONTEXT, "NLMJointFeature: model order above 16");
}

bool NLMJointFeature::IsUseable(const FactorMask &mask) const
{
  return mask[m_nlm.Factor()];
}

inline nlm_session *NLMJointFeature::Session() const
{
  return m_nlm.Session(GetScoreProducerDescription());
}

void NLMJointFeature::Affiliations(const TargetPhrase &phrase, size_t start, size_t srcLen, int *out)
{
  const AlignmentInfo &ai = phrase.GetAlignTerm();
  nlmfeature::Affiliations(ai.begin(), ai.end(), phrase.GetSize(), start, srcLen, out);
}

void NLMJointFeature::MemoAffiliations(const TargetPhrase &phrase, size_t start, size_t srcLen, int *out)
{
  const size_t n = phrase.GetSize();
  const AlignmentInfo *a = &phrase.GetAlignTerm();
  if (n > AffiliationMemo::kWords || srcLen > 255) {
    Affiliations(phrase, start, srcLen, out);
    return;
  }
  AffiliationMemo &memo = t_affiliations;
  AffiliationMemo::Slot &slot = memo.At(a, n, srcLen);
  if (slot.generation == memo.generation && slot.alignment == a && slot.n == n && slot.srcLen == srcLen) {
    for (size_t j = 0; j < n; ++j) out[j] = static_cast<int>(start + slot.rel[j]);
    return;
  }
  Affiliations(phrase, start, srcLen, out);
  uint8_t rel[AffiliationMemo::kWords];
  for (size_t j = 0; j < n; ++j) {
    const int r = out[j] - static_cast<int>(start);
    if (r < 0 || r > 255) return;  // (not kept: never for a well-formed alignment)
    rel[j] = static_cast<uint8_t>(r);
  }
  std::memcpy(slot.rel, rel, n);
  slot.alignment = a;
  slot.n = static_cast<uint8_t>(n);
  slot.srcLen = static_cast<uint8_t>(srcLen);
  slot.generation = memo.generation;
}

const FFState* NLMJointFeature::EmptyHypothesisState(const InputType &/*input*/) const
{
  NLMJointState *s = new NLMJointState();
  if (m_context > 0) {
    s->ids[0] = NLM_BOS;
    s->size = 1;
  }
  return s;
}

void NLMJointFeature::EvaluateWithSourceContext(const InputType &/*input*/, const InputPath &inputPath,
                                                const TargetPhrase &targetPhrase, const StackVec * /*stackVec*/,
                                                ScoreComponentCollection &scoreBreakdown,
                                                ScoreComponentCollection *estimatedScores) const
{
  const size_t n = targetPhrase.GetSize();
  if (!n) return;
  const Range &range = inputPath.GetWordsRange();
  std::vector<int> aff(n);
  Affiliations(targetPhrase, range.GetStartPos(), range.GetNumWordsCovered(), &aff[0]);
  nlm_session *s = Session();
  std::vector<int32_t> ids;
  ids.reserve(n);
  double final = 0, estimate = 0;
  for (size_t j = 0; j < n; ++j) {
    const Word &word = targetPhrase.GetWord(j);
    UTIL_THROW_IF2(word.IsNonTerminal(), "NLMJointFeature supports phrase-based decoding only");
    int32_t id = Id(word);
    // the real source window; the target context is the phrase so far (<null>-padded)
    double v = nlm_joint_score(s, ids.empty() ? NULL : &ids[0], static_cast<int>(ids.size()), id, aff[j]);
    if (j >= static_cast<size_t>(m_context)) final += v;
    else estimate += v;
    ids.push_back(id);
  }
  scoreBreakdown.PlusEquals(this, static_cast<float>(final));
  if (estimatedScores) estimatedScores->PlusEquals(this, static_cast<float>(estimate));
}

FFState* NLMJointFeature::EvaluateWhenApplied(const Hypothesis &hypo, const FFState *ps,
                                              ScoreComponentCollection *out) const
{
  const NLMJointState &in = static_cast<const NLMJointState&>(*ps);
  NLMJointState *ret = new NLMJointState(in);
  const size_t len = hypo.GetCurrTargetLength();
  const bool complete = hypo.IsSourceCompleted();
  if (!len && !complete) return ret;

  nlm_session *s = Session();
  const TargetPhrase &phrase = hypo.GetCurrTargetPhrase();
  const Range &range = hypo.GetCurrSourceWordsRange();
  int32_t stack[64];
  int affStack[64];
  std::vector<int32_t> heap;
  std::vector<int> affHeap;
  int32_t *hist = stack;
  int *aff = affStack;
  const size_t total = in.size + len;
  if (total > 64) {
    heap.resize(total);
    hist = &heap[0];
  }
  if (len > 64) {
    affHeap.resize(len);
    aff = &affHeap[0];
  }
  MemoAffiliations(phrase, range.GetStartPos(), range.GetNumWordsCovered(), aff);
  std::memcpy(hist, in.ids, sizeof(int32_t) * in.size);
  for (size_t j = 0; j < len; ++j) hist[in.size + j] = Id(phrase.GetWord(j));

  // the first n-1 words had only an estimate: score them with the real history now, and
  // </s> (affiliated with the source </s>, the position after the sentence) when complete;
  // one call for them all (their cache misses overlap), the same sum as word by word
  const size_t rescored = std::min(len, static_cast<size_t>(m_context));
  int32_t spanAff[NLMJointState::MAX_CONTEXT + 1];
  for (size_t j = 0; j < rescored; ++j) spanAff[j] = aff[j];
  spanAff[rescored] = 1 << 30;
  const double score = nlm_joint_score_span(s, hist, static_cast<int>(total), static_cast<int>(in.size),
                                            static_cast<int>(rescored), complete ? 1 : 0, spanAff);

  const size_t keep = std::min(total, static_cast<size_t>(m_context));
  std::memcpy(ret->ids, hist + (total - keep), sizeof(int32_t) * keep);
  ret->size = static_cast<int32_t>(keep);
  out->PlusEquals(this, static_cast<float>(score));
  return ret;
}

FFState* NLMJointFeature::EvaluateWhenApplied(const ChartHypothesis &/*hypo*/, int /*featureID*/,
                                              ScoreComponentCollection * /*accumulator*/) const
{
  UTIL_THROW2("NLMJointFeature supports phrase-based decoding only (not moses_chart)");
}

void NLMJointFeature::InitializeForInput(ttasksptr const& ttask)
{
  const InputType &input = *ttask->GetSource();
  const Sentence *sent = dynamic_cast<const Sentence*>(&input);
  UTIL_THROW_IF2(!sent, "NLMJointFeature needs plain sentence input (not lattices or confusion networks)");
  std::vector<int32_t> src(sent->GetSize());
  for (size_t i = 0; i < sent->GetSize(); ++i) {
    const StringPiece w = sent->GetWord(i).GetFactor(m_sourceFactorType)->GetString();
    src[i] = nlm_source_word_id(m_nlm.Model(), w.data(), w.size());
  }
  m_nlm.Begin("NLMJointFeature " + GetScoreProducerDescription(), input.GetTranslationId(), &src);
  ++t_affiliations.generation;  // (this thread decodes the sentence: its memo starts empty)
}

void NLMJointFeature::CleanUpAfterSentenceProcessing(ttasksptr const& ttask)
{
  m_nlm.End("NLMJointFeature " + GetScoreProducerDescription(), ttask->GetSource()->GetTranslationId());
}

}  // namespace Moses
