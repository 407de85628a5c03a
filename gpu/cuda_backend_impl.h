// The CUDA backend class (internal: gpu/cuda_backend.h is the public
// surface). Host code: checks every op's arguments as the CPU backend does,
// then queues the kernels of gpu/cuda_kernels.h on its stream.
// CUDA builds only.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>
#include <vector>

#include "gpu/cuda_backend.h"
#include "gpu/cuda_memory.h"

namespace topkv::cuda {

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& opt);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  bool host_memory() const override { return false; }
  Buffer alloc(size_t bytes) override;
  void to_host(const Buffer& src, size_t offset_bytes, void* dst, size_t bytes) override;
  void from_host(const void* src, const Buffer& dst, size_t offset_bytes, size_t bytes) override;
  Weight prepare_weight(const Weight& src, WeightMode mode) override;  // gpu/cuda_weights.cpp
  KvLayerCache alloc_kv(int n_kv_heads, int head_dim, int64_t capacity, DType dtype) override;

  void embed(const Weight& table, const int32_t* ids, int T, float scale, float* out) override;
  void rms_norm(const float* x, const Weight& w, int64_t rows, int dim, float eps, float* out) override;
  void rope(float* x, int T, int n_heads, int head_dim, int64_t pos0, const RopeParams& p) override;
  void matmul(const float* x, const Weight& w, int T, float* y) override;
  void glu(GluKind kind, const float* gate, const float* up, int64_t n, float* out) override;
  void add(const float* x, int64_t n, float* y) override;
  void kv_write(KvLayerCache& cache, const float* k, const float* v, int T, int64_t pos0) override;
  void attention(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& cache, int64_t window,
                 float scale, float* out) override;

  // ---- for the sampler, benchmarks and tests --------------------------------
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  float* cublas_scalars() const { return scalars_; }  // see cuda::gemm
  int sm_count() const { return sm_count_; }
  const std::string& device_name() const { return device_name_; }
  CudaMemoryUse memory_use() const { return mem_.use(); }
  void synchronize();  // waits for every queued op; reports a fault of any
  // Backend-owned device work space, one region per purpose, grown as needed
  // (growing waits for queued work first). Valid until the next call for the
  // same purpose.
  enum class Scratch : int { Ids, Cast, Attention, Sampling, Count };
  void* scratch(Scratch which, size_t bytes);

 private:
  // The device weight a matrix op may use: uploaded by prepare_weight.
  void check_device_weight(const Weight& w, const char* op) const;

  int device_ = 0, sm_count_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceMemory mem_;
  struct ScratchRegion {
    std::shared_ptr<void> mem;
    size_t bytes = 0;
  };
  ScratchRegion scratch_[(int)Scratch::Count];
  std::shared_ptr<void> scalars_mem_;  // 4 floats for cuBLAS: absmax, alpha, beta = 0, spare
  float* scalars_ = nullptr;
  std::vector<int32_t> ids_staging_;  // pageable copy of embed's ids (see embed)
};

}  // namespace topkv::cuda
