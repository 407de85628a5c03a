// GpuOffloadRuntime: the offloaded top-k decode with the model on a CUDA
// backend (DESIGN.md, "One decode step"). The host side — the stores, the
// indexes, the window's bookkeeping and eviction — is the CPU
// OffloadRuntime's, unchanged (it is the reference twin); this class adds
// the device side:
//   - each retrieval layer's sinks and window live on the device as fp32
//     mirrors of the host ring (sink i at slot i, window position p at slot
//     p % window), written from the model's k/v on the device each step;
//   - the host stores are pinned, device-mapped memory, so a kernel reads the
//     retrieved rows in place over PCIe, or (policy.stage_rows) the host
//     copies them into a pinned staging buffer that goes over in one copy;
//   - per step and layer, on the backend's stream: q, k, v to the host (the
//     step's one wait), append + index search on the host cores, row
//     pointers (+ multipole far partials) to the device, row_list_attention
//     over sinks + window and over the retrieved rows, merge_partials into
//     the layer's attention output.
// Device memory (mirrors, row lists, partials, staging) is allocated through
// the backend, so --gpu-mem-budget counts it; the pinned host memory is not
// device memory and is reported by host_bytes().
//
// This header compiles without CUDA; make_gpu_offload_runtime then throws.
#pragma once
#include <memory>

#include "offload/offload_runtime.h"
#include "src/model/backend.h"

namespace topkv {

// The runtime for a CUDA backend `be` (which must outlive it). Throws Error
// when `be` is not a CUDA backend or topkv was built without CUDA.
std::unique_ptr<OffloadRuntime> make_gpu_offload_runtime(Backend& be, const ModelConfig& cfg,
                                                         const OffloadPolicy& policy, bool progress);

}  // namespace topkv
