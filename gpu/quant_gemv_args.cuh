// The arguments of the MMVQ kernels (gpu/kernels_quant_gemv.cu: the old one,
// gpu/kernels_mmvq.cu: the new one), shared by both: the jobs of a launch and
// the q8_1 activations. A tile is R consecutive rows of one job (R fixed per
// launch); tiles are numbered job after job. Included by .cu files only.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu/cuda_quant.h"

namespace topkv::cuda {

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
  const int8_t* qs;
  const qunits::Q8Scale* ds;
  int64_t n_tiles;  // over all jobs
};

// The job that holds `tile` (tiles below n_tiles).
__device__ __forceinline__ int job_of(const GemvArgs& a, int64_t tile) {
  int j = 0;
  while (j + 1 < a.n_jobs && tile >= a.jobs[j + 1].tile0) ++j;
  return j;
}

// Host: checks every job and lays out tiles of R rows (gpu/kernels_quant_gemv.cu).
GemvArgs gemv_args(const QuantGemvJob* jobs, int n_jobs, int64_t cols, int T, const void* workspace, int R);

// The launches; the workspace already holds the activations. The rows per
// tile each picks for (T, cols), then the launch of a.
int old_mmvq_rows_per_tile(int T, int64_t cols);
void launch_old_mmvq(const GemvArgs& a, int T, cudaStream_t stream);  // gpu/kernels_quant_gemv.cu
int new_mmvq_rows_per_tile(int T, int64_t cols);
void launch_new_mmvq(const GemvArgs& a, int T, int max_blocks, cudaStream_t stream);  // gpu/kernels_mmvq.cu

}  // namespace topkv::cuda
