// An nlmfeature joint model (NNJM, Devlin et al. 2014) as an External cdec feature.
//
//   feature_function=External /abs/libcdec_ff_nlmjoint.so --model /abs/joint.nlm [--name NNJM]
//       [--cache-entries N] [--persistent-cache DIR] [--persistent-cache-max S] [--stats]
//
// Each target word is scored given its n-1 previous target words and the w = 2m+1 source
// words around its affiliated source word; natural logs.  The affiliation comes from the
// rule's word alignment (the grammar's alignment field; points index the rule's symbols,
// nonterminals included): Devlin et al. 2014's heuristic among the rule's terminals (the
// aligned source word, the middle one of several, the right one of two; an unaligned word
// takes the nearest aligned terminal's, right first; a rule without alignment points spreads
// its words proportionally over its span).  Absolute source positions need the spans of the
// antecedents, which the state carries.  The target </s> is affiliated with the source </s>.
//
// State of an item (memcmp-safe, zero-padded): its first n-1 words with their affiliations
// (their scores were estimates with <null>-padded contexts, corrected when the context is
// known), its last n-1 words, its source span length, counts and flags -- the target-only
// NLM feature's state (nlm_ff.cc) plus the left words' affiliations and the span length.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#pragma GCC visibility push(default)
#include "ff.h"
#include "fdict.h"
#include "hg.h"
#include "lattice.h"
#include "sentence_metadata.h"
#include "tdict.h"
#include "trule.h"
#pragma GCC visibility pop

#include <nlmfeature.h>

#include "nlm_client.h"  // options, model, session, word map, sentence start/end, stats

namespace {

enum { kLong = 1, kBos = 2 };  // state flags

// Layout (StateSize() = 12c + 8 bytes), c = n-1:
//   int32 left[c], int32 laff[c], int32 right[c], int32 span, uint8 nleft, nright, flags, 0
class StateView {
 public:
  StateView(const void* p, int c) : p_(static_cast<const unsigned char*>(p)), c_(c) {}
  const int32_t* left() const { return reinterpret_cast<const int32_t*>(p_); }
  const int32_t* laff() const { return reinterpret_cast<const int32_t*>(p_) + c_; }
  const int32_t* right() const { return reinterpret_cast<const int32_t*>(p_) + 2 * c_; }
  int32_t span() const { return reinterpret_cast<const int32_t*>(p_)[3 * c_]; }
  int nleft() const { return p_[12 * c_ + 4]; }
  int nright() const { return p_[12 * c_ + 5]; }
  int flags() const { return p_[12 * c_ + 6]; }
 private:
  const unsigned char* p_;
  int c_;
};

void Usage() {
  std::cerr << "usage: feature_function=External /abs/libcdec_ff_nlmjoint.so --model JOINT.nlm [options]\n"
            << kCommonUsage
            << "  (a joint model, trained with nlmfeature train --source; the feature name defaults to NNJM)\n";
}

class NLMJointFF : public FeatureFunction {
 public:
  explicit NLMJointFF(const std::string& param)
      : client_("NLMJointFeature", "NLMJointFeature (libcdec_ff_nlmjoint)", Usage, "NNJM"), session_(NULL),
        c_(0), fid_(0), nsrc_(0) {
    client_.Open(param, [](const std::string&, std::istream&) { return false; });
    if (nlm_model_source_window(client_.model()) <= 0)
      client_.Fail(client_.path() + " is a target-only model: use libcdec_ff_nlm.so for it");
    session_ = client_.session();
    c_ = client_.context();
    cdec_bos_ = TD::Convert("<s>");
    fid_ = FD::Convert(client_.name());
    SetStateSize(12 * c_ + 8);
  }

  void PrepareForInput(const SentenceMetadata& smeta) {
    const Lattice& lat = smeta.GetSourceLattice();
    std::vector<int32_t> src;
    for (size_t i = 0; i < lat.size(); ++i) {
      if (lat[i].size() != 1 || lat[i][0].dist2next != 1) client_.Fail("needs plain sentence input (not lattices)");
      const std::string& w = TD::Convert(lat[i][0].label);
      src.push_back(nlm_source_word_id(client_.model(), w.data(), w.size()));
    }
    nsrc_ = static_cast<int>(src.size());
    client_.Begin(smeta.GetSentenceId(), &src);
  }

  void FinalTraversalFeatures(const void* state, SparseVector<double>* features) const {
    StateView st(state, c_);
    int32_t hist[2 * kMaxContext + 2];
    double v = 0;
    if (!(st.flags() & kBos)) {
      hist[0] = NLM_BOS;
      for (int j = 0; j < st.nleft(); ++j) {
        const int32_t w = st.left()[j];
        v += nlm_joint_score(session_, hist, j + 1, w, st.laff()[j]) -
             nlm_joint_score(session_, st.left(), j, w, st.laff()[j]);
        hist[j + 1] = w;
      }
    }
    const int nr = st.nright();
    if (nr == 0 || st.right()[nr - 1] != NLM_EOS) {
      int n = 0;
      if (!(st.flags() & (kLong | kBos))) hist[n++] = NLM_BOS;
      for (int j = 0; j < nr; ++j) hist[n++] = st.right()[j];
      v += nlm_joint_score(session_, hist, n, NLM_EOS, nsrc_);
    }
    features->set_value(fid_, v);
  }

 protected:
  void TraversalFeaturesImpl(const SentenceMetadata& /*smeta*/, const HG::Edge& edge,
                             const std::vector<const void*>& ant_states,
                             SparseVector<double>* features,
                             SparseVector<double>* /*estimated_features*/, void* out) const {
    const TRule& rule = *edge.rule_;
    const std::vector<WordID>& e = rule.e();
    const std::vector<WordID>& f = rule.f();
    // absolute source position of each source symbol of the rule, the affiliation of each
    // target symbol (stack arrays: this runs for every edge and antecedent combination)
    const size_t kSmall = 64;
    int fposS[kSmall], affS[kSmall];
    std::vector<int> fposH, affH;
    int *fpos = fposS, *aff = affS;
    if (f.size() > kSmall) {
      fposH.resize(f.size());
      fpos = &fposH[0];
    }
    if (e.size() > kSmall) {
      affH.resize(e.size());
      aff = &affH[0];
    }
    int cur = edge.i_, nt = 0;
    for (size_t k = 0; k < f.size(); ++k) {
      fpos[k] = cur;
      if (f[k] > 0) ++cur;
      else cur += StateView(ant_states[nt++], c_).span();
    }
    Affiliations(rule, e, fpos, f.size(), edge, aff);
    Acc a(c_);
    double v = 0;
    for (size_t i = 0; i < e.size(); ++i) {
      if (e[i] > 0) {
        if (i == 0 && e[i] == cdec_bos_) {
          a.BeginSentence();
          continue;
        }
        const int32_t w = Map(e[i]);
        const int32_t af = w == NLM_EOS ? nsrc_ : aff[i];  // a rule's own </s>: the source </s>
        v += nlm_joint_score(session_, a.right, a.nright, w, af);
        a.Push(w, af);
      } else {
        StateView st(ant_states[-e[i]], c_);
        if (st.flags() & kBos) {
          a.Reset(st);
          continue;
        }
        for (int j = 0; j < st.nleft(); ++j) {
          const int32_t w = st.left()[j];
          const int32_t af = st.laff()[j];
          v += nlm_joint_score(session_, a.right, a.nright, w, af) -
               nlm_joint_score(session_, st.left(), j, w, af);
          a.Push(w, af);
        }
        if (st.flags() & kLong) a.Jump(st);
      }
    }
    a.Write(out, edge.j_ - edge.i_);
    features->set_value(fid_, v);
  }

 private:
  // affiliation of every target terminal of the rule (by e index; -1 for nonterminals) into
  // out[0 .. e.size()); called for every edge (and antecedent combination): stack arrays, no
  // allocation for rules of up to kSmall target symbols and alignment points
  static void Affiliations(const TRule& rule, const std::vector<WordID>& e, const int* fpos, size_t nf,
                           const HG::Edge& edge, int* out) {
    const size_t n = e.size(), na = rule.a_.size();
    const size_t kSmall = 64;
    int small[5 * kSmall];
    std::vector<int> large;
    int *buf = small;
    if (n > kSmall || na > kSmall) {
      large.resize(2 * n + 3 * na);
      buf = &large[0];
    }
    // own and terms per target symbol, then (target, source position) per point and a buffer
    int *own = buf, *terms = buf + n, *pt = buf + 2 * n, *pos = pt + na, *tmp = pos + na;
    size_t np = 0;  // terminal-terminal points: (target index, absolute source position)
    for (size_t k = 0; k < na; ++k) {
      const AlignmentPoint& p = rule.a_[k];
      if (p.t_ < 0 || static_cast<size_t>(p.t_) >= n || p.s_ < 0 ||
          static_cast<size_t>(p.s_) >= nf || e[p.t_] <= 0 || rule.f()[p.s_] <= 0)
        continue;
      pt[np] = p.t_;
      pos[np] = fpos[p.s_];
      ++np;
    }
    size_t nterms = 0;
    bool any = false;
    for (size_t t = 0; t < n; ++t) {
      own[t] = -1;
      if (e[t] <= 0) continue;
      terms[nterms++] = static_cast<int>(t);
      size_t m = 0;  // t's source positions, sorted; the middle one (the right one of two)
      for (size_t q = 0; q < np; ++q)
        if (pt[q] == static_cast<int>(t)) tmp[m++] = pos[q];
      if (!m) continue;
      std::sort(tmp, tmp + m);
      own[t] = tmp[m / 2];
      any = true;
    }
    for (size_t t = 0; t < n; ++t) out[t] = -1;
    const int span = edge.j_ - edge.i_;
    for (size_t q = 0; q < nterms; ++q) {
      const size_t t = terms[q];
      if (!any) {
        out[t] = edge.i_ + (span > 0 ? std::min<int>(span - 1, static_cast<int>(q * span / nterms)) : 0);
      } else if (own[t] >= 0) {
        out[t] = own[t];
      } else {
        for (size_t d = 1; d < nterms; ++d) {
          if (q + d < nterms && own[terms[q + d]] >= 0) { out[t] = own[terms[q + d]]; break; }
          if (q >= d && own[terms[q - d]] >= 0) { out[t] = own[terms[q - d]]; break; }
        }
      }
    }
  }

  struct Acc {
    int c;
    int32_t left[kMaxContext];
    int32_t laff[kMaxContext];
    int32_t right[kMaxContext];
    int nleft, nright, flags;
    bool complete;
    explicit Acc(int c_) : c(c_), nleft(0), nright(0), flags(0), complete(false) {}
    void BeginSentence() {
      right[0] = NLM_BOS;
      nright = 1;
      flags |= kBos;
      complete = true;
    }
    void Push(int32_t w, int32_t af) {
      if (!complete) {
        laff[nleft] = af;
        left[nleft++] = w;
      } else {
        flags |= kLong;
      }
      if (nright == c) {
        memmove(right, right + 1, sizeof(int32_t) * (c - 1));
        right[c - 1] = w;
      } else {
        right[nright++] = w;
      }
      if (nright == c) complete = true;
    }
    void Jump(const StateView& st) {
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
    void Write(void* out, int32_t span) const {
      unsigned char* p = static_cast<unsigned char*>(out);
      memset(p, 0, 12 * c + 8);
      memcpy(p, left, sizeof(int32_t) * nleft);
      memcpy(p + 4 * c, laff, sizeof(int32_t) * nleft);
      memcpy(p + 8 * c, right, sizeof(int32_t) * nright);
      memcpy(p + 12 * c, &span, sizeof span);
      p[12 * c + 4] = static_cast<unsigned char>(nleft);
      p[12 * c + 5] = static_cast<unsigned char>(nright);
      p[12 * c + 6] = static_cast<unsigned char>(flags);
    }
  };

  int32_t Map(WordID w) const { return client_.Map(w); }

  NLMClient client_;
  nlm_session* session_;  // client_'s: one sentence at a time, one thread (cdec)
  int c_;                 // n-1
  int fid_;
  WordID cdec_bos_;
  int nsrc_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) FeatureFunction* create_ff(const std::string& str) {
  return new NLMJointFF(str);
}
