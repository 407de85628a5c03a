#include "index/row_store.h"

#include <algorithm>
#include <cstring>

#include "src/common/binary_io.h"
#include "src/common/error.h"

namespace topkv {

RowStore::RowStore(int dim, DType dtype, ChunkAllocator alloc)
    : dim_(dim), dtype_(dtype), row_bytes_(dtype_bytes(dtype, (size_t)std::max(dim, 0))), alloc_(std::move(alloc)) {
  TOPKV_CHECK(dim > 0 && dim <= 65536, "row dimension {} is out of range (1..65536)", dim);
  TOPKV_CHECK(!dtype_blocked(dtype) || dim % (int)kQ8Block == 0,
              "rows of {} elements cannot be stored as {} (blocks of {}): use f8, f16 or bf16", dim,
              dtype_name(dtype), kQ8Block);
  chunks_.reserve(kMaxChunks);
}

size_t RowStore::bytes() const { return chunks_.size() * (size_t)kChunkRows * row_bytes_; }

void RowStore::append_raw(const void* rows, int64_t n) {
  const auto* src = static_cast<const uint8_t*>(rows);
  int64_t at = size_.load(std::memory_order_relaxed);
  TOPKV_CHECK(at + n <= kMaxChunks * kChunkRows, "row store full: {} + {} rows exceeds {} rows per head", at, n,
              kMaxChunks * kChunkRows);
  int64_t done = 0;
  while (done < n) {
    int64_t i = at + done;
    size_t c = (size_t)(i >> kChunkShift);
    if (c == chunks_.size()) {
      const size_t bytes = (size_t)kChunkRows * row_bytes_;
      chunks_.push_back(alloc_ ? alloc_(bytes) : std::shared_ptr<uint8_t>(new uint8_t[bytes], std::default_delete<uint8_t[]>()));
      TOPKV_CHECK(chunks_.back() != nullptr, "could not allocate a {}-byte row-store chunk", bytes);
    }
    int64_t take = std::min(n - done, kChunkRows - (i & kChunkMask));
    std::memcpy(chunks_[c].get() + (size_t)(i & kChunkMask) * row_bytes_, src + (size_t)done * row_bytes_,
                (size_t)take * row_bytes_);
    done += take;
  }
  size_.store(at + n, std::memory_order_release);
}

void RowStore::append_mapped(const void* rows, int64_t n, const std::shared_ptr<const void>& owner,
                             const TailMapper& map_tail) {
  const auto* src = static_cast<const uint8_t*>(rows);
  int64_t at = size_.load(std::memory_order_relaxed);
  TOPKV_CHECK(at + n <= kMaxChunks * kChunkRows, "row store full: {} + {} rows exceeds {} rows per head", at, n,
              kMaxChunks * kChunkRows);
  int64_t done = 0;
  while (!alloc_ && (at & kChunkMask) == 0 && n - done >= kChunkRows) {
    // Aliasing shared_ptr: shares ownership of the mapping, points at the chunk.
    chunks_.push_back(std::shared_ptr<uint8_t>(owner, const_cast<uint8_t*>(src + (size_t)done * row_bytes_)));
    mapped_rows_ += kChunkRows;
    done += kChunkRows;
    at += kChunkRows;
    size_.store(at, std::memory_order_release);
  }
  if (!alloc_ && map_tail && (at & kChunkMask) == 0 && done < n) {
    std::shared_ptr<uint8_t> tail = map_tail(done, (size_t)kChunkRows * row_bytes_);
    TOPKV_CHECK(tail != nullptr, "internal: no mapping for a row store's last chunk");
    chunks_.push_back(std::move(tail));
    mapped_rows_ += n - done;
    size_.store(at + (n - done), std::memory_order_release);
    return;
  }
  append_raw(src + (size_t)done * row_bytes_, n - done);
}

void RowStore::append_f32(const float* rows, int64_t n) {
  if (dtype_ == DType::F32) return append_raw(rows, n);
  const int64_t batch = 4096;
  std::vector<uint8_t> tmp((size_t)std::min(n, batch) * row_bytes_);
  for (int64_t i = 0; i < n; i += batch) {
    int64_t m = std::min(batch, n - i);
    from_f32(dtype_, rows + (size_t)i * dim_, tmp.data(), (size_t)m * dim_);
    append_raw(tmp.data(), m);
  }
}

void RowStore::for_each_span(int64_t begin, int64_t end,
                             const std::function<void(int64_t, int64_t, const void*)>& f) const {
  while (begin < end) {
    int64_t take = std::min(end - begin, kChunkRows - (begin & kChunkMask));
    f(begin, take, row(begin));
    begin += take;
  }
}

uint64_t RowStore::fingerprint(int64_t n_rows) const {
  uint64_t h = fnv1a64(&dim_, sizeof dim_);
  h = fnv1a64(&dtype_, sizeof dtype_, h);
  h = fnv1a64(&n_rows, sizeof n_rows, h);
  if (n_rows <= 0) return h;
  // 64 rows spread over the range, first and last included.
  int64_t samples = std::min<int64_t>(64, n_rows);
  for (int64_t s = 0; s < samples; ++s) {
    int64_t i = samples == 1 ? 0 : s * (n_rows - 1) / (samples - 1);
    h = fnv1a64(row(i), row_bytes_, h);
  }
  return h;
}

}  // namespace topkv
