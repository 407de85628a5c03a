// DeviceStoreCache: GPU copies of host-store rows (RowStore chunks), so that
// the device search reads the rows it retrieves from GPU memory instead of
// over PCIe wherever the GPU memory budget leaves room (--store-cache).
//
// Why: with the search on the device, a step's time past the model is the
// retrieved rows' reads. On the H100 with Llama-3-8B's geometry at 32K
// (quest, k = 256, GQA union of 4 query heads: ~1,000 rows per KV head),
// the row-list kernel over pinned host memory took 91 us of a layer's
// ~180 us of offloaded attention, ~45 GB/s, which is PCIe's rate
// (bench/results/gpu_h100_session8/). A copy in HBM serves the same rows in
// a few microseconds. The host store stays the KV's home (it is what the
// indexes, folds and packs use); the cache only changes where the device
// reads a row, never which rows or their values (same bytes: the results are
// bit for bit those of the uncached path).
//
// Layout: one device buffer per cached chunk of a store, holding the chunk's
// first rows (a multiple of kGrain, grown geometrically up to the whole
// chunk), so a row r of a cached chunk c is at copy(c) + (r - c * kChunkRows)
// * row_bytes: the device search's chunk table simply points at the copy
// (DeviceSearchTables). Chunks are taken first come, first served (layer
// order) while the limit and the backend's memory_left() less a reserve
// allow; a chunk never leaves once cached.
//
// CUDA builds only.
#pragma once
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "gpu/cuda_backend_impl.h"
#include "index/row_store.h"

namespace topkv {

class DeviceStoreCache {
 public:
  static constexpr int64_t kGrain = 8192;                 // rows a copy grows by, at least
  static constexpr int64_t kAutoReserve = int64_t(1) << 30;  // memory left for everything else (auto)

  // limit: bytes the copies may take in all (< 0: no limit of its own); in
  // every case the backend keeps `reserve` bytes left for the runtime's other
  // growth (tables, row lists, work space).
  DeviceStoreCache(cuda::CudaBackend& be, int64_t limit, int64_t reserve = kAutoReserve)
      : be_(be), limit_(limit), reserve_(reserve) {}

  // The chunk table the device search reads store `st`'s rows through: chunk
  // c's device copy where it holds rows [c * kChunkRows, upto) (copied now as
  // needed), else its host address. `upto`: the rows the search may name
  // (the tables' covered rows; later rows are never read through the table).
  // No search may be in flight: a copy that grows is replaced (the caller,
  // DeviceSearchTables, synchronizes first). The copies are queued on the
  // backend's stream, before any search that reads them.
  std::vector<const uint8_t*> chunk_table(const RowStore& st, int64_t upto);

  int64_t bytes() const { return bytes_; }          // device memory the copies hold
  int64_t rows_cached() const { return rows_; }     // store rows readable from a copy

 private:
  struct Copy {
    Buffer dev;         // capacity rows of the chunk
    int64_t rows = 0;   // rows copied (the chunk's first rows)
  };
  // Copies rows [cp.rows, want) of chunk c of st into cp, growing it; false
  // when there is no room (cp is then given back: the chunk is read from the host).
  bool ensure(const RowStore& st, size_t c, int64_t want, Copy& cp);

  cuda::CudaBackend& be_;
  int64_t limit_, reserve_;
  int64_t bytes_ = 0, rows_ = 0;
  bool full_ = false;
  std::unordered_map<const RowStore*, std::vector<Copy>> copies_;
};

}  // namespace topkv
