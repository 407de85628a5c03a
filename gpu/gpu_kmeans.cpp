#include "gpu/gpu_kmeans.h"

#include "src/common/error.h"

#ifndef TOPKV_HAVE_CUDA
namespace topkv {
std::shared_ptr<const KMeansEngine> make_gpu_kmeans(Backend&) {
  fail("--build-on gpu needs a CUDA build of topkv (this one has no CUDA): use --build-on host");
}
}  // namespace topkv
#else
#include <algorithm>
#include <vector>

#include "gpu/build_engine_stream.h"
#include "gpu/cuda_kernels.h"

namespace topkv {
namespace {

// Rows scored in one product: the [rows][k] scores stay within ~64 MiB.
int64_t score_tile_rows(int64_t k) { return std::max<int64_t>(32, (int64_t(16) << 20) / std::max<int64_t>(k, 1)); }

class GpuKMeans final : public KMeansEngine {
 public:
  explicit GpuKMeans(cuda::CudaBackend& be) : work_(be, "k-means work space (--build-on gpu)") {
    TOPKV_CUBLAS_CHECK(cublasCreate(&blas_));
    TOPKV_CUBLAS_CHECK(cublasSetStream(blas_, work_.get()));
    TOPKV_CUBLAS_CHECK(cublasSetMathMode(blas_, CUBLAS_PEDANTIC_MATH));  // fp32 products, as the twin's
  }
  ~GpuKMeans() override {
    work_.sync();
    cublasDestroy(blas_);
  }
  const char* name() const override { return "gpu"; }
  // ~64 MiB of scores (score_tile_rows) and the rows of a block of up to 64K
  // keys, twice (training rows and all rows).
  double device_bytes(int d) const override { return double(64 << 20) + 2.0 * 65536 * d * 4; }

  void cluster(const float* train, int64_t n_train, const float* all, int64_t n_all, int d, int64_t k, int iters,
               uint64_t seed, float* centroids, int32_t* labels) const override {
    const std::vector<int64_t> init = select_rows(n_train, k, seed);
    const auto lock = work_.lock();
    const cudaStream_t stream = work_.get();
    const bool same = all == train && n_all == n_train;
    const int64_t tile = score_tile_rows(k), n_max = std::max(n_train, n_all);
    float* x = work_.grow(x_, (size_t)n_train * d * 4).f32();
    float* xa = same ? x : work_.grow(xa_, (size_t)n_all * d * 4).f32();
    float* scores = work_.grow(scores_, (size_t)std::min(tile, n_max) * k * 4).f32();
    auto* lab = work_.grow(labels_, (size_t)n_max * 4).as<int32_t>();
    float* sums = work_.grow(sums_, (size_t)k * d * 4).f32();
    auto* counts = work_.grow(counts_, (size_t)k * 4).as<int32_t>();
    float* cent = work_.grow(cent_, (size_t)k * d * 4).f32();
    host_.resize((size_t)k * d);
    for (int64_t j = 0; j < k; ++j) std::copy_n(train + (size_t)init[(size_t)j] * d, d, host_.data() + (size_t)j * d);
    TOPKV_CUDA_CHECK(cudaMemcpyAsync(x, train, (size_t)n_train * d * 4, cudaMemcpyHostToDevice, stream));
    TOPKV_CUDA_CHECK(cudaMemcpyAsync(cent, host_.data(), host_.size() * 4, cudaMemcpyHostToDevice, stream));
    count_.resize((size_t)k);
    for (int it = 0; it < iters; ++it) {
      assign(x, n_train, cent, k, d, tile, scores, lab);
      cuda::kmeans_accumulate(x, lab, n_train, k, d, sums, counts, stream);
      cuda::kmeans_normalise(sums, k, d, cent, stream);
      // Empty clusters split a large one on the host (the twin's rule, kmeans_split_empty):
      // the counts come back each round, the centroids only when one is empty.
      TOPKV_CUDA_CHECK(cudaMemcpyAsync(count_.data(), counts, (size_t)k * 4, cudaMemcpyDeviceToHost, stream));
      work_.sync();
      if (std::find(count_.begin(), count_.end(), 0) == count_.end()) continue;
      TOPKV_CUDA_CHECK(cudaMemcpyAsync(host_.data(), cent, host_.size() * 4, cudaMemcpyDeviceToHost, stream));
      work_.sync();
      kmeans_split_empty(host_.data(), count_.data(), k, d, n_train, seed + 1 + (uint64_t)it);
      TOPKV_CUDA_CHECK(cudaMemcpyAsync(cent, host_.data(), host_.size() * 4, cudaMemcpyHostToDevice, stream));
    }
    if (!same) TOPKV_CUDA_CHECK(cudaMemcpyAsync(xa, all, (size_t)n_all * d * 4, cudaMemcpyHostToDevice, stream));
    assign(xa, n_all, cent, k, d, tile, scores, lab);
    TOPKV_CUDA_CHECK(cudaMemcpyAsync(labels, lab, (size_t)n_all * 4, cudaMemcpyDeviceToHost, stream));
    TOPKV_CUDA_CHECK(cudaMemcpyAsync(centroids, cent, (size_t)k * d * 4, cudaMemcpyDeviceToHost, stream));
    work_.sync();
  }

 private:
  // labels of n rows of x against k centroids, `tile` rows a product:
  // scores [rows][k] = x_tile . cent^T (column-major: cent^T x_tile^T).
  void assign(const float* x, int64_t n, const float* cent, int64_t k, int d, int64_t tile, float* scores,
              int32_t* lab) const {
    const float one = 1.f, zero = 0.f;
    for (int64_t r0 = 0; r0 < n; r0 += tile) {
      const int64_t r = std::min(tile, n - r0);
      TOPKV_CUBLAS_CHECK(cublasSgemm(blas_, CUBLAS_OP_T, CUBLAS_OP_N, (int)k, (int)r, d, &one, cent, d,
                                     x + (size_t)r0 * d, d, &zero, scores, (int)k));
      cuda::kmeans_argmax_rows(scores, r, (int)k, lab + r0, work_.get());
    }
  }
  cuda::BuildEngineStream work_;
  cublasHandle_t blas_ = nullptr;
  mutable Buffer x_, xa_, scores_, labels_, sums_, counts_, cent_;
  mutable std::vector<float> host_;
  mutable std::vector<int32_t> count_;
};

}  // namespace

std::shared_ptr<const KMeansEngine> make_gpu_kmeans(Backend& be) {
  return std::make_shared<GpuKMeans>(cuda::as_cuda_backend(be, "the device k-means (--build-on gpu|auto)"));
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
