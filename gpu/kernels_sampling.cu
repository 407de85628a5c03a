// Sampling from device logits, twins of topkv::argmax and of the plain
// temperature draw of Sampler::sample (src/model/sampler.h), so a decode loop
// can pick the next token without copying a 262k-entry logit row to the host.
//   argmax: per-block (max, lowest index) over a grid-stride slice, then one
//     block reduces the block winners. One pass over the logits.
//   temperature: block maxima (the argmax pass), block sums of
//     w_i = exp((l_i - max) / T) in double over contiguous chunks, then one
//     block finds the chunk where the running sum crosses u * total and scans
//     it (a block-wide prefix sum in double) for the first i past it. Two
//     passes over the logits, plus one chunk.
#include <cfloat>
#include <climits>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;
constexpr int kPickThreads = 1024;
static_assert(kPickThreads >= kMaxBlocks, "pick_kernel holds one chunk sum per thread");

struct Workspace {
  float* block_max;
  int32_t* block_arg;
  double* block_sum;
};
Workspace carve(void* ws) {
  auto* base = static_cast<unsigned char*>(ws);
  return {reinterpret_cast<float*>(base), reinterpret_cast<int32_t*>(base + kMaxBlocks * 4),
          reinterpret_cast<double*>(base + kMaxBlocks * 8)};
}
int blocks_for(int64_t n) { return (int)grid_for(n, kThreads * 4, kMaxBlocks); }

// (v, i) beats (bv, bi) when larger, or equal with a lower index.
__device__ __forceinline__ bool beats(float v, int32_t i, float bv, int32_t bi) {
  return v > bv || (v == bv && i < bi);
}

__device__ void block_argmax(float& v, int32_t& i) {
  __shared__ float sv[kThreads / 32];
  __shared__ int32_t si[kThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (beats(ov, oi, v, i)) v = ov, i = oi;
  }
  if (threadIdx.x % 32 == 0) sv[threadIdx.x / 32] = v, si[threadIdx.x / 32] = i;
  __syncthreads();
  if (threadIdx.x == 0)
    for (int w = 1; w < kThreads / 32; ++w)
      if (beats(sv[w], si[w], v, i)) v = sv[w], i = si[w];
}

// NaN never wins; -inf entries compete (an all -inf row gives index 0).
__global__ void block_argmax_kernel(const float* __restrict__ x, int64_t n, float* block_max, int32_t* block_arg) {
  float v = -INFINITY;
  int32_t i = INT_MAX;
  for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < n; j += (int64_t)gridDim.x * blockDim.x) {
    const float xj = x[j];
    if (!isnan(xj) && beats(xj, (int32_t)j, v, i)) v = xj, i = (int32_t)j;
  }
  block_argmax(v, i);
  if (threadIdx.x == 0) block_max[blockIdx.x] = v, block_arg[blockIdx.x] = i;
}

__global__ void final_argmax_kernel(const float* block_max, const int32_t* block_arg, int blocks, int32_t* result) {
  float v = -INFINITY;
  int32_t i = INT_MAX;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x)
    if (beats(block_max[b], block_arg[b], v, i)) v = block_max[b], i = block_arg[b];
  block_argmax(v, i);
  if (threadIdx.x == 0) *result = i == INT_MAX ? 0 : i;  // every logit NaN: index 0
}

__device__ __forceinline__ double tempered_weight(float logit, float mx, float temperature) {
  return exp((double)(logit - mx) / (double)temperature);  // as Sampler::sample computes it
}

// Max over the block maxima, computed by the whole block, returned to every thread.
__device__ float max_of_blocks(const float* block_max, int blocks) {
  __shared__ float red[32];
  __shared__ float result;
  float m = -INFINITY;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) m = fmaxf(m, block_max[b]);
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < (int)blockDim.x / 32; ++w) m = fmaxf(m, red[w]);
    result = m;
  }
  __syncthreads();
  return result;
}

// Inclusive prefix sum of one double per thread over the block (blockDim a
// multiple of 32, at most 1024); *total gets the block's sum. Ends synced.
__device__ double block_inclusive_scan(double v, double* total) {
  __shared__ double warp_tot[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const double y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  if (lane == 31) warp_tot[warp] = v;
  __syncthreads();
  double before = 0, all = 0;
  for (int w = 0; w < warps; ++w) {
    if (w < warp) before += warp_tot[w];
    all += warp_tot[w];
  }
  *total = all;
  __syncthreads();  // warp_tot may be reused by the next call
  return before + v;
}

// Block b sums the weights of the contiguous chunk [b*chunk, (b+1)*chunk).
__global__ void chunk_sums_kernel(const float* __restrict__ x, int64_t n, int64_t chunk, float temperature,
                                  const float* block_max, int blocks, double* block_sum) {
  __shared__ double red[kThreads / 32];
  const float mx = max_of_blocks(block_max, blocks);
  const int64_t lo = blockIdx.x * chunk, hi = min(n, lo + chunk);
  double s = 0;
  for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x)
    if (!isnan(x[j])) s += tempered_weight(x[j], mx, temperature);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = s;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) s += red[w];
    block_sum[blockIdx.x] = s;
  }
}

// One block of kPickThreads (>= kMaxBlocks): the first i whose running
// weight passes u * total. First the chunk (a scan over the chunk sums), then
// the logits from that chunk on, kPickThreads at a time; the chunk sums were
// added in another order, so the crossing may fall a little later.
__global__ void __launch_bounds__(kPickThreads) pick_kernel(const float* __restrict__ x, int64_t n, int64_t chunk,
                                                            float temperature, const float* block_max,
                                                            const double* block_sum, int blocks, double u,
                                                            int32_t* result) {
  __shared__ int found;
  const float mx = max_of_blocks(block_max, blocks);
  if (threadIdx.x == 0) found = INT_MAX;
  const double w_chunk = (int)threadIdx.x < blocks ? block_sum[threadIdx.x] : 0.0;
  double total;
  const double incl_chunk = block_inclusive_scan(w_chunk, &total);
  const double target = u * total;
  if ((int)threadIdx.x < blocks && incl_chunk > target) atomicMin(&found, (int)threadIdx.x);
  __syncthreads();
  const int b = found == INT_MAX ? blocks - 1 : found;
  __shared__ double base_sh;
  if ((int)threadIdx.x == b) base_sh = incl_chunk - w_chunk;  // sum of the chunks before b
  __syncthreads();
  double base = base_sh;
  if (threadIdx.x == 0) found = INT_MAX;
  __syncthreads();
  for (int64_t p0 = (int64_t)b * chunk; p0 < n; p0 += kPickThreads) {
    const int64_t j = p0 + threadIdx.x;
    const double w = j < n && !isnan(x[j]) ? tempered_weight(x[j], mx, temperature) : 0.0;
    double piece;
    const double incl = base + block_inclusive_scan(w, &piece);
    if (j < n && incl > target) atomicMin(&found, (int)threadIdx.x);
    __syncthreads();
    if (found != INT_MAX) {
      if (threadIdx.x == 0) *result = (int32_t)(p0 + found);
      return;
    }
    base += piece;
  }
  if (threadIdx.x == 0) *result = -1;
}

}  // namespace

size_t sampling_workspace_bytes(int64_t) { return (size_t)kMaxBlocks * 16; }

void argmax(const float* logits, int64_t n, int32_t* result, void* workspace, cudaStream_t stream) {
  TOPKV_CHECK(n > 0 && n < INT32_MAX, "argmax over {} logits: 1..2^31-1 supported", n);
  const Workspace ws = carve(workspace);
  const int blocks = blocks_for(n);
  block_argmax_kernel<<<blocks, kThreads, 0, stream>>>(logits, n, ws.block_max, ws.block_arg);
  TOPKV_CUDA_CHECK_LAUNCH();
  final_argmax_kernel<<<1, kThreads, 0, stream>>>(ws.block_max, ws.block_arg, blocks, result);
  TOPKV_CUDA_CHECK_LAUNCH();
}

void sample_temperature(const float* logits, int64_t n, float temperature, double u, int32_t* result,
                        void* workspace, cudaStream_t stream) {
  TOPKV_CHECK(n > 0 && n < INT32_MAX, "sampling over {} logits: 1..2^31-1 supported", n);
  TOPKV_CHECK(temperature > 0.f, "temperature sampling needs a temperature > 0, got {}", temperature);
  const Workspace ws = carve(workspace);
  const int blocks = blocks_for(n);
  block_argmax_kernel<<<blocks, kThreads, 0, stream>>>(logits, n, ws.block_max, ws.block_arg);
  TOPKV_CUDA_CHECK_LAUNCH();
  const int64_t chunk = (n + blocks - 1) / blocks;
  chunk_sums_kernel<<<blocks, kThreads, 0, stream>>>(logits, n, chunk, temperature, ws.block_max, blocks,
                                                     ws.block_sum);
  TOPKV_CUDA_CHECK_LAUNCH();
  pick_kernel<<<1, kPickThreads, 0, stream>>>(logits, n, chunk, temperature, ws.block_max, ws.block_sum, blocks,
                                              u, result);
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
