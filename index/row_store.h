// RowStore: the shared, append-only host store of one (layer, KV head)'s keys
// (or values). Rows are `dim` elements of f32/f16/bf16/f8 (or dim / 32 Q8_0
// blocks, src/common/dtype.h), kept in fixed-size
// chunks so that a row's address never changes when rows are appended: an
// index may keep pointers into it, and searches may read rows [0, size())
// while a single writer appends (size() is published with release order).
//
// Layout: row i lives in chunk i >> kChunkShift at offset (i & kChunkMask) *
// row_bytes(). Within a chunk rows are contiguous, so scans run chunk by chunk
// (for_each_span).
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "src/common/dtype.h"
#include "src/common/vec_math.h"

namespace topkv {

class RowStore {
 public:
  static constexpr int kChunkShift = 16;  // 65536 rows per chunk
  static constexpr int64_t kChunkRows = int64_t(1) << kChunkShift;
  static constexpr int64_t kChunkMask = kChunkRows - 1;
  static constexpr int64_t kMaxChunks = 8192;  // 536M rows per head

  // Where chunks come from. The default is plain heap memory; the CUDA
  // runtime passes a pinned, device-mapped allocator (pooled:
  // pinned_chunk_allocator in gpu/gpu_offload_runtime.cpp) so that a kernel
  // can read retrieved rows straight from host memory. A chunk's bytes past
  // the rows written are never read: they may hold anything.
  using ChunkAllocator = std::function<std::shared_ptr<uint8_t>(size_t bytes)>;

  RowStore(int dim, DType dtype, ChunkAllocator alloc = {});
  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  int dim() const { return dim_; }
  DType dtype() const { return dtype_; }
  size_t row_bytes() const { return row_bytes_; }
  int64_t size() const { return size_.load(std::memory_order_acquire); }
  size_t bytes() const;  // memory held (whole chunks, mapped ones included)
  size_t mapped_bytes() const { return (size_t)mapped_rows_ * row_bytes_; }  // rows used in place

  // Appends n rows given in fp32 (converted to the store's type) / already in
  // the store's type. Single writer; concurrent readers see old or new size.
  void append_f32(const float* rows, int64_t n);
  void append_raw(const void* rows, int64_t n);
  // Appends n rows of the store's type that lie contiguously at `rows`, in
  // memory that `owner` keeps alive (a memory-mapped context pack). Without a
  // chunk allocator, every whole chunk that starts on a chunk boundary of the
  // store is used in place, not copied (the mapping is read-only: such a
  // chunk is full, so no later append writes to it). The rest — a last
  // partial chunk — is in place too when `map_tail` is given and the rows
  // start on a chunk boundary: map_tail(first, bytes) returns a writable
  // chunk of `bytes` whose start holds rows [first, n) (a copy-on-write
  // mapping, SafetensorsReader::map_copy_on_write), appends land after them.
  // Otherwise it is copied, as everything is when an allocator is set
  // (pinned memory must be ours).
  using TailMapper = std::function<std::shared_ptr<uint8_t>(int64_t first_row, size_t chunk_bytes)>;
  void append_mapped(const void* rows, int64_t n, const std::shared_ptr<const void>& owner,
                     const TailMapper& map_tail = {});

  const void* row(int64_t i) const {
    return chunks_[(size_t)(i >> kChunkShift)].get() + (size_t)(i & kChunkMask) * row_bytes_;
  }
  // Chunk c's memory (kChunkRows rows), c < n_chunks().
  size_t n_chunks() const { return chunks_.size(); }
  const uint8_t* chunk(size_t c) const { return chunks_[c].get(); }
  void row_f32(int64_t i, float* out) const { to_f32(dtype_, row(i), out, (size_t)dim_); }
  float dot(int64_t i, const float* q) const { return dot_row(dtype_, row(i), q, (size_t)dim_); }

  // Calls f(first_row, n, pointer) for each contiguous run of rows in [begin, end).
  void for_each_span(int64_t begin, int64_t end,
                     const std::function<void(int64_t, int64_t, const void*)>& f) const;

  // Cheap fingerprint of (dim, dtype, size, a sample of rows): lets a saved
  // index refuse to attach to a store holding other keys.
  uint64_t fingerprint(int64_t n_rows) const;

 private:
  int dim_;
  DType dtype_;
  size_t row_bytes_;
  std::atomic<int64_t> size_{0};
  ChunkAllocator alloc_;
  std::vector<std::shared_ptr<uint8_t>> chunks_;  // capacity reserved: never reallocates
  int64_t mapped_rows_ = 0;
};

}  // namespace topkv
