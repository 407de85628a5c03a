// RMSNorm and RoPE on the device, twins of CpuBackend::rms_norm / rope.
//   rms_norm: rows of up to 1024 values get one warp each (QK-norm: T*heads
//     rows of head_dim), wider rows (the model width) one block of 256
//     threads; sum of squares in fp32, then one pass that scales. Memory-bound:
//     8 bytes per value (read + write), the second read hits L1.
//   rope: one block per token; the block computes cos/sin of its position for
//     the n_rot/2 pairs once, in double (positions reach 1e6 and more, where
//     an fp32 angle would be off by radians), then rotates every head.
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kNormThreads = 256;

// WARPS_PER_ROW warps share a row; a block of 256 threads holds
// 8 / WARPS_PER_ROW rows. out may alias x: every thread reads the values it
// writes, and the sum is complete before any write.
template <int WARPS_PER_ROW>
__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const float* x, const float* __restrict__ w,
                                                                int64_t rows, int dim, float eps, float* out) {
  constexpr int kRowsPerBlock = kNormThreads / 32 / WARPS_PER_ROW;
  constexpr int kRowThreads = 32 * WARPS_PER_ROW;
  __shared__ float partial[kNormThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int local_row = warp / WARPS_PER_ROW, tid = threadIdx.x % kRowThreads;
  const int64_t row = (int64_t)blockIdx.x * kRowsPerBlock + local_row;
  const bool active = row < rows;
  const float* xr = x + row * dim;
  float ss = 0.f;
  if (active)
    for (int i = tid; i < dim; i += kRowThreads) ss = fmaf(xr[i], xr[i], ss);
  ss = warp_sum(ss);
  if constexpr (WARPS_PER_ROW > 1) {
    if (lane == 0) partial[warp] = ss;
    __syncthreads();
    ss = 0.f;
#pragma unroll
    for (int i = 0; i < WARPS_PER_ROW; ++i) ss += partial[local_row * WARPS_PER_ROW + i];
  }
  if (!active) return;
  const float inv = 1.f / sqrtf(ss / (float)dim + eps);
  float* o = out + row * dim;
  for (int i = tid; i < dim; i += kRowThreads) o[i] = xr[i] * inv * w[i];
}

struct RopeFreqs {
  double inv_freq[kMaxRopePairs];
};

// Block per token. Pair i of a head is (2i, 2i+1) for Interleaved, (i, i+half)
// for NeoX; dims past n_rot are left alone.
__global__ void rope_kernel(float* x, int n_heads, int head_dim, int64_t pos0, const int64_t* dev_pos, int neox,
                            int half, const RopeFreqs freqs) {
  __shared__ float cs[kMaxRopePairs], sn[kMaxRopePairs];
  const int t = blockIdx.x;
  const double pos = (double)((dev_pos ? *dev_pos : pos0) + t);
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos(pos * freqs.inv_freq[i], &s, &c);
    cs[i] = (float)c, sn[i] = (float)s;
  }
  __syncthreads();
  const int stride = neox ? 1 : 2, other = neox ? half : 1;
  float* xt = x + (int64_t)t * n_heads * head_dim;
  for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx % half;
    float* v = xt + (int64_t)h * head_dim;
    const float a0 = v[i * stride], b0 = v[i * stride + other];
    v[i * stride] = a0 * cs[i] - b0 * sn[i];
    v[i * stride + other] = a0 * sn[i] + b0 * cs[i];
  }
}

}  // namespace

void rms_norm(const float* x, const float* w, int64_t rows, int dim, float eps, float* out, cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return;
  if (dim <= 1024) {
    constexpr int kRowsPerBlock = kNormThreads / 32;
    rms_norm_kernel<1><<<(unsigned)((rows + kRowsPerBlock - 1) / kRowsPerBlock), kNormThreads, 0, stream>>>(
        x, w, rows, dim, eps, out);
  } else {
    TOPKV_CHECK(rows < (int64_t)1 << 31, "rms_norm over {} rows is too large for one launch", rows);
    rms_norm_kernel<8><<<(unsigned)rows, kNormThreads, 0, stream>>>(x, w, rows, dim, eps, out);
  }
  TOPKV_CUDA_CHECK_LAUNCH();
}

void rope(float* x, int T, int n_heads, int head_dim, int64_t pos0, RopeStyle style, int n_rot,
          const double* inv_freq, cudaStream_t stream, const int64_t* dev_pos) {
  const int half = n_rot / 2;
  if (T <= 0 || half <= 0) return;
  TOPKV_CHECK(half <= kMaxRopePairs && n_rot <= head_dim,
              "RoPE over {} dims of a {}-dim head: the CUDA kernel rotates at most {} dims, within the head", n_rot,
              head_dim, 2 * kMaxRopePairs);
  RopeFreqs f{};
  for (int i = 0; i < half; ++i) f.inv_freq[i] = inv_freq[i];
  rope_kernel<<<T, 256, 0, stream>>>(x, n_heads, head_dim, pos0, dev_pos, style == RopeStyle::NeoX ? 1 : 0, half,
                                     f);
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
