#include "src/session/session.h"

#include <algorithm>

#include "gpu/cuda_sampler.h"
#include "src/common/error.h"
#include "src/common/progress.h"
#include "src/session/make_runtime.h"

namespace topkv {

void attach_override(Model& model, AttentionOverride* ov, const std::vector<int>& layers, bool release_kv) {
  model.set_attention_override(ov);
  if (ov && release_kv)
    for (int il : layers) model.release_kv(il);  // the override holds them now
}

void attach_runtime(Model& model, OffloadRuntime* rt, bool release_kv) {
  attach_override(model, rt, rt ? rt->retrieval_layers() : std::vector<int>{}, release_kv);
}

std::optional<DeviceTableChoice> device_table_choice(const Model& model, const OffloadRuntime& rt) {
  const std::vector<int64_t>& reserves = model.options().device_reserves;
  const std::vector<DeviceTableChoice> c = rt.device_table_choices();
  if (reserves.empty()) return std::nullopt;
  TOPKV_CHECK(reserves.size() == std::max<size_t>(c.size(), 1), "internal: the model was sized with {} device "
              "reserves for a runtime with {} table types", reserves.size(), c.size());
  if (c.size() < 2) return std::nullopt;
  return c[(size_t)model.device_reserve_choice()];
}

std::vector<float> prefill_into(Model& model, std::span<const int32_t> ids, int chunk, OffloadRuntime* rt,
                                bool overlap, bool progress, const std::atomic<bool>* cancel) {
  Progress bar("prefill", (int64_t)ids.size(), "tok", progress && (int64_t)ids.size() > chunk);
  const int64_t base = model.n_past();
  overlap = overlap && rt && base == 0;
  if (overlap) rt->begin_context((int64_t)ids.size());
  const KvReader read = model.kv_reader();
  // The model's prefill rings (ModelOptions::host_kv_past) read their past
  // from the stores the runtime fills here, chunk by chunk.
  struct PastScope {
    Model& m;
    ~PastScope() { m.set_kv_past(nullptr); }
  } past_scope{model};
  if (overlap && rt->serves_prefill_past()) model.set_kv_past(rt);
  std::vector<float> logits = model.prefill(ids, chunk, false, [&](int64_t done) {
    bar.set(done);
    if (overlap) rt->absorb(done, read);
    TOPKV_CHECK(!cancel || !cancel->load(), "cancelled during the prefill");
  });
  bar.finish();
  if (overlap) rt->end_context();
  else if (rt) rt->take_prefill(model);
  return logits;
}

Session::Session(std::shared_ptr<const GgufFile> file, const SessionOptions& opt)
    : Session(file, opt, Tokenizer::from_gguf(*file)) {}

Session::Session(std::shared_ptr<const GgufFile> file, const SessionOptions& opt, Tokenizer tok)
    : file_(std::move(file)), opt_(opt), tok_(std::move(tok)), cfg_(read_model_config(*file_)) {
  backend_ = open_backend(opt_.backend, cuda_);
}

Session::~Session() = default;

OffloadRuntime* Session::prepare_runtime(const OffloadPolicy& policy) {
  if (model_) model_->set_attention_override(nullptr);  // it may point at the runtime replaced here
  runtime_.reset();
  runtime_used_ = false;
  if (policy.attn != AttnMode::TopK) return nullptr;
  runtime_ = make_offload_runtime(*backend_, cfg_, policy, opt_.progress);
  runtime_->set_measure_error(opt_.measure_error);
  take_table_choice();
  return runtime_.get();
}

// A runtime that may hold its device tables as the model chose takes that
// choice before its first context (the tables go up as its layers are ready).
void Session::take_table_choice() {
  if (!runtime_ || !tables_) return;
  const std::vector<DeviceTableChoice> c = runtime_->device_table_choices();
  if (c.size() > 1 && std::find(c.begin(), c.end(), *tables_) != c.end()) runtime_->set_device_tables(*tables_);
}

Model& Session::load(const ModelOptions& mo) {
  model_.reset();
  tables_.reset();
  model_ = std::make_unique<Model>(file_, *backend_, mo);
  if (runtime_) tables_ = topkv::device_table_choice(*model_, *runtime_);
  if (!runtime_used_) take_table_choice();  // else the next start()'s fresh runtime takes it
  model_->touch_weights();  // page the mapped weights in now, not inside the timed prefill
  return *model_;
}

std::vector<float> Session::start(const OffloadPolicy& policy, const ContextPack* pack,
                                  std::span<const int32_t> prompt, int chunk, bool release_kv,
                                  const std::atomic<bool>* cancel) {
  TOPKV_CHECK(model_, "internal: Session::start before load");
  Model& model = *model_;
  if (runtime_used_ || (policy.attn == AttnMode::TopK) != (runtime_ != nullptr)) prepare_runtime(policy);
  runtime_used_ = true;
  model.set_attention_override(nullptr);
  model.reset();
  OffloadRuntime* rt = runtime_.get();
  std::vector<float> logits;
  if (pack) {  // the pack's context, then the prompt on top of it
    logits = pack->restore(model, rt);
    attach_runtime(model, rt, release_kv);
    if (!prompt.empty()) logits = prefill_into(model, prompt, chunk, nullptr, false, opt_.progress, cancel);
    return logits;
  }
  // The retrieval layers' KV goes to the host stores and their indexes are
  // built: during the prefill (overlap) or after.
  if (!prompt.empty()) logits = prefill_into(model, prompt, chunk, rt, opt_.overlap_build, opt_.progress, cancel);
  else if (rt) rt->take_prefill(model);  // (refused: nothing was prefilled)
  attach_runtime(model, rt, release_kv);
  return logits;
}

DecodeResult Session::decode(std::vector<float> logits, const DecodeParams& p, const Timer& since,
                             const TokenCallback& on_token, const std::atomic<bool>* cancel) {
  Model& model = *model_;
  DecodeResult r;
  Sampler sampler(p.sampling);
  std::unique_ptr<CudaSampler> gpu_sampler;
  if (cuda_) gpu_sampler = std::make_unique<CudaSampler>(*backend_, p.sampling);
  const float* device_logits = nullptr;
  const int64_t n_vocab = cfg_.n_vocab;
  Timer decode_timer;
  r.first_token_s = since.seconds();
  while (r.n_gen < p.n_predict) {
    if (cancel && cancel->load()) {
      r.stop = "cancelled";
      break;
    }
    const int32_t id = device_logits ? gpu_sampler->sample(device_logits, n_vocab) : sampler.sample(logits);
    if (r.n_gen == 0) r.first_token_s = since.seconds();
    if (!p.ignore_eog && tok_.is_eog(id)) {
      r.stop = "eog";
      break;
    }
    r.ids.push_back(id);
    if (on_token) on_token(id);
    if (++r.n_gen == p.n_predict) break;
    if (model.n_past() >= p.n_ctx) {
      r.stop = "context";
      break;
    }
    if (gpu_sampler)
      device_logits = model.decode_on_backend(id);
    else
      logits = model.decode(id);
    ++r.n_decode;
  }
  r.decode_s = decode_timer.seconds();
  return r;
}

}  // namespace topkv
