#include "gpu/gpu_page_bounds.h"

#include "src/common/error.h"

#ifndef TOPKV_HAVE_CUDA
namespace topkv {
std::shared_ptr<const PageBoundsEngine> make_gpu_page_bounds(Backend&) {
  fail("--build-on gpu needs a CUDA build of topkv (this one has no CUDA): use --build-on host");
}
}  // namespace topkv
#else
#include <algorithm>
#include <mutex>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"

namespace topkv {
namespace {

// Rows a block copies up and bounds: the longest page the engine takes.
constexpr int64_t kBlockRows = 16384;

class GpuPageBounds final : public PageBoundsEngine {
 public:
  explicit GpuPageBounds(cuda::CudaBackend& be) : be_(&be) {
    TOPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~GpuPageBounds() override {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "gpu"; }
  int64_t max_page() const override { return kBlockRows; }
  // A block's rows at fp32 (the widest store row) and its bounds at pages of one row.
  double device_bytes(int d) const override { return (double)kBlockRows * d * 4 * 3; }

  void bound_pages(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page, int64_t n_rows,
                   float* out) const override {
    TOPKV_CHECK(page >= 1 && page <= kBlockRows && first_page >= 0 && end_page >= first_page &&
                    n_rows <= keys.size() && (end_page == first_page || n_rows > (end_page - 1) * page),
                "internal: device bounds of pages {}..{} of {} rows over {} of the store's {} rows", first_page,
                end_page, page, n_rows, keys.size());
    if (end_page == first_page) return;
    const int d = keys.dim();
    const size_t row_bytes = keys.row_bytes(), w = 2 * (size_t)d;
    const int64_t block_pages = kBlockRows / page;
    std::lock_guard<std::mutex> lock(mu_);
    auto* raw = static_cast<uint8_t*>(grow(raw_, (size_t)kBlockRows * row_bytes)->mem.get());
    float* bounds = grow(bounds_, (size_t)block_pages * w * sizeof(float))->f32();
    for (int64_t p0 = first_page; p0 < end_page; p0 += block_pages) {
      const int64_t p1 = std::min(end_page, p0 + block_pages);
      const int64_t r0 = p0 * page, r1 = std::min(n_rows, p1 * page);
      keys.for_each_span(r0, r1, [&](int64_t first, int64_t n, const void* src) {
        TOPKV_CUDA_CHECK(cudaMemcpyAsync(raw + (size_t)(first - r0) * row_bytes, src, (size_t)n * row_bytes,
                                         cudaMemcpyHostToDevice, stream_));
      });
      cuda::page_bounds(keys.dtype(), raw, r1 - r0, d, page, bounds, stream_);
      TOPKV_CUDA_CHECK(cudaMemcpyAsync(out + (size_t)(p0 - first_page) * w, bounds,
                                       (size_t)(p1 - p0) * w * sizeof(float), cudaMemcpyDeviceToHost, stream_));
    }
    TOPKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  Buffer* grow(Buffer& b, size_t bytes) const {
    if (b.bytes < bytes) {
      TOPKV_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the old buffer may still be read
      b = Buffer{};
      b = be_->alloc(bytes, cuda::MemKind::Scratch, "page bounds work space (--build-on gpu)");
    }
    return &b;
  }

  cuda::CudaBackend* be_;
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
  mutable Buffer raw_, bounds_;
};

}  // namespace

std::shared_ptr<const PageBoundsEngine> make_gpu_page_bounds(Backend& be) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&be);
  TOPKV_CHECK(cb, "the device page bounds (--build-on gpu|auto) needs the CUDA backend, not '{}'", be.name());
  return std::make_shared<GpuPageBounds>(*cb);
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
