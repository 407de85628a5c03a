// One prompt's context shared by every top-k method of an evaluation
// (eval passkey, eval ruler), each index built once.
//
// The model holds the prompt, prefilled once densely. For each build policy
// (index spec, sinks, window, store type, head pattern, --build-on: what a
// context pack fixes) a host runtime with no dense layers takes that prefill
// once, which builds the indexes of every full-context layer as the backend's
// runtime would (make_build_runtime: on a CUDA backend the clustering
// indexes' k-means runs on the device, as `generate` there builds them;
// session 25's grid and earlier GPU suites built them with Faiss on the
// host), and is written to a context
// pack in a temporary file (offload/context_pack.h). Every method with that
// build policy then restores a fresh runtime from the pack: k, its schedule
// and the dense first layers may change per restore (the model holds every
// layer's KV, so a method with dense layers restores the pack's others), and
// a decode's changes (windows evicting into the store, folds into the index)
// stay in that runtime, never in the pack (the stores and index arrays are
// mapped copy-on-write). One pack exists at a time: asking
// for another build policy replaces it, so callers order their methods by
// build policy. Its file is unlinked once open (the mapping stays): nothing
// is left in the directory, even by a run that is killed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "offload/context_pack.h"
#include "offload/offload_runtime.h"
#include "offload/policy.h"
#include "src/model/backend.h"
#include "src/model/gguf.h"
#include "src/model/model.h"

namespace topkv {

// The fields of a policy fixed when a pack is built, as one string.
std::string build_key(const OffloadPolicy& p);

class SharedContext {
 public:
  // `model` holds `tokens` (n_past() == tokens.size(), perhaps more after a
  // dense decode: each use rewinds it to the prompt); `logits` follow the
  // last one. Packs go to `dir` (removed again).
  SharedContext(const GgufFile& file, Model& model, std::vector<int32_t> tokens, std::vector<float> logits,
                std::string dir);
  ~SharedContext();
  SharedContext(const SharedContext&) = delete;
  SharedContext& operator=(const SharedContext&) = delete;

  struct Build {
    std::string key;
    double build_s = 0;  // the index build (host runtime taking the prefill)
    double write_s = 0;  // writing the pack
    uint64_t pack_bytes = 0;
    int64_t keys_indexed = 0;
  };
  // The pack for `policy`'s build fields, built unless it is the current one
  // (by make_build_runtime(be, ...): the indexes `be`'s runtime would build).
  const Build& prepare(Backend& be, const OffloadPolicy& policy);
  // A fresh runtime for `policy` on `be` (make_offload_runtime: the CUDA
  // runtime on a CUDA backend) holding the context from the pack, set as the
  // model's attention override with the model at the end of the prompt.
  // `restore_s`: the time the restore took.
  std::unique_ptr<OffloadRuntime> attach(Backend& be, const OffloadPolicy& policy, bool measure_error,
                                         double* restore_s = nullptr);
  // The model back to dense attention over the prompt (after a method's run).
  void detach();
  int64_t n_tokens() const { return (int64_t)tokens_.size(); }
  int builds() const { return builds_; }              // packs built so far
  const Build& current() const { return build_; }     // the pack's build (key empty: none yet)

 private:
  void drop_pack();
  const GgufFile& file_;
  Model& model_;
  std::vector<int32_t> tokens_;
  std::vector<float> logits_;
  std::string dir_, path_;
  std::unique_ptr<ContextPack> pack_;
  Build build_;
  int builds_ = 0;
};

}  // namespace topkv
