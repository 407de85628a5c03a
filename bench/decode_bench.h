// The decode benchmark (`topkv bench decode`): tokens per second of one
// decode step at long contexts, for each way of holding the KV cache:
//
//   dense       the model's own cache, all KV in the backend's memory (on a
//               CUDA backend: the GPU; the row is skipped, with the reason,
//               when weights + cache do not fit --gpu-mem-budget)
//   topk        the offloaded top-k runtime (src/session/make_runtime.h), one row
//               per --index backend
//   host-dense  exact attention over a host-memory KV cache on the CPU cores
//               (offload/host_dense_attention.h: llama.cpp --no-kv-offload)
//
// The context is either a real prefill of a passkey prompt of the requested
// length ("prefill") or synthetic keys and values written straight into the
// caches ("synthetic", bench/synthetic_fill.h), for contexts a prefill would
// take hours for; every row says which. Each row times `steps` decode steps
// after `warmup` untimed ones, greedy on the model's own logits.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "offload/policy.h"

namespace topkv {

enum class DecodeMode { Dense, TopK, HostDense };
const char* decode_mode_name(DecodeMode m);                    // "dense", "topk", "host-dense"
std::vector<DecodeMode> parse_decode_modes(const std::string& list);  // "dense,topk"; throws Error

enum class ContextFill { Prefill, Synthetic };
const char* context_fill_name(ContextFill f);
ContextFill parse_context_fill(const std::string& s);

struct DecodeBenchConfig {
  std::string model_path;          // GGUF file
  std::string model_label;         // what rows call the model (file name, or "synthetic llama3-8b")
  std::vector<int64_t> contexts;   // tokens
  std::vector<DecodeMode> modes;
  std::vector<std::string> indexes{"multipole"};  // topk: one row per index spec
  OffloadPolicy policy;            // k, window, sinks, dense layers, ... (attn and index are set per row)
  std::string backend = "auto";    // "cpu", "cuda", or "auto" (cuda when a device is there, else cpu)
  size_t gpu_mem_budget = 0;       // bytes the model may hold in backend memory; 0 = no limit
  int q8_terms = 0;                // CUDA: CudaBackendOptions::q8_terms (0: its default)
  int steps = 16, warmup = 2;
  ContextFill fill = ContextFill::Synthetic;
  DType kv_dtype = DType::F16;     // the model's cache (dense) and the host-dense rows
  WeightMode weights = WeightMode::Quant;  // quant (either backend), f16 (CUDA) or f32 (CPU)
  int chunk = 512;                 // prefill chunk
  bool beyond_trained = false;     // allow contexts past the model's trained context
  uint64_t seed = 1;               // synthetic data and the passkey prompt
  bool progress = true;
};

// One (context, mode, index) measurement. Times are per decode step.
struct DecodeRow {
  std::string mode, index;  // index: "" for dense and host-dense
  int64_t context = 0;      // requested
  int64_t context_tokens = 0;  // held when decoding starts (a prompt can be a few tokens short)
  int64_t k = 0;            // topk: mean k per layer; 0 otherwise
  std::string skipped;      // why the row did not run ("" = it ran)
  int steps = 0;
  double tok_s = 0;         // median over steps of 1 / step time
  double step_ms_p50 = 0, step_ms_p99 = 0, step_ms_mean = 0;
  // Mean split of a step (ms): the override's attention (attn_ms) splits into
  // index search, GPU kernels, host<->GPU copies, waiting on the GPU and the
  // rest of its host work (host_attn_ms); model_ms is the step outside it
  // (projections, FFN, the layers the model attends itself). On the CPU the
  // parts are disjoint: search + gpu + transfer + wait + host_attn = attn,
  // attn + model = step. On the CUDA runtime gpu and transfer are device-event
  // times that can overlap host work (host_attn is then clamped at 0), and wait
  // is where the host blocks for the device: it includes the model's own GPU
  // work queued before the layer (kernels run asynchronously).
  double attn_ms = 0, search_ms = 0, gpu_ms = 0, transfer_ms = 0, wait_ms = 0, host_attn_ms = 0, model_ms = 0;
  size_t kv_backend_bytes = 0;  // the model's caches (backend memory: host on CPU, device on CUDA)
  size_t kv_host_bytes = 0;     // the override's host stores (+ indexes, sinks, window)
  size_t peak_rss_bytes = 0;    // the process's largest resident set by the row's end (rows before included)
  // CUDA only: device memory the backend holds, by kind (after the steps).
  std::optional<size_t> gpu_weights, gpu_kv_cache, gpu_activations, gpu_scratch;
  // CUDA top-k with the device search: the store cache (--store-cache; part
  // of gpu_kv_cache) and the share it serves of the rows the device search may read.
  size_t store_cache_bytes = 0;
  double store_cached_share = 0;
  // ... and its tables' element type, chosen by the budget unless named
  // (--device-table-type; "" without device tables).
  std::string device_table_type;
  // ... and how many of the index's pages a device page merges: 1, or 2 and
  // 4 where the budget held only longer pages (DeviceTableChoice); 0 without
  // device tables.
  int device_table_page_factor = 0;
  double load_s = 0, fill_s = 0, build_s = 0;  // build_s: the override's take_context (reading + index build)
  double read_s = 0;  // of build_s, the layers' reading of the context (OffloadStats::read_s: summed over layers)
  int64_t keys_indexed = 0;
  // CUDA only: kernels launched per timed step (cuda_kernel_launches: our
  // launches plus the kernel nodes of replayed step graphs).
  std::optional<double> launches_per_step;
};

struct DecodeBenchResult {
  DecodeBenchConfig config;
  std::string arch, backend_name;  // backend_name: the one used ("cpu" / "cuda")
  std::string backend_note;        // auto: why it is the one used
  int n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0;
  int64_t n_ctx_train = 0;
  std::vector<int> offloaded_layers;  // the layers topk and host-dense take
  int threads = 0;
  std::vector<DecodeRow> rows;
};

// Checks everything cheap first (modes, contexts against the model, budget
// against the weights, index specs) and throws Error before any long work.
DecodeBenchResult run_decode_bench(const DecodeBenchConfig& cfg);

}  // namespace topkv
