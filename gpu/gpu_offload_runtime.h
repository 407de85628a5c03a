// GpuOffloadRuntime: the offloaded top-k decode with the model on a CUDA
// backend (DESIGN.md, "One decode step"; docs/AS_BUILT.md). The host side —
// the stores, the indexes, the window's bookkeeping and eviction — is the CPU
// OffloadRuntime's (its reference twin); this class adds the device side:
//   - each retrieval layer's sinks and a ring of recent tokens live on the
//     device in fp32 (sink i at slot i, position p at ring slot p % ring),
//     written from the model's k/v on the device each step;
//   - the host stores are pinned, device-mapped memory, so a kernel reads the
//     retrieved rows in place over PCIe, or (policy.stage_rows) the host
//     copies them into a pinned staging buffer that goes over in one copy.
//     Restored from a context pack, a pinned store is a copy of the pack's
//     (a kernel cannot read the file's pages: registering the mapping hung
//     the driver, and the GPU host has no pageable memory access,
//     scripts/probes/pageable_store_probe.cu); with stage_rows the store
//     needs no pinning and is used in place from the pack.
// Two ways to search (policy.search_on):
//   - on the device (multipole, centroid, quest; the default where allowed):
//     the index's summary tables are on the GPU (gpu/device_search_tables.h)
//     and cuda::summary_search scores, cuts, gathers and adds the far rows
//     with no host round trip (with stage_rows one: the searched rows' list
//     comes back and the host stages those rows, stage_searched_rows). The host layer trails by one token
//     (OffloadedLayer::begin_append now, fill_appended at the next step);
//     the ring also holds the evicted rows the tables do not cover yet;
//   - on the host: q, k, v to the host (the step's one wait per layer),
//     append + index search on the host cores, row pointers (+ far
//     partials) back to the device.
// Either way row_list_attention covers sinks + ring and the retrieved rows,
// and merge_partials writes the layer's attention output.
// Device memory (mirrors, tables, row lists, partials, staging) is allocated
// through the backend, so --gpu-mem-budget counts it; the pinned host memory
// is not device memory and is reported by host_bytes().
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
