#ifdef TOPKV_HAVE_CUDA
#include "gpu/cuda_sampler.h"

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"

namespace topkv {

namespace {

// Work space for the kernels plus the int32 result at its end; the result is
// copied back (the only transfer) once the kernels are queued.
struct DeviceDraw {
  cuda::CudaBackend& be;
  void* ws;
  int32_t* result;
  DeviceDraw(cuda::CudaBackend& b, int64_t n) : be(b) {
    const size_t ws_bytes = (cuda::sampling_workspace_bytes(n) + 15) / 16 * 16;
    ws = be.scratch(cuda::CudaBackend::Scratch::Sampling, ws_bytes + 16);
    result = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(ws) + ws_bytes);
  }
  int32_t fetch() {
    int32_t r = -1;
    TOPKV_CUDA_CHECK(cudaMemcpyAsync(&r, result, sizeof r, cudaMemcpyDeviceToHost, be.stream()));
    be.synchronize();
    return r;
  }
};

}  // namespace

int32_t cuda_argmax(Backend& be, const float* logits, int64_t n) {
  TOPKV_CHECK(n > 0, "cannot sample from an empty vocabulary");
  DeviceDraw d(cuda::as_cuda_backend(be, "cuda_argmax"), n);
  cuda::argmax(logits, n, d.result, d.ws, d.be.stream());
  return d.fetch();
}

CudaSampler::CudaSampler(Backend& be, const SamplerParams& p) : be_(be), host_(p), rng_(p.seed) {
  cuda::as_cuda_backend(be, "CudaSampler");
}

int32_t CudaSampler::sample(const float* logits, int64_t n) {
  TOPKV_CHECK(n > 0, "cannot sample from an empty vocabulary");
  const SamplerParams& p = host_.params();
  if (p.temperature <= 0.f) return cuda_argmax(be_, logits, n);
  if (p.top_k == 0 && p.top_p >= 1.f) {
    const double u = (double)(rng_() >> 11) * 0x1.0p-53;  // Sampler::sample's draw
    DeviceDraw d(cuda::as_cuda_backend(be_, "CudaSampler"), n);
    cuda::sample_temperature(logits, n, p.temperature, u, d.result, d.ws, d.be.stream());
    const int32_t id = d.fetch();
    return id >= 0 ? id : cuda_argmax(be_, logits, n);  // u within rounding of 1, as the CPU
  }
  host_logits_.resize((size_t)n);
  auto& c = cuda::as_cuda_backend(be_, "CudaSampler");
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(host_logits_.data(), logits, (size_t)n * sizeof(float), cudaMemcpyDeviceToHost,
                                   c.stream()));
  c.synchronize();
  return host_.sample(host_logits_);
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
