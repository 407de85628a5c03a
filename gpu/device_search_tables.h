// DeviceSearchTables: one retrieval layer's indexes as the device search
// reads them (cuda::SummaryHead per KV head, gpu/cuda_kernels.h): each
// index's SummaryTables (index/kv_index.h) converted to the table type and
// uploaded, with the chunk tables of its key and value stores (pinned,
// device-mapped host memory: members are read there in place; or a chunk's
// GPU copy where a DeviceStoreCache holds one).
//
// An index that folds rows in (OffloadedLayer's appends) changes its tables;
// stale() says so and upload() replaces them. Rows past covered(h) are not in
// the tables: the runtime attends them exactly from the device.
//
// CUDA builds only.
#pragma once
#include <cstdint>
#include <vector>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_kernels.h"
#include "gpu/device_store_cache.h"
#include "offload/offloaded_layer.h"

namespace topkv {

class DeviceSearchTables {
 public:
  // The index backends with a device search: those that export SummaryTables.
  static bool backend_supported(const std::string& index_spec);

  // Every head's tables exported and converted to the table type on the
  // host: what upload() copies. Safe on any thread while the decode thread
  // runs (the indexes are read under their locks): a fold on a host thread
  // stages the new tables this way.
  struct Staged {
    struct Head {
      bool present = false;
      int32_t n = 0, page = 0, max_count = 0;
      int32_t coarse_n = 0, coarse_ratio = 0;  // two levels (SummaryTables::coarse_level)
      int64_t covered = 0;
      TableCodes rows, value_means, key_var, coarse_rows;  // table type (i8: with their scales)
      std::vector<int32_t> counts, offsets, members, coarse_counts;
    };
    std::vector<Head> heads;
    DType table_type = DType::F16;
    bool page_bounds = false;
    double spread = 0.0, spread_clip = 1.0;  // SummaryTables' far spread term (key_var set)
    double expand = 0.0;                     // two levels: SummaryTables::expand; 0: one level
    bool far_dropped = false;                // SummaryTables::far_dropped
  };
  // Page bounds with tables.page_factor > 1 go up coarsened (SummaryTables::
  // coarsened): the search then takes pages that many times longer.
  static Staged stage(const OffloadedLayer& L, const DeviceTableChoice& tables);
  // (Re)uploads every head's tables; waits for queued work first (the old
  // tables may still be read). Device memory comes from `be` (the budget).
  // With a cache, the stores' rows the tables cover are read from their GPU
  // copies where it holds (or now takes) them.
  void upload(cuda::CudaBackend& be, const OffloadedLayer& L, const DeviceTableChoice& tables,
              DeviceStoreCache* cache = nullptr) {
    upload(be, L, stage(L, tables), cache);
  }
  void upload(cuda::CudaBackend& be, const OffloadedLayer& L, const Staged& s, DeviceStoreCache* cache = nullptr);
  // Only the chunk tables again, through `cache` (which may take chunks now);
  // waits for queued work first.
  void refresh_chunks(cuda::CudaBackend& be, const OffloadedLayer& L, DeviceStoreCache& cache);
  bool stale(const OffloadedLayer& L) const;  // some index covers other rows than uploaded

  const cuda::SummaryHead* heads() const { return heads_.as<cuda::SummaryHead>(); }
  int max_n() const { return max_n_; }
  int64_t covered(int h) const { return covered_[(size_t)h]; }
  bool page_bounds() const { return page_bounds_; }
  bool far_field() const { return far_field_; }
  // The far rows' spread term (SummarySearchArgs::spread, spread_clip): 0 without one.
  float spread() const { return (float)spread_; }
  float spread_clip() const { return (float)spread_clip_; }
  // With a rerank, the rows it drops from selected groups are far rows too
  // (SummarySearchArgs::far_dropped; SummaryTables::far_dropped).
  bool far_dropped() const { return far_dropped_; }
  // Two levels: tokens each query head's coarse cut covers at budget k
  // (SummarySearchArgs::coarse_k); 0 with one level.
  int64_t coarse_budget(int64_t k) const { return expanded_budget(expand_, k); }
  // Row-list capacity per KV head for budget k and `group` query heads: the
  // union of the heads' takes, each at most k plus its last group.
  int row_cap(int64_t k, int group) const;
  size_t device_bytes() const { return bytes_; }

 private:
  // Writes the chunk tables of every present head (host addresses, or the
  // cache's copies) and the heads array the kernels read.
  void put_chunk_tables(cuda::CudaBackend& be, const OffloadedLayer& L, DeviceStoreCache* cache);

  std::vector<Buffer> owned_, chunk_tables_;
  std::vector<cuda::SummaryHead> host_heads_;  // what heads_ holds
  std::vector<char> present_;                  // per head: an index, so tables
  size_t chunk_table_bytes_ = 0;
  Buffer heads_;
  std::vector<int64_t> covered_;
  int max_n_ = 0;
  int32_t max_count_ = 0;
  int64_t max_covered_ = 0;
  bool page_bounds_ = false, far_field_ = false, far_dropped_ = false;
  double spread_ = 0.0, spread_clip_ = 1.0, expand_ = 0.0;
  size_t bytes_ = 0;
};

}  // namespace topkv
