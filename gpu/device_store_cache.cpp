// CUDA builds only: the file is empty without CUDA.
#ifdef TOPKV_HAVE_CUDA
#include "gpu/device_store_cache.h"

#include <algorithm>

#include "gpu/cuda_check.h"

namespace topkv {

bool DeviceStoreCache::ensure(const RowStore& st, size_t c, int64_t want, Copy& cp) {
  if (want <= cp.rows) return true;
  const size_t row = st.row_bytes();
  const int64_t have_cap = cp.dev.bytes / row;
  if (want > have_cap) {
    // Grow: 1.5x, whole grains, at most the chunk. The old copy's rows are
    // copied again from the host (pinned: full PCIe rate), not kept.
    const int64_t cap = std::min(RowStore::kChunkRows,
                                 (std::max(want, have_cap + have_cap / 2) + kGrain - 1) / kGrain * kGrain);
    const int64_t grown_bytes = cap * (int64_t)row, more = grown_bytes - (int64_t)cp.dev.bytes;
    // (The old copy is held while the new one is allocated.)
    if (full_ || (limit_ >= 0 && bytes_ + more > limit_) || be_.memory_left() - grown_bytes < reserve_) {
      // No room: the chunk is read from the host, so a copy too small for it is given back.
      full_ = true;
      bytes_ -= (int64_t)cp.dev.bytes, rows_ -= cp.rows;
      cp = Copy{};
      return false;
    }
    Buffer grown = be_.alloc((size_t)grown_bytes, cuda::MemKind::KvCache, "host-store rows cached on the GPU");
    bytes_ += (int64_t)grown.bytes - (int64_t)cp.dev.bytes;
    rows_ -= cp.rows;
    cp.dev = std::move(grown);
    cp.rows = 0;
  }
  const uint8_t* src = st.chunk(c) + (size_t)cp.rows * row;
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(cp.dev.as<uint8_t>() + (size_t)cp.rows * row, src, (size_t)(want - cp.rows) * row,
                                   cudaMemcpyDefault, be_.stream()));
  rows_ += want - cp.rows;
  cp.rows = want;
  return true;
}

std::vector<const uint8_t*> DeviceStoreCache::chunk_table(const RowStore& st, int64_t upto) {
  upto = std::min(upto, st.size());
  std::vector<const uint8_t*> table(st.n_chunks());
  std::vector<Copy>& copies = copies_[&st];
  copies.resize(st.n_chunks());
  for (size_t c = 0; c < table.size(); ++c) {
    const int64_t first = (int64_t)c * RowStore::kChunkRows;
    const int64_t want = std::clamp<int64_t>(upto - first, 0, RowStore::kChunkRows);
    Copy& cp = copies[c];
    const bool held = want > 0 && ensure(st, c, want, cp);
    table[c] = held ? cp.dev.as<uint8_t>() : st.chunk(c);
  }
  // The copies are queued on the stream before any search that reads them;
  // the host rows they come from are final (rows < upto are never rewritten).
  return table;
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
