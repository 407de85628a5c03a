// CPU twins of the quantised-weight kernels of the CUDA backend, plain C++
// compiled in every build (tests/test_quant_matvec_ref.cpp runs them in CI;
// tests/gpu/test_cuda_quant.cpp compares the kernels with them):
//   repack            the file's blocks -> the device layout (gpu/quant_units.h);
//                     CudaBackend::prepare_weight uploads exactly this;
//   quantize_q8_1     x[T][cols] -> q8_1 activations (one or two terms), as
//                     quantize_q8_1_kernel;
//   mmvq              y[T][rows] = W x as mul_mat_vec_q_kernel computes it: the
//                     same per-unit arithmetic (the shared header), each lane's
//                     units summed in the kernel's order, the 32 lanes reduced
//                     in the warp's butterfly order, then the epilogue;
//   dequant_row       a row of the device layout as dequant_f16_kernel /
//                     dequant_rows_kernel compute it (fp32, before any fp16
//                     rounding): bit for bit dequantize_row's.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/quant_units.h"
#include "src/model/ggml_types.h"

namespace topkv::qref {

using qunits::Q8Scale;

// Whether t has a device layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K).
bool has_device_layout(GgmlType t);
// Bytes of a rows x cols matrix of type t in the device layout.
size_t device_bytes(GgmlType t, int64_t rows, int64_t cols);
// `rows` rows of the file's blocks (src: rows * ggml_row_bytes(t, cols)
// bytes) -> one rows x cols matrix in the device layout at dst
// (device_bytes(t, rows, cols) bytes). Throws Error for a type without one.
void repack(GgmlType t, const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst);

// A bound on |value| over n_blocks of the file's blocks of type t, from the
// block scales alone (|d| times the largest code, plus |min|): the device
// dequantises to fp16 for the prefill GEMM only when this stays within fp16.
float abs_bound(GgmlType t, const uint8_t* src, int64_t n_blocks);

// q8_1 activations of T tokens with `terms` (quant_units.h: 1, or 2 for a
// 16-bit code in hi and lo halves): qs [T * terms][cols] (token t's codes at
// row t * terms, its lo codes at t * terms + 1), ds [T][cols / 32].
struct Q8Activations {
  int T = 0, terms = 1;
  int64_t cols = 0;
  std::vector<int8_t> qs;
  std::vector<Q8Scale> ds;
  qunits::Q8Row row(int t) const { return qunits::q8_row(qs.data(), ds.data(), t, cols, terms); }
  // The code of value i of token t: q, or 256 hi + lo.
  int code(int t, int64_t i) const;
  // The values the kernels multiply: d * code (fp32), [T][cols].
  std::vector<float> dequantised() const;
};
// Throws Error unless terms is 1 (q8_1) or 2 (q8_1x2); the twin and the
// CUDA backend's launchers and options check with it.
void check_q8_terms(int terms);
// cols must be a multiple of 32; terms 1 or 2.
Q8Activations quantize_q8_1(const float* x, int T, int64_t cols, int terms = 1);

// y[t][r] (= or += when accumulate) sum over the row of w * (d8 q8) (+ bias[r]),
// w a rows x cols matrix in the device layout (host memory), x.T tokens.
void mmvq(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, const Q8Activations& x, float* y,
          const float* bias = nullptr, bool accumulate = false);
// out[0..cols) = row r of a device-layout matrix, dequantised.
void dequant_row(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, int64_t r, float* out);

}  // namespace topkv::qref
