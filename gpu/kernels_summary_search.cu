// The search of a summary index on the device (cuda_kernels.h,
// summary_search): score every group, cut each query head's budget with a
// radix select, gather the selected groups' rows, and attend to the rest as
// Multipole far rows. RetroInfer-style: the centroid table lives on the GPU,
// only the chosen rows are read from host memory, and the host is not in the
// loop at all.
//
// Work space: scores [n_kv][group][max_n] f32 | lo [rows] f32 | inv [rows] f32 |
// cut [rows] u32 | minmax [2][rows] u32 | offset [n_kv][max_n] u32 |
// selected [n_kv][max_n] u8
// (rows = n_kv * group).
#include <cub/block/block_scan.cuh>

#include <type_traits>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"
#include "gpu/partial_block.cuh"

namespace topkv::cuda {
namespace {

constexpr int kMaxGroup = 8;        // query heads a scoring / far block carries (more: grid.z chunks)
constexpr int kScoreWarps = 8, kScoreRows = 4, kScoreIters = 4;  // a scoring warp: kScoreIters x kScoreRows groups
constexpr int kSelectThreads = 1024, kCutLoads = 8;
constexpr int kFarWarps = 4, kFarUnroll = 4;
constexpr uint32_t kKeyMax = (1u << 24) - 1;

size_t align256(size_t b) { return (b + 255) & ~size_t(255); }

struct Work {
  float* scores;
  float *lo, *inv;
  uint32_t* cut;
  uint32_t* minmax;  // [2][rows]: each query head's lowest and highest score (ordered keys)
  uint32_t* offset;  // a selected group's first slot in the row lists
  uint8_t* selected;
};
// The layout above over the work space at `ws` (null: offsets only);
// `bytes` gets its size (summary_search_workspace_bytes).
Work carve(void* ws, int n_kv, int group, int max_n, size_t* bytes = nullptr) {
  const size_t rows = (size_t)n_kv * group;
  size_t at = 0;
  const auto take = [&](size_t n) {
    const size_t o = at;
    at += align256(n);
    return ws ? static_cast<uint8_t*>(ws) + o : nullptr;
  };
  Work w;
  w.scores = reinterpret_cast<float*>(take(rows * max_n * sizeof(float)));
  w.lo = reinterpret_cast<float*>(take(rows * sizeof(float)));
  w.inv = reinterpret_cast<float*>(take(rows * sizeof(float)));
  w.cut = reinterpret_cast<uint32_t*>(take(rows * sizeof(uint32_t)));
  w.minmax = reinterpret_cast<uint32_t*>(take(2 * rows * sizeof(uint32_t)));
  w.offset = reinterpret_cast<uint32_t*>(take((size_t)n_kv * max_n * sizeof(uint32_t)));
  w.selected = take((size_t)n_kv * max_n);
  if (bytes) *bytes = at;
  return w;
}

// The 24-bit key of score x (see summary_search). Written as in the CPU twin
// (gpu/summary_search_ref.cpp): a subtraction, then a product, in fp32.
__device__ __forceinline__ uint32_t score_key(float x, float lo, float inv) {
  const float t = (x - lo) * inv;
  return t >= (float)kKeyMax ? kKeyMax : (t > 0.f ? (uint32_t)t : 0u);
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

// 1. Scores, and each query head's lowest and highest score. Warp w of block
// b takes kScoreIters rounds of kScoreRows groups (loads in flight
// together); lane i owns dims [i*DPL, (i+1)*DPL) (of both halves for page
// bounds). The block's queries sit in shared memory, not registers: with
// them in registers (141 per thread) one warp in eight could run, and the
// table streamed at an eighth of the bandwidth (ncu, H100).
template <class E, int HD, bool PAGES>
__global__ void __launch_bounds__(kScoreWarps * 32) score_kernel(const SummarySearchArgs a, Work w) {
  constexpr int DPL = HD / 32, LEN = PAGES ? 2 * HD : HD;
  __shared__ __align__(16) float sq[kMaxGroup][HD];
  const int h = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g0 = blockIdx.z * kMaxGroup, ng = min(kMaxGroup, a.group - g0);
  const SummaryHead head = a.heads[h];
  for (int i = threadIdx.x; i < ng * HD; i += blockDim.x)
    sq[i / HD][i % HD] = a.q[((size_t)h * a.group + g0) * HD + i];
  __syncthreads();
  const int warp_first = (blockIdx.x * kScoreWarps + warp) * kScoreRows * kScoreIters;
  if (warp_first >= head.n) return;
  float lo = INFINITY, hi = -INFINITY;  // lane g < ng: query head g's
  for (int it = 0; it < kScoreIters; ++it) {
    const int j0 = warp_first + it * kScoreRows;
    if (j0 >= head.n) break;
    float r[kScoreRows][DPL], r2[kScoreRows][PAGES ? DPL : 1];
#pragma unroll
    for (int u = 0; u < kScoreRows; ++u) {
      if (j0 + u >= head.n) break;
      const E* row = static_cast<const E*>(head.rows) + (size_t)(j0 + u) * LEN + lane * DPL;
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
        if (lane == g) lo = fminf(lo, s), hi = fmaxf(hi, s);
        if (lane == 0) w.scores[((size_t)h * a.group + g0 + g) * a.max_n + j0 + u] = s;
      }
    }
  }
  if (lane < ng) {
    const int row = h * a.group + g0 + lane;
    atomicMin(&w.minmax[row], ordered(lo));
    atomicMax(&w.minmax[a.n_kv * a.group + row], ordered(hi));
  }
}

// 2. Per query head (one block each): the scores' range, then the cut key by
// a radix select over the three bytes of the keys, weighted by group size.
__global__ void __launch_bounds__(kSelectThreads) threshold_kernel(const SummarySearchArgs a, Work w) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t s_prefix, s_mask, s_need;
  __shared__ bool s_all;
  const int row = blockIdx.x, h = row / a.group;
  const SummaryHead head = a.heads[h];
  const float* x = w.scores + (size_t)row * a.max_n;
  float lo = unordered(w.minmax[row]);
  const float hi = unordered(w.minmax[a.n_kv * a.group + row]);
  const float inv = head.n > 0 && hi > lo ? (float)kKeyMax / (hi - lo) : 0.f;
  if (threadIdx.x == 0) {
    s_prefix = 0, s_mask = 0, s_all = false;
    s_need = a.k < 0xffffffffll ? (uint32_t)a.k : 0xffffffffu;
  }
  __syncthreads();
  for (int shift = 16; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kSelectThreads) hist[b] = 0;
    __syncthreads();
    const uint32_t prefix = s_prefix, mask = s_mask;
    // kCutLoads scores (and weights) loaded together, then counted.
    for (int j0 = threadIdx.x; j0 < head.n; j0 += kSelectThreads * kCutLoads) {
      float xs[kCutLoads];
      uint32_t cs[kCutLoads];
#pragma unroll
      for (int u = 0; u < kCutLoads; ++u) {
        const int j = j0 + u * kSelectThreads;
        xs[u] = j < head.n ? x[j] : lo;
        cs[u] = j < head.n ? (uint32_t)head.counts[j] : 0u;
      }
#pragma unroll
      for (int u = 0; u < kCutLoads; ++u) {
        const uint32_t key = score_key(xs[u], lo, inv);
        if (cs[u] && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], cs[u]);
      }
    }
    __syncthreads();
    if (threadIdx.x < 32) {
      // Bins from the top: the first whose weight, with all above it, covers
      // need. The first warp finds it in parallel: lane i holds bins
      // 255 - 8i down to 248 - 8i, a shuffle scan gives the weight above each
      // lane's bins, and the one lane where need is crossed walks its eight
      // (thread 0 walked all 256, one dependent shared load after another;
      // the two have not been timed against each other yet).
      const int lane = threadIdx.x, top = 255 - 8 * lane;
      const uint32_t need = s_need;
      uint32_t c[8];
      uint64_t mine = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) c[i] = hist[top - i], mine += c[i];
      uint64_t incl = mine;
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const uint64_t t = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += t;
      }
      const bool crossed = incl - mine < need && incl >= need;
      if (__ballot_sync(0xffffffffu, crossed) == 0) {
        if (lane == 0) s_all = true;  // only on the first pass: the head holds fewer than k tokens
      } else if (crossed) {
        uint64_t above = incl - mine;
        int chosen = top;
        for (int i = 0; i < 8; ++i, --chosen) {
          if (above + c[i] >= need) break;
          above += c[i];
        }
        s_need = need - (uint32_t)above;
        s_prefix = prefix | ((uint32_t)chosen << shift);
        s_mask = mask | (255u << shift);
      }
    }
    __syncthreads();
    if (s_all) break;
  }
  if (threadIdx.x == 0) {
    w.lo[row] = lo, w.inv[row] = inv;
    w.cut[row] = s_all ? 0u : s_prefix;
  }
}

// 3. Gather, in three grid-wide steps so that no single block walks the
// groups: mark (selected by any query head of the KV head; its weight),
// scan (per KV head, the exclusive prefix of the weights: each selected
// group's slots, in group order, deterministic; and the row count that fits
// `cap`), write (each selected group that fits writes its rows' pointers;
// one that does not is left to the far field, as is every later one).
__global__ void mark_kernel(const SummarySearchArgs a, Work w) {
  const int h = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
  const SummaryHead head = a.heads[h];
  if (j >= head.n) return;
  bool chosen = false;
  for (int g = 0; g < a.group && !chosen; ++g) {
    const int row = h * a.group + g;
    chosen = score_key(w.scores[(size_t)row * a.max_n + j], w.lo[row], w.inv[row]) >= w.cut[row];
  }
  w.selected[(size_t)h * a.max_n + j] = chosen;
  w.offset[(size_t)h * a.max_n + j] = chosen ? (uint32_t)head.counts[j] : 0u;
}

constexpr int kScanItems = 16;
__global__ void __launch_bounds__(kSelectThreads) scan_kernel(const SummarySearchArgs a, Work w) {
  using Scan = cub::BlockScan<uint32_t, kSelectThreads>;
  __shared__ typename Scan::TempStorage tmp;
  __shared__ uint32_t s_fit;
  const int h = blockIdx.x;
  const int n = a.heads[h].n;
  uint32_t* off = w.offset + (size_t)h * a.max_n;
  const uint32_t cap = (uint32_t)a.cap;
  if (threadIdx.x == 0) s_fit = 0xffffffffu;
  uint32_t running = 0;
  for (int tile = 0; tile < n; tile += kSelectThreads * kScanItems) {
    const int first = tile + (int)threadIdx.x * kScanItems;
    uint32_t v[kScanItems], x[kScanItems], total;
#pragma unroll
    for (int i = 0; i < kScanItems; ++i) v[i] = first + i < n ? off[first + i] : 0u;
    Scan(tmp).ExclusiveSum(v, x, total);
#pragma unroll
    for (int i = 0; i < kScanItems; ++i) {
      if (first + i >= n) break;
      const uint32_t at = running + x[i];
      off[first + i] = at;
      if (v[i] > 0 && at <= cap && at + v[i] > cap) s_fit = at;  // the first group that does not fit
    }
    running += total;
    __syncthreads();  // tmp is reused by the next tile
  }
  if (threadIdx.x == 0) a.counts[h] = (int32_t)(s_fit != 0xffffffffu ? s_fit : min(running, cap));
}

// A warp takes 32 groups; each selected one's rows are written by the
// whole warp (lane t: rows t, t + 32, ...).
__global__ void write_kernel(const SummarySearchArgs a, Work w, size_t row_bytes) {
  const int h = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x, lane = threadIdx.x % 32;
  const SummaryHead head = a.heads[h];
  bool mine = j < head.n && w.selected[(size_t)h * a.max_n + j];
  uint32_t off = 0, n = 0;
  if (mine) {
    off = w.offset[(size_t)h * a.max_n + j], n = (uint32_t)head.counts[j];
    if (off + n > (uint32_t)a.cap) {
      w.selected[(size_t)h * a.max_n + j] = 0;
      mine = false;
    }
  }
  unsigned todo = __ballot_sync(0xffffffffu, mine);
  while (todo) {
    const int src = __ffs(todo) - 1;
    todo &= todo - 1;
    const int jj = __shfl_sync(0xffffffffu, j, src);
    const uint32_t o = __shfl_sync(0xffffffffu, off, src), cnt = __shfl_sync(0xffffffffu, n, src);
    const void** kr = a.k_rows + (size_t)h * a.cap + o;
    const void** vr = a.v_rows + (size_t)h * a.cap + o;
    for (uint32_t t = lane; t < cnt; t += 32) {
      const int64_t r = head.offsets ? (int64_t)head.members[head.offsets[jj] + t] : (int64_t)jj * head.page + t;
      const size_t at = (size_t)(r & ((int64_t(1) << kStoreChunkShift) - 1)) * row_bytes;
      kr[t] = head.k_chunks[r >> kStoreChunkShift] + at;
      vr[t] = head.v_chunks[r >> kStoreChunkShift] + at;
    }
  }
}

// 4. Far rows: every group not selected, logit scale * x + ln N_j, value V̄_j.
// Grid: x = KV head, y = split of its groups, z = chunk of query heads.
template <class E, int HD>
__global__ void __launch_bounds__(kFarWarps * 32) far_kernel(const SummarySearchArgs a, Work w) {
  constexpr int DPL = HD / 32;
  __shared__ BlockPartials<HD, kFarWarps, kMaxGroup> sm;
  const int h = blockIdx.x, split = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g0 = blockIdx.z * kMaxGroup, ng = min(kMaxGroup, a.group - g0);
  const SummaryHead head = a.heads[h];
  const int per = (head.n + a.far_splits - 1) / a.far_splits;
  const int first = split * per, last = min(head.n, first + per);
  const uint8_t* sel = w.selected + (size_t)h * a.max_n;
  float m[kMaxGroup], l[kMaxGroup], o[kMaxGroup][DPL];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[g][i] = 0.f;
  }
  // kFarUnroll groups per warp with their loads in flight (the rows are in
  // HBM, but one dependent load per iteration leaves the warp idle).
  for (int j0 = first + warp * kFarUnroll; j0 < last; j0 += kFarWarps * kFarUnroll) {
    float v[kFarUnroll][DPL], x[kFarUnroll][kMaxGroup], count[kFarUnroll];
    bool use[kFarUnroll];
#pragma unroll
    for (int u = 0; u < kFarUnroll; ++u) {
      const int j = j0 + u;
      use[u] = j < last && !sel[j];
      if (!use[u]) continue;
      load_lane<E, DPL>(static_cast<const E*>(head.value_means) + (size_t)j * HD + lane * DPL, v[u]);
      count[u] = (float)head.counts[j];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < ng) x[u][g] = w.scores[((size_t)h * a.group + g0 + g) * a.max_n + j];
    }
#pragma unroll
    for (int u = 0; u < kFarUnroll; ++u) {
      if (!use[u]) continue;
      const float lw = logf(count[u]);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= ng) break;
        online_add(x[u][g] * a.scale + lw, v[u], m[g], l[g], o[g]);
      }
    }
  }
  store_block_partials(sm, m, l, o, ng, (size_t)h * a.group + g0, a.part0 + split, a.parts, a.part_m, a.part_l,
                       a.part_o);
}

template <class F> void with_head_dim(int hd, F&& f) {
  switch (hd) {
    case 64: f(std::integral_constant<int, 64>{}); return;
    case 128: f(std::integral_constant<int, 128>{}); return;
    case 256: f(std::integral_constant<int, 256>{}); return;
  }
  fail("the device search supports head_dim 64, 128 and 256, not {}", hd);
}

}  // namespace

size_t summary_search_workspace_bytes(int n_kv, int group, int max_n) {
  size_t bytes = 0;
  carve(nullptr, n_kv, group, max_n, &bytes);
  return bytes;
}

const float* summary_scores(const SummarySearchArgs& a) { return carve(a.workspace, a.n_kv, a.group, a.max_n).scores; }
const uint8_t* summary_selected(const SummarySearchArgs& a) {
  return carve(a.workspace, a.n_kv, a.group, a.max_n).selected;
}

void summary_search(const SummarySearchArgs& a, cudaStream_t stream) {
  TOPKV_CHECK(a.n_kv >= 1 && a.group >= 1 && a.group <= 64 && a.max_n >= 0 && a.k >= 1 && a.cap >= 0,
              "device search: bad shape (kv heads {}, group {} (at most 64), groups {}, k {}, cap {})", a.n_kv,
              a.group, a.max_n, a.k, a.cap);
  TOPKV_CHECK(a.far_splits == 0 || a.part0 + a.far_splits <= a.parts,
              "device search writes far partial slots {}..{} of {}", a.part0, a.part0 + a.far_splits - 1, a.parts);
  const Work w = carve(a.workspace, a.n_kv, a.group, a.max_n);
  const unsigned gz = (unsigned)((a.group + kMaxGroup - 1) / kMaxGroup);
  using A = SummarySearchArgs;
  if (a.max_n > 0 && (a.phases & A::kSearchScore)) {
    const size_t rows = (size_t)a.n_kv * a.group;
    TOPKV_CUDA_CHECK(cudaMemsetAsync(w.minmax, 0xff, rows * sizeof(uint32_t), stream));  // min: all ones
    TOPKV_CUDA_CHECK(cudaMemsetAsync(w.minmax + rows, 0, rows * sizeof(uint32_t), stream));
    const int per_block = kScoreWarps * kScoreRows * kScoreIters;
    const dim3 grid((unsigned)((a.max_n + per_block - 1) / per_block), (unsigned)a.n_kv, gz);
    with_elem_type(a.table_type, [&](auto e) {
      using E = decltype(e);
      with_head_dim(a.head_dim, [&](auto hd) {
        if (a.page_bounds) score_kernel<E, hd(), true><<<grid, kScoreWarps * 32, 0, stream>>>(a, w);
        else score_kernel<E, hd(), false><<<grid, kScoreWarps * 32, 0, stream>>>(a, w);
      });
    });
    TOPKV_CUDA_CHECK_LAUNCH();
  }
  if (a.max_n > 0 && (a.phases & A::kSearchCut)) {
    threshold_kernel<<<(unsigned)(a.n_kv * a.group), kSelectThreads, 0, stream>>>(a, w);
    TOPKV_CUDA_CHECK_LAUNCH();
  }
  if (a.max_n > 0 && (a.phases & A::kSearchGather)) {
    const dim3 grid((unsigned)((a.max_n + 255) / 256), (unsigned)a.n_kv);
    mark_kernel<<<grid, 256, 0, stream>>>(a, w);
    TOPKV_CUDA_CHECK_LAUNCH();
    scan_kernel<<<(unsigned)a.n_kv, kSelectThreads, 0, stream>>>(a, w);
    TOPKV_CUDA_CHECK_LAUNCH();
    write_kernel<<<grid, 256, 0, stream>>>(a, w, (size_t)a.head_dim * dtype_size(a.store_type));
    TOPKV_CUDA_CHECK_LAUNCH();
  } else if (a.max_n == 0) {
    TOPKV_CUDA_CHECK(cudaMemsetAsync(a.counts, 0, (size_t)a.n_kv * sizeof(int32_t), stream));
  }
  if (a.far_splits > 0 && (a.phases & A::kSearchFar)) {
    const dim3 grid((unsigned)a.n_kv, (unsigned)a.far_splits, gz);
    with_elem_type(a.table_type, [&](auto e) {
      using E = decltype(e);
      with_head_dim(a.head_dim, [&](auto hd) { far_kernel<E, hd()><<<grid, kFarWarps * 32, 0, stream>>>(a, w); });
    });
    TOPKV_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace topkv::cuda
