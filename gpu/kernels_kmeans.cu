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

// One block a cluster: its rows' sum and count, the rows taken in index order
// (the twin's order, so the sums are the twin's to the bit, and a call's
// result does not depend on the device's scheduling). A tile of labels at a
// time, each warp marks which of its 32 labels are this cluster's (a ballot
// word in shared memory); then every thread walks the words' set bits in
// order, adding the rows' dims t = threadIdx.x + m * kSumThreads.
constexpr int kSumThreads = 128, kSumDims = 8, kLabelTile = 4096, kTileWords = kLabelTile / 32;

__global__ void __launch_bounds__(kSumThreads)
    accumulate_kernel(const float* __restrict__ x, const int32_t* __restrict__ labels, int64_t n, int d,
                      float* __restrict__ sums, int32_t* __restrict__ counts) {
  __shared__ uint32_t word[kTileWords];
  const int j = blockIdx.x, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float acc[kSumDims];
#pragma unroll
  for (int m = 0; m < kSumDims; ++m) acc[m] = 0.f;
  int32_t count = 0;
  for (int64_t i0 = 0; i0 < n; i0 += kLabelTile) {
    __syncthreads();
    for (int w = warp; w < kTileWords; w += kSumThreads / 32) {
      const int64_t i = i0 + w * 32 + lane;
      const uint32_t b = __ballot_sync(0xffffffffu, i < n && labels[i] == j);
      if (lane == 0) word[w] = b;
    }
    __syncthreads();
    for (int w = 0; w < kTileWords; ++w)
      for (uint32_t b = word[w]; b; b &= b - 1) {
        ++count;
        const float* r = x + (size_t)(i0 + w * 32 + __ffs(b) - 1) * d;
#pragma unroll
        for (int m = 0; m < kSumDims; ++m) {
          const int t = threadIdx.x + m * kSumThreads;
          if (t < d) acc[m] += r[t];
        }
      }
  }
#pragma unroll
  for (int m = 0; m < kSumDims; ++m) {
    const int t = threadIdx.x + m * kSumThreads;
    if (t < d) sums[(size_t)j * d + t] = acc[m];
  }
  if (threadIdx.x == 0) counts[j] = count;
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

void kmeans_accumulate(const float* x, const int32_t* labels, int64_t n, int64_t k, int d, float* sums,
                       int32_t* counts, cudaStream_t stream) {
  TOPKV_CHECK(d >= 1 && d <= kSumThreads * kSumDims, "the GPU k-means sums rows of at most {} dims, not {}",
              kSumThreads * kSumDims, d);
  if (k == 0) return;
  accumulate_kernel<<<(unsigned)k, kSumThreads, 0, stream>>>(x, labels, n, d, sums, counts);
  TOPKV_CUDA_CHECK_LAUNCH();
}

void kmeans_normalise(const float* sums, int64_t k, int d, float* centroids, cudaStream_t stream) {
  if (k == 0) return;
  normalise_kernel<<<(unsigned)((k + kWarps - 1) / kWarps), kWarps * 32, 0, stream>>>(sums, k, d, centroids);
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
