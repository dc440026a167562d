// An nlmfeature neural language model as an External cdec feature.
//
//   feature_function=External /abs/libcdec_ff_nlm.so --model /abs/model.nlm [--name NLM]
//       [--persistent-cache DIR] [--persistent-cache-max 2G] [--oov-feature] [--stats]
//
// Scores are natural logs (cdec's KenLM feature reports log10).  The feature value of a
// derivation is the model's log-probability of its yield: every word after <s> and the
// words before it, then </s> (FinalTraversalFeatures adds both markers, unless the rules
// produce them).  State of an item, memcmp-safe and zero-padded: its first n-1 words (those
// whose context reaches outside the item), its last n-1 words, and counts/flags.  Left words
// are scored at once with <null>-padded contexts (estimates) and corrected by the difference
// when their context becomes known, so every partial item carries a usable score for cube
// pruning and the total is exact.  Built against cdec's headers only (see Makefile): FD::,
// TD:: and FeatureFunction resolve to the cdec executable; everything here is hidden.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#pragma GCC visibility push(default)
#include "ff.h"
#include "fdict.h"
#include "hg.h"
#include "sentence_metadata.h"
#include "tdict.h"
#include "trule.h"
#pragma GCC visibility pop

#include <nlmfeature.h>

#define NLM_STR_(x) #x
#define NLM_STR(x) NLM_STR_(x)

namespace {

enum { kMaxContext = 15 };
enum { kLong = 1, kBos = 2 };  // state flags

// Layout of the state buffer (StateSize() bytes, all zero where unused):
//   int32 left[c], int32 right[c], uint8 nleft, uint8 nright, uint8 flags, uint8 zero
// with c = n-1.  left: the first words of the yield whose score was only estimated;
// right: the last up-to-c words; kLong: the yield has words after its left words (then
// nleft == c); kBos: the yield starts with <s> (then nleft == 0).
class StateView {
 public:
  StateView(const void* p, int c) : p_(static_cast<const unsigned char*>(p)), c_(c) {}
  const int32_t* left() const { return reinterpret_cast<const int32_t*>(p_); }
  const int32_t* right() const { return reinterpret_cast<const int32_t*>(p_) + c_; }
  int nleft() const { return p_[8 * c_]; }
  int nright() const { return p_[8 * c_ + 1]; }
  int flags() const { return p_[8 * c_ + 2]; }
 private:
  const unsigned char* p_;
  int c_;
};

void Usage() {
  std::cerr <<
      "usage: feature_function=External /abs/libcdec_ff_nlm.so --model MODEL.nlm [options]\n"
      "  --model PATH              nlmfeature model file (required)\n"
      "  --name NAME               feature name (default NLM)\n"
      "  --persistent-cache DIR    keep n-gram scores per sentence id in DIR (tuning)\n"
      "  --persistent-cache-max S  disk bound of DIR, e.g. 500M, 2G (default 4G)\n"
      "  --cache-entries N         per-sentence context cache bound (default " NLM_STR(NLM_DEFAULT_CACHE_ENTRIES) ")\n"
      "  --oov-feature             also fire NAME_OOV: rule words unknown to the model\n"
      "  --stats                   print cache statistics per sentence to stderr\n";
}

int64_t ParseBytes(const std::string& s) {
  char* end = NULL;
  double v = strtod(s.c_str(), &end);
  int64_t m = 1;
  if (end && *end) {
    switch (*end) {
      case 'k': case 'K': m = 1LL << 10; break;
      case 'm': case 'M': m = 1LL << 20; break;
      case 'g': case 'G': m = 1LL << 30; break;
      case 't': case 'T': m = 1LL << 40; break;
      default: return -1;
    }
  }
  return static_cast<int64_t>(v * m);
}

class NLMFeatureFF : public FeatureFunction {
 public:
  explicit NLMFeatureFF(const std::string& param)
      : model_(NULL), session_(NULL), c_(0), fid_(0), oov_fid_(0), stats_(false), sentence_(-1) {
    std::string path, name = "NLM", pcache;
    int64_t pmax = 0, cache_entries = -1;
    bool oov = false;
    std::istringstream in(param);
    std::string key;
    while (in >> key) {
      std::string value;
      if (key == "--oov-feature") { oov = true; continue; }
      if (key == "--stats") { stats_ = true; continue; }
      if (!(in >> value)) Fail("option " + key + " needs a value");
      if (key == "--model" || key == "-m") path = value;
      else if (key == "--name" || key == "-n") name = value;
      else if (key == "--persistent-cache") pcache = value;
      else if (key == "--persistent-cache-max") {
        pmax = ParseBytes(value);
        if (pmax < 0) Fail("bad size " + value + " (use e.g. 500M or 2G)");
      } else if (key == "--cache-entries") cache_entries = atoll(value.c_str());
      else Fail("unknown option " + key);
    }
    if (path.empty()) Fail("--model is required");
    int rc = nlm_model_load(path.c_str(), &model_);
    if (rc != NLM_OK) Fail(std::string("cannot load the model: ") + nlm_last_error());
    c_ = nlm_model_state_size(model_);
    if (c_ < 1 || c_ > kMaxContext) Fail("the model order must be between 2 and 16");
    nlm_session_options o;
    nlm_session_options_init(&o);
    if (!pcache.empty()) o.persistent_cache = pcache.c_str();
    o.persistent_max_bytes = pmax;
    if (cache_entries >= 0) o.cache_entries = cache_entries;
    rc = nlm_session_new(model_, &o, &session_);
    if (rc != NLM_OK) Fail(nlm_last_error());
    // map every model word to its cdec id once (words cdec creates later are <unk>)
    const int32_t V = nlm_model_vocab_size(model_);
    for (int32_t v = 0; v < V; ++v) {
      if (v == NLM_NULL) continue;  // padding, never a real word
      size_t len = 0;
      const char* w = nlm_vocab_word(model_, v, &len);
      const WordID id = TD::Convert(std::string(w, len));
      if (id < 0) continue;
      if (static_cast<size_t>(id) >= map_.size()) map_.resize(id + 1, NLM_UNK);
      map_[id] = v;
    }
    cdec_bos_ = TD::Convert("<s>");
    fid_ = FD::Convert(name);
    if (oov) oov_fid_ = FD::Convert(name + "_OOV");
    stats_last_.struct_size = sizeof(nlm_stats);
    nlm_session_stats(session_, &stats_last_);
    SetStateSize(8 * c_ + 4);
  }

  ~NLMFeatureFF() {
    EndSentence();
    nlm_session_free(session_);  // also writes the last sentence's persistent cache
    nlm_model_free(model_);
  }

  void PrepareForInput(const SentenceMetadata& smeta) {
    EndSentence();
    sentence_ = smeta.GetSentenceId();
    nlm_session_begin(session_, sentence_);
  }

  void FinalTraversalFeatures(const void* state, SparseVector<double>* features) const {
    StateView st(state, c_);
    int32_t hist[2 * kMaxContext + 2];
    double v = 0;
    if (!(st.flags() & kBos)) {
      // the left words' contexts start the sentence: replace their estimates
      hist[0] = NLM_BOS;
      for (int j = 0; j < st.nleft(); ++j) {
        const int32_t w = st.left()[j];
        v += nlm_score(session_, hist, j + 1, w) - nlm_score(session_, st.left(), j, w);
        hist[j + 1] = w;
      }
    }
    const int nr = st.nright();
    if (nr == 0 || st.right()[nr - 1] != NLM_EOS) {
      int n = 0;
      if (!(st.flags() & (kLong | kBos))) hist[n++] = NLM_BOS;  // short yield: <s> + all of it
      for (int j = 0; j < nr; ++j) hist[n++] = st.right()[j];
      v += nlm_score(session_, hist, n, NLM_EOS);
    }
    features->set_value(fid_, v);
  }

 protected:
  void TraversalFeaturesImpl(const SentenceMetadata& /*smeta*/, const HG::Edge& edge,
                             const std::vector<const void*>& ant_states,
                             SparseVector<double>* features,
                             SparseVector<double>* /*estimated_features*/, void* out) const {
    const std::vector<WordID>& e = edge.rule_->e();
    Acc a(c_);
    double v = 0;
    int oovs = 0;
    for (size_t i = 0; i < e.size(); ++i) {
      if (e[i] > 0) {
        if (i == 0 && e[i] == cdec_bos_) {  // the rule produces <s> itself
          a.BeginSentence();
          continue;
        }
        const int32_t w = Map(e[i]);
        if (w == NLM_UNK) ++oovs;
        v += nlm_score(session_, a.right, a.nright, w);  // exact, or an estimate if !complete
        a.Push(w);
      } else {
        StateView st(ant_states[-e[i]], c_);
        if (st.flags() & kBos) {  // an antecedent that starts the sentence
          a.Reset(st);
          continue;
        }
        for (int j = 0; j < st.nleft(); ++j) {
          const int32_t w = st.left()[j];
          // replace the estimate made inside the antecedent by the score in this context
          v += nlm_score(session_, a.right, a.nright, w) - nlm_score(session_, st.left(), j, w);
          a.Push(w);
        }
        if (st.flags() & kLong) a.Jump(st);
      }
    }
    a.Write(out);
    features->set_value(fid_, v);
    if (oov_fid_ && oovs) features->set_value(oov_fid_, oovs);
  }

 private:
  // the yield of the edge built so far
  struct Acc {
    int c;
    int32_t left[kMaxContext];
    int32_t right[kMaxContext];
    int nleft, nright, flags;
    bool complete;  // the next word has its full context (n-1 words, or <s> before it)
    explicit Acc(int c_) : c(c_), nleft(0), nright(0), flags(0), complete(false) {}
    void BeginSentence() {
      right[0] = NLM_BOS;
      nright = 1;
      flags |= kBos;
      complete = true;
    }
    void Push(int32_t w) {
      if (!complete) {
        left[nleft++] = w;
      } else {
        flags |= kLong;  // a word scored exactly
      }
      if (nright == c) {
        memmove(right, right + 1, sizeof(int32_t) * (c - 1));
        right[c - 1] = w;
      } else {
        right[nright++] = w;
      }
      if (nright == c) complete = true;
    }
    void Jump(const StateView& st) {  // the antecedent's words after its left words
      memcpy(right, st.right(), sizeof(int32_t) * st.nright());
      nright = st.nright();
      flags |= kLong;
      complete = true;
    }
    void Reset(const StateView& st) {
      memcpy(right, st.right(), sizeof(int32_t) * st.nright());
      nright = st.nright();
      nleft = 0;
      flags = st.flags();
      complete = true;
    }
    void Write(void* out) const {
      unsigned char* p = static_cast<unsigned char*>(out);
      memset(p, 0, 8 * c + 4);
      memcpy(p, left, sizeof(int32_t) * nleft);
      memcpy(p + 4 * c, right, sizeof(int32_t) * nright);
      p[8 * c] = static_cast<unsigned char>(nleft);
      p[8 * c + 1] = static_cast<unsigned char>(nright);
      p[8 * c + 2] = static_cast<unsigned char>(flags);
    }
  };

  int32_t Map(WordID w) const {
    return (w >= 0 && static_cast<size_t>(w) < map_.size()) ? map_[w] : NLM_UNK;
  }

  void EndSentence() {
    if (sentence_ < 0) return;
    nlm_session_end(session_);
    if (stats_) {
      nlm_stats now;
      now.struct_size = sizeof now;
      nlm_session_stats(session_, &now);
      fprintf(stderr, "NLMFeature sentence %d lookups=%lld ngram_hits=%lld context_hits=%lld "
              "context_misses=%lld class_hits=%lld class_misses=%lld persistent_hits=%lld "
              "persistent_loaded=%lld persistent_written=%lld files_ignored=%lld\n", sentence_,
              (long long)(now.lookups - stats_last_.lookups),
              (long long)(now.ngram_hits - stats_last_.ngram_hits),
              (long long)(now.context_hits - stats_last_.context_hits),
              (long long)(now.context_misses - stats_last_.context_misses),
              (long long)(now.class_hits - stats_last_.class_hits),
              (long long)(now.class_misses - stats_last_.class_misses),
              (long long)(now.persistent_hits - stats_last_.persistent_hits),
              (long long)(now.persistent_loaded - stats_last_.persistent_loaded),
              (long long)(now.persistent_written - stats_last_.persistent_written),
              (long long)(now.files_ignored - stats_last_.files_ignored));
      stats_last_ = now;
    }
    sentence_ = -1;
  }

  static void Fail(const std::string& msg) {
    std::cerr << "NLMFeature (libcdec_ff_nlm): " << msg << "\n";
    Usage();
    exit(1);
  }

  nlm_model* model_;
  nlm_session* session_;  // cdec decodes one sentence at a time, on one thread
  int c_;                 // n-1
  int fid_, oov_fid_;
  WordID cdec_bos_;
  bool stats_;
  int sentence_;
  nlm_stats stats_last_;
  std::vector<int32_t> map_;  // cdec WordID -> model id
};

}  // namespace

extern "C" __attribute__((visibility("default"))) FeatureFunction* create_ff(const std::string& str) {
  return new NLMFeatureFF(str);
}
