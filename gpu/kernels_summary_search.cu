// The search of a summary index on the device (cuda_kernels.h,
// summary_search): score every group, cut each query head's budget with a
// radix select, gather the selected groups' rows, and attend to the rest as
// Multipole far rows. RetroInfer-style: the centroid table lives on the GPU,
// only the chosen rows are read from host memory, and the host is not in the
// loop at all. Two levels (page bounds, quest:coarse_ratio): the coarse
// table is scored and cut first, and the steps after walk the list of the
// pages below the coarse pages taken (1b, 3').
//
// Launches a layer: one level score, cut (a cluster a query head past 8,192
// groups where the SMs hold them: 2b), mark, write (+ rerank, far:
// kernels_summary_rerank.cu, kernels_summary_far.cu);
// two levels coarse score, coarse cut, expand, score, cut, gather. All but
// the cluster cut go out with programmatic dependent launch
// (launch_dependent, gpu/cuda_common.cuh), each waiting first thing.
//
// Work space and the shared pieces: gpu/summary_search_work.cuh.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <algorithm>
#include <type_traits>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"
#include "gpu/partial_block.cuh"
#include "gpu/summary_search_work.cuh"

namespace topkv::cuda {
namespace {

using namespace summary_work;

constexpr int kScoreWarps = 8, kScoreRows = 4;  // a scoring warp: `iters` x kScoreRows groups a block stride
// A table the size of a long context's: 4 rounds a warp (fewer blocks); a
// short one (the coarse level, the listed groups): 1, so that its few rows
// spread over more SMs.
constexpr int kScoreItersLong = 4, kScoreItersShort = 1, kShortBlocks = 64;

// 1. Scores (the cut finds their range itself). Warp w of block
// b takes `iters` rounds of kScoreRows groups (loads in flight together),
// blocks striding over the table by the grid; lane i owns dims [i*DPL, (i+1)*DPL) (of both halves for page
// bounds). The block's queries sit in shared memory, not registers: with
// them in registers (141 per thread) one warp in eight could run, and the
// table streamed at an eighth of the bandwidth (ncu, H100).
// `coarse`: the coarse level's rows (two levels), else the fine groups
// (those listed, with two levels).
template <class E, int HD, bool PAGES>
__global__ void __launch_bounds__(kScoreWarps * 32)
    score_kernel(const SummarySearchArgs a, Work w, bool coarse, int iters) {
  grid_dependency_wait();  // launch_dependent: the work space and q are the earlier kernels'
  constexpr int DPL = HD / 32, LEN = PAGES ? 2 * HD : HD;
  __shared__ __align__(16) float sq[kMaxGroup][HD];
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g0 = blockIdx.z * kMaxGroup, ng = min(kMaxGroup, a.group - g0);
  const GroupView head = group_view(a, w, h, coarse);
  const int per_block = kScoreWarps * kScoreRows * iters;
  if ((int)blockIdx.x * per_block >= head.n) return;  // the whole block: no sync after
  load_block_queries<HD>(sq, a, h, g0, ng);
  if constexpr (std::is_same_v<E, int8_t>) {  // i8: q.(s*c) = (q*s).c, the scales folded into the queries once
    for (int i = threadIdx.x; i < ng * HD; i += blockDim.x) sq[i / HD][i % HD] *= head.scale[i % HD];
    __syncthreads();
  }
  for (int b = blockIdx.x; b * per_block < head.n; b += gridDim.x)
  for (int it = 0; it < iters; ++it) {
    const int j0 = (b * kScoreWarps + warp) * kScoreRows * iters + it * kScoreRows;
    if (j0 >= head.n) break;
    float r[kScoreRows][DPL], r2[kScoreRows][PAGES ? DPL : 1];
#pragma unroll
    for (int u = 0; u < kScoreRows; ++u) {
      if (j0 + u >= head.n) break;
      const E* row = static_cast<const E*>(head.rows) + (size_t)head.id(j0 + u) * LEN + lane * DPL;
      load_lane<E, DPL>(row, r[u]);
      if constexpr (PAGES) load_lane<E, DPL>(row + HD, r2[u]);
    }
    for (int g = 0; g < ng; ++g) {
      float q[DPL];
      load_lane<float, DPL>(&sq[g][lane * DPL], q);
#pragma unroll
      for (int u = 0; u < kScoreRows; ++u) {
        if (j0 + u >= head.n) break;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) {
          if constexpr (PAGES) s = fmaf(fmaxf(q[i], 0.f), r[u][i], fmaf(fminf(q[i], 0.f), r2[u][i], s));
          else s = fmaf(q[i], r[u][i], s);
        }
        s = warp_sum(s);
        if (lane == 0) w.scores[((size_t)h * a.group + g0 + g) * a.max_n + j0 + u] = s;
      }
    }
  }
}

// 2. Per query head (one block each): the scores' range, then the cut key by
// a radix select over the three bytes of the keys, weighted by group size
// (the coarse level's cut at coarse_k tokens, with two levels). THREADS:
// 1024 for a whole table, 256 for the short ones (fewer threads to sync in
// each of the passes, over a few thousand items).
template <int THREADS>
__global__ void __launch_bounds__(THREADS) threshold_kernel(const SummarySearchArgs a, Work w, bool coarse) {
  grid_dependency_wait();
  const int row = blockIdx.x, h = row / a.group;
  const GroupView head = group_view(a, w, h, coarse);
  const float* x = w.scores + (size_t)row * a.max_n;
  const KeyScale ks = block_key_scale<THREADS>(head.n, [&](int j) { return x[j]; });
  const uint32_t cut = radix_cut<THREADS>(
      head.n, [&](int j) { return x[j]; }, [&](int j) { return (uint32_t)head.counts[head.id(j)]; },
      need_of(coarse ? a.coarse_k : a.k), ks.lo, ks.inv);
  if (threadIdx.x == 0) w.lo[row] = ks.lo, w.inv[row] = ks.inv, w.cut[row] = cut;
}

// 2b. One level over a long table, few query heads (sm_90): a query
// head's cut by a thread block cluster of kCutCluster blocks (radix_cut's
// team), each counting an eighth of the items and reading the others'
// histograms from their shared memory; the same cut as threshold_kernel's,
// bit for bit. Measured on an H100 (bench/results/gpu_session30/out2/):
// Gemma 3 at 1M (4 query heads, 65K groups) 59 -> 33 us, one block a query
// head leaving 128 of 132 SMs idle; the Llama-8B 512K layer (32 query heads,
// 32K groups) 36 -> 59 us, where one block a head already fills 32 SMs and
// the cluster's barriers cost more than they spread. So the cluster is taken
// only where its blocks fit the SMs at once (rows * kCutCluster <= SMs: 16
// query heads on an H100; between the two measured shapes, 4 and 32, the
// line is not measured).
constexpr int kCutCluster = 8, kClusterCutThreads = 512, kClusterCutMinGroups = 8192;
__global__ void __launch_bounds__(kClusterCutThreads) cluster_threshold_kernel(const SummarySearchArgs a, Work w) {
  using Team = CutTeam<kCutCluster>;
  const int row = blockIdx.x / kCutCluster, h = row / a.group;
  const GroupView head = group_view(a, w, h, false);
  const float* x = w.scores + (size_t)row * a.max_n;
  const KeyScale ks = block_key_scale<kClusterCutThreads, kCutCluster>(head.n, [&](int j) { return x[j]; });
  const uint32_t cut = radix_cut<kClusterCutThreads, kCutCluster>(
      head.n, [&](int j) { return x[j]; }, [&](int j) { return (uint32_t)head.counts[head.id(j)]; }, need_of(a.k),
      ks.lo, ks.inv);
  if (Team::rank() == 0 && threadIdx.x == 0) w.lo[row] = ks.lo, w.inv[row] = ks.inv, w.cut[row] = cut;
}

// Whether the one-level cut of `rows` query heads over tables of up to
// max_n groups runs as clusters (2b): a device with clusters (compute
// capability 9.0 on), a long table, and rows * kCutCluster blocks that the
// SMs hold at once.
bool use_cluster_cut(int rows, int max_n) {
  if (max_n < kClusterCutMinGroups) return false;
  const DeviceShape d = current_device_shape();
  return d.major >= 9 && (int64_t)rows * kCutCluster <= d.sms;
}

// 3. Gather, in two grid-wide steps so that no block walks a KV head's
// groups: mark (a tile of kGatherTile groups a block: a group is selected
// when any query head of its KV head takes it (GQA union); the rows the
// tile selected), then write (the same tiles: the rows of the head's earlier
// tiles, summed from mark's, plus the exclusive prefix within the tile give
// each selected group's first slot, in group order and deterministic; a
// group whose rows end within `cap` writes their pointers, the first that
// does not fit sets the head's count, and it and every later group are left
// to the far field). Before session 31 one block a KV head scanned the
// prefix between them (47 us at the Llama-8B 512K layer, 83 at Gemma 1M's
// one KV head of 65K groups: bench/results/gpu_session31/).
__global__ void __launch_bounds__(kGatherTile) mark_kernel(const SummarySearchArgs a, Work w) {
  grid_dependency_wait();
  using Reduce = cub::BlockReduce<uint32_t, kGatherTile>;
  __shared__ typename Reduce::TempStorage tmp;
  const int h = blockIdx.y, j = blockIdx.x * kGatherTile + threadIdx.x;
  const GroupView head = group_view(a, w, h, false);
  if ((int)blockIdx.x * kGatherTile >= head.n) return;  // the whole block: past this head's tiles
  const bool chosen = j < head.n && taken_by_any(a, w.scores, w.lo, w.inv, w.cut, h, j);
  if (j < head.n) w.selected[(size_t)h * a.max_n + j] = chosen;
  const uint32_t rows = Reduce(tmp).Sum(chosen ? (uint32_t)head.counts[head.id(j)] : 0u);
  if (threadIdx.x == 0) w.tile_rows[(size_t)h * w.tiles + blockIdx.x] = rows;
}

// A warp takes 32 groups; each selected one's rows are written by the
// whole warp (lane t: rows t, t + 32, ...), with the group's index into
// `groups` when it is set (rerank's candidates: [n_kv][a.cap]).
__global__ void __launch_bounds__(kGatherTile) write_kernel(const SummarySearchArgs a, Work w, size_t row_bytes,
                                                             uint32_t* groups) {
  grid_dependency_wait();
  using Scan = cub::BlockScan<uint32_t, kGatherTile>;
  using Reduce = cub::BlockReduce<uint32_t, kGatherTile>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  __shared__ uint32_t s_before;
  const int h = blockIdx.y, tile = blockIdx.x, j = tile * kGatherTile + threadIdx.x, lane = threadIdx.x % 32;
  const SummaryHead head = a.heads[h];
  const GroupView view = group_view(a, w, h, false);
  const int tiles = (view.n + kGatherTile - 1) / kGatherTile;
  if (tile >= max(tiles, 1)) return;  // the whole block (a head of no groups: tile 0 sets its count)
  uint32_t before = 0;                // rows of the head's earlier tiles
  for (int t = threadIdx.x; t < tile; t += kGatherTile) before += w.tile_rows[(size_t)h * w.tiles + t];
  before = Reduce(tmp.reduce).Sum(before);
  if (threadIdx.x == 0) s_before = before;
  __syncthreads();  // s_before, and tmp free for the scan
  before = s_before;
  bool mine = j < view.n && w.selected[(size_t)h * a.max_n + j];
  const uint32_t n = mine ? (uint32_t)head.counts[view.id(j)] : 0u, cap = (uint32_t)a.cap;
  uint32_t within, total;
  Scan(tmp.scan).ExclusiveSum(n, within, total);
  const uint32_t off = before + within;
  if (mine && off + n > cap) {
    if (off <= cap) a.counts[h] = (int32_t)off;  // the first group that does not fit (one a head)
    w.selected[(size_t)h * a.max_n + j] = 0;
    mine = false;
  }
  if (threadIdx.x == 0 && tile == max(tiles, 1) - 1 && before + total <= cap) a.counts[h] = (int32_t)(before + total);
  unsigned todo = __ballot_sync(0xffffffffu, mine);
  while (todo) {
    const int src = __ffs(todo) - 1;
    todo &= todo - 1;
    const int jj = __shfl_sync(0xffffffffu, mine ? view.id(j) : 0, src);
    const uint32_t o = __shfl_sync(0xffffffffu, off, src), cnt = __shfl_sync(0xffffffffu, n, src);
    const void** kr = a.k_rows + (size_t)h * a.cap + o;
    const void** vr = a.v_rows + (size_t)h * a.cap + o;
    for (uint32_t t = lane; t < cnt; t += 32) {
      const int64_t r = head.offsets ? (int64_t)head.members[head.offsets[jj] + t] : (int64_t)jj * head.page + t;
      const size_t at = (size_t)(r & ((int64_t(1) << kStoreChunkShift) - 1)) * row_bytes;
      kr[t] = head.k_chunks[r >> kStoreChunkShift] + at;
      vr[t] = head.v_chunks[r >> kStoreChunkShift] + at;
      if (groups) groups[(size_t)h * a.cap + o + t] = (uint32_t)jj;
    }
  }
}

// 3'. Two levels, per KV head (one block each): mark, scan and write of the
// listed groups in one pass over them (a list holds a few thousand groups
// at most; three grid-wide launches cost more than the work). The same
// prefix layout: a chosen group's slots start at the sum of the chosen
// groups before it, and it is kept when they end within `cap` (so the kept
// ones are a prefix of the chosen). A page's rows are one thread's.
__global__ void __launch_bounds__(kSelectThreads) gather_listed_kernel(const SummarySearchArgs a, Work w,
                                                                        size_t row_bytes) {
  grid_dependency_wait();
  using Scan = cub::BlockScan<uint32_t, kSelectThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ uint32_t s_kept;  // rows of the kept groups: the end of the last
  const int h = blockIdx.x;
  const SummaryHead head = a.heads[h];
  const GroupView view = group_view(a, w, h, false);
  const uint32_t cap = (uint32_t)a.cap;
  if (threadIdx.x == 0) s_kept = 0;
  const void** kr = a.k_rows + (size_t)h * a.cap;
  const void** vr = a.v_rows + (size_t)h * a.cap;
  uint32_t running = 0;
  for (int t0 = 0; t0 < view.n; t0 += kSelectThreads) {
    const int j = t0 + (int)threadIdx.x;
    const bool chosen = j < view.n && taken_by_any(a, w.scores, w.lo, w.inv, w.cut, h, j);
    const int jj = j < view.n ? view.id(j) : 0;
    const uint32_t cnt = chosen ? (uint32_t)head.counts[jj] : 0u;
    uint32_t at, total;
    Scan(tmp).ExclusiveSum(cnt, at, total);
    const uint32_t start = running + at;
    const bool fits = chosen && start + cnt <= cap;
    if (j < view.n) w.selected[(size_t)h * a.max_n + j] = fits;
    for (uint32_t t = 0; fits && t < cnt; ++t) {
      const int64_t r = (int64_t)jj * head.page + t;
      const size_t off = (size_t)(r & ((int64_t(1) << kStoreChunkShift) - 1)) * row_bytes;
      kr[start + t] = head.k_chunks[r >> kStoreChunkShift] + off;
      vr[start + t] = head.v_chunks[r >> kStoreChunkShift] + off;
    }
    if (fits) atomicMax(&s_kept, start + cnt);
    running += total;
    __syncthreads();  // tmp is reused by the next tile
  }
  __syncthreads();  // s_kept's last adds (a list of 0 tiles: its reset)
  if (threadIdx.x == 0) a.counts[h] = (int32_t)s_kept;
}

// 1b. Two levels, per KV head (one block each): the coarse groups some
// query head's coarse cut took, expanded in order into the list of their
// fine groups (at most max_n: the fine groups there are).
__global__ void __launch_bounds__(kSelectThreads) expand_kernel(const SummarySearchArgs a, Work w) {
  grid_dependency_wait();
  using Scan = cub::BlockScan<uint32_t, kSelectThreads>;
  __shared__ typename Scan::TempStorage tmp;
  const int h = blockIdx.x;
  const SummaryHead head = a.heads[h];
  int32_t* list = w.list + (size_t)h * a.max_n;
  uint32_t running = 0;
  for (int c0 = 0; c0 < head.coarse_n; c0 += kSelectThreads) {
    const int c = c0 + (int)threadIdx.x;
    const bool chosen = c < head.coarse_n && taken_by_any(a, w.scores, w.lo, w.inv, w.cut, h, c);
    const uint32_t first = (uint32_t)c * (uint32_t)head.coarse_ratio;
    const uint32_t kids = chosen ? min((uint32_t)head.coarse_ratio, (uint32_t)head.n - first) : 0u;
    uint32_t at, total;
    Scan(tmp).ExclusiveSum(kids, at, total);
    for (uint32_t i = 0; i < kids; ++i) list[running + at + i] = (int32_t)(first + i);
    running += total;
    __syncthreads();  // tmp is reused by the next tile
  }
  if (threadIdx.x == 0) w.list_n[h] = (int32_t)running;
}

}  // namespace

size_t summary_search_workspace_bytes(int n_kv, int group, int max_n, int cand_cap, bool far_dropped) {
  size_t bytes = 0;
  carve(nullptr, n_kv, group, max_n, cand_cap, far_dropped && cand_cap > 0, &bytes);
  return bytes;
}

namespace {
Work carve_args(const SummarySearchArgs& a) {
  const bool rerank = a.rerank_k > 0;
  return carve(a.workspace, a.n_kv, a.group, a.max_n, rerank ? a.cand_cap : 0, rerank && a.far_dropped);
}
}  // namespace

const float* summary_scores(const SummarySearchArgs& a) { return carve_args(a).scores; }
const uint8_t* summary_selected(const SummarySearchArgs& a) { return carve_args(a).selected; }
const float* summary_row_scores(const SummarySearchArgs& a) { return carve_args(a).row_scores; }
const int32_t* summary_listed(const SummarySearchArgs& a) { return carve_args(a).list; }
const int32_t* summary_listed_count(const SummarySearchArgs& a) { return carve_args(a).list_n; }
const int32_t* summary_candidate_counts(const SummarySearchArgs& a) { return carve_args(a).cand_count; }
const float* summary_row_dots(const SummarySearchArgs& a) { return carve_args(a).row_dots; }
const uint8_t* summary_candidate_listed(const SummarySearchArgs& a) { return carve_args(a).cand_listed; }

void summary_search(const SummarySearchArgs& a, cudaStream_t stream) {
  TOPKV_CHECK(a.n_kv >= 1 && a.group >= 1 && a.group <= 64 && a.max_n >= 0 && a.k >= 1 && a.cap >= 0,
              "device search: bad shape (kv heads {}, group {} (at most 64), groups {}, k {}, cap {})", a.n_kv,
              a.group, a.max_n, a.k, a.cap);
  TOPKV_CHECK(a.far_splits == 0 || a.part0 + a.far_splits <= a.parts,
              "device search writes far partial slots {}..{} of {}", a.part0, a.part0 + a.far_splits - 1, a.parts);
  TOPKV_CHECK(a.spread >= 0.f && a.spread_clip >= 1.f, "device search: spread {} (>= 0), spread_clip {} (>= 1)",
              a.spread, a.spread_clip);
  TOPKV_CHECK(a.rerank_k == 0 || (a.rerank_k >= 1 && a.cand_cap >= 1),
              "device search rerank: keep {} rows of {} candidates a head", a.rerank_k, a.cand_cap);
  TOPKV_CHECK(!a.far_dropped || a.rerank_k == 0 || a.far_splits > 0,
              "device search: far_dropped needs the far rows (far_splits > 0)");
  TOPKV_CHECK(a.coarse_k == 0 || (a.page_bounds && a.rerank_k == 0 && a.far_splits == 0),
              "device search: two levels are for page bounds without rerank or far rows");
  const Work w = carve_args(a);
  const unsigned gz = (unsigned)((a.group + kMaxGroup - 1) / kMaxGroup);
  using A = SummarySearchArgs;
  // One level: the whole table, a block per 128 groups. Two levels: the
  // coarse table and then the listed groups, each a small share of it, kShortBlocks
  // blocks of 32 striding over them.
  const auto score = [&](bool coarse) {
    const bool two = a.coarse_k > 0;
    const int iters = two ? kScoreItersShort : kScoreItersLong, per_block = kScoreWarps * kScoreRows * iters;
    const int blocks = (a.max_n + per_block - 1) / per_block;
    const dim3 grid((unsigned)(two ? std::min(blocks, kShortBlocks) : blocks), (unsigned)a.n_kv, gz);
    with_table_type(a.table_type, [&](auto e) {
      using E = decltype(e);
      with_head_dim(a.head_dim, [&](auto hd) {
        const auto kernel = a.page_bounds ? score_kernel<E, hd(), true> : score_kernel<E, hd(), false>;
        launch_dependent(kernel, grid, kScoreWarps * 32, stream, a, w, coarse, iters);
      });
    });
    TOPKV_CUDA_CHECK_LAUNCH();
  };
  const auto cut = [&](bool coarse) {
    const int rows = a.n_kv * a.group;
    if (a.coarse_k > 0) launch_dependent(threshold_kernel<256>, rows, 256, stream, a, w, coarse);
    else if (use_cluster_cut(rows, a.max_n))
      launch_kernel(cluster_threshold_kernel, rows * kCutCluster, kClusterCutThreads, stream,
                    LaunchHow{false, kCutCluster}, a, w);
    else launch_dependent(threshold_kernel<kSelectThreads>, rows, kSelectThreads, stream, a, w, coarse);
    TOPKV_CUDA_CHECK_LAUNCH();
  };
  // Two levels: the coarse cut lists the groups to score (1b), and the
  // steps below walk the list. The phases time both levels together.
  if (a.max_n > 0 && a.coarse_k > 0 && (a.phases & A::kSearchScore)) {
    score(true);
    cut(true);
    launch_dependent(expand_kernel, a.n_kv, kSelectThreads, stream, a, w);
    TOPKV_CUDA_CHECK_LAUNCH();
  }
  if (a.max_n > 0 && (a.phases & A::kSearchScore)) score(false);
  if (a.max_n > 0 && (a.phases & A::kSearchCut)) cut(false);
  if (a.max_n > 0 && (a.phases & A::kSearchGather)) {
    const dim3 grid((unsigned)w.tiles, (unsigned)a.n_kv);
    // With rerank the selected groups' rows are candidates (the work space's
    // lists, cand_cap a head), and summary_rerank keeps the best into a's.
    SummarySearchArgs into = a;
    if (a.rerank_k > 0) into.k_rows = w.cand_k, into.v_rows = w.cand_v, into.counts = w.cand_count, into.cap = a.cand_cap;
    const size_t row_bytes = dtype_bytes(a.store_type, (size_t)a.head_dim);
    if (a.coarse_k > 0) {
      launch_dependent(gather_listed_kernel, a.n_kv, kSelectThreads, stream, a, w, row_bytes);
      TOPKV_CUDA_CHECK_LAUNCH();
    } else {
      launch_dependent(mark_kernel, grid, kGatherTile, stream, into, w);
      TOPKV_CUDA_CHECK_LAUNCH();
      launch_dependent(write_kernel, grid, kGatherTile, stream, into, w, row_bytes,
                       a.rerank_k > 0 ? w.cand_group : nullptr);
      TOPKV_CUDA_CHECK_LAUNCH();
    }
    if (a.rerank_k > 0) summary_rerank(a, w, stream);
  } else if (a.max_n == 0) {  // nothing to search: empty lists (and no candidates, which the far rows read)
    TOPKV_CUDA_CHECK(cudaMemsetAsync(a.counts, 0, (size_t)a.n_kv * sizeof(int32_t), stream));
    if (a.rerank_k > 0) TOPKV_CUDA_CHECK(cudaMemsetAsync(w.cand_count, 0, (size_t)a.n_kv * sizeof(int32_t), stream));
  }
  if (a.far_splits > 0 && (a.phases & A::kSearchFar)) summary_far(a, w, stream);
}

}  // namespace topkv::cuda
