// nlm_client.h: what the two cdec features (libcdec_ff_nlm.so, nlm_ff.cc, and
// libcdec_ff_nlmjoint.so, nlm_joint_ff.cc) share: the options every nlmfeature feature takes,
// the model and its session (cdec decodes one sentence at a time, on one thread), the cdec
// word -> model word table, the sentence start and end, and the per-sentence stats line.
// Included by each .cc after <nlmfeature.h> and cdec's tdict.h; everything stays inside the
// .so that includes it (anonymous namespace, hidden symbols).
#pragma once

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <iostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#define NLMFEATURE_CLIENT_PARSERS_ONLY  // the option rules the Moses features use; no Boost
#include <nlmfeature_client.h>

#define NLM_STR_(x) #x
#define NLM_STR(x) NLM_STR_(x)

namespace {

enum { kMaxContext = 15 };  // n-1 of the highest model order (16)

//! the option lines every nlmfeature cdec feature takes (after its own usage line)
const char* const kCommonUsage =
    "  --model PATH              nlmfeature model file (required)\n"
    "  --name NAME               feature name\n"
    "  --persistent-cache DIR    keep n-gram scores per sentence id in DIR (tuning)\n"
    "  --persistent-cache-max S  disk bound of DIR, e.g. 500M, 2G (default 4G)\n"
    "  --cache-entries N         per-sentence context cache bound (default " NLM_STR(NLM_DEFAULT_CACHE_ENTRIES) ")\n"
    "  --stats                   print cache statistics per sentence to stderr\n";


class NLMClient {
 public:
  //! `kind` starts the stats lines ("NLMFeature"), `label` names the feature in messages
  //! ("NLMFeature (libcdec_ff_nlm)"); `usage` prints its usage (called before exiting on a
  //! bad option); `name` is the default feature name
  NLMClient(const char* kind, const char* label, void (*usage)(), const char* name)
      : kind_(kind), label_(label), usage_(usage), name_(name), model_(NULL), session_(NULL), c_(0),
        stats_(false), sentence_(-1) {
    stats_last_.struct_size = sizeof(nlm_stats);
  }
  ~NLMClient() {
    End();
    nlm_session_free(session_);  // also writes the last sentence's persistent cache
    nlm_model_free(model_);
  }

  //! Parse the feature's options ("--key value" or flags), load the model and open the
  //! session.  `own(key, in)` handles the feature's own options (reading a value from `in`
  //! if it takes one) and returns false for a key it does not know.
  template <class Own>
  void Open(const std::string& param, Own own) {
    std::string path, pcache;
    int64_t pmax = 0, cache_entries = -1;
    std::istringstream in(param);
    std::string key;
    while (in >> key) {
      if (key == "--stats") { stats_ = true; continue; }
      if (own(key, in)) continue;
      std::string value;
      if (!(in >> value)) Fail("option " + key + " needs a value");
      if (key == "--model" || key == "-m") path = value;
      else if (key == "--name" || key == "-n") name_ = value;
      else if (key == "--persistent-cache") pcache = value;
      else if (key == "--persistent-cache-max") {
        try {
          pmax = nlmfeature::ParseSize(key, value);
        } catch (const std::runtime_error& e) {
          Fail(e.what());
        }
      } else if (key == "--cache-entries") cache_entries = atoll(value.c_str());
      else Fail("unknown option " + key);
    }
    if (path.empty()) Fail("--model is required");
    int rc = nlm_model_load(path.c_str(), &model_);
    if (rc != NLM_OK) Fail(std::string("cannot load the model: ") + nlm_last_error());
    path_ = path;
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
    nlm_session_stats(session_, &stats_last_);
  }

  nlm_model* model() const { return model_; }
  nlm_session* session() const { return session_; }
  int context() const { return c_; }  // n-1
  const std::string& name() const { return name_; }
  const std::string& path() const { return path_; }
  bool stats() const { return stats_; }

  //! the model id of a cdec word (<unk> for words the model does not know)
  int32_t Map(WordID w) const {
    return (w >= 0 && static_cast<size_t>(w) < map_.size()) ? map_[w] : NLM_UNK;
  }

  //! end the previous sentence and start sentence `id` (a joint model: with its source
  //! ids).  A model file overwritten in place is fatal: every score would be NaN; cdec stops
  //! with the reason.
  void Begin(int id, const std::vector<int32_t>* source = NULL) {
    End();
    sentence_ = id;
    int rc = source ? nlm_session_begin_source(session_, id, source->empty() ? NULL : &(*source)[0],
                                               static_cast<int>(source->size()))
                    : nlm_session_begin(session_, id);
    if (rc != NLM_OK) {
      std::cerr << label_ << ": error: " << nlm_last_error() << "\n";
      exit(2);
    }
  }

  //! end the current sentence (the persistent cache writes); with --stats print its
  //! counters and `extra` (the feature's own, e.g. " edge_calls=..")
  void End(const std::string& extra = std::string()) {
    if (sentence_ < 0) return;
    if (nlm_session_end(session_) != NLM_OK)
      std::cerr << label_ << ": warning: " << nlm_last_error() << "\n";
    if (stats_) {
      nlm_stats now;
      now.struct_size = sizeof now;
      nlm_session_stats(session_, &now);
      const nlm_stats& last = stats_last_;
      fprintf(stderr, "%s sentence %d lookups=%lld ngram_hits=%lld context_hits=%lld "
              "context_misses=%lld class_hits=%lld class_misses=%lld persistent_hits=%lld "
              "persistent_loaded=%lld persistent_written=%lld files_ignored=%lld nlm_ns=%lld%s\n",
              kind_, sentence_,
              (long long)(now.lookups - last.lookups),
              (long long)(now.ngram_hits - last.ngram_hits),
              (long long)(now.context_hits - last.context_hits),
              (long long)(now.context_misses - last.context_misses),
              (long long)(now.class_hits - last.class_hits),
              (long long)(now.class_misses - last.class_misses),
              (long long)(now.persistent_hits - last.persistent_hits),
              (long long)(now.persistent_loaded - last.persistent_loaded),
              (long long)(now.persistent_written - last.persistent_written),
              (long long)(now.files_ignored - last.files_ignored),
              (long long)(now.nlm_ns - last.nlm_ns), extra.c_str());
      stats_last_ = now;
    }
    sentence_ = -1;
  }

  void Fail(const std::string& msg) const {
    std::cerr << label_ << ": " << msg << "\n";
    usage_();
    exit(1);
  }

 private:
  const char* kind_;
  const char* label_;
  void (*usage_)();
  std::string name_, path_;
  nlm_model* model_;
  nlm_session* session_;
  int c_;
  bool stats_;
  int sentence_;
  nlm_stats stats_last_;
  std::vector<int32_t> map_;  // cdec WordID -> model id
};

}  // namespace
