// Kernels of the CPU backend that deserve their own file (matmul: GEMV for
// decode, dequantised tiles + BLAS sgemm for prefill). Internal to
// src/model/cpu_*.cpp; the public surface is backend.h.
#pragma once
#include <cstdint>

#include "src/model/backend.h"

namespace topkv::cpu {

// dst[0..w.cols) = row r of w as fp32.
void weight_row_f32(const Weight& w, int64_t r, float* dst);
// sum_i w.row(r)[i] * x[i].
float weight_row_dot(const Weight& w, int64_t r, const float* x);

// y[T][w.rows] = x[T][w.cols] * W^T (see Backend::matmul).
void matmul(const float* x, const Weight& w, int T, float* y);
// Below this many tokens matmul runs as T GEMVs (rows dotted in place, no
// dequantised copy); from it on, as dequantised tiles times sgemm.
inline constexpr int kGemmMinTokens = 4;

}  // namespace topkv::cpu
