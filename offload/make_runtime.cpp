#include "offload/make_runtime.h"

#include "gpu/cuda_backend.h"
#include "gpu/gpu_offload_runtime.h"

namespace topkv {

std::unique_ptr<OffloadRuntime> make_offload_runtime(Backend& be, const ModelConfig& cfg, const OffloadPolicy& policy,
                                                     bool progress) {
  if (is_cuda_backend(be)) return make_gpu_offload_runtime(be, cfg, policy, progress);
  return std::make_unique<OffloadRuntime>(cfg, policy, progress);
}

}  // namespace topkv
