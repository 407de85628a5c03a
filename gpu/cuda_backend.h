// The CUDA backend: every op of src/model/backend.h on one CUDA device, the
// twin of the CPU backend (src/model/cpu_backend.cpp); tests/gpu/
// test_cuda_backend.cpp compares the two op by op and on whole models.
//
// What differs from the CPU backend, by design:
//   - Weights. prepare_weight dequantises every matrix once on the host and
//     uploads it as fp16 (bf16 when the file holds BF16, or when a value lies
//     beyond fp16's range); 1-row weights (norms) are uploaded as F32. The
//     WeightMode is ignored for matrices: the device never holds quantised
//     rows (no quantised GEMV kernels yet), and never fp32 copies (twice the
//     memory and bandwidth of fp16 for no gain the tests could see).
//   - matmul. T <= 4 tokens (decode) run a GEMV kernel that streams the
//     16-bit weight once with fp32 activations and accumulation; larger T
//     cast the activations to the weight's 16-bit type (with a power-of-two
//     scale that keeps them inside fp16's range) and call cuBLAS with fp32
//     accumulation and output. Expect ~1e-3 relative difference from the CPU.
//   - Every float* an op takes is device memory from alloc(); token ids and
//     RoPE factors stay host values, as backend.h says.
// Ops are queued on the backend's own stream; to_host waits for them.
//
// This header compiles without CUDA. In a CPU-only build make_cuda_backend
// throws Error("... built without CUDA ..."), is_cuda_backend is false and
// cuda_memory_use throws.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "src/model/backend.h"

namespace topkv {

struct CudaBackendOptions {
  int device = 0;         // CUDA device ordinal
  size_t mem_budget = 0;  // device bytes the backend may hold (0: as much as the device has)
};

// Throws Error when built without CUDA, when the device does not exist, or
// when its compute capability is below what the build targets.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& opt = {});

// Device memory a CUDA backend holds, by what it is for.
struct CudaMemoryUse {
  size_t weights = 0;      // prepare_weight
  size_t kv_cache = 0;     // alloc_kv
  size_t activations = 0;  // alloc
  size_t scratch = 0;      // the backend's own work space (cast activations, attention partials, ...)
  size_t budget = 0;       // 0 = none
  size_t total() const { return weights + kv_cache + activations + scratch; }
  std::string describe() const;  // "weights 1.20 GiB, kv cache 512.00 MiB, ..."
};

bool is_cuda_backend(const Backend& be);
// Kernels launched by this process on any CUDA backend (a replayed decode-step
// graph counts its kernel nodes); launches per step = the difference over a
// step. 0 in a build without CUDA.
uint64_t cuda_kernel_launches();
CudaMemoryUse cuda_memory_use(const Backend& be);  // throws Error when be is not a CUDA backend

}  // namespace topkv
