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

// A host runtime (OffloadRuntime: stores and indexes on the host, nothing on
// the device) that builds the indexes `make_offload_runtime(be, ...)` would:
// on a CUDA backend its indexes take the device's build engines (k-means,
// page bounds) where the CUDA runtime's would (build_on_gpu; --build-on
// auto|gpu). What
// builds a context pack (`index build`, eval's shared context) uses it, so a
// pack built on a GPU host holds what `generate` there builds. --build-on gpu
// on another backend is refused.
std::unique_ptr<OffloadRuntime> make_build_runtime(Backend& be, const ModelConfig& cfg, const OffloadPolicy& policy,
                                                   bool progress);

}  // namespace topkv
