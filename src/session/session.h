// The session layer: one model opened for decoding, the code every command
// that generates shares (generate, the server; the evaluations and the decode
// benchmark use its pieces). Above offload/ and gpu/, below src/cli/:
//   - the backend (src/session/backend_choice.h: one meaning of auto),
//   - the model, built from the caller's ModelOptions,
//   - the top-k runtime for a policy (make_offload_runtime: the CUDA runtime
//     on a CUDA backend),
//   - a context: restored from a context pack or prefilled (the runtime takes
//     the prefill, during it with overlap, else after), then the runtime set
//     as the model's attention override,
//   - decoding with a per-token callback and a cancel flag.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "offload/context_pack.h"
#include "offload/offload_runtime.h"
#include "offload/policy.h"
#include "src/common/timer.h"
#include "src/model/gguf.h"
#include "src/model/model.h"
#include "src/model/sampler.h"
#include "src/model/tokenizer.h"
#include "src/session/backend_choice.h"

namespace topkv {

// Sets `rt` (null: dense attention) as `model`'s attention override. With
// `release_kv` the model frees the caches of the layers rt serves (their keys
// live in rt from now on); without, it keeps them, so that a later context
// can be prefilled densely into the same model (the server, the evaluations).
void attach_runtime(Model& model, OffloadRuntime* rt, bool release_kv);
// The same for any override `ov` serving `layers` (e.g. offload/host_dense_attention.h).
void attach_override(Model& model, AttentionOverride* ov, const std::vector<int>& layers, bool release_kv);
// The device tables `model`'s memory check chose for `rt` (the model was
// sized with ModelOptions::device_reserves = rt.device_reserves(n)): its
// Model::device_reserve_choice among rt.device_table_choices(), for
// rt.set_device_tables before rt takes a context. nullopt when there was
// no choice to make (one choice or none, or the model was given no reserves).
std::optional<DeviceTableChoice> device_table_choice(const Model& model, const OffloadRuntime& rt);

// Prefills `ids` in chunks of `chunk` (a progress bar when there are several
// and `progress`) and returns the last token's logits. With an offloaded
// runtime `rt`, hands it the retrieval layers' KV: while the prefill runs when
// `overlap` (the indexes build on the host cores as the keys appear,
// OffloadRuntime::begin_context), else after it (take_prefill). `cancel`, when
// set during the prefill, stops it after the current chunk (Error).
std::vector<float> prefill_into(Model& model, std::span<const int32_t> ids, int chunk, OffloadRuntime* rt,
                                bool overlap, bool progress = true, const std::atomic<bool>* cancel = nullptr);

struct DecodeParams {
  SamplerParams sampling;
  int n_predict = 128;  // tokens to generate at most
  int64_t n_ctx = 0;    // the model's context size: decoding stops when it is full
  bool ignore_eog = false;  // an end-of-generation token is generated like any other (soaks, benchmarks)
};
struct DecodeResult {
  std::vector<int32_t> ids;  // generated, end-of-generation token excluded
  std::string stop = "length";  // length, eog, context, cancelled
  int n_gen = 0, n_decode = 0;  // tokens sampled; model.decode runs
  double first_token_s = 0;     // from `since` to the first sample
  double decode_s = 0;
  double decode_tps() const { return n_decode > 0 ? n_decode / decode_s : 0.0; }
};
// Called with each generated token, before it is run through the model.
using TokenCallback = std::function<void(int32_t id)>;

struct SessionOptions {
  BackendSpec backend;
  bool overlap_build = false;  // resolved --overlap-build (see overlap_build in src/cli/cli_util.h)
  bool progress = true;        // progress bars and the runtime's notes on stderr
  bool measure_error = false;  // top-k: exact attention beside each step (OffloadRuntime::set_measure_error)
};

class Session {
 public:
  // Opens the backend and reads the model's tokenizer and configuration.
  Session(std::shared_ptr<const GgufFile> file, const SessionOptions& opt);
  // The same with the model's tokenizer read already (Tokenizer::from_gguf of `file`).
  Session(std::shared_ptr<const GgufFile> file, const SessionOptions& opt, Tokenizer tok);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  const GgufFile& file() const { return *file_; }
  const std::shared_ptr<const GgufFile>& file_ptr() const { return file_; }
  const Tokenizer& tokenizer() const { return tok_; }
  const ModelConfig& config() const { return cfg_; }
  Backend& backend() { return *backend_; }
  bool cuda() const { return cuda_; }

  // A top-k runtime for `policy` (null for dense), made now so that the
  // caller can size the model for it (retrieval_layers, device_bytes_estimate);
  // the next start() uses it. Replaces a runtime made before.
  OffloadRuntime* prepare_runtime(const OffloadPolicy& policy);
  OffloadRuntime* runtime() { return runtime_.get(); }

  // Builds the model. Error on bad options or memory. With device_reserves
  // (OffloadRuntime::device_reserves of the prepared runtime) the model's
  // memory check chooses the runtime's device tables (--device-table-type
  // auto), which this runtime and those start() makes later take.
  Model& load(const ModelOptions& mo);
  // That choice, when the budget made one among several.
  std::optional<DeviceTableChoice> device_table_choice() const { return tables_; }
  Model& model() { return *model_; }
  bool loaded() const { return model_ != nullptr; }

  // A context to decode from, the model at its end: the pack's (its policy
  // must be `policy`, see ContextPack::policy_for_run) with `prompt` appended,
  // or `prompt` alone. The runtime is prepare_runtime's when unused, else a
  // fresh one for `policy`; it takes the pack or the prefill and is attached
  // (attach_runtime with `release_kv`). Returns the logits after the last token.
  std::vector<float> start(const OffloadPolicy& policy, const ContextPack* pack, std::span<const int32_t> prompt,
                           int chunk, bool release_kv, const std::atomic<bool>* cancel = nullptr);

  // Samples from `logits` and runs each token to get the next logits, until
  // n_predict, an end-of-generation token, a full context, or `cancel` set.
  // `since` started with the context work (first_token_s). On CUDA the decode
  // logits stay on the device and are sampled there (gpu/cuda_sampler.h); the
  // first token comes from the host logits. A fresh sampler each call: the
  // same seed repeats an answer.
  DecodeResult decode(std::vector<float> logits, const DecodeParams& p, const Timer& since,
                      const TokenCallback& on_token = {}, const std::atomic<bool>* cancel = nullptr);

 private:
  void take_table_choice();

  std::shared_ptr<const GgufFile> file_;
  SessionOptions opt_;
  Tokenizer tok_;
  ModelConfig cfg_;
  bool cuda_ = false;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<OffloadRuntime> runtime_;  // declared before the model: it outlives the model's pointer to it
  bool runtime_used_ = false;
  std::optional<DeviceTableChoice> tables_;  // the model's choice of device tables (load)
  std::unique_ptr<Model> model_;
};

}  // namespace topkv
