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
// Grid: x = KV head, y = split of the head's row list (a multiple of
// kWarps * kUnroll rows), z = chunk of up to kMaxGroup query heads. A block's
// 4 warps take kUnroll consecutive list entries each a round (warp w: rows
// first + 16 j + 4 w ..+3), so a warp's rows of one Quest page lie back to
// back and q8_0 rows are read by whole lines (Q8Run, partial_block.cuh);
// lane i owns dims [i*DPL, (i+1)*DPL) of each row (DPL = head_dim / 32,
// contiguous so a lane's share is one or two 16-byte loads, or for q8_0 rows
// one block's scale and 2-byte code loads). Each warp keeps kUnroll rows'
// loads in flight before it does their math: row reads over PCIe take
// microseconds, and only loads in flight hide that.
// Per row and query head: s = warp_sum(q . k) (q pre-scaled), online softmax
// (m, l, o) in fp32 registers. The block's warps then merge their partials
// through shared memory and write one partial (m, l, o) per query head into
// slot part0 + split of the caller's partial arrays.
#include <algorithm>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"
#include "gpu/partial_block.cuh"

namespace topkv::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxGroup = 8;  // query heads a block carries (more: grid.z chunks)
constexpr int kUnroll = 4;    // rows per warp with loads in flight (retrieved rows come over PCIe: ~1 us a round trip)

template <class E, int HD>
__global__ void __launch_bounds__(kThreads) row_list_kernel(const RowListArgs a) {
  constexpr int DPL = HD / 32;
  __shared__ BlockPartials<HD, kWarps, kMaxGroup> sm;
  // Each warp's rows in flight (K and V) staged for the lanes' reads: q8_0 only (load_row_pairs).
  __shared__ __align__(16) uint8_t stage[kWarps][stage_run_bytes_of<E, HD, kUnroll>()];

  const int h = blockIdx.x, split = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g0 = blockIdx.z * kMaxGroup, ng = min(kMaxGroup, a.group - g0);
  const bool ring = a.k_ring != nullptr;
  const int pre = ring && a.k_prefix ? a.prefix_count : 0;  // ring mode: rows before the ring's
  const int count = ring ? pre + a.ring_count[h] : min(a.counts[h], a.max_rows);
  constexpr int kRound = kWarps * kUnroll;
  const int per = ((count + a.n_splits - 1) / a.n_splits + kRound - 1) / kRound * kRound;
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
  // Row addresses in bytes: E may be Q8Row (blocks), which has no element size.
  constexpr size_t RB = row_bytes_of<E, HD>();
  const void* const* kr = ring ? nullptr : a.k_rows + (size_t)h * a.max_rows;
  const void* const* vr = ring ? nullptr : a.v_rows + (size_t)h * a.max_rows;
  const uint8_t* ring_k = ring ? static_cast<const uint8_t*>(a.k_ring) + (size_t)h * a.ring_cap * RB : nullptr;
  const uint8_t* ring_v = ring ? static_cast<const uint8_t*>(a.v_ring) + (size_t)h * a.ring_cap * RB : nullptr;
  const int ring_first = ring ? a.ring_first[h] : 0;
  const uint8_t* pre_k = pre ? static_cast<const uint8_t*>(a.k_prefix) + (size_t)h * a.prefix_cap * RB : nullptr;
  const uint8_t* pre_v = pre ? static_cast<const uint8_t*>(a.v_prefix) + (size_t)h * a.prefix_cap * RB : nullptr;
  const auto row_at = [&](int rr, const void*& kp, const void*& vp) {
    if (!ring) kp = kr[rr], vp = vr[rr];
    else if (rr < pre) kp = pre_k + (size_t)rr * RB, vp = pre_v + (size_t)rr * RB;
    else kp = ring_k + (size_t)((ring_first + rr - pre) % a.ring_cap) * RB,
         vp = ring_v + (size_t)((ring_first + rr - pre) % a.ring_cap) * RB;
  };
  for (int r = first + warp * kUnroll; r < last; r += kRound) {
    const void* rp[2 * kUnroll];  // row r + u: K at 2u, V at 2u + 1
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      rp[2 * u] = rp[2 * u + 1] = nullptr;
      if (r + u < last) row_at(r + u, rp[2 * u], rp[2 * u + 1]);
    }
    float kv[2 * kUnroll][DPL];
    load_row_pairs<E, HD, kUnroll>(rp, lane, stage[warp], kv);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r + u >= last) break;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= ng) break;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) s = fmaf(q[g][i], kv[2 * u][i], s);
        online_add(warp_sum(s), kv[2 * u + 1], m[g], l[g], o[g]);
      }
    }
  }
  store_block_partials(sm, m, l, o, ng, (size_t)h * a.group + g0, a.part0 + split, a.parts, a.part_m, a.part_l,
                       a.part_o);
}

}  // namespace

void row_list_attention(const RowListArgs& a, cudaStream_t stream) {
  TOPKV_CHECK(a.n_kv >= 1 && a.group >= 1 && a.max_rows >= 0 && a.n_splits >= 1,
              "row-list attention: bad shape (kv heads {}, group {}, max rows {}, splits {})", a.n_kv, a.group,
              a.max_rows, a.n_splits);
  TOPKV_CHECK(!a.k_ring || (a.n_kv <= kMaxRingHeads && a.ring_cap >= 1 && a.v_ring),
              "row-list attention in ring mode: {} KV heads (at most {}), ring of {} rows", a.n_kv, kMaxRingHeads,
              a.ring_cap);
  TOPKV_CHECK(!a.k_prefix || (a.k_ring && a.v_prefix && a.prefix_count >= 0 && a.prefix_count <= a.prefix_cap),
              "row-list attention: a prefix of {} rows in {} (ring mode only)", a.prefix_count, a.prefix_cap);
  TOPKV_CHECK(a.part0 >= 0 && a.part0 + a.n_splits <= a.parts,
              "row-list attention writes partial slots {}..{} of {}", a.part0, a.part0 + a.n_splits - 1, a.parts);
  const dim3 grid((unsigned)a.n_kv, (unsigned)a.n_splits, (unsigned)((a.group + kMaxGroup - 1) / kMaxGroup));
  bool launched = false;
  const auto launch = [&](auto e) {
    using E = decltype(e);
    switch (a.head_dim) {
      case 64: row_list_kernel<E, 64><<<grid, kThreads, 0, stream>>>(a), launched = true; break;
      case 128: row_list_kernel<E, 128><<<grid, kThreads, 0, stream>>>(a), launched = true; break;
      case 256: row_list_kernel<E, 256><<<grid, kThreads, 0, stream>>>(a), launched = true; break;
      default: break;
    }
  };
  // 8-bit store rows (--store-type f8, q8_0) only here: the model's caches never hold them.
  with_store_type(a.row_type, launch);
  TOPKV_CHECK(launched, "row-list attention supports head_dim 64, 128 and 256, not {}", a.head_dim);
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
