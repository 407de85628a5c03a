// What the device search's kernels share (kernels_summary_search.cu, and the
// rerank step in kernels_summary_rerank.cu): the work space's layout, the
// 24-bit score keys and the radix select that cuts a budget over them.
//
// Work space: scores [n_kv][group][max_n] f32 | lo [rows] f32 | inv [rows] f32 |
// cut [rows] u32 | tile_rows [n_kv][tiles] u32 (tiles = max_n / kGatherTile, up) |
// selected [n_kv][max_n] u8 | list [n_kv][max_n] i32 | list_n [n_kv] i32
// (two levels: the groups the coarse cut expanded; the fine steps' index j
// is then a position in the list, scores and selected among them)
// (rows = n_kv * group); with rerank (cand_cap > 0) then
// cand_k, cand_v [n_kv][cand_cap] pointers | cand_group [n_kv][cand_cap] u32 |
// cand_count [n_kv] i32 | row_scores [n_kv][group][cand_cap] f32 |
// row_lo, row_inv [rows] f32 | row_cut [rows] u32 | row_minmax [2][rows] u32;
// with far_dropped too, row_dots [n_kv][group][cand_cap] f32 (q.k for every
// query head) | cand_listed [n_kv][cand_cap] u8 (3b put the row in the lists).
#pragma once
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include <cooperative_groups.h>

#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda::summary_work {

constexpr uint32_t kKeyMax = (1u << 24) - 1;
constexpr int kSelectThreads = 1024, kCutLoads = 8;
constexpr int kMaxGroup = 8;  // query heads a scoring / far block carries (more: grid.z chunks)
constexpr int kGatherTile = 256;  // groups a one-level gather block marks and writes

inline size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

struct Work {
  float* scores;
  float *lo, *inv;
  uint32_t* cut;
  uint32_t* tile_rows;  // one level: the rows each tile of kGatherTile groups selected
  int tiles;            // tile_rows' entries a KV head
  uint8_t* selected;
  int32_t* list;    // two levels: [n_kv][max_n] groups to score, in order
  int32_t* list_n;  // [n_kv] their count
  // rerank only (null without): the candidates' row lists, their groups and
  // counts, their exact scores per query head, and the cut over those.
  const void** cand_k;
  const void** cand_v;
  uint32_t* cand_group;
  int32_t* cand_count;
  float* row_scores;
  float *row_lo, *row_inv;
  uint32_t* row_cut;
  uint32_t* row_minmax;
  int cand_cap;
  // far_dropped only (null without).
  float* row_dots;
  uint8_t* cand_listed;
};

// The layout above over the work space at `ws` (null: offsets only);
// `bytes` gets its size (summary_search_workspace_bytes).
inline Work carve(void* ws, int n_kv, int group, int max_n, int cand_cap, bool far_dropped,
                  size_t* bytes = nullptr) {
  const size_t rows = (size_t)n_kv * group;
  size_t at = 0;
  const auto take = [&](size_t n) {
    const size_t o = at;
    at += align256(n);
    return ws ? static_cast<uint8_t*>(ws) + o : nullptr;
  };
  Work w{};
  w.scores = reinterpret_cast<float*>(take(rows * max_n * sizeof(float)));
  w.lo = reinterpret_cast<float*>(take(rows * sizeof(float)));
  w.inv = reinterpret_cast<float*>(take(rows * sizeof(float)));
  w.cut = reinterpret_cast<uint32_t*>(take(rows * sizeof(uint32_t)));
  w.tiles = (max_n + kGatherTile - 1) / kGatherTile;
  w.tile_rows = reinterpret_cast<uint32_t*>(take((size_t)n_kv * w.tiles * sizeof(uint32_t)));
  w.selected = take((size_t)n_kv * max_n);
  w.list = reinterpret_cast<int32_t*>(take((size_t)n_kv * max_n * sizeof(int32_t)));
  w.list_n = reinterpret_cast<int32_t*>(take((size_t)n_kv * sizeof(int32_t)));
  w.cand_cap = cand_cap;
  if (cand_cap > 0) {
    const size_t nc = (size_t)n_kv * cand_cap;
    w.cand_k = reinterpret_cast<const void**>(take(nc * sizeof(void*)));
    w.cand_v = reinterpret_cast<const void**>(take(nc * sizeof(void*)));
    w.cand_group = reinterpret_cast<uint32_t*>(take(nc * sizeof(uint32_t)));
    w.cand_count = reinterpret_cast<int32_t*>(take((size_t)n_kv * sizeof(int32_t)));
    w.row_scores = reinterpret_cast<float*>(take(rows * cand_cap * sizeof(float)));
    w.row_lo = reinterpret_cast<float*>(take(rows * sizeof(float)));
    w.row_inv = reinterpret_cast<float*>(take(rows * sizeof(float)));
    w.row_cut = reinterpret_cast<uint32_t*>(take(rows * sizeof(uint32_t)));
    w.row_minmax = reinterpret_cast<uint32_t*>(take(2 * rows * sizeof(uint32_t)));
    if (far_dropped) {
      w.row_dots = reinterpret_cast<float*>(take(rows * cand_cap * sizeof(float)));
      w.cand_listed = take(nc);
    }
  }
  if (bytes) *bytes = at;
  return w;
}

// The groups one step of the search walks for KV head h: the coarse level,
// or the fine groups (with two levels, those listed by the coarse cut:
// position j is group id(j)).
struct GroupView {
  const void* rows;
  const int32_t* counts;
  const int32_t* ids;  // null: position j is group j
  int n;
  const float* scale;  // i8 rows: their per-dimension scales (SummaryHead)
  __device__ __forceinline__ int id(int j) const { return ids ? ids[j] : j; }
};
__device__ __forceinline__ GroupView group_view(const SummarySearchArgs& a, const Work& w, int h, bool coarse) {
  const SummaryHead& hd = a.heads[h];
  if (coarse) return {hd.coarse_rows, hd.coarse_counts, nullptr, hd.coarse_n, hd.coarse_rows_scale};
  if (a.coarse_k > 0) return {hd.rows, hd.counts, w.list + (size_t)h * a.max_n, w.list_n[h], hd.rows_scale};
  return {hd.rows, hd.counts, nullptr, hd.n, hd.rows_scale};
}

// The 24-bit key of score x (see summary_search). Written as in the CPU twin
// (gpu/summary_search_ref.cpp): a subtraction, then a product, in fp32.
__device__ __forceinline__ uint32_t score_key(float x, float lo, float inv) {
  const float t = (x - lo) * inv;
  return t >= (float)kKeyMax ? kKeyMax : (t > 0.f ? (uint32_t)t : 0u);
}

// Whether some query head of KV head h took position j (its score's key at
// or above the head's cut): the GQA union of the mark, expand and gather steps.
__device__ __forceinline__ bool taken_by_any(const SummarySearchArgs& a, const float* scores, const float* lo,
                                             const float* inv, const uint32_t* cut, int h, int j) {
  for (int g = 0; g < a.group; ++g) {
    const int row = h * a.group + g;
    if (score_key(scores[(size_t)row * a.max_n + j], lo[row], inv[row]) >= cut[row]) return true;
  }
  return false;
}

// Order-preserving map of a float to uint32 (larger float, larger key), for
// atomicMin/Max on scores.
__device__ __forceinline__ uint32_t ordered(float x) {
  const uint32_t b = __float_as_uint(x);
  return b & 0x80000000u ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float unordered(uint32_t u) {
  return __uint_as_float(u & 0x80000000u ? u & 0x7fffffffu : ~u);
}

// A block's query heads g0 .. g0 + ng - 1 of KV head h into shared memory,
// where the scoring kernels read them (in registers, 141 per thread, they
// left one warp in eight running: ncu, H100).
template <int HD>
__device__ __forceinline__ void load_block_queries(float (*sq)[HD], const SummarySearchArgs& a, int h, int g0, int ng) {
  for (int i = threadIdx.x; i < ng * HD; i += blockDim.x) sq[i / HD][i % HD] = a.q[((size_t)h * a.group + g0) * HD + i];
  __syncthreads();
}

// Lane g < ng holds query head g0 + g's lowest and highest score of what its
// warp scored: into minmax [2][n_kv * group] (the rerank's row scores: each
// query head's lowest as a complemented ordered key, its highest as an
// ordered key; both take atomicMax, so zeros are the empty range).
__device__ __forceinline__ void publish_range(uint32_t* minmax, const SummarySearchArgs& a, int h, int g0, int ng,
                                              int lane, float lo, float hi) {
  if (lane >= ng) return;
  const int row = h * a.group + g0 + lane;
  atomicMax(&minmax[row], ~ordered(lo));
  atomicMax(&minmax[a.n_kv * a.group + row], ordered(hi));
}

// The empty range of `rows` query heads: one memset (publish_range's keys).
inline void reset_ranges(uint32_t* minmax, size_t rows, cudaStream_t stream) {
  TOPKV_CUDA_CHECK(cudaMemsetAsync(minmax, 0, 2 * rows * sizeof(uint32_t), stream));
}

// Query head `row`'s score range from minmax and the keys' scale over it
// (0 when nothing was scored, or all scores are equal).
struct KeyScale {
  float lo, inv;
};

// A cut is run by one block (CL = 1) or by a thread block cluster of CL
// blocks (sm_90: "the cut with more than one block per query head"), each
// taking every CL-th run of THREADS * kCutLoads items and sharing its partial
// results with the others through distributed shared memory. Every block of
// the cluster then reaches the same decisions from the same integer sums, so
// the cut equals the one-block cut exactly.
template <int CL> struct CutTeam {
  // (Clusters are sm_90's: compiled for an older device, a team of more
  // than one block traps, and summary_search never launches one there.)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
  __device__ static int rank() { return CL == 1 ? 0 : (__trap(), 0); }
  __device__ static void sync() { CL == 1 ? __syncthreads() : __trap(); }
  template <class T> __device__ static T* of(T* local, int) { return CL == 1 ? local : (__trap(), local); }
#else
  __device__ static int rank() {
    if constexpr (CL == 1) return 0;
    else return (int)cooperative_groups::this_cluster().block_rank();
  }
  __device__ static void sync() {  // every thread of every block of the team
    if constexpr (CL == 1) __syncthreads();
    else cooperative_groups::this_cluster().sync();
  }
  template <class T> __device__ static T* of(T* local, int r) {  // block r's copy of a shared variable
    if constexpr (CL == 1) return local;
    else return cooperative_groups::this_cluster().map_shared_rank(local, (unsigned)r);
  }
#endif
};

// This block's items of the team: runs of THREADS * kCutLoads, every CL-th.
template <int THREADS, int CL, class F> __device__ __forceinline__ void for_team_items(int n, F&& f) {
  constexpr int run = THREADS * kCutLoads;
  for (int j0 = CutTeam<CL>::rank() * run + (int)threadIdx.x; j0 < n; j0 += CL * run) f(j0);
}

// The range of x(0..n-1) and its keys' scale, by a team of CL blocks of
// THREADS (the cut's own pass over its items: the scores need no range of
// their own).
template <int THREADS, int CL = 1, class Score>
__device__ KeyScale block_key_scale(int n, Score x) {
  __shared__ float s_lo[THREADS / 32], s_hi[THREADS / 32], s_block[2];
  float lo = INFINITY, hi = -INFINITY;
  for_team_items<THREADS, CL>(n, [&](int j0) {
#pragma unroll
    for (int u = 0; u < kCutLoads; ++u)
      if (j0 + u * THREADS < n) lo = fminf(lo, x(j0 + u * THREADS)), hi = fmaxf(hi, x(j0 + u * THREADS));
  });
  for (int o = 16; o > 0; o >>= 1)
    lo = fminf(lo, __shfl_xor_sync(0xffffffffu, lo, o)), hi = fmaxf(hi, __shfl_xor_sync(0xffffffffu, hi, o));
  if (threadIdx.x % 32 == 0) s_lo[threadIdx.x / 32] = lo, s_hi[threadIdx.x / 32] = hi;
  __syncthreads();
  lo = INFINITY, hi = -INFINITY;
  for (int i = 0; i < THREADS / 32; ++i) lo = fminf(lo, s_lo[i]), hi = fmaxf(hi, s_hi[i]);
  if constexpr (CL > 1) {
    if (threadIdx.x == 0) s_block[0] = lo, s_block[1] = hi;
    CutTeam<CL>::sync();
    lo = INFINITY, hi = -INFINITY;
    for (int r = 0; r < CL; ++r) {
      const float* b = CutTeam<CL>::of(s_block, r);
      lo = fminf(lo, b[0]), hi = fmaxf(hi, b[1]);
    }
    CutTeam<CL>::sync();  // no block leaves (or reuses its shared memory) while another reads it
  }
  return {lo, hi > lo ? (float)kKeyMax / (hi - lo) : 0.f};  // as summary_cut_reference
}
__device__ __forceinline__ KeyScale key_scale(const uint32_t* minmax, int rows, int row, bool scored) {
  const float lo = unordered(~minmax[row]), hi = unordered(minmax[rows + row]);
  return {lo, scored && hi > lo ? (float)kKeyMax / (hi - lo) : 0.f};  // no score: both NaN, hi > lo false
}

// A token budget as radix_cut's need.
__device__ __forceinline__ uint32_t need_of(int64_t k) { return k < 0xffffffffll ? (uint32_t)k : 0xffffffffu; }

// The cut key of one budget, run by a whole block of THREADS, or by every
// block of a team of CL (CutTeam): items
// j < n with score x(j) and weight weight(j) (0: not a candidate), keys
// score_key(x, lo, inv); returns the largest key K whose items at or above
// it weigh >= need, or 0 when all of them together weigh less (take all).
// A radix select over the keys' three bytes; per pass kCutLoads items are
// loaded together, then counted into a shared histogram, and the first warp
// finds the bin where need is crossed with a shuffle scan: lane i holds bins
// 255 - 8i down to 248 - 8i, and the one lane where need is crossed walks its
// eight (thread 0 walking all 256 was one dependent shared load after
// another).
template <int THREADS = kSelectThreads, int CL = 1, class Score, class Weight>
__device__ uint32_t radix_cut(int n, Score x, Weight weight, uint32_t need, float lo, float inv) {
  using Team = CutTeam<CL>;
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask, s_need;
  __shared__ bool s_all;
  if (threadIdx.x == 0) s_prefix = 0, s_mask = 0, s_all = false, s_need = need;
  __syncthreads();
  for (int shift = 16; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += THREADS) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix, mask = s_mask;
    for_team_items<THREADS, CL>(n, [&](int j0) {
      float xs[kCutLoads];
      uint32_t cs[kCutLoads];
#pragma unroll
      for (int u = 0; u < kCutLoads; ++u) {
        const int j = j0 + u * THREADS;
        xs[u] = j < n ? x(j) : lo;
        cs[u] = j < n ? weight(j) : 0u;
      }
#pragma unroll
      for (int u = 0; u < kCutLoads; ++u) {
        const uint32_t key = score_key(xs[u], lo, inv);
        if (cs[u] && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], cs[u]);
      }
    });
    Team::sync();  // every block's histogram is complete
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x, top = 255 - 8 * lane;
      const uint32_t need_now = s_need;
      uint32_t c[8];
      uint64_t mine = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        c[i] = 0;
        for (int r = 0; r < CL; ++r) c[i] += Team::of(hist, r)[top - i];  // the same sums in every block
        mine += c[i];
      }
      uint64_t incl = mine;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint64_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
      }
      const bool crossed = incl - mine < need_now && incl >= need_now;
      if (__ballot_sync(0xffffffffu, crossed) == 0) {
        if (lane == 0) s_all = true;  // only on the first pass: the items weigh less than need
      } else if (crossed) {
        uint64_t above = incl - mine;
        int chosen = top;
        for (int i = 0; i < 8; ++i, --chosen) {
          if (above + c[i] >= need_now) break;
          above += c[i];
        }
        s_need = need_now - (uint32_t)above;
        s_prefix = prefix | ((uint32_t)chosen << shift);
        s_mask = mask | (255u << shift);
      }
    }
    Team::sync();  // the decision is seen, and no block clears its histogram while another reads it
    if (s_all) break;
  }
  return s_all ? 0u : s_prefix;
}

template <class F> void with_head_dim(int hd, F&& f) {
  switch (hd) {
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    case 256: f(std::integral_constant<int, 256>{}); return;
  }
  fail("the device search supports head_dim 64, 128 and 256, not {}", hd);
}

// The rerank step (kernels_summary_rerank.cu), run by summary_search after
// the candidates' gather into w.cand_*: exact scores, each query head's cut,
// and the kept rows into a's lists.
void summary_rerank(const SummarySearchArgs& a, const Work& w, cudaStream_t stream);

// The far rows (kernels_summary_far.cu), run by summary_search last: every
// group not selected (and with far_dropped every candidate not kept) into
// the far partial slots a.part0 .. a.part0 + a.far_splits - 1.
void summary_far(const SummarySearchArgs& a, const Work& w, cudaStream_t stream);

}  // namespace topkv::cuda::summary_work
