// The arguments of the MMVQ kernels (gpu/kernels_quant_gemv.cu: the old one,
// gpu/kernels_mmvq.cu: the new one), shared by both: the jobs of a launch and
// the q8_1 activations. A tile is R consecutive rows of one job (R fixed per
// launch); tiles are numbered job after job. Included by .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_quant.h"

namespace topkv::cuda {

// One q8_1 block of 32 activations, a lane each (the calling warp holds
// block b of token t; `blocks` = cols / 32): ggml's quantize_q8_1, the scale
// and d * sum(q) kept fp32; with two terms the 16-bit code's hi and lo
// halves (quant_units.h). Codes into row t * terms (lo: t * terms + 1) of qs,
// the scale into row t of ds. The CPU twin is quant_matvec_ref.cpp's
// quantisation (the same qunits helpers). Used by quantize_q8_1_kernel and by
// the fused input kernel (gpu/kernels_quant_input.cu).
__device__ __forceinline__ void quantize_q8_1_warp(float x, int64_t t, int64_t b, int64_t blocks, int terms,
                                                   int8_t* qs, qunits::Q8Scale* ds) {
  const int lane = threadIdx.x % 32;
  const float amax = warp_max(fabsf(x));
  const float d = qunits::q8_scale(amax, terms);
  const int q = qunits::q8_code(x, d, amax);
  qunits::put_q8_code(qunits::q8_block_codes(qs, t, b, blocks * 32, terms), blocks * 32, lane, q, terms);
  const int sum = __reduce_add_sync(0xffffffffu, q);
  if (lane == 0) ds[t * blocks + b] = qunits::Q8Scale{d, qunits::fmul(d, (float)sum)};
}

// One matrix of a launch as the kernels read it (from the constant bank).
struct GemvJobDev {
  qunits::QuantMatrix w;
  int type;  // GgmlType
  int accumulate;
  int64_t rows;
  float* y;
  const float* bias;
  int64_t tile0;                     // the job's first tile
  int64_t row_bytes[qunits::kMaxPlanes];  // bytes of one row in each plane (0: no such plane)
};
struct GemvArgs {
  GemvJobDev jobs[kQuantGroupMaxJobs];
  int n_jobs;
  int64_t cols;
  const int8_t* qs;  // token t's codes at row t * terms (its lo codes at t * terms + 1)
  const qunits::Q8Scale* ds;
  int64_t n_tiles;  // over all jobs
};
// Token t's activations with S terms (quant_units.h).
template <int S> __device__ __forceinline__ qunits::Q8Row q8_row(const GemvArgs& a, int t) {
  return qunits::q8_row(a.qs, a.ds, t, a.cols, S);
}

// The job that holds `tile` (tiles below n_tiles).
__device__ __forceinline__ int job_of(const GemvArgs& a, int64_t tile) {
  int j = 0;
  while (j + 1 < a.n_jobs && tile >= a.jobs[j + 1].tile0) ++j;
  return j;
}

// Host: checks every job and lays out tiles of R rows (gpu/kernels_quant_gemv.cu).
GemvArgs gemv_args(const QuantGemvJob* jobs, int n_jobs, int64_t cols, int T, int terms, const void* workspace, int R);

// The launches; the workspace already holds the activations. The rows per
// tile each picks for (T, cols), then the launch of a.
int old_mmvq_rows_per_tile(int T, int64_t cols, int terms);
void launch_old_mmvq(const GemvArgs& a, int T, int terms, cudaStream_t stream);  // gpu/kernels_quant_gemv.cu
int new_mmvq_rows_per_tile(int T, int64_t cols, int terms);
void launch_new_mmvq(const GemvArgs& a, int T, int terms, int max_blocks, cudaStream_t stream);  // gpu/kernels_mmvq.cu

}  // namespace topkv::cuda
