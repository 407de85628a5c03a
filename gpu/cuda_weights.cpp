// CudaBackend::prepare_weight: weights go to the device once, as
//   the file's blocks, for a quantised matrix (Q4_0 ... Q6_K) with --weights
//         quant: repacked on the host into the device layout of
//         gpu/quant_units.h (qref::repack) chunk by chunk and copied up; the
//         Dequant scratch grows to the matrix's fp16 size (at most
//         kDequantScratchMax) so that a prefill never allocates;
//   F32   for 1-row weights (norm gains, biases: tiny, and read in fp32);
//   BF16  for BF16 files, and for any matrix with a value beyond fp16's
//         range (65504), which fp16 would turn into inf;
//   F16   for every other matrix (--weights f16: the quantised ones too,
//         dequantised on the host by dequantize_row; 11 significant bits,
//         more than any GGUF quantisation keeps).
// Rows are converted in chunks of ~32 MB (OpenMP over rows) and copied up as
// each chunk is done, so host memory stays small for any model size.
#ifdef TOPKV_HAVE_CUDA
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/quant_matvec_ref.h"

namespace topkv::cuda {

namespace {

constexpr float kF16Max = 65504.f;
constexpr size_t kChunkF32Bytes = size_t{32} << 20;

// Uploads src converted to `target` into fresh device memory. Returns null
// (nothing kept) when target is F16 and a value does not fit.
std::shared_ptr<void> upload_as(const Weight& src, DType target, DeviceMemory& mem, cudaStream_t stream) {
  const int64_t rows = src.rows, cols = src.cols;
  ggml_row_bytes(src.type, cols);  // throws for a row that is not whole blocks, before the parallel loop
  const size_t out_row = (size_t)cols * dtype_size(target);
  std::shared_ptr<void> dev = mem.alloc((size_t)rows * out_row, MemKind::Weights, "weight " + src.name);
  const int64_t chunk_rows = std::max<int64_t>(1, (int64_t)(kChunkF32Bytes / ((size_t)cols * sizeof(float))));
  std::vector<float> f32((size_t)std::min(chunk_rows, rows) * cols);
  std::vector<uint8_t> conv((size_t)std::min(chunk_rows, rows) * out_row);
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t nr = std::min(chunk_rows, rows - r0);
    int overflow = 0;
#pragma omp parallel for schedule(static) reduction(| : overflow) if (nr > 1)
    for (int64_t r = 0; r < nr; ++r) {
      float* d = f32.data() + (size_t)r * cols;
      dequantize_row(src.type, src.row(r0 + r), d, cols);
      if (target == DType::F16)
        for (int64_t i = 0; i < cols; ++i) overflow |= std::fabs(d[i]) > kF16Max;
      from_f32(target, d, conv.data() + (size_t)r * out_row, (size_t)cols);
    }
    if (overflow) return nullptr;
    // Pageable source: the call returns once `conv` is staged, so the next
    // chunk may overwrite it.
    TOPKV_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dev.get()) + (size_t)r0 * out_row, conv.data(),
                                     (size_t)nr * out_row, cudaMemcpyHostToDevice, stream));
  }
  TOPKV_CUDA_CHECK(cudaStreamSynchronize(stream));
  return dev;
}

GgmlType ggml_of(DType t) {
  return t == DType::F32 ? GgmlType::F32 : t == DType::F16 ? GgmlType::F16 : GgmlType::BF16;
}

}  // namespace

Weight CudaBackend::upload_quant(const Weight& src) {
  const GgmlType t = src.type;
  const int64_t rows = src.rows, cols = src.cols, nb = cols / qunits::block_values(t);
  TOPKV_CHECK(src.row_bytes == ggml_row_bytes(t, cols), "weight '{}': rows of {} bytes, but {} {} values take {}",
              src.name, src.row_bytes, cols, ggml_type_name((uint32_t)t), ggml_row_bytes(t, cols));
  std::shared_ptr<void> dev = mem_.alloc(qref::device_bytes(t, rows, cols), MemKind::Weights, "weight " + src.name);
  size_t off[qunits::kMaxPlanes], total;
  qunits::plane_offsets(t, rows, cols, off, &total);
  const qunits::PlaneBytes pb = qunits::plane_bytes(t);
  const int64_t chunk_rows = std::max<int64_t>(1, (int64_t)(kChunkF32Bytes / src.row_bytes));
  std::vector<uint8_t> stage(qref::device_bytes(t, std::min(chunk_rows, rows), cols));
  for (int64_t r0 = 0; r0 < rows; r0 += chunk_rows) {
    const int64_t nr = std::min(chunk_rows, rows - r0);
    qref::repack(t, src.row(r0), nr, cols, stage.data());
    size_t chunk_off[qunits::kMaxPlanes], chunk_total;
    qunits::plane_offsets(t, nr, cols, chunk_off, &chunk_total);
    for (int p = 0; p < qunits::kMaxPlanes; ++p) {
      const size_t bytes = (size_t)nr * nb * pb.b[p];
      if (bytes == 0) continue;
      // Pageable source: the call returns once `stage` is staged, so the next chunk may overwrite it.
      TOPKV_CUDA_CHECK(cudaMemcpyAsync(static_cast<uint8_t*>(dev.get()) + off[p] + (size_t)r0 * nb * pb.b[p],
                                       stage.data() + chunk_off[p], bytes, cudaMemcpyHostToDevice, stream_));
    }
  }
  TOPKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  Weight w = src;
  w.data = static_cast<const uint8_t*>(dev.get());
  w.owned = std::move(dev);
  if (!(qref::abs_bound(t, src.data, rows * nb) <= kF16Max)) {  // its prefill dequantises to bf16
    std::shared_ptr<WideWeights> wide = wide_weights_;
    {
      std::lock_guard<std::mutex> lock(wide->mu);
      wide->set.insert(w.data);
    }
    std::shared_ptr<void> mem = w.owned;
    w.owned = std::shared_ptr<void>(mem.get(), [mem, wide](void* p) mutable {
      {
        std::lock_guard<std::mutex> lock(wide->mu);
        wide->set.erase(p);
      }
      mem.reset();  // frees the device memory only after the key is gone
    });
  }
  const size_t row16 = (size_t)cols * 2;
  scratch(Scratch::Dequant, (size_t)std::clamp<int64_t>((int64_t)(dequant_tile_bytes_ / row16), 1, rows) * row16);
  return w;
}

Weight CudaBackend::prepare_weight(const Weight& src, WeightMode mode) {
  TOPKV_CHECK(mode != WeightMode::F32, "--weights f32 is for the CPU backend; the CUDA backend keeps the file's "
              "quantised blocks (quant) or dequantises them to fp16 (f16)");
  TOPKV_CHECK(src.data && src.rows > 0 && src.cols > 0, "weight '{}' is empty ({} x {})", src.name, src.rows,
              src.cols);
  TOPKV_CHECK(!mem_.owns(src.data, MemKind::Weights),
              "weight '{}' is already in device memory; prepare_weight takes the host (mapped file) weight",
              src.name);
  TOPKV_CHECK(!rec_, "prepare_weight while recording a decode step: prepare weights before recording");
  if (mode == WeightMode::Quant && src.rows > 1 && qunits::has_device_layout(src.type)) return upload_quant(src);
  DType target = src.rows == 1 ? DType::F32 : src.type == GgmlType::BF16 ? DType::BF16 : DType::F16;
  std::shared_ptr<void> dev = upload_as(src, target, mem_, stream_);
  if (!dev) {  // a value beyond fp16: bf16 has fp32's range
    target = DType::BF16;
    dev = upload_as(src, target, mem_, stream_);
  }
  Weight w;
  w.name = src.name;
  w.type = ggml_of(target);
  w.rows = src.rows, w.cols = src.cols;
  w.row_bytes = (size_t)src.cols * dtype_size(target);
  w.data = static_cast<const uint8_t*>(dev.get());
  w.owned = std::move(dev);
  return w;
}

}  // namespace topkv::cuda
#endif  // TOPKV_HAVE_CUDA
