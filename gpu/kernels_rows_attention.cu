// Partial attention over rows given by pointer: the offloaded decode's
// retrieved rows (DESIGN.md, "One decode step"). Twin of partial_add /
// partial_add_rows (gpu/partial_attention.h) applied to the same rows.
//
// Rows are addressed one pointer per row, so one kernel serves every place a
// row can live: the pinned host store read in place over PCIe (mapped
// memory: host and device share the address), a staged device copy of
// gathered rows, or the device's sinks + window. The rows of one KV head are
// read once for all of its query heads (GQA group), which for rows read over
// PCIe is what matters.
//
// Grid: x = KV head, y = split of the head's row list, z = chunk of up to
// kMaxGroup query heads. A block's 4 warps take rows r = first + warp,
// + 4, ...; lane i owns dims [i*DPL, (i+1)*DPL) of each row (DPL = head_dim
// / 32, contiguous so a lane's share is one or two 16-byte loads). Each warp
// keeps kUnroll rows' loads in flight before it does their math: row reads
// over PCIe take microseconds, and only loads in flight hide that.
// Per row and query head: s = warp_sum(q . k) (q pre-scaled), online softmax
// (m, l, o) in fp32 registers. The block's warps then merge their partials
// through shared memory and write one partial (m, l, o) per query head into
// slot part0 + split of the caller's partial arrays.
#include <algorithm>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxGroup = 8;  // query heads a block carries (more: grid.z chunks)
constexpr int kUnroll = 2;    // rows per warp with loads in flight

// Lane's N contiguous elements at p as fp32 (16-byte loads where they fit).
template <class E, int N> __device__ __forceinline__ void load_lane(const E* p, float* out) {
  constexpr int bytes = N * (int)sizeof(E);
  if constexpr (bytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i) Vec16<E>::load(p + i * Vec16<E>::n, out + i * Vec16<E>::n);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}

template <class E, int HD>
__global__ void __launch_bounds__(kThreads) row_list_kernel(const RowListArgs a) {
  constexpr int DPL = HD / 32;
  __shared__ float sm_m[kWarps][kMaxGroup], sm_l[kWarps][kMaxGroup];
  __shared__ float sm_o[kWarps][kMaxGroup][HD];

  const int h = blockIdx.x, split = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g0 = blockIdx.z * kMaxGroup, ng = min(kMaxGroup, a.group - g0);
  const int count = min(a.counts[h], a.max_rows);
  const int per = (count + a.n_splits - 1) / a.n_splits;
  const int first = split * per, last = min(count, first + per);

  float q[kMaxGroup][DPL], m[kMaxGroup], l[kMaxGroup], o[kMaxGroup][DPL];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) {
      o[g][i] = 0.f;
      q[g][i] = g < ng ? a.q[((size_t)h * a.group + g0 + g) * HD + lane * DPL + i] * a.scale : 0.f;
    }
  }
  const void* const* kr = a.k_rows + (size_t)h * a.max_rows;
  const void* const* vr = a.v_rows + (size_t)h * a.max_rows;
  for (int r = first + warp; r < last; r += kWarps * kUnroll) {
    float kf[kUnroll][DPL], vf[kUnroll][DPL];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int rr = r + u * kWarps;
      if (rr < last) {
        load_lane<E, DPL>(static_cast<const E*>(kr[rr]) + lane * DPL, kf[u]);
        load_lane<E, DPL>(static_cast<const E*>(vr[rr]) + lane * DPL, vf[u]);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r + u * kWarps >= last) break;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= ng) break;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s = fmaf(q[g][i], kf[u][i], s);
        s = warp_sum(s);
        const float m_new = fmaxf(m[g], s), c = __expf(m[g] - m_new), p = __expf(s - m_new);
        l[g] = l[g] * c + p;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[g][i] = fmaf(p, vf[u][i], o[g][i] * c);
        m[g] = m_new;
      }
    }
  }
  // Merge the warps' partials.
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= ng) break;
    if (lane == 0) sm_m[warp][g] = m[g], sm_l[warp][g] = l[g];
#pragma unroll
    for (int i = 0; i < DPL; ++i) sm_o[warp][g][lane * DPL + i] = o[g][i];
  }
  __syncthreads();
  for (int g = 0; g < ng; ++g) {
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w)
      if (sm_l[w][g] > 0.f) M = fmaxf(M, sm_m[w][g]);
    float f[kWarps], L = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      f[w] = sm_l[w][g] > 0.f ? __expf(sm_m[w][g] - M) : 0.f;
      L += sm_l[w][g] * f[w];
    }
    const size_t row = (size_t)h * a.group + g0 + g, slot = row * a.parts + a.part0 + split;
    if (threadIdx.x == 0) a.part_m[slot] = M, a.part_l[slot] = L;
    for (int d = threadIdx.x; d < HD; d += kThreads) {
      float acc = 0.f;
      for (int w = 0; w < kWarps; ++w) acc = fmaf(sm_o[w][g][d], f[w], acc);
      a.part_o[slot * HD + d] = acc;
    }
  }
}

}  // namespace

void row_list_attention(const RowListArgs& a, cudaStream_t stream) {
  TOPKV_CHECK(a.n_kv >= 1 && a.group >= 1 && a.max_rows >= 0 && a.n_splits >= 1,
              "row-list attention: bad shape (kv heads {}, group {}, max rows {}, splits {})", a.n_kv, a.group,
              a.max_rows, a.n_splits);
  TOPKV_CHECK(a.part0 >= 0 && a.part0 + a.n_splits <= a.parts,
              "row-list attention writes partial slots {}..{} of {}", a.part0, a.part0 + a.n_splits - 1, a.parts);
  const dim3 grid((unsigned)a.n_kv, (unsigned)a.n_splits, (unsigned)((a.group + kMaxGroup - 1) / kMaxGroup));
  bool launched = false;
  with_elem_type(a.row_type, [&](auto e) {
    using E = decltype(e);
    switch (a.head_dim) {
      case 64: row_list_kernel<E, 64><<<grid, kThreads, 0, stream>>>(a), launched = true; break;
      case 128: row_list_kernel<E, 128><<<grid, kThreads, 0, stream>>>(a), launched = true; break;
      case 256: row_list_kernel<E, 256><<<grid, kThreads, 0, stream>>>(a), launched = true; break;
      default: break;
    }
  });
  TOPKV_CHECK(launched, "row-list attention supports head_dim 64, 128 and 256, not {}", a.head_dim);
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
