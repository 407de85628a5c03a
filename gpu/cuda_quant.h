// Host launchers of the kernels on quantised weights in the device layout
// (gpu/quant_units.h): q8_1 activations, the decode GEMV (MMVQ) over a group
// of matrices, and dequantisation (to fp16 for the prefill GEMM, to fp32 for
// embedding rows). Each names its CPU twin in gpu/quant_matvec_ref.h. CUDA
// builds only (C++17).
//
// Expected bounds per call (H100: ~3.0 TB/s measured copy):
//   quant_gemv: memory, the weight bytes once (~0.56 bytes per value for
//     Q4_K, 1.06 for Q8_0); activations and the scale headers come from L1/L2.
//     At T = 8 the integer and fp32 work (8 dp4a + ~14 other ops per 32
//     values per row and token) approaches the memory time on big matrices:
//     rows are tiled 4 per warp there to share each activation load
//     (gpu/kernels_mmvq.cu says the tile of each T).
//   dequant_16bit: memory, the weight once plus 2 bytes written per value.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu/quant_units.h"
#include "src/model/ggml_types.h"
#include "src/model/op_kinds.h"

namespace topkv::cuda {

// Tokens up to which a quantised matmul runs the GEMV; larger T dequantise
// the weight to fp16 and run cuBLAS.
inline constexpr int kQuantGemvMaxTokens = 8;
// Matrices one quant_gemv launch covers.
inline constexpr int kQuantGroupMaxJobs = 4;

// One product of a group: y[T][rows] (= or += when accumulate) x W^T (+ bias).
struct QuantGemvJob {
  GgmlType type = GgmlType::Q8_0;
  const uint8_t* w = nullptr;  // rows x cols in the device layout
  int64_t rows = 0;
  float* y = nullptr;
  const float* bias = nullptr;  // [rows] or null
  bool accumulate = false;
};

// The q8_1 activations of T tokens of `cols` (a multiple of 32) with
// `terms` (1 or 2, quant_units.h) in a work space of q8_activation_bytes:
// qs [T * terms][cols] int8 (token t's codes, then with two terms its lo
// codes), then ds [T][cols / 32].
size_t q8_activation_bytes(int T, int64_t cols, int terms = 1);
struct Q8DeviceActivations {
  int8_t* qs;
  qunits::Q8Scale* ds;
};
Q8DeviceActivations carve_q8_activations(void* workspace, int T, int64_t cols, int terms = 1);

// x[T][cols] (fp32, any alignment) -> q8_1 in `workspace`. Twin: qref::quantize_q8_1.
void quantize_q8_1(const float* x, int T, int64_t cols, void* workspace, cudaStream_t stream, int terms = 1);
// A group's input formed (MatmulInput, backend.h) and quantised in one kernel
// (gpu/kernels_quant_input.cu): either x += [rms_norm(add) * add_norm | add]
// (when add is set), then rms_norm(x) * norm; or act(x) * up (GLU). The
// result goes to `workspace` as quantize_q8_1 writes it; x is updated in
// place when add is set. Twin: the default Backend::matmul_group's forming
// (rms_norm, add, glu of the CPU backend), then qref::quantize_q8_1.
struct FormQ8Args {
  float* x = nullptr;
  const float* add = nullptr;
  const float* add_norm = nullptr;  // device, cols values
  const float* norm = nullptr;      // device, cols values
  const float* up = nullptr;
  GluKind glu = GluKind::SiLU;
  float eps = 0.f;
  int T = 0;
  int64_t cols = 0;
  int terms = 1;
};
void form_q8_1(const FormQ8Args& a, void* workspace, cudaStream_t stream);
// The MMVQ kernel a launch runs. Both compute every row as qref::mmvq does
// (the same units, each lane's in the same order, the same butterfly), so
// they agree with each other and the twin to the bit:
//   Old  a warp per tile of rows, the grid covers every tile once
//        (gpu/kernels_quant_gemv.cu; kept for device comparisons);
//   New  warps that stay resident and walk tiles, each tile's rows queued
//        into L2 one tile ahead, more loads in flight (gpu/kernels_mmvq.cu);
//   Auto the one measured faster for the call's shape (mmvq_auto_kernel).
// H100, one launch in a graph (bench/results/gpu_h100_session6/kernels/): for
// rows of >= 2048 values at T <= 2 Old is faster (Llama-3-8B down 16.7 vs
// 21.4 us, q/o 7.1 vs 8.8, gate/up 18.2 vs 19.2; the 8B model 359 vs 325
// tok/s), New at T >= 4 (gate/up T=8 37 vs 61 us) and on narrow rows (the
// Gemma-3-270M model 1318 vs 1189 tok/s).
enum class MmvqKernel { Old, New, Auto };
const char* mmvq_kernel_name(MmvqKernel k);
MmvqKernel mmvq_auto_kernel(int T, int64_t cols);
// TOPKV_MMVQ=old|new|auto in the environment (unset or empty: auto); any
// other value throws Error naming the three.
MmvqKernel mmvq_kernel_from_env();
// The activation terms of the decode GEMV (quant_units.h): 2 (q8_1x2, the
// default) unless TOPKV_Q8_TERMS=1 (ggml's q8_1: ~1e-2 rounding per product,
// ~2% faster on an 8B model at short context); any other value throws Error.
int q8_terms_from_env();
struct MmvqOptions {
  MmvqKernel kernel = MmvqKernel::Auto;
  // New kernel only: at most this many CUDA blocks (0: as many as the device
  // holds at once). Tests set it small so every warp walks many tiles.
  int max_blocks = 0;
  // Rows of activations a token (1 or 2: quant_units.h), as quantised.
  int terms = 1;
};

// The MMVQ of n_jobs (1..kQuantGroupMaxJobs) matrices of `cols` columns over
// the activations of T (1..kQuantGemvMaxTokens) tokens quantised in
// `workspace` with opt.terms terms, in one launch: every warp finds its job
// and the job's type. Twin: qref::mmvq per job.
void quant_gemv(const QuantGemvJob* jobs, int n_jobs, int64_t cols, int T, const void* workspace,
                cudaStream_t stream, const MmvqOptions& opt = {});
// Rows row0 .. row0 + n_rows - 1 of a rows x cols matrix -> out [n_rows][cols]
// of out_type (F16 or BF16, round to nearest; 16-byte aligned). Twin:
// qref::dequant_row, then from_f32.
void dequant_16bit(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, int64_t row0, int64_t n_rows,
                   DType out_type, void* out, cudaStream_t stream);
// out[t][:] = scale * row ids[t] (device ids, already checked), fp32. Twin:
// qref::dequant_row times scale (CpuBackend::embed).
void dequant_rows_f32(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, const int32_t* ids, int T, float scale,
                      float* out, cudaStream_t stream);

}  // namespace topkv::cuda
