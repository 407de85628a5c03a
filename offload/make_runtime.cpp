#include "offload/make_runtime.h"

#include "gpu/cuda_backend.h"
#include "src/common/error.h"

namespace topkv {

std::unique_ptr<OffloadRuntime> make_offload_runtime(Backend& be, const ModelConfig& cfg, const OffloadPolicy& policy,
                                                     bool progress) {
  if (is_cuda_backend(be)) return make_gpu_offload_runtime(be, cfg, policy, progress);
  return std::make_unique<OffloadRuntime>(cfg, policy, progress);
}

// LEAD-MERGE: replaced by gpu/gpu_offload_runtime.cpp
std::unique_ptr<OffloadRuntime> make_gpu_offload_runtime(Backend&, const ModelConfig&, const OffloadPolicy&, bool) {
  fail("the CUDA offload runtime is not built yet");
}

}  // namespace topkv
