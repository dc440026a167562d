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

#include <algorithm>
#include <iostream>
#include <new>
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

#include "nlm_client.h"  // options, model, session, word map, sentence start/end, stats

namespace {

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

// Per-sentence memo of whole edge evaluations: an edge's feature value, OOV count and
// next state depend only on its rule's target side and its antecedents' states, and cube
// pruning evaluates the same (rule, antecedent states) many times.  Key: the rule pointer
// (rules live for the sentence) and the antecedent states' bytes; value: the double and the
// state computed the first time (so a hit gives exactly what recomputing would).  Open
// addressing in one byte array, grown by doubling (load <= 1/2) up to a bound, emptied per
// sentence by bumping a generation.
class EdgeMemo {
 public:
  EdgeMemo() : state_size_(0), max_key_(0), slot_size_(0), capacity_(0), count_(0), limit_(0),
               generation_(1), calls_(0), hits_(0) {}
  void Init(int state_size, int64_t limit) {
    state_size_ = state_size;
    max_key_ = 8 + 2 * state_size;  // rule pointer + up to two antecedent states
    // [generation u32][key length u32][key][value double][oovs i32][state]
    slot_size_ = (8 + max_key_ + 8 + 4 + state_size + 7) & ~7;
    limit_ = limit;
  }
  bool enabled() const { return limit_ > 0; }
  int max_key() const { return max_key_; }
  void Clear() {
    count_ = 0;
    if (++generation_ == 0) {
      std::fill(slots_.begin(), slots_.end(), 0);
      generation_ = 1;
    }
  }
  // The slot holding the key, or the free slot to fill (found = false); NULL if full.
  unsigned char* Probe(const unsigned char* key, uint32_t n, bool* found) {
    *found = false;
    ++calls_;
    if (count_ < limit_ && 2 * (count_ + 1) > capacity_) Grow();
    if (!capacity_) return NULL;
    const uint64_t mask = capacity_ - 1;
    uint64_t i = Hash(key, n) & mask;
    for (;;) {
      unsigned char* p = &slots_[i * slot_size_];
      uint32_t g, len;
      memcpy(&g, p, 4);
      if (g != generation_) return count_ < limit_ && 2 * (count_ + 1) <= capacity_ ? p : NULL;
      memcpy(&len, p + 4, 4);
      if (len == n && memcmp(p + 8, key, n) == 0) {
        *found = true;
        ++hits_;
        return p;
      }
      i = (i + 1) & mask;
    }
  }
  void Fill(unsigned char* p, const unsigned char* key, uint32_t n, double v, int32_t oovs, const void* state) {
    memcpy(p, &generation_, 4);
    memcpy(p + 4, &n, 4);
    memcpy(p + 8, key, n);
    memcpy(p + 8 + max_key_, &v, 8);
    memcpy(p + 16 + max_key_, &oovs, 4);
    memcpy(p + 20 + max_key_, state, state_size_);
    ++count_;
  }
  double Value(const unsigned char* p) const { double v; memcpy(&v, p + 8 + max_key_, 8); return v; }
  int32_t Oovs(const unsigned char* p) const { int32_t o; memcpy(&o, p + 16 + max_key_, 4); return o; }
  const unsigned char* State(const unsigned char* p) const { return p + 20 + max_key_; }
  int64_t calls() const { return calls_; }
  int64_t hits() const { return hits_; }

 private:
  static uint64_t Hash(const unsigned char* k, uint32_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ n, w;
    uint32_t i = 0;
    for (; i + 8 <= n; i += 8) {
      memcpy(&w, k + i, 8);
      h = (h ^ w) * 0xBF58476D1CE4E5B9ULL;
      h ^= h >> 31;
    }
    for (; i < n; ++i) h = (h ^ k[i]) * 0x94D049BB133111EBULL;
    return h ^ (h >> 29);
  }
  void Grow() {
    const uint64_t cap = capacity_ ? capacity_ * 2 : 4096;
    std::vector<unsigned char> next;
    try {
      next.assign(cap * slot_size_, 0);
    } catch (const std::bad_alloc&) {
      return;  // keep the current table (look-ups only once it is full)
    }
    const uint64_t mask = cap - 1;
    for (uint64_t j = 0; j < capacity_; ++j) {
      const unsigned char* p = &slots_[j * slot_size_];
      uint32_t g, len;
      memcpy(&g, p, 4);
      if (g != generation_) continue;
      memcpy(&len, p + 4, 4);
      uint64_t i = Hash(p + 8, len) & mask;
      while (true) {
        uint32_t g2;
        memcpy(&g2, &next[i * slot_size_], 4);
        if (g2 != generation_) break;
        i = (i + 1) & mask;
      }
      memcpy(&next[i * slot_size_], p, slot_size_);
    }
    slots_.swap(next);
    capacity_ = cap;
  }

  int state_size_, max_key_, slot_size_;
  std::vector<unsigned char> slots_;
  uint64_t capacity_;
  int64_t count_, limit_;
  uint32_t generation_;
  int64_t calls_, hits_;
};

void Usage() {
  std::cerr << "usage: feature_function=External /abs/libcdec_ff_nlm.so --model MODEL.nlm [options]\n"
            << kCommonUsage <<
      "  --edge-memo N             per-sentence memo of edge evaluations, N entries (default 0: off)\n"
      "  --oov-feature             also fire NAME_OOV: rule words unknown to the model\n"
      "  (the feature name defaults to NLM)\n";
}

class NLMFeatureFF : public FeatureFunction {
 public:
  explicit NLMFeatureFF(const std::string& param)
      : client_("NLMFeature", "NLMFeature (libcdec_ff_nlm)", Usage, "NLM"), session_(NULL), c_(0),
        fid_(0), oov_fid_(0), memo_calls_last_(0), memo_hits_last_(0) {
    int64_t edge_memo = 0;  // off: measured not to pay (docs/performance.md)
    bool oov = false;
    client_.Open(param, [&](const std::string& key, std::istream& in) {
      if (key == "--oov-feature") { oov = true; return true; }
      if (key != "--edge-memo") return false;
      std::string value;
      if (!(in >> value)) client_.Fail("option " + key + " needs a value");
      edge_memo = atoll(value.c_str());
      return true;
    });
    session_ = client_.session();
    c_ = client_.context();
    cdec_bos_ = TD::Convert("<s>");
    fid_ = FD::Convert(client_.name());
    if (oov) oov_fid_ = FD::Convert(client_.name() + "_OOV");
    SetStateSize(8 * c_ + 4);
    memo_.Init(8 * c_ + 4, edge_memo);
  }

  ~NLMFeatureFF() { client_.End(MemoStats()); }

  void PrepareForInput(const SentenceMetadata& smeta) {
    client_.End(MemoStats());
    client_.Begin(smeta.GetSentenceId());
    memo_.Clear();
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
    unsigned char key[8 + 2 * (8 * kMaxContext + 4)];
    unsigned char* slot = NULL;
    uint32_t klen = 0;
    if (memo_.enabled() && ant_states.size() <= 2) {
      const TRule* rule = edge.rule_.get();
      const int ss = 8 * c_ + 4;
      memcpy(key, &rule, sizeof rule);
      klen = 8;
      for (size_t k = 0; k < ant_states.size(); ++k, klen += ss) memcpy(key + klen, ant_states[k], ss);
      bool found;
      slot = memo_.Probe(key, klen, &found);
      if (found) {
        memcpy(out, memo_.State(slot), ss);
        features->set_value(fid_, memo_.Value(slot));
        if (oov_fid_ && memo_.Oovs(slot)) features->set_value(oov_fid_, memo_.Oovs(slot));
        return;
      }
    }
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
    if (slot) memo_.Fill(slot, key, klen, v, oovs, out);
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

  int32_t Map(WordID w) const { return client_.Map(w); }

  //! the edge memo's counters since the last call (for the --stats line)
  std::string MemoStats() {
    std::ostringstream o;
    o << " edge_calls=" << memo_.calls() - memo_calls_last_ << " edge_hits=" << memo_.hits() - memo_hits_last_;
    memo_calls_last_ = memo_.calls();
    memo_hits_last_ = memo_.hits();
    return o.str();
  }

  NLMClient client_;
  nlm_session* session_;  // client_'s: cdec decodes one sentence at a time, on one thread
  int c_;                 // n-1
  int fid_, oov_fid_;
  WordID cdec_bos_;
  int64_t memo_calls_last_, memo_hits_last_;
  mutable EdgeMemo memo_;     // one sentence at a time, one thread (cdec)
};

}  // namespace

extern "C" __attribute__((visibility("default"))) FeatureFunction* create_ff(const std::string& str) {
  return new NLMFeatureFF(str);
}
