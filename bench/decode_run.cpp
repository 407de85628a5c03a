#include "bench/decode_run.h"

#include <fmt/format.h>

#include <algorithm>

#include "bench/decode_memory.h"
#include "bench/synthetic_fill.h"
#include "gpu/cuda_backend.h"
#include "offload/host_dense_attention.h"
#include "src/session/make_runtime.h"
#include "src/session/session.h"
#include "src/common/error.h"
#include "src/common/host_memory.h"
#include "src/common/options.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/model/model.h"

namespace topkv {

namespace {

int32_t argmax(const std::vector<float>& v) { return (int32_t)(std::max_element(v.begin(), v.end()) - v.begin()); }

// A CUDA backend refusing memory (its budget ledger, or a full device) skips a
// row like the estimate does; any other error is a real failure.
bool is_memory_error(const Error& e) {
  const std::string w = e.what();
  return w.find("budget") != std::string::npos || w.find("out of memory") != std::string::npos;
}

}  // namespace

DecodeRunner::DecodeRunner(const DecodeBenchConfig& cfg, std::shared_ptr<const GgufFile> file, const ModelConfig& mc,
                           Backend& be)
    : cfg_(cfg), file_(std::move(file)), mc_(mc), be_(be), cuda_(is_cuda_backend(be)),
      tok_(Tokenizer::from_gguf(*file_)) {
  const std::vector<int32_t> ids = tok_.encode("The", false, false);
  TOPKV_CHECK(!ids.empty(), "the tokenizer of {} encodes 'The' to no token", cfg_.model_label);
  first_token_ = ids.front();
}

DecodeRow DecodeRunner::run(int64_t context, DecodeMode mode, const std::string& index,
                            const std::vector<int32_t>& prompt) {
  DecodeRow row;
  row.mode = decode_mode_name(mode), row.index = index, row.context = context;
  const bool prefill = cfg_.fill == ContextFill::Prefill;
  const int64_t n = prefill ? (int64_t)prompt.size() : context;
  row.context_tokens = n;
  if (n == 0 && mode != DecodeMode::Dense) {
    row.skipped = "context 0: nothing is held off the GPU to retrieve or attend on the host (dense rows only)";
    return row;
  }

  // The override and the layers it takes.
  std::unique_ptr<OffloadRuntime> rt;
  std::unique_ptr<HostDenseAttention> hd;
  AttentionOverride* ov = nullptr;
  std::vector<int> taken;
  if (mode == DecodeMode::TopK) {
    OffloadPolicy p = cfg_.policy;
    p.attn = AttnMode::TopK, p.index = index;
    rt = make_offload_runtime(be_, mc_, p, cfg_.progress);
    ov = rt.get(), taken = rt->retrieval_layers();
  } else if (mode == DecodeMode::HostDense) {
    hd = std::make_unique<HostDenseAttention>(mc_, cfg_.policy.dense_layers, cfg_.kv_dtype, cfg_.progress);
    ov = hd.get(), taken = hd->layers();
  }
  const auto stats = [&] { return rt ? rt->stats() : hd ? hd->stats() : OffloadStats{}; };

  ModelOptions mo;
  mo.n_ctx = n + cfg_.warmup + cfg_.steps;
  mo.max_chunk = prefill ? (int)std::min<int64_t>(cfg_.chunk, n) : 1;
  mo.kv_dtype = cfg_.kv_dtype;
  mo.weights = cfg_.weights;
  if (!prefill) mo.override_layers = taken;  // a prefill attends densely: caches for all, released after
  if (rt) mo.device_reserves = rt->device_reserves(mo.n_ctx);  // the model picks the table type they fit
  const ModelMemory need = estimate_model_memory(*file_, mc_, mo, cuda_);
  if (cfg_.gpu_mem_budget > 0 && need.total() > (double)cfg_.gpu_mem_budget) {
    row.skipped = fmt::format("needs about {} of {} memory ({}), over --gpu-mem-budget {}", format_bytes(need.total()),
                              cuda_ ? "GPU" : "backend", need.describe(), format_bytes((double)cfg_.gpu_mem_budget));
    return row;
  }
  Timer load;
  std::unique_ptr<Model> model;
  try {
    model = std::make_unique<Model>(file_, be_, mo);
  } catch (const Error& e) {
    if (!cuda_ || !is_memory_error(e)) throw;
    row.skipped = e.what();
    return row;
  }
  model->touch_weights();  // mapped pages resident before timing (a no-op for uploaded CUDA weights)
  if (rt) {
    if (const std::optional<DeviceTableChoice> t = device_table_choice(*model, *rt)) rt->set_device_tables(*t);
    if (!rt->device_table_choices().empty()) {
      row.device_table_type = dtype_name(rt->device_tables().type);
      row.device_table_page_factor = rt->device_tables().page_factor;
    }
  }
  row.load_s = load.seconds();

  Timer fill;
  int32_t tok = first_token_;
  if (prefill) {
    Progress bar("prefill", n, "tok", cfg_.progress && n > mo.max_chunk);
    tok = argmax(model->prefill(prompt, mo.max_chunk, false, [&](int64_t done) { bar.set(done); }));
    bar.finish();
    if (ov) ov->take_prefill(*model);
  } else if (n > 0) {
    const SyntheticFill synth(mc_, n, cfg_.seed, cfg_.progress);
    synth.fill_model(*model);
    if (rt) rt->take_context(n, synth.reader());
    if (hd) hd->take_context(n, synth.reader());
  }
  // A prefill attended densely: the override takes its caches now.
  if (ov) attach_override(*model, ov, taken, /*release_kv=*/prefill);
  row.fill_s = fill.seconds();
  row.build_s = stats().build_s, row.read_s = stats().read_s, row.keys_indexed = stats().keys_indexed;
  if (rt) {  // the mean over retrieval layers (a linear schedule varies it)
    const auto& ks = rt->k_per_layer();
    for (int64_t k : ks) row.k += k;
    row.k /= std::max<int64_t>(1, (int64_t)ks.size());
  }

  std::vector<double> step_s, rate;
  OffloadStats sum;
  const int64_t steps_before = stats().steps;
  uint64_t launches = 0;
  for (int i = 0; i < cfg_.warmup + cfg_.steps; ++i) {
    const OffloadStats before = stats();
    const uint64_t launches_before = cuda_kernel_launches();
    Timer t;
    const std::vector<float> logits = model->decode(tok);
    const double dt = t.seconds();
    if (i >= cfg_.warmup) launches += cuda_kernel_launches() - launches_before;
    tok = argmax(logits);
    if (i < cfg_.warmup) continue;
    const OffloadStats after = stats();
    step_s.push_back(dt), rate.push_back(1.0 / dt);
    sum.attend_s += after.attend_s - before.attend_s, sum.search_s += after.search_s - before.search_s;
    sum.gpu_s += after.gpu_s - before.gpu_s, sum.transfer_s += after.transfer_s - before.transfer_s;
    sum.wait_s += after.wait_s - before.wait_s;
  }
  TOPKV_CHECK(!ov || stats().steps - steps_before == cfg_.warmup + cfg_.steps,
              "internal: the {} override counted {} decode steps, the benchmark ran {}", row.mode,
              stats().steps - steps_before, cfg_.warmup + cfg_.steps);
  const double ms = 1e3 / cfg_.steps;  // seconds summed over the steps -> ms per step
  row.steps = cfg_.steps;
  row.tok_s = percentile(rate, 50);
  row.step_ms_p50 = percentile(step_s, 50) * 1e3, row.step_ms_p99 = percentile(step_s, 99) * 1e3;
  row.step_ms_mean = mean(step_s) * 1e3;
  row.attn_ms = sum.attend_s * ms, row.search_ms = sum.search_s * ms, row.gpu_ms = sum.gpu_s * ms;
  row.transfer_ms = sum.transfer_s * ms, row.wait_ms = sum.wait_s * ms;
  row.host_attn_ms = std::max(0.0, row.attn_ms - row.search_ms - row.gpu_ms - row.transfer_ms - row.wait_ms);
  row.model_ms = std::max(0.0, row.step_ms_mean - row.attn_ms);

  row.kv_backend_bytes = model->kv_bytes();
  row.kv_host_bytes = rt ? rt->host_bytes() : hd ? hd->host_bytes() : 0;
  row.peak_rss_bytes = peak_rss_bytes();
  if (cuda_) {
    const CudaMemoryUse u = cuda_memory_use(be_);
    row.gpu_weights = u.weights, row.gpu_kv_cache = u.kv_cache, row.gpu_activations = u.activations;
    row.gpu_scratch = u.scratch;
    row.launches_per_step = (double)launches / cfg_.steps;
  }
  row.store_cache_bytes = (size_t)stats().device_store_bytes;
  row.store_cached_share = stats().device_store_share;
  return row;
}

}  // namespace topkv
