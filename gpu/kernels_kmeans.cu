// The GPU k-means's own kernels (gpu/gpu_kmeans.cpp runs the products in
// cuBLAS): a row's label from its scores, the clusters' sums, and the
// centroids from them. Twin: LloydKMeans (index/kmeans.h), step by step.
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kWarps = 8;

// One warp a row: the largest score, the lowest index among equal ones (as
// the twin's strict `>` over ascending j).
__global__ void __launch_bounds__(kWarps * 32)
    argmax_rows_kernel(const float* __restrict__ scores, int64_t n, int k, int32_t* __restrict__ labels) {
  const int64_t i = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (i >= n) return;
  const float* row = scores + i * k;
  float best = -INFINITY;
  int arg = k;  // larger than any index: loses every tie
  for (int j = lane; j < k; j += 32) {
    const float s = row[j];
    if (s > best) best = s, arg = j;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, off);
    const int oa = __shfl_xor_sync(0xffffffffu, arg, off);
    if (ob > best || (ob == best && oa < arg)) best = ob, arg = oa;
  }
  if (lane == 0) labels[i] = arg < k ? arg : 0;  // a row of NaN scores: cluster 0, as the twin's
}

// sums[labels[i]][t] += x[i][t]: a thread per element, in float atomics (the
// order of the additions is the device's: sums equal the twin's to rounding).
__global__ void accumulate_kernel(const float* __restrict__ x, const int32_t* __restrict__ labels, int64_t n, int d,
                                  float* __restrict__ sums) {
  const int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (e >= n * d) return;
  const int64_t i = e / d;
  const int t = (int)(e - i * d);
  atomicAdd(&sums[(size_t)labels[i] * d + t], x[e]);
}

// One warp a centroid: sums_j / |sums_j| where the norm is positive; else the
// centroid stays.
__global__ void __launch_bounds__(kWarps * 32)
    normalise_kernel(const float* __restrict__ sums, int64_t k, int d, float* __restrict__ centroids) {
  const int64_t j = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (j >= k) return;
  const float* s = sums + j * d;
  float sq = 0.f;
  for (int t = lane; t < d; t += 32) sq = fmaf(s[t], s[t], sq);
  sq = warp_sum(sq);
  const float nrm = sqrtf(sq);
  if (!(nrm > 0.f)) return;
  for (int t = lane; t < d; t += 32) centroids[j * d + t] = s[t] / nrm;
}

}  // namespace

void kmeans_argmax_rows(const float* scores, int64_t n, int k, int32_t* labels, cudaStream_t stream) {
  if (n == 0) return;
  argmax_rows_kernel<<<(unsigned)((n + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(scores, n, k, labels);
  TOPKV_CUDA_CHECK_LAUNCH();
}

void kmeans_accumulate(const float* x, const int32_t* labels, int64_t n, int d, float* sums, cudaStream_t stream) {
  if (n == 0) return;
  const int64_t e = n * d;
  accumulate_kernel<<<(unsigned)((e + 255) / 256), 256, 0, stream>>>(x, labels, n, d, sums);
  TOPKV_CUDA_CHECK_LAUNCH();
}

void kmeans_normalise(const float* sums, int64_t k, int d, float* centroids, cudaStream_t stream) {
  if (k == 0) return;
  normalise_kernel<<<(unsigned)((k + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(sums, k, d, centroids);
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
