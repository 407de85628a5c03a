// The CUDA backend: every op of src/model/backend.h on one CUDA device, the
// twin of the CPU backend (src/model/cpu_backend.cpp); tests/gpu/
// test_cuda_backend.cpp compares the two op by op and on whole models.
//
// What differs from the CPU backend, by design:
//   - Weights (gpu/cuda_weights.cpp). --weights quant (the default): a
//     quantised matrix (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) keeps
//     the file's blocks, split into 16-byte-aligned planes on upload (the
//     device layout of gpu/quant_units.h; Weight::type stays the GGML type):
//     the file's size on the device. --weights f16: every matrix dequantised
//     once on the host to fp16. Either way F32 matrices become fp16, F16 and
//     BF16 ones stay 16-bit (bf16 also for a value beyond fp16's range) and
//     1-row weights (norms, biases) F32. --weights f32 is refused (twice
//     fp16's memory and bandwidth for no gain the tests could see).
//   - matmul on quantised weights (gpu/cuda_quant_matmul.cpp). T <= 8 tokens:
//     the activations are quantised once to a 16-bit code per value in two
//     int8 halves (q8_1x2: 64 int8 and an fp32 scale per block of 32;
//     gpu/quant_units.h), and the MMVQ kernel takes integer dot products
//     (dp4a) of the blocks with both halves, 256 hi + lo in int32, fp32
//     accumulation, the epilogue in the kernel; matmul_group runs
//     the products of one input (q, k, v; gate, up) in one launch. Expect
//     ~1e-4 relative difference from the CPU per product (~1e-2 with
//     TOPKV_Q8_TERMS=1, ggml's one term; 1-4e-2 on a model's logits). T > 8: the weight is
//     dequantised to fp16 in row tiles (<= 256 MiB of work space, reserved
//     when the weight is prepared) and multiplied by cuBLAS as below.
//   - matmul on 16-bit weights. T <= 4 tokens (decode) run a GEMV kernel that
//     streams the weight once with fp32 activations and accumulation; larger
//     T cast the activations to the weight's 16-bit type (with a power-of-two
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
  // Activation terms of the decode products on quantised weights
  // (gpu/quant_units.h): 2 (q8_1x2) or 1 (ggml's q8_1); 0: TOPKV_Q8_TERMS, else 2.
  int q8_terms = 0;
};

// Throws Error when built without CUDA, when the device does not exist, or
// when its compute capability is below what the build targets.
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& opt = {});

// Device memory a CUDA backend holds, by what it is for.
struct CudaMemoryUse {
  size_t weights = 0;      // prepare_weight
  size_t kv_cache = 0;     // alloc_kv
  size_t activations = 0;  // alloc
  size_t scratch = 0;      // the backend's own work space (cast activations, dequantised weight tiles, ...)
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
