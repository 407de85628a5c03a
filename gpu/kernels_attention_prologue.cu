// The end of a layer's attention input in one kernel, twin of the default
// Backend::attention_prologue (rms_norm over each head, rope, kv_write on the
// CPU backend). One block per token: the block computes cos/sin of its
// position once (in double, as rope_kernel: positions reach 1e6 and more),
// then each warp takes whole heads: QK-norm in registers, RoPE, and for a key
// head the rotated key and its value go into the cache slot. Decode (T = 1)
// launches one small kernel instead of five (two norms, two ropes, the write).
// Bound: latency; the bytes (q, k, v and the cache rows) are a few KiB.
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxHeadDim = 512;  // values of one head a warp keeps in registers: 16 per lane

struct RopeTable {
  double inv_freq[kMaxRopePairs];
};

template <class E>
__global__ void __launch_bounds__(kThreads)
    attention_prologue_kernel(float* __restrict__ q, float* __restrict__ k, const float* __restrict__ v, int n_head,
                              int n_kv, int head_dim, const float* __restrict__ q_norm,
                              const float* __restrict__ k_norm, float eps, int64_t pos0, const int64_t* dev_pos,
                              int neox, int half, const RopeTable rope, E* __restrict__ k_cache,
                              E* __restrict__ v_cache, int64_t capacity, int t_first_written) {
  __shared__ float cs[kMaxRopePairs], sn[kMaxRopePairs];
  const int t = blockIdx.x;
  const int64_t pos = (dev_pos ? *dev_pos : pos0) + t;
  for (int i = threadIdx.x; i < half; i += blockDim.x) {
    double s, c;
    sincos((double)pos * rope.inv_freq[i], &s, &c);
    cs[i] = (float)c, sn[i] = (float)s;
  }
  __syncthreads();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = kThreads / 32;
  constexpr int kPerLane = kMaxHeadDim / 32;
  for (int head = warp; head < n_head + n_kv; head += warps) {
    const bool is_k = head >= n_head;
    const int h = is_k ? head - n_head : head;
    float* x = is_k ? k + ((int64_t)t * n_kv + h) * head_dim : q + ((int64_t)t * n_head + h) * head_dim;
    const float* w = is_k ? k_norm : q_norm;
    // Lane j holds values j, j + 32, ... of the head.
    float val[kPerLane];
    float ss = 0.f;
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int d = lane + 32 * r;
      val[r] = d < head_dim ? x[d] : 0.f;
      ss = fmaf(val[r], val[r], ss);
    }
    if (w) {
      const float inv = 1.f / sqrtf(warp_sum(ss) / (float)head_dim + eps);
#pragma unroll
      for (int r = 0; r < kPerLane; ++r) {
        const int d = lane + 32 * r;
        if (d < head_dim) val[r] = val[r] * inv * w[d];
      }
    }
    // RoPE needs each value's partner, held by another lane: go through memory.
#pragma unroll
    for (int r = 0; r < kPerLane; ++r) {
      const int d = lane + 32 * r;
      if (d < head_dim) x[d] = val[r];
    }
    __syncwarp();
    const int stride = neox ? 1 : 2, other = neox ? half : 1;
    for (int i = lane; i < half; i += 32) {
      const float a0 = x[i * stride], b0 = x[i * stride + other];
      x[i * stride] = a0 * cs[i] - b0 * sn[i];
      x[i * stride + other] = a0 * sn[i] + b0 * cs[i];
    }
    __syncwarp();
    if (is_k && k_cache && t >= t_first_written) {
      const int64_t dst = ((int64_t)h * capacity + pos % capacity) * head_dim;
      const float* vr = v + ((int64_t)t * n_kv + h) * head_dim;
      for (int d = lane; d < head_dim; d += 32) {
        k_cache[dst + d] = from_float<E>(x[d]);
        v_cache[dst + d] = from_float<E>(vr[d]);
      }
    }
  }
}

}  // namespace

void attention_prologue(const AttentionPrologueArgs& a, cudaStream_t stream) {
  if (a.T <= 0) return;
  const int half = a.rope_n_rot / 2;
  TOPKV_CHECK(a.head_dim > 0 && a.head_dim <= kMaxHeadDim, "attention_prologue: head_dim {} is outside 1..{}",
              a.head_dim, kMaxHeadDim);
  TOPKV_CHECK(half >= 0 && half <= kMaxRopePairs && a.rope_n_rot <= a.head_dim,
              "RoPE over {} dims of a {}-dim head: the CUDA kernel rotates at most {} dims, within the head",
              a.rope_n_rot, a.head_dim, 2 * kMaxRopePairs);
  RopeTable table{};
  for (int i = 0; i < half; ++i) table.inv_freq[i] = a.inv_freq[i];
  // T > capacity: sequential writes would leave the last `capacity` tokens (as kv_write).
  const int t_first = a.k_cache && (int64_t)a.T > a.capacity ? a.T - (int)a.capacity : 0;
  with_elem_type(a.cache_type, [&](auto e) {
    using E = decltype(e);
    attention_prologue_kernel<E><<<a.T, kThreads, 0, stream>>>(
        a.q, a.k, a.v, a.n_head, a.n_kv, a.head_dim, a.q_norm, a.k_norm, a.eps, a.pos0, a.dev_pos,
        a.rope_style == RopeStyle::NeoX ? 1 : 0, half, table, static_cast<E*>(a.k_cache), static_cast<E*>(a.v_cache),
        a.capacity, t_first);
  });
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
