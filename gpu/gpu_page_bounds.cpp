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

#include "gpu/build_engine_stream.h"
#include "gpu/cuda_kernels.h"

namespace topkv {
namespace {

// Rows a block copies up and bounds: the longest page the engine takes.
constexpr int64_t kBlockRows = 16384;

class GpuPageBounds final : public PageBoundsEngine {
 public:
  explicit GpuPageBounds(cuda::CudaBackend& be) : stream_(be, "page bounds work space (--build-on gpu)") {}
  const char* name() const override { return "gpu"; }
  int64_t max_page() const override { return kBlockRows; }
  // A block's rows at fp32 (the widest store row) and its bounds at pages of one row.
  double device_bytes(int d) const override { return (double)kBlockRows * d * 4 * 3; }

 protected:
  void bound_impl(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page, int64_t n_rows,
                  float* out) const override {
    const int d = keys.dim();
    const size_t row_bytes = keys.row_bytes(), w = 2 * (size_t)d;
    const int64_t block_pages = kBlockRows / page;
    const cudaStream_t s = stream_.get();
    const auto lock = stream_.lock();
    auto* raw = stream_.grow(raw_, (size_t)kBlockRows * row_bytes).as<uint8_t>();
    float* bounds = stream_.grow(bounds_, (size_t)block_pages * w * sizeof(float)).f32();
    for (int64_t p0 = first_page; p0 < end_page; p0 += block_pages) {
      const int64_t p1 = std::min(end_page, p0 + block_pages);
      const int64_t r0 = p0 * page, r1 = std::min(n_rows, p1 * page);
      keys.for_each_span(r0, r1, [&](int64_t first, int64_t n, const void* src) {
        TOPKV_CUDA_CHECK(cudaMemcpyAsync(raw + (size_t)(first - r0) * row_bytes, src, (size_t)n * row_bytes,
                                         cudaMemcpyHostToDevice, s));
      });
      cuda::page_bounds(keys.dtype(), raw, r1 - r0, d, page, bounds, s);
      TOPKV_CUDA_CHECK(cudaMemcpyAsync(out + (size_t)(p0 - first_page) * w, bounds,
                                       (size_t)(p1 - p0) * w * sizeof(float), cudaMemcpyDeviceToHost, s));
    }
    stream_.sync();
  }

 private:
  cuda::BuildEngineStream stream_;
  mutable Buffer raw_, bounds_;
};

}  // namespace

std::shared_ptr<const PageBoundsEngine> make_gpu_page_bounds(Backend& be) {
  return std::make_shared<GpuPageBounds>(cuda::as_cuda_backend(be, "the device page bounds (--build-on gpu|auto)"));
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
