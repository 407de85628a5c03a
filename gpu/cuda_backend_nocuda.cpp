// CPU-only builds: the CUDA backend's entry points say why there is none.
#ifndef TOPKV_HAVE_CUDA
#include "gpu/cuda_backend.h"
#include "gpu/cuda_sampler.h"
#include "src/common/error.h"

namespace topkv {

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions&) {
  fail("the CUDA backend is not available: topkv was built without CUDA (configure with nvcc on the PATH and "
       "-DTOPKV_CUDA=ON), or use the CPU backend");
}

bool is_cuda_backend(const Backend&) { return false; }
uint64_t cuda_kernel_launches() { return 0; }

CudaMemoryUse cuda_memory_use(const Backend& be) {
  fail("cuda_memory_use: backend '{}' is not a CUDA backend (topkv was built without CUDA)", be.name());
}

CudaSampler::CudaSampler(Backend& be, const SamplerParams& p) : be_(be), host_(p), rng_(p.seed) {
  fail("CudaSampler: backend '{}' is not a CUDA backend (topkv was built without CUDA)", be.name());
}
int32_t CudaSampler::sample(const float*, int64_t) { fail("CudaSampler: topkv was built without CUDA"); }
int32_t cuda_argmax(Backend& be, const float*, int64_t) {
  fail("cuda_argmax: backend '{}' is not a CUDA backend (topkv was built without CUDA)", be.name());
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
