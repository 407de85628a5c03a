// Device pieces shared by the kernels that build attention partials from rows
// (kernels_rows_attention.cu, kernels_summary_search.cu): a lane's share of
// a row in fp32, one query head's online-softmax update, and the block
// epilogue that merges its warps' partials and writes one (m, l, o) per
// query head. Included by .cu files only.
#pragma once
#include <type_traits>

#include "gpu/cuda_common.cuh"

namespace topkv::cuda {

// Lane's N contiguous elements at p as fp32 (16-byte loads where they fit).
// 16-bit elements in 4- or 8-byte loads where 16 do not fit (head_dim 128 or
// 64 over a warp: 4 or 2 elements a lane): one load instead of one per element
// (the quest score kernel read its f16 page bounds at 1.4 TB/s with 2-byte loads).
template <class E> __device__ __forceinline__ float2 pair_to_float2(uint32_t w) {
  if constexpr (std::is_same_v<E, __half>) return __half22float2(*reinterpret_cast<const __half2*>(&w));
  else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

template <class E, int N> __device__ __forceinline__ void load_lane(const E* p, float* out) {
  constexpr int bytes = N * (int)sizeof(E);
  constexpr bool pairs = sizeof(E) == 2;  // __half or __nv_bfloat16
  if constexpr (bytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i) Vec16<E>::load(p + i * Vec16<E>::n, out + i * Vec16<E>::n);
  } else if constexpr (pairs && bytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    const float2 a = pair_to_float2<E>(v.x), b = pair_to_float2<E>(v.y);
    out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
  } else if constexpr (pairs && bytes == 4) {
    const float2 a = pair_to_float2<E>(*reinterpret_cast<const uint32_t*>(p));
    out[0] = a.x, out[1] = a.y;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}

// (m, l, o) <- (m, l, o) + one row of logit s and value share v (this lane's DPL dims).
template <int DPL>
__device__ __forceinline__ void online_add(float s, const float (&v)[DPL], float& m, float& l, float (&o)[DPL]) {
  const float m_new = fmaxf(m, s), c = __expf(m - m_new), p = __expf(s - m_new);
  l = l * c + p;
#pragma unroll
  for (int i = 0; i < DPL; ++i) o[i] = fmaf(p, v[i], o[i] * c);
  m = m_new;
}

template <int HD, int kWarps, int kMaxGroup> struct BlockPartials {
  float m[kWarps][kMaxGroup], l[kWarps][kMaxGroup], o[kWarps][kMaxGroup][HD];
};

// Each warp holds partials for ng query heads (lane owns dims [lane*DPL, +DPL));
// the block merges them exactly and writes the partial of query head
// row0 + g into slot row * parts + slot of part_m/l [rows][parts] and
// part_o [rows][parts][HD]. Every thread of the block must call it.
template <int HD, int kWarps, int kMaxGroup, int DPL>
__device__ void store_block_partials(BlockPartials<HD, kWarps, kMaxGroup>& sm, const float (&m)[kMaxGroup],
                                     const float (&l)[kMaxGroup], const float (&o)[kMaxGroup][DPL], int ng,
                                     size_t row0, int slot, int parts, float* part_m, float* part_l,
                                     float* part_o) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= ng) break;
    if (lane == 0) sm.m[warp][g] = m[g], sm.l[warp][g] = l[g];
#pragma unroll
    for (int i = 0; i < DPL; ++i) sm.o[warp][g][lane * DPL + i] = o[g][i];
  }
  __syncthreads();
  for (int g = 0; g < ng; ++g) {
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w)
      if (sm.l[w][g] > 0.f) M = fmaxf(M, sm.m[w][g]);
    float f[kWarps], L = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      f[w] = sm.l[w][g] > 0.f ? __expf(sm.m[w][g] - M) : 0.f;
      L += sm.l[w][g] * f[w];
    }
    const size_t at = (row0 + g) * parts + slot;
    if (threadIdx.x == 0) part_m[at] = M, part_l[at] = L;
    for (int d = threadIdx.x; d < HD; d += kWarps * 32) {
      float acc = 0.f;
      for (int w = 0; w < kWarps; ++w) acc = fmaf(sm.o[w][g][d], f[w], acc);
      part_o[at * HD + d] = acc;
    }
  }
}

}  // namespace topkv::cuda
