#include "bench/decode_bench.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <random>

#include "bench/decode_memory.h"
#include "bench/decode_run.h"
#include "gpu/cuda_backend.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/eval/passkey_prompt.h"
#include "src/session/backend_choice.h"

namespace topkv {

const char* decode_mode_name(DecodeMode m) {
  switch (m) {
    case DecodeMode::Dense: return "dense";
    case DecodeMode::TopK: return "topk";
    case DecodeMode::HostDense: return "host-dense";
  }
  return "?";
}

std::vector<DecodeMode> parse_decode_modes(const std::string& list) {
  std::vector<DecodeMode> out;
  for (const std::string& m : split_list(list)) {
    if (m == "dense") out.push_back(DecodeMode::Dense);
    else if (m == "topk") out.push_back(DecodeMode::TopK);
    else if (m == "host-dense") out.push_back(DecodeMode::HostDense);
    else fail("unknown decode mode '{}': use dense (all KV in the backend's memory: the GPU on --backend cuda), "
              "topk (the offloaded top-k runtime) or host-dense (exact attention over host memory on the CPU)", m);
  }
  TOPKV_CHECK(!out.empty(), "--modes names no mode: use dense, topk and/or host-dense");
  return out;
}

const char* context_fill_name(ContextFill f) { return f == ContextFill::Prefill ? "prefill" : "synthetic"; }

ContextFill parse_context_fill(const std::string& s) {
  if (s == "prefill") return ContextFill::Prefill;
  if (s == "synthetic") return ContextFill::Synthetic;
  fail("unknown --fill '{}': use prefill (a real passkey prompt, prefilled) or synthetic (generated keys and values "
       "written into the caches)", s);
}

namespace {

// The backend the config names (src/session/backend_choice.h: auto is CUDA
// when a device is visible); with auto on the CPU, the note says why.
std::unique_ptr<Backend> make_backend(const DecodeBenchConfig& c, std::string& note) {
  BackendSpec spec;
  spec.name = c.backend, spec.gpu_mem_budget = c.gpu_mem_budget, spec.q8_terms = c.q8_terms;
  note = auto_backend_note(c.backend);
  bool cuda = false;
  return open_backend(spec, cuda);
}

// Everything that can be checked without long work: a bad request fails here,
// first what needs no model, then what needs its config.
void validate_config(const DecodeBenchConfig& c) {
  TOPKV_CHECK(!c.contexts.empty(), "--contexts names no context length");
  for (int64_t n : c.contexts) {
    TOPKV_CHECK(n >= 0, "context {} must not be negative", n);
    TOPKV_CHECK(n >= 1 || c.fill == ContextFill::Synthetic, "--fill prefill needs contexts of at least 1 token "
                "(a prompt to prefill); context 0 decodes from an empty context with --fill synthetic");
  }
  TOPKV_CHECK(!c.modes.empty(), "--modes names no mode: use dense, topk and/or host-dense");
  TOPKV_CHECK(c.steps >= 1, "--steps must be at least 1 (got {})", c.steps);
  TOPKV_CHECK(c.warmup >= 0, "--warmup must be >= 0 (got {})", c.warmup);
  TOPKV_CHECK(c.chunk >= 1, "--chunk must be positive (got {})", c.chunk);
  TOPKV_CHECK(c.kv_dtype == DType::F16 || c.kv_dtype == DType::F32, "--kv-type must be f16 or f32");
}

void validate_for_model(const DecodeBenchConfig& c, const GgufFile& file, const ModelConfig& mc, bool cuda) {
  check_weight_mode(c.weights, cuda);
  for (int64_t n : c.contexts) {
    const int64_t need = n + c.warmup + c.steps;
    TOPKV_CHECK(c.beyond_trained || need <= mc.n_ctx_train,
                "context {} (+ {} decode steps) is beyond the {} positions {} was trained on; pass --beyond-trained "
                "to time decode there anyway (speed is still measured; the text would be meaningless)",
                n, c.warmup + c.steps, mc.n_ctx_train, c.model_label);
  }
  const auto has = [&](DecodeMode m) { return std::find(c.modes.begin(), c.modes.end(), m) != c.modes.end(); };
  if (has(DecodeMode::TopK) || has(DecodeMode::HostDense))
    TOPKV_CHECK(!offloaded_layers(mc, c.policy.dense_layers).empty(),
                "topk and host-dense have no layer to take: every full-context layer of {} is among the first "
                "--dense-layers {}; lower --dense-layers", c.model_label, c.policy.dense_layers);
  if (has(DecodeMode::TopK)) {
    TOPKV_CHECK(!c.indexes.empty(), "topk needs at least one --index");
    for (auto& spec : c.indexes) KvIndex::create(spec);  // unknown backend or parameter
    OffloadPolicy p = c.policy;
    p.attn = AttnMode::TopK;
    p.validate();
  }
  if (c.gpu_mem_budget > 0) {  // the least any row holds: weights, scratch, sliding-window rings
    ModelOptions least;
    least.n_ctx = 1, least.max_chunk = 1, least.kv_dtype = c.kv_dtype, least.weights = c.weights;
    for (int il = 0; il < mc.n_layer; ++il) least.override_layers.push_back(il);
    const ModelMemory m = estimate_model_memory(file, mc, least, cuda);
    TOPKV_CHECK(m.total() <= (double)c.gpu_mem_budget,
                "--gpu-mem-budget {} is too small for {}: no mode can run, the model alone takes {} ({}) on the {} "
                "backend; raise the budget", format_bytes((double)c.gpu_mem_budget), c.model_label,
                format_bytes(m.total()), m.describe(), cuda ? "cuda" : "cpu");
  }
}

}  // namespace

DecodeBenchResult run_decode_bench(const DecodeBenchConfig& cfg) {
  validate_config(cfg);
  DecodeBenchResult res;
  res.config = cfg;
  std::shared_ptr<const GgufFile> file = GgufFile::open(cfg.model_path);
  const ModelConfig mc = read_model_config(*file);
  if (res.config.model_label.empty()) res.config.model_label = cfg.model_path;
  std::unique_ptr<Backend> be = make_backend(cfg, res.backend_note);
  const bool cuda = is_cuda_backend(*be);
  validate_for_model(res.config, *file, mc, cuda);
  res.arch = arch_name(mc.arch);
  res.backend_name = cuda ? "cuda" : "cpu";
  res.n_layer = mc.n_layer, res.n_head = mc.n_head, res.n_head_kv = mc.n_head_kv, res.head_dim = mc.head_dim;
  res.n_ctx_train = mc.n_ctx_train;
  res.offloaded_layers = offloaded_layers(mc, cfg.policy.dense_layers);
  res.threads = omp_get_max_threads();
  if (!res.backend_note.empty() && cfg.progress) fmt::print(stderr, "topkv: {}\n", res.backend_note);

  DecodeRunner runner(res.config, file, mc, *be);
  for (int64_t n : cfg.contexts) {
    std::vector<int32_t> prompt;
    if (cfg.fill == ContextFill::Prefill) {  // one prompt per context, shared by its rows
      std::mt19937_64 rng(cfg.seed);
      prompt = build_retrieval_prompt(runner.tokenizer(), RetrievalTask::Passkey, n, 0.5, rng).tokens;
    }
    for (DecodeMode mode : cfg.modes) {
      const std::vector<std::string> indexes =
          mode == DecodeMode::TopK ? cfg.indexes : std::vector<std::string>{""};
      for (const std::string& index : indexes) {
        DecodeRow row = runner.run(n, mode, index, prompt);
        if (cfg.progress) {
          const std::string what = fmt::format("context {} {}{}", n, row.mode, index.empty() ? "" : " " + index);
          if (row.skipped.empty())
            fmt::print(stderr, "topkv: {}: {:.2f} tok/s (p50 {:.2f} ms, p99 {:.2f} ms per step)\n", what, row.tok_s,
                       row.step_ms_p50, row.step_ms_p99);
          else
            fmt::print(stderr, "topkv: {}: skipped: {}\n", what, row.skipped);
        }
        res.rows.push_back(std::move(row));
      }
    }
  }
  return res;
}

}  // namespace topkv
