// GpuOffloadRuntime's class and helpers, shared by its two source files:
// gpu/gpu_offload_runtime.cpp (set-up, mirrors, the host-search step) and
// gpu/gpu_offload_device_search.cpp (the device-search step). Internal: the
// public surface is gpu/gpu_offload_runtime.h. CUDA builds only.
#pragma once
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <future>
#include <limits>
#include <memory>
#include <vector>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"
#include "gpu/device_search_tables.h"
#include "gpu/gpu_kmeans.h"
#include "gpu/gpu_page_bounds.h"
#include "offload/offload_runtime.h"

namespace topkv::gpu_offload {

// Pinned, device-mapped chunks for the host stores: with unified addressing
// the host pointer is also the device pointer, which the row lists rely on.
RowStore::ChunkAllocator pinned_chunk_allocator();

// A pinned host buffer that grows (contents are not kept).
struct PinnedBuffer {
  std::shared_ptr<uint8_t> mem;
  size_t bytes = 0;
  uint8_t* get(size_t need) {
    if (need > bytes) {
      void* p = nullptr;
      TOPKV_CUDA_CHECK(cudaHostAlloc(&p, need, cudaHostAllocDefault));
      mem.reset(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFreeHost(q); });
      bytes = need;
    }
    return mem.get();
  }
};

// Splits of a head's row list over blocks: enough blocks to keep reads over
// PCIe in flight for the retrieved rows, fewer for the device-resident
// sinks + window, and for the far rows (device search) enough to read the
// value means at full bandwidth.
inline constexpr int kIdsRowsPerSplit = 32, kMaxIdsSplits = 64, kExactRowsPerSplit = 32, kMaxExactSplits = 16;
inline constexpr int kFarGroupsPerSplit = 128, kMaxFarSplits = 512;
inline constexpr int kMaxParts = 1 + kMaxExactSplits + kMaxIdsSplits + kMaxFarSplits;  // sinks, window, ids, far
inline int splits_for(int64_t rows, int per_split, int max_splits) {
  return (int)std::clamp<int64_t>((rows + per_split - 1) / per_split, 1, max_splits);
}

// Whether `policy` asks for the search on the device (gpu, or auto where the
// index and options allow it). Decided before any layer exists: it sets
// where evicted rows wait (the device window ring) and how often they fold.
bool wants_device_search(const OffloadPolicy& p);
// The rerank factor the device search applies (SearchParams::rerank, or the
// index spec's own when that is 0); 1: off.
double device_rerank(const OffloadPolicy& p);

class GpuOffloadRuntime final : public OffloadRuntime {
 public:
  GpuOffloadRuntime(cuda::CudaBackend& be, const ModelConfig& cfg, const OffloadPolicy& policy, bool progress)
      : OffloadRuntime(cfg, policy, progress),
        be_(be),
        device_search_(wants_device_search(policy)),
        rerank_(device_rerank(policy)) {
    TOPKV_CHECK(cfg.head_dim == 64 || cfg.head_dim == 128 || cfg.head_dim == 256, "the CUDA offload runtime supports head_dim 64, 128 and 256, not {}", cfg.head_dim);
    TOPKV_CHECK(cfg.n_head_kv <= cuda::kMaxRingHeads, "the CUDA offload runtime supports at most {} KV heads, "
                "not {}", cuda::kMaxRingHeads, cfg.n_head_kv);
    for (auto& e : ev_) TOPKV_CUDA_CHECK(cudaEventCreate(&e));
    // --store-cache: with the search on the device and rows read in place
    // (stage_rows copies rows on the host, which cannot read a GPU copy).
    if (device_search_ && !policy.stage_rows && policy.store_cache != 0)
      store_cache_ = std::make_unique<DeviceStoreCache>(be, policy.store_cache > 0 ? policy.store_cache : -1);
    if (build_on_gpu(policy, /*cuda=*/true)) set_build_engines(make_gpu_kmeans(be), make_gpu_page_bounds(be));
  }
  ~GpuOffloadRuntime() override {
    for (auto& f : folds_)
      if (f.valid()) f.wait();  // a fold thread reads the layers the base class frees
    cudaStreamSynchronize(be_.stream());
    if (copy_stream_) cudaStreamSynchronize(copy_stream_), cudaStreamDestroy(copy_stream_);
    for (auto& e : ev_) cudaEventDestroy(e);
    for (auto& p : pending_)
      for (auto& e : p.ev) cudaEventDestroy(e);
  }

  bool on_device() const override { return true; }
  // With the device search: the policy's type; where the budget chooses
  // (OffloadPolicy::device_table_by_budget) then i8 (half of f16's bytes),
  // then for page bounds i8 with pages 2 and 4 times longer as the index
  // allows (half the fine rows each: KvIndex::summary_page_factor_max).
  std::vector<DeviceTableChoice> device_table_choices() const override {
    if (!device_search_) return {};
    std::vector<DeviceTableChoice> c{{policy_.device_table_type, 1}};
    if (!policy_.device_table_by_budget) return c;
    if (policy_.device_table_type != DType::I8) c.push_back({DType::I8, 1});
    const int f_max = KvIndex::create(policy_.index)->summary_page_factor_max();
    for (int f = 2; f <= f_max; f *= 2) c.push_back({DType::I8, f});
    return c;
  }
  void decode_attention(int layer, const float*, const float*, const float*, int64_t, float, float*) override {
    fail("internal: the CUDA offload runtime of layer {} takes device pointers (decode_attention_device)", layer);
  }
  void decode_attention_device(int layer, const float* q, const float* k, const float* v, int64_t pos, float scale,
                               float* out) override;

 protected:
  // The mirrors (sinks + ring), ~64 MiB of row lists, partials and staging,
  // and with the device search its tables at the table type. The store cache
  // is not planned: it takes what the budget leaves once the step is recorded.
  std::vector<MemoryPlan::Line> device_plan_at(int64_t n, const DeviceTableChoice& tables) const override {
    const double heads = (double)retrieval_layers_.size() * cfg_.n_head_kv;
    std::vector<MemoryPlan::Line> lines = OffloadRuntime::device_plan_at(n, tables);  // the k-means work space
    lines.push_back({fmt::format("GPU mirrors of sinks + window ({} + {} rows, fp32)", policy_.sinks, ring_capacity()),
                     0, heads * (policy_.sinks + ring_capacity()) * 2.0 * cfg_.head_dim * sizeof(float)});
    lines.push_back({"GPU row lists, partials, staging", 0, double(64 << 20)});
    if (device_search_) {
      const auto index = KvIndex::create(policy_.index);
      const double per_key = index->summary_bytes_per_key(cfg_.head_dim, dtype_size(tables.type), tables.page_factor);
      lines.push_back({fmt::format("device search tables ({}, {})", policy_.index, tables.name()), 0,
                       heads * (double)n * per_key});
      lines.push_back({"device search work space (scores per group and query head)", 0,
                       (double)search_workspace_bytes(*index, n)});
    }
    return lines;
  }
  OffloadedLayer::Config layer_config(int i) const override {
    OffloadedLayer::Config c = OffloadRuntime::layer_config(i);
    if (!policy_.stage_rows) c.store_alloc = pinned_chunk_allocator();
    // Device search: the runtime folds (manage_folds), on a host thread
    // unless sync_folds; the layer then never folds by itself.
    if (device_search_) c.fold_every = policy_.sync_folds ? policy_.device_fold : std::numeric_limits<int>::max();
    return c;
  }
  void on_layer_ready(int i) override;

 private:
  // Sinks and the recent tokens on the device, fp32 [n_kv][capacity][head_dim]:
  // sink i at slot i, position p at ring slot p % ring capacity. The ring
  // holds the window, and with the device search also the evicted rows its
  // tables do not cover yet (ring_capacity).
  struct Mirror {
    KvLayerCache sinks, ring;
  };
  // Device search: the newest token's k, v on their way to the host (which
  // fills them into its layer at the next step), the step's row counts, and
  // the events that time the step's kernels. The copies run on copy_stream_
  // after the step's attention, so the next layer's kernels do not wait for
  // them: k, v from the mirror (which keeps the token's slot for
  // ring_capacity() steps), the counts from the layer's own device counts
  // (the row lists are shared by every layer).
  struct Pending {
    bool waiting = false;
    OffloadedLayer::Placement at;
    PinnedBuffer kv, counts;
    Buffer dev_counts;       // [n_kv] rows the search listed (the gather writes them)
    cudaEvent_t ev[4] = {};  // search start, search end, attention end, everything copied (copy_stream_)
  };
  // The window, and with the device search the rows its tables do not cover
  // yet: fewer than device_fold, or twice that while a fold runs on a host thread.
  int ring_capacity() const {
    return policy_.window + (device_search_ ? (policy_.sync_folds ? 1 : 2) * policy_.device_fold : 0);
  }
  // Partial slots of sinks + ring: 1 + the ring's splits for its longest head.
  static int exact_parts(const OffloadedLayer& L, const std::vector<int64_t>& tail) {
    int64_t most = 0;
    for (int64_t t : tail) most = std::max(most, t + L.window_len());
    return 1 + splits_for(most, kExactRowsPerSplit, kMaxExactSplits);
  }
  void write_mirror(Mirror& mir, const OffloadedLayer::Placement& at, const float* k, const float* v);
  // The mirror's cache and slot of the token placed at `at`.
  static std::pair<const KvLayerCache*, int64_t> mirror_slot(const Mirror& mir, const OffloadedLayer::Placement& at) {
    const KvLayerCache& c = at.sink >= 0 ? mir.sinks : mir.ring;
    return {&c, at.sink >= 0 ? at.sink : at.pos % c.capacity};
  }
  // Partials of sinks and ring, in one launch (the sinks a prefix of each
  // head's ring rows), into slots 0 .. exact_parts - 1 for every query head;
  // tail[h]: evicted rows before the window to attend too.
  void attend_exact(const Mirror& mir, const OffloadedLayer& L, const std::vector<int64_t>& tail,
                   cuda::RowListArgs a);
  // The end of either step: partials over sinks + ring (tail_ rows before the
  // window), over the rows in the pointer lists (lists_: [2][n_kv][stride])
  // into slots n_exact .. + ids_splits of `parts`, then
  // the exact merge of all `parts` (the search's far slots included) into out.
  // counts: the lists' row counts [n_kv] (device).
  void attend_parts(const Mirror& mir, const OffloadedLayer& L, const float* q, float scale, int parts, int n_exact,
                    int ids_splits, int stride, const int32_t* counts, float* out);
  // stage_rows: copies the rows that the pointer lists hl ([2][n_kv][stride]
  // host addresses of store rows; hcount[h] per head) name into the pinned
  // staging buffer, points the lists at the staged rows' device copy
  // (staged_) and queues that copy; the caller uploads the lists. The last
  // copies out of host_rows_ must have ended (the step's wait).
  void stage_listed_rows(const OffloadedLayer& L, const void** hl, const int32_t* hcount, int stride);
  // Device search with stage_rows: the searched lists to the host, staged.
  void stage_searched_rows(const OffloadedLayer& L, int cap, const int32_t* dcounts);
  void decode_host_search(int slot, const float* q, const float* k, const float* v, float scale, float* out);
  void decode_device_search(int slot, const float* q, const float* k, const float* v, float scale, float* out);
  void finish_pending(int slot);
  // The store cache takes its rows once the model's decode step is recorded
  // (stats_.steps >= kStoreCacheAfterSteps: the recording's work space is
  // allocated by then), so that it takes what is left, not what they need.
  static constexpr int kStoreCacheAfterSteps = 2;
  void start_store_cache();
  void count_store_cache();  // stats_.device_store_*: after the cache took rows
  DeviceStoreCache* store_cache() const { return store_cache_started_ ? store_cache_.get() : nullptr; }
  // Device search, before the step's kernels: uploads tables a fold has
  // staged, starts a fold on a host thread when a head has device_fold rows
  // the tables do not cover (sync_folds: the layer folded them itself; the
  // tables are uploaded again now).
  void manage_folds(int slot);
  // What the device search's work space takes at n tokens (device_plan): a
  // score per group and query head, and with rerank the candidates' lists.
  size_t search_workspace_bytes(const KvIndex& index, int64_t n) const;
  // tail_[h] = layer `slot`'s evicted rows its uploaded tables do not cover
  // (the ring attends them exactly); returns the most over the heads.
  int64_t count_tail(int slot);
  // set_measure_error: the step's q and output come to the host (a wait);
  // with the device search the host layer takes its new token now instead
  // of at the next step, so the exact attention sees what the device did.
  void measure_step(int slot, const float* q, float scale, const float* out);
  void collect_timing();
  void ensure_capacity(int max_ids);

  cuda::CudaBackend& be_;
  const bool device_search_;
  const double rerank_;  // the device search's rerank factor (SearchParams::rerank, or the spec's own); 1: off
  std::vector<Mirror> mirrors_;               // per retrieval layer
  std::vector<DeviceSearchTables> tables_;    // per retrieval layer (device search)
  std::vector<Pending> pending_;              // per retrieval layer (device search)
  std::vector<std::future<DeviceSearchTables::Staged>> folds_;  // per retrieval layer: a fold running
  std::unique_ptr<DeviceStoreCache> store_cache_;  // --store-cache (device search)
  bool store_cache_started_ = false;
  // Device work space, sized by ensure_capacity: the retrieved rows' pointer
  // lists [2][n_kv][ids_cap_] (k, then v) and counts [n_kv]; partials
  // [n_head][kMaxParts] (m, l, then o x head_dim); staged rows; the device
  // search's work space.
  Buffer lists_, parts_, staged_, search_ws_;
  int ids_cap_ = 0;
  PinnedBuffer host_lists_, host_qkv_, host_far_, host_rows_;
  std::vector<OffloadedLayer::Retrieved> found_;
  std::vector<int64_t> tail_;  // per KV head: evicted rows before the window the step attends exactly
  cudaEvent_t ev_[5] = {};
  bool timing_pending_ = false;
  cudaStream_t copy_stream_ = nullptr;  // device search: the step's copies to the host (Pending)
};

}  // namespace topkv::gpu_offload
