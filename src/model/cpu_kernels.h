// Kernels of the CPU backend that deserve their own file (matmul: GEMV for
// decode, dequantised tiles + BLAS sgemm for prefill; attention: per token
// for decode, blocked sgemm for prefill). Internal to src/model/cpu_*.cpp;
// the public surface is backend.h.
#pragma once
#include <cstdint>

#include "src/model/backend.h"

namespace topkv::cpu {

// dst[0..w.cols) = row r of w as fp32.
void weight_row_f32(const Weight& w, int64_t r, float* dst);
// sum_i w.row(r)[i] * x[i].
float weight_row_dot(const Weight& w, int64_t r, const float* x);

// y[T][w.rows] = x[T][w.cols] * W^T, then the epilogue (see Backend::matmul).
void matmul(const float* x, const Weight& w, int T, float* y, const MatmulEpilogue& ep = {});
// Below this many tokens matmul runs as T GEMVs (rows dotted in place, no
// dequantised copy); from it on, as dequantised tiles times sgemm.
inline constexpr int kGemmMinTokens = 4;

// Row-major C[n][m] = B[n][k] * A[m][k]^T + beta * C, and C[n][m] = B[n][k] *
// A[k][m] + beta * C, through BLAS sgemm (single-threaded: callers parallelise
// over tiles).
void gemm_abt(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc,
              float beta = 0.f);
void gemm_ab(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc, float beta);

// See Backend::attention.
void attention(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& c, int64_t window, float scale,
               float* out);

}  // namespace topkv::cpu
