// NLMFeature for Moses2 (see NLMFeature.h).
#include "NLMFeature.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "../Phrase.h"
#include "../Scores.h"
#include "../System.h"
#include "../ManagerBase.h"
#include "../PhraseBased/Hypothesis.h"
#include "../PhraseBased/TargetPhraseImpl.h"
#include "../PhraseBased/Sentence.h"
#include "../AlignmentInfo.h"
#include "../InputPathBase.h"
#include "../legacy/Bitmap.h"
#include "../legacy/FactorCollection.h"
#include "../legacy/Util2.h"

#include <nlmfeature.h>
#include <nlmfeature_client.h>

namespace Moses2
{

namespace
{
//! A bad feature line, a model that does not load, an unwritable cache: one line naming the
//! feature and the file, and exit status 2 (Moses2's main catches no exception: a throw would
//! abort the decoder with a core dump; nlmfeature::Stop is safe from a decoder thread).
void Fatal(const std::string &who, const std::string &what)
{
  std::cerr << who << ": error: " << what << std::endl;
  nlmfeature::Stop(2);
}

//! this thread's buffers of EvaluateWhenAppliedBatch (a stack's expansions at a time)
struct BatchBuffers {
  std::vector<int32_t> ids;      // every expansion's history, one after another
  std::vector<size_t> offsets;   // where each one starts in ids
  std::vector<nlm_span> spans;
  std::vector<double> scores;
};
thread_local BatchBuffers t_batch;
}  // namespace

size_t NLMFeatureState::hash() const
{
  return nlmfeature::StateHash(ids, size);
}

bool NLMFeatureState::operator==(const FFState &o) const
{
  const NLMFeatureState &other = static_cast<const NLMFeatureState &>(o);
  return nlmfeature::SameState(ids, size, other.ids, other.size);
}

std::string NLMFeatureState::ToString() const
{
  std::ostringstream out;
  for (int32_t i = 0; i < size; ++i) out << (i ? " " : "") << ids[i];
  return out.str();
}

NLMFeature::NLMFeature(size_t startInd, const std::string &line, const char *kind)
  : StatefulFeatureFunction(startInd, line)
  , m_kind(kind)
  , m_client(new nlmfeature::Client())
  , m_order(0)
  , m_context(0)
  , m_factorType(0)
  , m_bos(NULL)
{
  if (m_kind == "NLMFeature") {  // (NLMJointFeature reads its line in its own constructor)
    ReadParameters();
    if (m_client->Path().empty()) Fatal(Who(), "the feature line needs path=/abs/model.nlm");
  }
}

NLMFeature::~NLMFeature()
{
  delete m_client;
}

void NLMFeature::SetParameter(const std::string &key, const std::string &value)
{
  try {
    if (key == "order") {
      m_order = static_cast<size_t>(nlmfeature::ParseInt(key, value));
    } else if (key == "factor") {
      m_factorType = static_cast<FactorType>(nlmfeature::ParseInt(key, value));
    } else if (key == "oov-feature" && m_kind == "NLMFeature") {
      // a second score: the words of the output the model does not know (read before the
      // decoder counts this feature's scores: the line is read in the constructor)
      m_numScores = nlmfeature::ParseBool(key, value) ? 2 : 1;
    } else if (!m_client->SetParameter(key, value)) {
      if (key != "tuneable")
        Fatal(Who(), "unknown key " + key + "=" + value + " on the feature line");
      StatefulFeatureFunction::SetParameter(key, value);
    }
  } catch (const std::runtime_error &e) {
    Fatal(Who(), e.what());
  }
}

void NLMFeature::Load(System &system)
{
  LoadModel(system, false);
}

void NLMFeature::LoadModel(System &system, bool joint)
{
  if (!system.isPb) Fatal(Who(), "phrase-based decoding only (not Moses2's SCFG decoder)");
  m_who = Who();
  try {
    m_client->Load(m_who, joint);
  } catch (const std::runtime_error &e) {
    Fatal(Who(), e.what());
  }
  nlm_model *model = m_client->Model();
  m_context = nlm_model_state_size(model);
  if (m_order && m_order != static_cast<size_t>(nlm_model_order(model))) {
    std::ostringstream msg;
    msg << "order=" << m_order << " on the feature line but " << m_client->Path() << " is an order-"
        << nlm_model_order(model) << " model";
    Fatal(Who(), msg.str());
  }
  if (m_context > NLMFeatureState::MAX_CONTEXT) Fatal(Who(), "model order above 16");
  FactorCollection &vocab = system.GetVocab();
  m_bos = vocab.AddFactor(BOS_, system, false);
  struct AddWord {
    FactorCollection &vocab;
    System &system;
    size_t operator()(const char *w, size_t len) const {
      return vocab.AddFactor(StringPiece(w, len), system, false)->GetId();
    }
  } add = {vocab, system};
  m_client->MapVocabulary(add, m_lookup);
}

inline nlm_session *NLMFeature::Session() const
{
  try {
    return m_client->Session(m_who);
  } catch (const std::runtime_error &e) {
    Fatal(Who(), e.what());
  }
  return NULL;
}

FFState *NLMFeature::BlankState(MemPool &pool, const System &sys) const
{
  return new (pool.Allocate<NLMFeatureState>()) NLMFeatureState();
}

void NLMFeature::EmptyHypothesisState(FFState &state, const ManagerBase &mgr, const InputType &input,
                                      const Hypothesis &hypo) const
{
  NLMFeatureState &s = static_cast<NLMFeatureState &>(state);
  s.size = 0;
  if (m_context > 0) {
    s.ids[0] = NLM_BOS;
    s.size = 1;
  }
}

void NLMFeature::EvaluateInIsolation(MemPool &pool, const System &system, const Phrase<Moses2::Word> &source,
                                     const TargetPhraseImpl &targetPhrase, Scores &scores,
                                     SCORE &estimatedScore) const
{
  const size_t n = targetPhrase.GetSize();
  if (!n) return;
  nlm_session *s = Session();
  int32_t stack[64];
  std::vector<int32_t> heap;
  int32_t *ids = stack;
  if (n + 1 > 64) {
    heap.resize(n + 1);
    ids = &heap[0];
  }
  int nids = 0;
  size_t start = 0;
  if (targetPhrase[0][m_factorType] == m_bos) {
    ids[nids++] = NLM_BOS;  // a sentence start: context known to be <s>
    start = 1;
  }
  double full = 0, ngram = 0;
  SCORE oov = 0;
  for (size_t i = start; i < n; ++i) {
    int32_t id = Id(targetPhrase[i]);
    oov += id == NLM_UNK;
    // the context is the phrase so far: complete once it has n-1 words (or starts with <s>);
    // otherwise <null>-padded, a future-cost estimate rescored when the phrase is applied
    double v = nlm_score(s, nids ? ids : NULL, nids, id);
    full += v;
    if (i >= static_cast<size_t>(m_context)) ngram += v;  // full context inside the phrase
    ids[nids++] = id;
  }
  // (the OOV count of a phrase is exact here; the second score exists with oov-feature=true)
  SCORE exact[2] = {static_cast<SCORE>(ngram), oov}, estimate[2] = {static_cast<SCORE>(full - ngram), 0};
  scores.PlusEquals(system, *this, exact);
  estimatedScore += Scores::CalcWeightedScore(system, *this, estimate);
}

void NLMFeature::EvaluateInIsolation(MemPool &pool, const System &system, const Phrase<SCFG::Word> &source,
                                     const TargetPhrase<SCFG::Word> &targetPhrase, Scores &scores,
                                     SCORE &estimatedScore) const
{
  Fatal(Who(), "phrase-based decoding only (not Moses2's SCFG decoder)");
}

void NLMFeature::History(const NLMFeatureState &in, const Hypothesis &hypo, std::vector<int32_t> &hist,
                         int *count, int *final) const
{
  const TargetPhrase<Moses2::Word> &phrase = hypo.GetTargetPhrase();
  const size_t len = phrase.GetSize();
  hist.insert(hist.end(), in.ids, in.ids + in.size);
  for (size_t j = 0; j < len; ++j) hist.push_back(Id(phrase[j]));
  // words whose in-phrase context was incomplete: EvaluateInIsolation gave them only an
  // estimate; they are scored with the real context now (the others are already in the
  // score), and </s> after the whole history when the sentence is complete
  *count = static_cast<int>(std::min(len, static_cast<size_t>(m_context)));
  *final = hypo.GetBitmap().IsComplete() ? 1 : 0;
}

void NLMFeature::SetState(const int32_t *hist, int nhist, FFState &state) const
{
  NLMFeatureState &out = static_cast<NLMFeatureState &>(state);
  const int keep = std::min(nhist, m_context);
  std::memcpy(out.ids, hist + (nhist - keep), sizeof(int32_t) * keep);
  out.size = keep;
}

void NLMFeature::EvaluateWhenApplied(const ManagerBase &mgr, const Hypothesis &hypo, const FFState &prevState,
                                     Scores &scores, FFState &state) const
{
  const NLMFeatureState &in = static_cast<const NLMFeatureState &>(prevState);
  thread_local std::vector<int32_t> hist;
  hist.clear();
  int count, final;
  History(in, hypo, hist, &count, &final);
  const int nhist = static_cast<int>(hist.size());
  SetState(hist.data(), nhist, state);
  if (!count && !final) return;
  const double score = nlm_score_span(Session(), hist.data(), nhist, in.size, count, final);
  scores.PlusEquals(mgr.system, *this, static_cast<SCORE>(score), 0);
}

void NLMFeature::EvaluateWhenAppliedBatch(const System &system, const Batch &batch) const
{
  const size_t n = batch.size();
  if (!n) return;
  BatchBuffers &b = t_batch;
  b.ids.clear();
  b.offsets.resize(n);
  b.spans.resize(n);
  b.scores.resize(n);
  const size_t ind = GetStatefulInd();
  for (size_t i = 0; i < n; ++i) {
    const Hypothesis &hypo = *batch[i];
    const NLMFeatureState &in = static_cast<const NLMFeatureState &>(*hypo.GetPrevHypo()->GetState(ind));
    b.offsets[i] = b.ids.size();
    int count, final;
    History(in, hypo, b.ids, &count, &final);
    nlm_span &sp = b.spans[i];
    sp.nhist = static_cast<int>(b.ids.size() - b.offsets[i]);
    sp.first = in.size;
    sp.count = count;
    sp.final = final;
  }
  for (size_t i = 0; i < n; ++i) b.spans[i].hist = b.ids.data() + b.offsets[i];  // (ids has grown)
  // (invalid spans cannot occur: each is the state's ids and its phrase's words)
  nlm_score_spans(Session(), &b.spans[0], static_cast<int>(n), &b.scores[0]);
  for (size_t i = 0; i < n; ++i) {
    Hypothesis &hypo = *batch[i];
    const nlm_span &sp = b.spans[i];
    SetState(sp.hist, sp.nhist, *hypo.GetState(ind));
    if (sp.count || sp.final)
      hypo.GetScores().PlusEquals(system, *this, static_cast<SCORE>(b.scores[i]), 0);
  }
}

void NLMFeature::EvaluateWhenApplied(const SCFG::Manager &mgr, const SCFG::Hypothesis &hypo, int featureID,
                                     Scores &scores, FFState &state) const
{
  Fatal(Who(), "phrase-based decoding only (not Moses2's SCFG decoder)");
}

void NLMFeature::InitializeForInput(const ManagerBase &mgr, const InputType &input)
{
  m_client->Begin(Who(), mgr.GetTranslationId());
}

void NLMFeature::CleanUpAfterSentenceProcessing(const System &system, const InputType &input) const
{
  m_client->End(Who());
}

// ---- NLMJointFeature ------------------------------------------------------------------

NLMJointFeature::NLMJointFeature(size_t startInd, const std::string &line)
  : NLMFeature(startInd, line, "NLMJointFeature")
  , m_sourceFactorType(0)
{
  ReadParameters();
  if (m_client->Path().empty()) Fatal(Who(), "the feature line needs path=/abs/joint.nlm");
}

void NLMJointFeature::SetParameter(const std::string &key, const std::string &value)
{
  if (key == "source-factor") {
    try {
      m_sourceFactorType = static_cast<FactorType>(nlmfeature::ParseInt(key, value));
    } catch (const std::runtime_error &e) {
      Fatal(Who(), e.what());
    }
  } else {
    NLMFeature::SetParameter(key, value);
  }
}

void NLMJointFeature::Load(System &system)
{
  LoadModel(system, true);
  if (nlm_model_source_window(m_client->Model()) <= 0)
    Fatal(Who(), m_client->Path() + " is a target-only model: use NLMFeature for it");
}

void NLMJointFeature::EvaluateInIsolation(MemPool &pool, const System &system, const Phrase<Moses2::Word> &source,
                                          const TargetPhraseImpl &targetPhrase, Scores &scores,
                                          SCORE &estimatedScore) const
{
  // the phrase's source position is not known here: every word gets an estimate (the <null>
  // source window, the phrase so far as target context), scored for real when applied
  const size_t n = targetPhrase.GetSize();
  if (!n) return;
  nlm_session *s = Session();
  std::vector<int32_t> ids;
  ids.reserve(n);
  double estimate = 0;
  for (size_t j = 0; j < n; ++j) {
    const int32_t id = Id(targetPhrase[j]);
    estimate += nlm_score(s, ids.empty() ? NULL : ids.data(), static_cast<int>(ids.size()), id);
    ids.push_back(id);
  }
  estimatedScore += Scores::CalcWeightedScore(system, *this, static_cast<SCORE>(estimate));
}

void NLMJointFeature::EvaluateWhenApplied(const ManagerBase &mgr, const Hypothesis &hypo, const FFState &prevState,
                                          Scores &scores, FFState &state) const
{
  const NLMFeatureState &in = static_cast<const NLMFeatureState &>(prevState);
  const TargetPhrase<Moses2::Word> &phrase = hypo.GetTargetPhrase();
  const size_t len = phrase.GetSize();
  const bool complete = hypo.GetBitmap().IsComplete();
  thread_local std::vector<int32_t> hist;
  thread_local std::vector<int32_t> aff;
  hist.assign(in.ids, in.ids + in.size);
  for (size_t j = 0; j < len; ++j) hist.push_back(Id(phrase[j]));
  const int nhist = static_cast<int>(hist.size());
  SetState(hist.data(), nhist, state);
  if (!len && !complete) return;
  // every word of the phrase with its real source window and target history, then </s>
  // (affiliated with the source </s>, past the sentence) when the source is covered
  const Range &range = hypo.GetInputPath().range;
  const AlignmentInfo &ai = phrase.GetAlignTerm();
  aff.resize(len + 1);
  nlmfeature::Affiliations(ai.begin(), ai.end(), len, range.GetStartPos(), range.GetNumWordsCovered(), aff.data());
  aff[len] = 1 << 30;
  const double score = nlm_joint_score_span(Session(), hist.data(), nhist, in.size, static_cast<int>(len),
                                            complete ? 1 : 0, aff.data());
  scores.PlusEquals(mgr.system, *this, static_cast<SCORE>(score));
}

void NLMJointFeature::EvaluateWhenAppliedBatch(const System &system, const Batch &batch) const
{
  StatefulFeatureFunction::EvaluateWhenAppliedBatch(system, batch);
}

void NLMJointFeature::InitializeForInput(const ManagerBase &mgr, const InputType &input)
{
  const Sentence &sentence = static_cast<const Sentence &>(input);
  std::vector<int32_t> src(sentence.GetSize());
  for (size_t i = 0; i < sentence.GetSize(); ++i) {
    const StringPiece w = sentence[i][m_sourceFactorType]->GetString();
    src[i] = nlm_source_word_id(m_client->Model(), w.data(), w.size());
  }
  m_client->Begin(Who(), mgr.GetTranslationId(), &src);
}

}  // namespace Moses2
