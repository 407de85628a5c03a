// The offloading policy: which layers and heads retrieve from host-memory
// indexes, with what budget, and how large the GPU-resident part is.
// Everything here can come from the command line or a JSON config file.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "index/kv_index.h"
#include "offload/head_pattern.h"
#include "src/model/model_config.h"

namespace topkv {

// The command line's k when a run gives none (--k, --k-fraction, --config,
// a pack): 2% of the context, at least 64 and at most 1024 keys per KV head
// and layer. Why (issue 13, Qwen2.5-Coder, every layer retrieving;
// docs/AS_BUILT.md, "Evaluation"): the default index at 2% kept agreement
// >= 0.99 and KL ~0.001 from 4K to 32K, and the score within 2% of dense
// over 55-198 prompts a length (Faiss-built indexes; built as the GPU builds
// them, one near tie short at 8K and 16K on 6 prompts a length), while 64
// keys (0.4% at 16K, the 0.5B) had 8-10x its KL; 1% is the floor, not the
// default. 64 keeps short prompts as they
// were; the cap bounds a step's rows past the models' trained contexts,
// where nothing real is measured (2% reaches 1024 at 51K tokens; the speed
// runs use 256-1024).
inline constexpr double kDefaultKFraction = 0.02;
inline constexpr int64_t kDefaultKMin = 64, kDefaultKMax = 1024;

enum class AttnMode : uint8_t { Dense, TopK };
enum class KSchedule : uint8_t { Uniform, Linear, Ends, Weights };
enum class SearchOn : uint8_t { Auto, Host, Gpu };
// Where the clustering indexes' blockwise k-means runs (OffloadPolicy::build_on).
enum class BuildOn : uint8_t { Auto, Host, Gpu, Lloyd };

// What the device search's summary tables are, as the budget chooses them
// (OffloadRuntime::device_table_choices): the element type, and for page
// bounds how many of the index's pages one device page merges (1: its own).
struct DeviceTableChoice {
  DType type = DType::F16;
  int page_factor = 1;
  bool operator==(const DeviceTableChoice&) const = default;
  std::string name() const;  // "i8", or "i8, pages x2"
};

struct OffloadPolicy {
  AttnMode attn = AttnMode::Dense;
  // KvIndex spec "name[:build params]". multipole by default: the closest to
  // dense decoding on real Gemma passkey data, no private key copy (~70 B/key
  // at head_dim 128 against ~500 for the graph indexes' fp32 key copies)
  // (bench/results/passkey_gemma3_270m_cpu.txt, bench/results/recall_1m/).
  std::string index = "multipole";
  SearchParams search;          // per-call search parameters; search.k is the mean k per layer
  double k_fraction = 0.0;      // > 0: k = k_fraction x context tokens (e.g. 0.01 = 1%),
  int64_t k_min = 1;            // ... at least k_min
  int64_t k_max = 0;            // ... and at most k_max (0: no bound). mean_k() applies them
  KSchedule k_schedule = KSchedule::Uniform;
  // KSchedule::Weights: k of each retrieval layer in proportion to its weight
  // (one a retrieval layer, first to last), the same total as uniform; written
  // "weights:w0/w1/..." wherever a schedule is text (flags, JSON, packs).
  std::vector<double> k_weights;
  int dense_layers = 0;         // the first N layers stay dense (as Quest does)
  int sinks = 4;                // attention sinks kept with the window (StreamingLLM / DuoAttention)
  int window = 256;             // recent tokens kept exactly (GPU-resident in the CUDA runtime)
  DType store_dtype = DType::F16;  // host store element type: f16, bf16, q8_0 or f8 (E4M3: half the bytes)
  // Layers (model layer index) whose host store takes another type than
  // store_dtype, written "0=f16,8=f16" wherever it is text (--store-type-at,
  // JSON "store_type_at", packs). For keys with outlier dimensions that no
  // 8-bit type keeps: with every layer of Qwen2.5-Coder in q8_0 the top-k
  // attention error is 1.12-1.21x f16's, most of it layer 0's (3.7-8.9x there);
  // docs/AS_BUILT.md, "A store type per layer". Each named layer must be a
  // full-context layer of the model (OffloadRuntime checks it); one that
  // dense_layers keeps dense has no store and is passed over.
  std::map<int, DType> store_dtype_at;
  DType store_dtype_of(int layer) const;  // store_dtype_at's type for the layer, else store_dtype
  // CUDA runtime: false = kernels read retrieved rows in place from the pinned
  // host store over PCIe; true = the host copies them into a pinned staging
  // buffer sent in one copy (needed when the store is not pinned, e.g. a
  // memory-mapped context pack).
  bool stage_rows = false;
  // CUDA runtime: where retrieval heads search. Gpu: the index's summary
  // tables (cluster centroids, Quest page bounds) live on the device and the
  // whole search runs there, without a host round trip per layer (budget
  // mode, GQA union, rows read in place: not with stage_rows); Host: the
  // host cores search every index; Auto: Gpu where the index allows it.
  SearchOn search_on = SearchOn::Auto;
  DType device_table_type = DType::F16;  // element type of the device summary tables
  // --device-table-type auto (the default): device_table_type while the GPU
  // can hold its tables beside the rest, else i8 (half of f16's bytes and
  // f16's fidelity on the Qwen models: docs/AS_BUILT.md, "i8 device
  // tables"). The model's memory check makes the choice before any table goes
  // up (OffloadRuntime::device_table_choices, ModelOptions::device_reserves);
  // false: the type is the user's, and a plan it does not fit is refused.
  bool device_table_by_budget = true;
  // Where the clustering backends' blockwise k-means runs (centroid,
  // multipole: KvIndex::uses_kmeans), and quest's page bounds
  // (KvIndex::uses_page_bounds). Gpu (CUDA runtime): Lloyd rounds on the
  // device (gpu/gpu_kmeans.h), the page bounds there (gpu/gpu_page_bounds.h);
  // Host: Faiss and the bounds on the host cores; Lloyd: the k-means engine's
  // twin on the host cores (LloydKMeans, index/kmeans.h: the labels the
  // device gives, on any machine; slower than Faiss), bounds on the host (the
  // device's, bit for bit); Auto (since session 19; quest's bounds since
  // session 32): Gpu on the CUDA runtime when the index takes an engine, Host
  // elsewhere (the CPU runtime). The rest of the build stays on the host.
  BuildOn build_on = BuildOn::Auto;
  int device_fold = 1024;  // Gpu search: rows evicted from the window are attended exactly from the
                           // device until this many are pending, then folded into the index (and its
                           // tables uploaded again device_fold/4 steps later: a fixed step, whatever
                           // the host's timing)
  bool sync_folds = false;  // Gpu search: fold on the decode path (the step waits, as the CPU runtime's
                            // does) instead of on a host thread while the device keeps attending the
                            // rows exactly
  // CUDA runtime, search on the device, rows read in place: bytes of GPU
  // memory for copies of the host store's rows (gpu/device_store_cache.h), so
  // retrieved rows are read from GPU memory instead of over PCIe where they
  // fit; -1 = auto (whatever the GPU memory budget leaves, less 1 GiB), 0 = off.
  int64_t store_cache = -1;
  std::string heads_file;       // DuoAttention pattern; empty = every head retrieves
  double heads_threshold = 0.5; // gate < threshold -> streaming head
  double heads_sparsity = -1.0; // in [0,1]: this fraction of heads stream (overrides threshold)

  // The mean k per retrieval layer for a context of n tokens: search.k, or
  // with k_fraction > 0 that fraction of n within [k_min, k_max].
  int64_t mean_k(int64_t n) const;

  // Reads a JSON object with any of the fields above (names as here, k as "k",
  // enums as strings). Unknown keys are an Error. "k" without "k_fraction"
  // in the same object sets a fixed k (k_fraction 0), as --k alone does.
  void apply_json(const std::string& json_text, const std::string& origin);
  void apply_json_file(const std::string& path);  // the keys the file has, over this policy
  std::string to_json() const;
  void validate() const;  // Error on nonsense (negative window, k < 1, ...)
};

const char* attn_mode_name(AttnMode m);
AttnMode parse_attn_mode(const std::string& s);
std::vector<std::string> attn_mode_names();
KSchedule parse_k_schedule(const std::string& s);  // a named schedule: uniform | linear | ends
const char* k_schedule_name(KSchedule s);  // as parse_k_schedule reads it ("weights" for Weights)
std::vector<std::string> k_schedule_names();  // every name parse_k_schedule reads
// A schedule as text: a name above or "weights:w0/w1/..." (relative k per
// retrieval layer). set_k_schedule sets k_schedule and k_weights from it;
// k_schedule_spec writes them back the same way.
void set_k_schedule(OffloadPolicy& p, const std::string& spec);
std::string k_schedule_spec(const OffloadPolicy& p);
// The device tables' type as text: "auto" (device_table_by_budget, f16
// preferred) or a table type (parse_table_dtype). set_device_table_spec sets
// both fields from it; device_table_spec writes them back the same way.
void set_device_table_spec(OffloadPolicy& p, const std::string& spec);
std::string device_table_spec(const OffloadPolicy& p);
// The per-layer store types as text: "" (none) or "L=TYPE[,L=TYPE...]"
// (layers in order, each once). set_store_type_at replaces store_dtype_at
// with the spec's; store_type_at_spec writes it back the same way.
void set_store_type_at(OffloadPolicy& p, const std::string& spec);
std::string store_type_at_spec(const OffloadPolicy& p);
// k as text: "64", or "2% of the context within [64, 1024]".
std::string k_spec(const OffloadPolicy& p);
const char* search_on_name(SearchOn s);
SearchOn parse_search_on(const std::string& s);  // auto | host | gpu
std::vector<std::string> search_on_names();
const char* build_on_name(BuildOn b);
BuildOn parse_build_on(const std::string& s);  // auto | host | gpu | lloyd
std::vector<std::string> build_on_names();
int64_t parse_store_cache(const std::string& s);  // auto (-1) | off (0) | a size ("16G")

// The layers whose KV leaves the model for host memory (the top-k runtime's
// retrieval layers, the host-dense baseline's layers): those that attend to the
// whole context (gemma3's sliding-window layers already keep a bounded ring
// and stay with the model), from layer index `dense_layers` on (earlier ones
// stay dense, as Quest does). Ascending model layer ids; may be empty.
std::vector<int> offloaded_layers(const ModelConfig& cfg, int dense_layers);
// Bytes the host stores (K and V, every KV head) take per stored position
// over the top-k layers (offloaded_layers(cfg, p.dense_layers)), each at its
// store type (store_dtype_of): the memory plan's store line per position.
double store_bytes_per_position(const ModelConfig& cfg, const OffloadPolicy& p);

// Per-layer k for `n_layers` retrieval layers with the same total as
// k_mean x n_layers: uniform; rising linearly from the first to the last layer
// (top-k paper, Sec. 4, Fig. 8); or ends: twice as much at the first and last
// layer as in the middle, linear between (weight 1 + |2l/(L-1) - 1|): on the
// Qwen2.5-Coder models exact top-k holds the least attention in the first and
// last few layers (bench/results/qwen05_topk_mass_per_layer/); on RULER it
// scored below uniform there (ruler_qwen2.5_0.5b_cpu/ends_schedule_8k/). Every
// layer gets at least 1; the total is exact (largest-remainder rounding).
// Weights takes the layers' weights from `weights` (one a layer: an Error
// names both counts otherwise), for a measured allocation such as
// bench/results/ruler_qwen2.5_1.5b_cpu_fwe/'s per-layer ablation.
std::vector<int64_t> k_per_layer(int64_t k_mean, int n_layers, KSchedule schedule,
                                 const std::vector<double>& weights = {});

}  // namespace topkv
