// OffloadRuntime: the offloaded top-k decode over a whole model (DESIGN.md,
// "One decode step"). It owns one OffloadedLayer per retrieval layer and
// serves their decode attention through the model's AttentionOverride seam.
//
// Which layers retrieve:
//   - layers that attend to the whole context (gemma3's sliding-window local
//     layers are already streaming layers and stay with the model),
//   - from layer index `dense_layers` on (earlier ones stay dense, as Quest does),
//   - per KV head, unless a DuoAttention pattern makes it a streaming head.
// k per retrieval layer follows the policy's schedule around its mean
// (OffloadPolicy::mean_k: with k_fraction > 0, that fraction of the prompt
// tokens within [k_min, k_max]).
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "offload/memory_plan.h"
#include "offload/offloaded_layer.h"
#include "offload/policy.h"
#include "src/model/attention_override.h"
#include "src/common/timer.h"
#include "src/model/model_config.h"

namespace topkv {

struct OffloadStats {
  int64_t steps = 0;           // decode tokens served
  int64_t retrieved = 0;       // store rows attended, summed over layers and heads
  int64_t far_clusters = 0;
  int64_t exact = 0;           // sink + window tokens attended
  double search_s = 0;         // index search time (sum over layers of the slowest head)
  double attend_s = 0;         // whole offloaded attention time
  double build_s = 0;          // index build time after prefill
  // Of build_s, the layers' on_layer_ready (the GPU runtime: the sinks and
  // window mirrors and the device search tables going up); the rest is the
  // indexes finishing (OffloadedLayer::end_prefill).
  double ready_s = 0;
  // take_context: the time its layers spent reading the context (the model's
  // KV, or a synthetic generator's), summed over layers; build_s less what of
  // it ran at once with other layers is the stores' and indexes' share.
  double read_s = 0;
  int64_t keys_indexed = 0;
  // The GPU runtime's split of attend_s (0 on the CPU runtime): kernels on
  // the device, host<->device copies, and time the host waited for the device.
  double gpu_s = 0, transfer_s = 0, wait_s = 0;
  // The GPU runtime's store cache (--store-cache): device memory it holds, the
  // host-store rows (keys and values) it serves, and their share of the rows
  // the device search may read (those its tables cover).
  int64_t device_store_bytes = 0, device_store_rows = 0;
  double device_store_share = 0;
};

// Whether a runtime on the CUDA backend (cuda) or the host builds `policy`'s
// index with the GPU's engines (--build-on; auto asks the index whether its
// build takes one: KvIndex::uses_kmeans, the clustering backends;
// KvIndex::uses_page_bounds, quest). Here, not in policy.cpp: it creates an
// index, and the policy's parser stays free of the index factory.
bool build_on_gpu(const OffloadPolicy& policy, bool cuda);

class OffloadRuntime : public AttentionOverride, public KvPastSource {
 public:
  OffloadRuntime(const ModelConfig& cfg, const OffloadPolicy& policy, bool progress = true);

  bool overrides(int layer) const override;
  void take_prefill(const Model& model) override;
  // The same from any source of a context's keys and values (KvReader,
  // src/model/attention_override.h), each layer read in pieces of
  // kContextPiece positions. take_prefill is take_context(model.n_past(),
  // Model::read_kv).
  using KvReader = topkv::KvReader;
  virtual void take_context(int64_t n, const KvReader& read);
  // take_context while a chunked prefill runs (the index build overlapped
  // with the prefill): begin_context(n) before it, absorb(upto, read) after
  // each chunk — read(layer, from, upto - from, k, v) gives the layer's new
  // positions, e.g. Model::read_kv(layer, k, v, from, upto - from) — and
  // end_context() after the last. Each index clusters its blocks on the
  // host's threads as they complete (KvIndex::begin_build), while the device
  // prefills; end_context finishes. The result equals take_context's.
  void begin_context(int64_t n);
  void absorb(int64_t upto, const KvReader& read);
  void end_context();
  // While begin_context ... end_context runs, the positions absorbed so far are
  // the past of the model's prefill rings (KvPastSource, src/model/kv_past.h;
  // Model::set_kv_past): sinks, store chunks and window as the layers hold
  // them (OffloadedLayer::past_runs). Only when every retrieval head keeps its
  // rows (serves_prefill_past: no DuoAttention streaming head).
  bool serves_prefill_past() const;
  int64_t past_end(int layer) const override;
  void past_runs(int layer, int kv_head, bool values, int64_t begin, int64_t end,
                 const std::function<void(const KvPastRun&)>& f) const override;
  // Context packs (offload/context_pack.h). build_extra_indexes(), before
  // take_context, makes each head also build these index specs (saved in
  // the pack beside the policy's, never searched here). save() writes every
  // retrieval layer (OffloadedLayer::save, prefix "offload.L<layer>.") and,
  // under the pack's manifest key "offload", {"tokens", "retrieval_layers",
  // "streaming": [per retrieval layer, per KV head 0/1], "indexes": [the
  // canonical specs of index.0, index.1, ...]}. take_pack() is take_context
  // from such a pack: the layers, their streaming heads (the pack's, whatever
  // the policy's head pattern) and the policy's index (which must be among
  // the pack's) come from the pack, nothing is rebuilt. The runtime must
  // have the pack's layers (same model, same --dense-layers).
  void build_extra_indexes(const std::vector<std::string>& specs);
  void save(PackWriter& w) const;
  virtual void take_pack(const PackReader& r);
  void decode_attention(int layer, const float* q, const float* k, const float* v, int64_t pos, float scale,
                        float* out) override;

  const OffloadPolicy& policy() const { return policy_; }
  const std::vector<int>& retrieval_layers() const { return retrieval_layers_; }
  const std::vector<int64_t>& k_per_layer() const { return k_; }
  const OffloadStats& stats() const { return stats_; }
  // A count of stats() (retrieved, exact) per retrieval layer, KV head and
  // decode step, on average; 0 before the first step.
  double per_head_step(int64_t count) const {
    const double slots = (double)stats_.steps * (double)retrieval_layers_.size() * cfg_.n_head_kv;
    return slots > 0 ? (double)count / slots : 0.0;
  }
  // Fidelity measurement: each decode step also computes exact attention over
  // everything the layer holds and accumulates the relative L2 error of the
  // served output (slow: a full scan per layer and step; for evaluation).
  void set_measure_error(bool on) { measure_error_ = on; }
  // The engines of the indexes this runtime builds: the clustering indexes'
  // blockwise k-means (BuildOptions::kmeans; null: Faiss's on the host
  // cores) and quest's page bounds (BuildOptions::bounds; null: the host
  // cores). --build-on lloyd sets the k-means twin here; the CUDA runtime
  // sets its device engines (gpu/gpu_kmeans.h, gpu/gpu_page_bounds.h); a
  // host runtime building a pack for a CUDA runtime takes them too
  // (make_build_runtime), so the pack holds the indexes the CUDA runtime
  // would have built. Set before the context.
  void set_build_engines(std::shared_ptr<const KMeansEngine> kmeans, std::shared_ptr<const PageBoundsEngine> bounds) {
    kmeans_ = std::move(kmeans);
    bounds_ = std::move(bounds);
  }
  // Per retrieval layer: sqrt(sum |out - exact|^2 / sum |exact|^2) over the steps so far.
  std::vector<double> attention_rel_error() const;
  // Per retrieval layer, over the same steps: the oracle top-k mass at the
  // layer's k (OffloadedLayer::attend_exact_and_mass), mean over steps and heads.
  std::vector<double> oracle_topk_mass() const;
  const OffloadedLayer* layer(int il) const;
  size_t host_bytes() const;
  size_t in_place_bytes() const;  // of host_bytes(): used in place from a context pack
  // Device memory this runtime will allocate for a context of n tokens, line
  // by line (the memory plan's GPU column; none for the CPU runtime), and its
  // sum: what a prefill must leave free (ModelOptions::device_reserves), with
  // the device tables as the policy has them or as `tables`.
  std::vector<MemoryPlan::Line> device_plan(int64_t n) const { return device_plan_at(n, device_tables()); }
  int64_t device_bytes_estimate(int64_t n) const { return device_bytes_estimate(n, device_tables()); }
  int64_t device_bytes_estimate(int64_t n, const DeviceTableChoice& tables) const;
  // The estimate at each of device_table_choices() (the one estimate when
  // there are none): what ModelOptions::device_reserves takes.
  std::vector<int64_t> device_reserves(int64_t n) const;
  // What its device summary tables may be, most preferred first: none
  // without device tables, the policy's type alone when the user named it;
  // by the budget (OffloadPolicy::device_table_by_budget) f16, then i8, then
  // for page bounds i8 with pages 2 and 4 times longer, as far as the index
  // allows (KvIndex::summary_page_factor_max).
  virtual std::vector<DeviceTableChoice> device_table_choices() const { return {}; }
  // Takes the choice the model's memory check made among those (Model::
  // device_reserve_choice); before the first context, whose tables it sizes.
  void set_device_tables(const DeviceTableChoice& c);
  // The tables as they go up: the policy's type at its own pages until a
  // choice is taken. The policy itself stays as given, so the choices do not
  // change with the one taken.
  const DeviceTableChoice& device_tables() const { return device_tables_; }
  std::string describe() const;  // one paragraph: layers, heads, k, index

 protected:
  // The configuration of retrieval layer i (a subclass may change where its
  // store lives) and a hook run for each layer, in order, once every layer
  // holds the context (the GPU runtime uploads sinks + window there).
  virtual OffloadedLayer::Config layer_config(int i) const;
  // device_plan with the tables at `tables`. Here: the k-means engine's work
  // space when it runs on the device (a host runtime building a pack on a GPU
  // host, make_build_runtime, has one).
  virtual std::vector<MemoryPlan::Line> device_plan_at(int64_t n, const DeviceTableChoice& tables) const;
  virtual void on_layer_ready(int i) { (void)i; }
  void start_context(int64_t n);  // k per layer for a context of n tokens; layers_ sized
  std::vector<int64_t> k_for_context(int64_t n) const;  // what start_context(n) sets k_per_layer() to
  // Builds every layer (layer_config, then fill(i, worker, layer)), layers
  // in parallel (at most in_flight at once) where the model has many KV
  // heads, then runs on_layer_ready for each in order; sets stats_.build_s
  // and keys_indexed. worker < in_flight: no two layers in flight share it
  // (what a fill may keep from layer to layer, e.g. staging buffers).
  void fill_layers(int in_flight, const std::function<void(int, int, OffloadedLayer&)>& fill);
  // measure_error: adds retrieval layer i's step (host q and served out,
  // [n_head][head_dim]) against exact attention over everything it holds.
  void record_error(int i, const float* q, float scale, const float* out);
  // Every layer holds its context: on_layer_ready for each, in order; build_s
  // (the time since `since`) and keys_indexed set.
  void layers_ready(const Timer& since);
  // How many layers take_context stages at once for a context of n tokens.
  int layers_in_flight(int64_t n) const;

  ModelConfig cfg_;
  OffloadPolicy policy_;
  DeviceTableChoice device_tables_{policy_.device_table_type, 1};  // set_device_tables
  bool progress_;
  std::vector<int> retrieval_layers_;        // model layer ids
  std::vector<int> slot_;                    // model layer -> index into layers_ (-1: not retrieval)
  std::vector<std::vector<char>> streaming_; // per retrieval layer, per KV head
  std::vector<int64_t> k_;                   // per retrieval layer
  std::vector<std::string> extra_indexes_;   // build_extra_indexes
  std::vector<std::unique_ptr<OffloadedLayer>> layers_;
  OffloadStats stats_;
  int64_t absorbed_ = -1;  // positions a begin_context ... end_context has taken (-1: none running)
  bool measure_error_ = false;
  std::shared_ptr<const KMeansEngine> kmeans_;      // set_build_engines
  std::shared_ptr<const PageBoundsEngine> bounds_;  // set_build_engines
  std::vector<double> err_sq_, ref_sq_;  // per retrieval layer
  std::vector<double> mass_sum_;         // per retrieval layer: oracle top-k mass summed over the steps
  std::vector<int64_t> mass_steps_;
};

}  // namespace topkv
