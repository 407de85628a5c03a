#include "src/eval/shared_context.h"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>

#include "src/session/make_runtime.h"
#include "src/session/session.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/timer.h"

namespace topkv {

// Not the dense layers: a pack is built with none (every full-context layer
// indexed) and serves any count, as the model holds every layer's KV of the
// prompt (ContextPack::policy_for_run's model_holds_context).
std::string build_key(const OffloadPolicy& p) {
  return fmt::format("{}|sinks={}|window={}|store={}:{}|heads={}:{}:{}|build_on={}", canonical_spec(p.index),
                     p.sinks, p.window, dtype_name(p.store_dtype), store_type_at_spec(p), p.heads_file,
                     p.heads_threshold, p.heads_sparsity, build_on_name(p.build_on));
}

SharedContext::SharedContext(const GgufFile& file, Model& model, std::vector<int32_t> tokens,
                             std::vector<float> logits, std::string dir)
    : file_(file), model_(model), tokens_(std::move(tokens)), logits_(std::move(logits)), dir_(std::move(dir)) {
  TOPKV_CHECK(model_.n_past() >= n_tokens(), "internal: a shared context of {} tokens from a model holding {}",
              n_tokens(), model_.n_past());
  static std::atomic<int> counter{0};
  path_ = (std::filesystem::path(dir_) / fmt::format("topkv-eval-{}-{}.tkv", getpid(), counter++)).string();
}

SharedContext::~SharedContext() {
  model_.set_attention_override(nullptr);
  drop_pack();
}

void SharedContext::drop_pack() {
  pack_.reset();
  std::error_code ec;
  std::filesystem::remove(path_, ec);
  build_ = {};
}

const SharedContext::Build& SharedContext::prepare(Backend& be, const OffloadPolicy& policy) {
  TOPKV_CHECK(policy.attn == AttnMode::TopK, "internal: a shared context for a dense policy");
  const std::string key = build_key(policy);
  if (pack_ && build_.key == key) return build_;
  drop_pack();
  detach();  // the host runtime reads the prompt's keys from the model
  Build b;
  b.key = key;
  {
    OffloadPolicy build = policy;
    build.dense_layers = 0;
    const std::unique_ptr<OffloadRuntime> rt = make_build_runtime(be, model_.config(), build, /*progress=*/false);
    Timer t;
    rt->take_prefill(model_);
    b.build_s = t.seconds();
    b.keys_indexed = rt->stats().keys_indexed;
    Timer w;
    save_context_pack(path_, file_, model_, rt.get(), tokens_, logits_,
                      {{"source", "topkv eval (temporary)"}, {"index_build_s", b.build_s}});
    b.write_s = w.seconds();
  }
  std::error_code ec;
  b.pack_bytes = std::filesystem::file_size(path_, ec);
  TOPKV_CHECK(!ec, "cannot read back the temporary context pack {}: {} (--tmp-dir)", path_, ec.message());
  pack_ = std::make_unique<ContextPack>(path_, /*verify=*/false);  // written just now
  // The reader keeps the file open and maps it through that descriptor: the
  // name can go now, so that a run stopped midway leaves no pack behind.
  std::filesystem::remove(path_, ec);
  build_ = b;
  ++builds_;
  return build_;
}

std::unique_ptr<OffloadRuntime> SharedContext::attach(Backend& be, const OffloadPolicy& policy, bool measure_error,
                                                      double* restore_s) {
  TOPKV_CHECK(pack_ && build_.key == build_key(policy), "internal: attach before prepare for {}", build_key(policy));
  detach();
  Timer t;
  std::unique_ptr<OffloadRuntime> rt = make_offload_runtime(
      be, model_.config(), pack_->policy_for_run(policy, /*model_holds_context=*/true), /*progress=*/false);
  rt->set_measure_error(measure_error);
  rt->take_pack(pack_->file());
  // The model keeps its own cache of the layers the runtime serves (they
  // decode through the runtime only), so dense runs can follow.
  attach_runtime(model_, rt.get(), /*release_kv=*/false);
  if (restore_s) *restore_s = t.seconds();
  return rt;
}

void SharedContext::detach() {
  model_.set_attention_override(nullptr);
  model_.rewind(n_tokens());
}

}  // namespace topkv
