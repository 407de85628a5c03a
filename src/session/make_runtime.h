// The top-k offload runtime for a backend: the CPU runtime (OffloadRuntime,
// every part on the host) for a CPU backend, the CUDA runtime
// (gpu/gpu_offload_runtime.h: sinks and window on the device, stores in
// pinned host memory) for a CUDA one. Callers need not know which exists.
#pragma once
#include <memory>

#include "offload/offload_runtime.h"
#include "offload/policy.h"
#include "src/model/backend.h"
#include "src/model/model_config.h"

namespace topkv {

std::unique_ptr<OffloadRuntime> make_offload_runtime(Backend& be, const ModelConfig& cfg, const OffloadPolicy& policy,
                                                     bool progress);

}  // namespace topkv
