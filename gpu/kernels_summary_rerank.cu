// The device search's rerank step (cuda_kernels.h, summary_search, step 3b):
// the groups a query head's cut took at R times the budget are candidates;
// their rows are scored exactly and each query head keeps its k best.
//
// Why: a centroid scores a cluster's keys together, and where look-alike keys
// share clusters (RULER's multi-key needles) a budget of whole clusters fills
// with the wrong ones; ranking the candidates' rows exactly picks the needle
// as exact top-k does (the top-k paper's exact top-k, Sec. 3.2), for R·k
// dot products instead of n. The
// host search does the same (index/cluster_index.h, rerank=R); this is its
// device twin, so rerank runs at device-search speed.
//
// Three launches: scores (candidate rows read once per KV head, for all of
// its query heads: rows over PCIe are what costs), a cut per query head
// (radix select, summary_search_work.cuh), and keep (per KV head, a block
// scan of the kept flags writes the lists in candidate order and marks the
// groups with a kept row as selected, so the far field takes the others).
// With far_dropped the scores kernel also keeps every query head's q.k of
// every candidate (row_dots; the far kernel's logits for the rows no head
// keeps) and keep marks each candidate listed or not (cand_listed).
#include <cub/block/block_scan.cuh>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"
#include "gpu/partial_block.cuh"
#include "gpu/summary_search_work.cuh"

namespace topkv::cuda::summary_work {
namespace {

constexpr int kWarps = 8, kUnroll = 4;  // a warp scores kUnroll candidate rows with their loads in flight
constexpr int kScanItems = 16;

// Whether query head `row`'s cut took group j (summary_search step 2).
__device__ __forceinline__ bool taken(const SummarySearchArgs& a, const Work& w, int row, uint32_t j) {
  return score_key(w.scores[(size_t)row * a.max_n + j], w.lo[row], w.inv[row]) >= w.cut[row];
}

// Grid: x = kWarps * kUnroll candidates, y = KV head, z = chunk of query
// heads. Lane i owns dims [i*DPL, (i+1)*DPL) as in the scoring kernel.
template <class E, int HD>
__global__ void __launch_bounds__(kWarps * 32) rerank_score_kernel(const SummarySearchArgs a, Work w) {
  constexpr int DPL = HD / 32;
  __shared__ __align__(16) float sq[kMaxGroup][HD];
  __shared__ __align__(16) uint8_t stage[kWarps][stage_bytes_of<E, HD, kUnroll>()];  // q8_0 rows (load_rows_lanes)
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g0 = blockIdx.z * kMaxGroup, ng = min(kMaxGroup, a.group - g0);
  const int count = w.cand_count[h];
  load_block_queries<HD>(sq, a, h, g0, ng);
  const int r0 = (blockIdx.x * kWarps + warp) * kUnroll;
  if (r0 >= count) return;
  const void* const* kr = w.cand_k + (size_t)h * w.cand_cap;
  const uint32_t* grp = w.cand_group + (size_t)h * w.cand_cap;
  const void* rp[kUnroll];
  uint32_t j[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    rp[u] = r0 + u < count ? kr[r0 + u] : nullptr;
    j[u] = r0 + u < count ? grp[r0 + u] : 0;
  }
  float kf[kUnroll][DPL];
  load_rows_lanes<E, HD>(rp, lane, stage[warp], kf);
  float lo = INFINITY, hi = -INFINITY;  // lane g < ng: query head g's, over its candidates
  for (int g = 0; g < ng; ++g) {
    const int row = h * a.group + g0 + g;
    float q[DPL];
    load_lane<float, DPL>(&sq[g][lane * DPL], q);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (r0 + u >= count) break;
      float s = 0.f;
#pragma unroll
      for (int i = 0; i < DPL; ++i) s = fmaf(q[i], kf[u][i], s);
      s = warp_sum(s);
      const bool mine = taken(a, w, row, j[u]);  // the same for the whole warp
      if (mine && lane == g) lo = fminf(lo, s), hi = fmaxf(hi, s);
      if (lane == 0) w.row_scores[(size_t)row * w.cand_cap + r0 + u] = mine ? s : -INFINITY;
      if (lane == 0 && w.row_dots) w.row_dots[(size_t)row * w.cand_cap + r0 + u] = s;
    }
  }
  publish_range(w.row_minmax, a, h, g0, ng, lane, lo, hi);
}

// Per query head (one block each): the cut of rerank_k rows over its
// candidates (weight 1; the others weigh 0).
__global__ void __launch_bounds__(kSelectThreads) rerank_threshold_kernel(const SummarySearchArgs a, Work w) {
  const int row = blockIdx.x, h = row / a.group;
  const int n = w.cand_count[h];
  const float* x = w.row_scores + (size_t)row * w.cand_cap;
  const KeyScale ks = key_scale(w.row_minmax, a.n_kv * a.group, row, true);  // no candidate: lo, hi NaN
  const uint32_t cut = radix_cut(
      n, [&](int t) { return x[t]; }, [&](int t) { return x[t] != -INFINITY ? 1u : 0u; }, need_of(a.rerank_k),
      ks.lo, ks.inv);
  if (threadIdx.x == 0) w.row_lo[row] = ks.lo, w.row_inv[row] = ks.inv, w.row_cut[row] = cut;
}

__device__ __forceinline__ bool kept(const SummarySearchArgs& a, const Work& w, int h, int t) {
  for (int g = 0; g < a.group; ++g) {
    const int row = h * a.group + g;
    const float s = w.row_scores[(size_t)row * w.cand_cap + t];
    if (s != -INFINITY && score_key(s, w.row_lo[row], w.row_inv[row]) >= w.row_cut[row]) return true;
  }
  return false;
}

// Per KV head (one block): the groups of every candidate unselected, then
// the kept rows' pointers written in candidate order (at most cap) and
// their groups selected again.
__global__ void __launch_bounds__(kSelectThreads) rerank_keep_kernel(const SummarySearchArgs a, Work w) {
  using Scan = cub::BlockScan<uint32_t, kSelectThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int h = blockIdx.x, n = w.cand_count[h];
  const uint32_t* grp = w.cand_group + (size_t)h * w.cand_cap;
  uint8_t* sel = w.selected + (size_t)h * a.max_n;
  for (int t = threadIdx.x; t < n; t += kSelectThreads) sel[grp[t]] = 0;
  __syncthreads();  // every clear before any set (one block owns the head's groups)
  const uint32_t cap = (uint32_t)a.cap;
  uint32_t running = 0;
  for (int tile = 0; tile < n; tile += kSelectThreads * kScanItems) {
    const int first = tile + (int)threadIdx.x * kScanItems;
    uint32_t v[kScanItems], x[kScanItems], total;
#pragma unroll
    for (int i = 0; i < kScanItems; ++i) v[i] = first + i < n && kept(a, w, h, first + i) ? 1u : 0u;
    Scan(tmp).ExclusiveSum(v, x, total);
#pragma unroll
    for (int i = 0; i < kScanItems; ++i) {
      const uint32_t at = running + x[i];
      const size_t from = (size_t)h * w.cand_cap + first + i, to = (size_t)h * a.cap + at;
      if (w.cand_listed && first + i < n) w.cand_listed[from] = v[i] && at < cap;
      if (!v[i] || at >= cap) continue;
      a.k_rows[to] = w.cand_k[from];
      a.v_rows[to] = w.cand_v[from];
      sel[grp[first + i]] = 1;
    }
    running += total;
    __syncthreads();  // tmp is reused by the next tile
  }
  if (threadIdx.x == 0) a.counts[h] = (int32_t)min(running, cap);
}

}  // namespace

void summary_rerank(const SummarySearchArgs& a, const Work& w, cudaStream_t stream) {
  const size_t rows = (size_t)a.n_kv * a.group;
  reset_ranges(w.row_minmax, rows, stream);
  const int per_block = kWarps * kUnroll;
  const dim3 grid((unsigned)((w.cand_cap + per_block - 1) / per_block), (unsigned)a.n_kv,
                  (unsigned)((a.group + kMaxGroup - 1) / kMaxGroup));
  const auto launch = [&](auto e) {
    using E = decltype(e);
    with_head_dim(a.head_dim, [&](auto hd) { rerank_score_kernel<E, hd()><<<grid, kWarps * 32, 0, stream>>>(a, w); });
  };
  // The store's rows: 8-bit (--store-type f8, q8_0) or a model cache type.
  with_store_type(a.store_type, launch);
  TOPKV_CUDA_CHECK_LAUNCH();
  rerank_threshold_kernel<<<(unsigned)rows, kSelectThreads, 0, stream>>>(a, w);
  TOPKV_CUDA_CHECK_LAUNCH();
  rerank_keep_kernel<<<(unsigned)a.n_kv, kSelectThreads, 0, stream>>>(a, w);
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda::summary_work
