// The device search's far rows (cuda_kernels.h, summary_search, step 4):
// Multipole's far field ("Multipole Attention for Efficient Long Context
// Reasoning", Sec. 3.2): every group the cut did not take attends as one
// weighted row, logit scale * x + ln N_j and value V̄_j, into attention
// partials of its own, which the row-list partials are merged with exactly.
// With rerank's far_dropped, the candidates no query head kept are far rows
// of their own (4b).
#include <type_traits>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"
#include "gpu/partial_block.cuh"
#include "gpu/summary_search_work.cuh"

namespace topkv::cuda::summary_work {
namespace {

constexpr int kFarWarps = 4;

// 4b. far_dropped: this split's share of the KV head's candidates (3b); a
// candidate not listed whose group is selected (a row of it was) is a far
// row of its own, logit scale * q.k (row_dots: every query head's), value
// V̄_j of its group. No spread term: the score is the row's own.
template <class E, int HD, int NG>
__device__ __forceinline__ void add_dropped_rows(const SummarySearchArgs& a, const Work& w, int h, int split, int g0,
                                                 int ng, float (&m)[NG], float (&l)[NG], float (&o)[NG][HD / 32]) {
  constexpr int DPL = HD / 32, U = 4;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n = w.cand_count[h], per = (n + a.far_splits - 1) / a.far_splits;
  const int first = split * per, last = min(n, first + per);
  const size_t base = (size_t)h * w.cand_cap;
  const uint8_t* sel = w.selected + (size_t)h * a.max_n;
  const E* means = static_cast<const E*>(a.heads[h].value_means);  // i8: codes (far_kernel scales o)
  for (int t0 = first + warp * U; t0 < last; t0 += kFarWarps * U) {
    float v[U][DPL];
    bool use[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {  // the same for the whole warp
      const int t = t0 + u;
      const uint32_t j = t < last ? w.cand_group[base + t] : 0u;
      use[u] = t < last && !w.cand_listed[base + t] && sel[j];
      if (use[u]) load_lane<E, DPL>(means + (size_t)j * HD + lane * DPL, v[u]);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (!use[u]) continue;
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        if (g >= ng) break;
        const float x = w.row_dots[((size_t)h * a.group + g0 + g) * w.cand_cap + t0 + u] * a.scale;
        online_add(x, v[u], m[g], l[g], o[g]);
      }
    }
  }
}

// 4. Far rows: every group not selected, logit scale * x + ln N_j, value V̄_j
// (i8 value means: codes, their scales applied to the output once);
// SPREAD: plus min(spread s^2/2 q^2.var_j, ln clip) (far_spread_logit), from
// the block's queries in shared memory (load_block_queries) and var_j, a
// lane's dims each and a warp sum (one more table row read per far group).
// Grid: x = KV head, y = split of its groups, z = chunk of NG query heads
// (NG: 4, or 8 where a KV head has more than 4).
//
// The split's groups go kFarStage at a time: first the block stages their
// scores (NG rows, coalesced) and ln N_j (-inf for a selected group) in
// shared memory, so that a warp knows which rows it reads without a
// dependent global load; then each warp streams U contiguous value-mean rows
// at a time, all in flight together, and folds them into its softmax state
// once a round (one rescale per query head and round, not one per row).
// The kernel before this (one row per load round, the selected byte read
// first, kMaxGroup-sized state) held 128 registers, ran 24% of the warps an
// SM can hold and read the means at 11.5% of the H100's DRAM bandwidth
// (ncu, Llama-8B 512K layer, 193 us: bench/results/gpu_session30/out/ncu_compact.txt).
// This one (93 registers at head_dim 128 and NG 4): 161 -> 52 us at that
// layer in `bench gpu-ops --only search` on one H100 (67 MB of value means:
// 1.3 TB/s), Gemma 3 at 1M 92 -> 31 us (out2/search-ab.txt).
// A split is ~128 groups (kFarGroupsPerSplit); the shared memory stays under
// 48 KB at head_dim 256.
constexpr int kFarStage = 128;
template <int HD> constexpr int far_rows_in_flight() { return HD <= 128 ? 8 : 4; }

template <class E, int HD, bool SPREAD, int NG>
__global__ void __launch_bounds__(kFarWarps * 32) far_kernel(const SummarySearchArgs a, Work w) {
  constexpr int DPL = HD / 32, U = far_rows_in_flight<HD>();
  __shared__ BlockPartials<HD, kFarWarps, NG> sm;
  __shared__ float s_x[NG][kFarStage], s_lw[kFarStage];
  const int h = blockIdx.x, split = blockIdx.y, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g0 = blockIdx.z * NG, ng = min(NG, a.group - g0);
  const SummaryHead head = a.heads[h];
  __shared__ __align__(16) float sq[SPREAD ? NG : 1][SPREAD ? HD : 1];
  const float spread_c = SPREAD ? 0.5f * a.spread * a.scale * a.scale : 0.f;
  const float log_clip = SPREAD ? logf(a.spread_clip) : 0.f;
  if constexpr (SPREAD) load_block_queries<HD>(sq, a, h, g0, ng);
  const int per = (head.n + a.far_splits - 1) / a.far_splits;
  const int first = split * per, last = min(head.n, first + per);
  const uint8_t* sel = w.selected + (size_t)h * a.max_n;
  const E* means = static_cast<const E*>(head.value_means);
  float m[NG], l[NG], o[NG][DPL];
#pragma unroll
  for (int g = 0; g < NG; ++g) {
    m[g] = -INFINITY, l[g] = 0.f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) o[g][i] = 0.f;
  }
  for (int c0 = first; c0 < last; c0 += kFarStage) {
    const int cn = min(kFarStage, last - c0);
    for (int i = threadIdx.x; i < cn; i += blockDim.x)
      s_lw[i] = sel[c0 + i] ? -INFINITY : logf((float)head.counts[c0 + i]);
    for (int i = threadIdx.x; i < ng * kFarStage; i += blockDim.x) {
      const int g = i / kFarStage, j = i % kFarStage;
      if (j < cn) s_x[g][j] = w.scores[((size_t)h * a.group + g0 + g) * a.max_n + c0 + j] * a.scale;
    }
    __syncthreads();
    for (int r0 = warp * U; r0 < cn; r0 += kFarWarps * U) {
      float v[U][DPL];
      bool use[U];  // the same for the whole warp
#pragma unroll
      for (int u = 0; u < U; ++u) {
        use[u] = r0 + u < cn && s_lw[r0 + u] != -INFINITY;
        if (use[u]) load_lane<E, DPL>(means + (size_t)(c0 + r0 + u) * HD + lane * DPL, v[u]);
        else {
#pragma unroll
          for (int i = 0; i < DPL; ++i) v[u][i] = 0.f;
        }
      }
      float sp[U][SPREAD ? NG : 1];
      if constexpr (SPREAD) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          if (!use[u]) continue;
          float var[DPL];
          load_lane<E, DPL>(static_cast<const E*>(head.key_var) + (size_t)(c0 + r0 + u) * HD + lane * DPL, var);
          LaneScale<E, DPL>(head.key_var_scale, lane).apply(var);  // i8 (L1 hits after the first)
#pragma unroll
          for (int g = 0; g < NG; ++g) {
            if (g >= ng) break;
            float acc = 0.f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) {
              const float qi = sq[g][lane * DPL + i];
              acc += qi * qi * var[i];
            }
            sp[u][g] = fminf(spread_c * warp_sum(acc), log_clip);
          }
        }
      }
#pragma unroll
      for (int g = 0; g < NG; ++g) {
        if (g >= ng) break;
        float x[U], mx = m[g];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          x[u] = -INFINITY;
          if (use[u]) {
            float xs = s_x[g][r0 + u];
            if constexpr (SPREAD) xs += sp[u][g];
            x[u] = xs + s_lw[r0 + u];
          }
          mx = fmaxf(mx, x[u]);
        }
        if (mx == -INFINITY) continue;  // no far row this round (the same for the whole warp)
        const float c = __expf(m[g] - mx);  // 0 while the state is empty (m = -inf)
        float lsum = l[g] * c;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[g][i] *= c;
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const float p = __expf(x[u] - mx);  // 0 for a row not used
          lsum += p;
#pragma unroll
          for (int i = 0; i < DPL; ++i) o[g][i] = fmaf(p, v[u][i], o[g][i]);
        }
        l[g] = lsum, m[g] = mx;
      }
    }
    __syncthreads();  // the stage is refilled by the next round of the split
  }
  if (w.cand_listed) add_dropped_rows<E, HD, NG>(a, w, h, split, g0, ng, m, l, o);
  // i8 value means: o summed p * code; sum p * (s * code) = s * that, once
  // here (the scales read here, not held in registers through the loop).
  const LaneScale<E, DPL> mean_scale(head.value_means_scale, lane);
#pragma unroll
  for (int g = 0; g < NG; ++g) mean_scale.apply(o[g]);
  store_block_partials(sm, m, l, o, ng, (size_t)h * a.group + g0, a.part0 + split, a.parts, a.part_m, a.part_l,
                       a.part_o);
}

}  // namespace

void summary_far(const SummarySearchArgs& a, const Work& w, cudaStream_t stream) {
  const auto far = [&](auto ng) {
    constexpr int NG = decltype(ng)::value;
    const dim3 grid((unsigned)a.n_kv, (unsigned)a.far_splits, (unsigned)((a.group + NG - 1) / NG));
    with_table_type(a.table_type, [&](auto e) {
      using E = decltype(e);
      with_head_dim(a.head_dim, [&](auto hd) {
        if (a.spread > 0.f) far_kernel<E, hd(), true, NG><<<grid, kFarWarps * 32, 0, stream>>>(a, w);
        else far_kernel<E, hd(), false, NG><<<grid, kFarWarps * 32, 0, stream>>>(a, w);
      });
    });
  };
  if (a.group <= 4) far(std::integral_constant<int, 4>{});
  else far(std::integral_constant<int, kMaxGroup>{});
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda::summary_work
