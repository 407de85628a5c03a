// Decode attention v3 (one query token, T = 1): split-KV over one full wave
// of small blocks, after Flash-Decoding (Dao, Haziza, Massa, Sizov 2023,
// "Flash-Decoding for long-context inference": split the keys until the
// device is full, merge the partials exactly) and FlashInfer's decode
// kernels (Ye et al. 2025, "FlashInfer: Efficient and Customizable Attention
// Engine for LLM Inference Serving": every query head of a KV head in one
// block, so each K/V row is read once; cp.async stages). Twin:
// CpuBackend::attention with T = 1; the v2 kernel (attention_decode_kernel.cuh,
// one 16-warp block per SM) stays selectable (TOPKV_DECODE_ATTN=v2).
//   - grid (split, KV head x row tile), one wave: sm_count x kBlocksPerSm
//     blocks of 4 warps in all (4 per SM for R = 4 rows, 2 for R = 8), so a
//     single KV head (Gemma 3: 4 query heads on 1) still puts 16 warps on
//     every SM. The splits cut the visible keys evenly (>= kMinSplitKeys
//     each); the number of splits depends on the cache geometry only (CUDA
//     graphs), splits past the visible keys are empty;
//   - the 4 warps of a block take turns over steps of STEP keys; each warp
//     streams its steps through a private cp.async pipeline kStages deep:
//     per step 4 x 16 bytes of K and of V per lane (4 KB per warp: half as
//     many steps as 2 x 16 would take; the SASS of the Llama shape's loop
//     runs ~75 instructions per key instead of ~90), 2 steps in flight, ~128
//     KB per SM for R = 4 (Little's law at 3 TB/s and ~1 us of loaded latency
//     asks ~23 KB). A lane reads back only the bytes it copied itself: no
//     barrier in the loop;
//   - the step's math is v2's (its helpers are used as they are): partial
//     scores of the lane's 16-byte chunks, reduce-scattered over the lanes
//     of a key, scores in log2 units (q pre-scaled by scale * log2 e, one
//     ex2_ftz each), the online softmax (m, l, o) per lane, merged over the
//     key segments of a warp, then over the warps in shared memory;
//   - the partial (m, l, o) of each (query head, split) goes to the work
//     space. The non-empty splits are a prefix (split_range); an empty one
//     writes m = -inf, l = 0 only, and the merge kernel (below) reads the
//     prefix without a branch. With one split the block writes the output.
// Included by gpu/kernels_attention_decode.cu only (host plan, launch).
#pragma once
#include "gpu/attention_decode_kernel.cuh"

namespace topkv::cuda::decode_attn_v3 {

using decode_attn::DecodeKernelArgs;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStages = 3;
constexpr int64_t kMinSplitKeys = 32;  // a shorter split costs more in its merge than it saves
constexpr int kMaxSplits = 1024;       // the merge holds one weight per split in shared memory
constexpr int kMergeThreads = 256;     // 8 lanes x 4 dims = 32 dims, times 32 groups of splits
// Blocks the split count assumes resident per SM (one wave): __launch_bounds__
// holds R = 4 to 128 registers (4 x 128 threads), R = 8 to 255.
constexpr int blocks_per_sm(int rows) { return rows <= 4 ? 4 : 2; }

// Geometry of one instantiation (E cache element, HD head dim, R query rows).
template <class E, int HD, int R> struct Geo {
  static constexpr int VE = 16 / (int)sizeof(E);   // elements per 16-byte chunk
  static constexpr int C = HD / VE;                // chunks per row
  static constexpr int LPK = C >= 32 ? 32 : C > 16 ? 32 : C > 8 ? 16 : C > 4 ? 8 : 4;  // lanes per key
  static constexpr int CPL = C >= 32 ? C / 32 : 1;  // chunks per lane
  static constexpr int KPW = 32 / LPK;              // keys per warp load
  static constexpr int FPR = CPL * VE;              // floats of a row a lane owns
  static constexpr int U = CPL >= 4 ? 1 : 4 / CPL;  // warp loads per step: 4 chunks of K and of V per lane
  static constexpr int STEP = U * KPW;              // keys per warp step
  static constexpr int NV = U * R;                  // scores per lane per step (before the reduce-scatter)
  static constexpr int LL = decode_attn::ilog2(LPK);
  static constexpr int H = NV >= LPK ? NV / LPK : 1;                            // scores a lane holds after it
  static constexpr int SH = NV >= LPK ? 0 : decode_attn::ilog2(LPK) - decode_attn::ilog2(NV);  // lanes alike: 2^SH
  static constexpr int W = kWarps, NT = kThreads;
  static constexpr size_t stage_bytes = (size_t)U * CPL * 2 * 16 * NT;  // K and V chunks of every thread
  static constexpr size_t merge_bytes = ((size_t)W * R * HD + 2 * (size_t)W * R + 2 * R) * sizeof(float);
  static constexpr size_t smem_bytes = std::max(kStages * stage_bytes, merge_bytes);
  static constexpr int min_blocks = blocks_per_sm(R);
  static_assert(C * VE == HD && (C < 32 || C % 32 == 0), "head_dim must split into 16-byte chunks over the lanes");
  static_assert((NV & (NV - 1)) == 0, "the reduce-scatter halves the scores at each level");
  static_assert(smem_bytes <= 48 * 1024, "v3 blocks stay under the default shared-memory limit");
};

// 2^x on the SFU with subnormal results flushed to 0: one MUFU.EX2, where
// exp2f adds three instructions to keep subnormals (20 exponentials per warp
// step at R = 4: ~10% of the loop). A weight below 2^-126 of the running maximum
// changes no sum; the approximation is exp2f's (2 ulp).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// The keys of split `split` out of n_splits: the n visible keys [lo, lo + n)
// cut into `active` nearly equal ranges of >= kMinSplitKeys (all n when
// n < kMinSplitKeys); splits >= active are empty (returns false).
__device__ __forceinline__ bool split_range(int64_t lo, int64_t n, int n_splits, int split, int64_t& k_begin,
                                            int64_t& k_end) {
  const int64_t active = min((int64_t)n_splits, max((int64_t)1, n / kMinSplitKeys));
  if (split >= active) return false;
  k_begin = lo + (int64_t)split * n / active;
  k_end = lo + (int64_t)(split + 1) * n / active;
  return true;
}

template <class E, int HD, int R>
__global__ void __launch_bounds__(kThreads, Geo<E, HD, R>::min_blocks) decode_attention_v3_kernel(
    const DecodeKernelArgs a) {
  using G = Geo<E, HD, R>;
  constexpr int VE = G::VE, C = G::C, LPK = G::LPK, CPL = G::CPL, KPW = G::KPW, FPR = G::FPR, U = G::U;
  constexpr int STEP = G::STEP, W = G::W, NT = G::NT, NV = G::NV, H = G::H, SH = G::SH, LL = G::LL;
  extern __shared__ uint4 dsmem[];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int seg = lane / LPK, c = lane % LPK;  // key slot within a warp load, chunk within the row
  const bool lane_active = c < C;              // head dims 32/96 leave some lanes without a chunk
  const int kh = blockIdx.y / a.row_tiles, rt = blockIdx.y % a.row_tiles, split = blockIdx.x;
  const int g0 = rt * R;  // first query head of the group in this block
  const int rows = min(R, a.group - g0);
  const int n_head_row0 = kh * a.group + g0;  // query head of row 0

  const int64_t pos = a.dev_pos ? *a.dev_pos : a.pos;
  const int64_t lo = a.window > 0 ? max((int64_t)0, pos - a.window + 1) : (int64_t)0;
  int64_t k_begin = 0, k_end = 0;
  if (!split_range(lo, pos - lo + 1, a.n_splits, split, k_begin, k_end)) {
    // Empty split (block-uniform; never when n_splits == 1): l = 0 tells the
    // merge to stop before it, o is left unwritten.
    if (tid < rows) {
      const int64_t pi = (int64_t)(n_head_row0 + tid) * a.n_splits + split;
      a.part_m[pi] = -INFINITY, a.part_l[pi] = 0.f;
    }
    return;
  }

  // q rows, this lane's dims d = (c + j*LPK)*VE + e, pre-scaled by scale * log2(e).
  const float qscale = a.scale * 1.4426950408889634f;
  float q[R][FPR];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int j = 0; j < CPL; ++j)
#pragma unroll
      for (int e = 0; e < VE; ++e) {
        const int d = (c + j * LPK) * VE + e;
        q[r][j * VE + e] = (r < rows && lane_active) ? a.q[(int64_t)(n_head_row0 + r) * HD + d] * qscale : 0.f;
      }
  float m[R], l[R], o[R][FPR];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY, l[r] = 0.f;
#pragma unroll
    for (int i = 0; i < FPR; ++i) o[r][i] = 0.f;
  }

  const E* kbase = static_cast<const E*>(a.k) + (int64_t)kh * a.capacity * HD;
  const E* vbase = static_cast<const E*>(a.v) + (int64_t)kh * a.capacity * HD;
  const int64_t slot0 = k_begin % a.capacity;  // the range wraps the ring at most once (n <= capacity)
  // Staging slot of (stage, u, j, K/V) for this thread: consecutive threads, consecutive 16 bytes.
  auto stg = [&](int st, int u, int j, int kv) -> uint4* {
    return dsmem + ((((st * U + u) * CPL + j) * 2 + kv) * NT + tid);
  };
  // Queues the K and V chunks of the warp step at key `b` into stage st; keys
  // past the split (and lanes without a chunk) get zeros, so p * v stays finite.
  auto issue = [&](int st, int64_t b) {
    if (b < k_end) {  // warp-uniform
      int64_t slot_b = slot0 + (b - k_begin);
      if (slot_b >= a.capacity) slot_b -= a.capacity;
      if (b + STEP <= k_end && slot_b + STEP <= a.capacity && lane_active) {
        // The usual step: every key valid, contiguous slots.
        const E* kp = kbase + (slot_b + seg) * HD + c * VE;
        const E* vp = vbase + (slot_b + seg) * HD + c * VE;
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int j = 0; j < CPL; ++j) {
            decode_attn::cp_async16(stg(st, u, j, 0), kp + (u * KPW * HD + j * LPK * VE), 16u);
            decode_attn::cp_async16(stg(st, u, j, 1), vp + (u * KPW * HD + j * LPK * VE), 16u);
          }
        decode_attn::cp_async_commit();
        return;
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t key = b + u * KPW + seg;
        const bool ok = key < k_end && lane_active;
        int64_t slot = slot0 + (key - k_begin);
        if (slot >= a.capacity) slot -= a.capacity;
#pragma unroll
        for (int j = 0; j < CPL; ++j) {
          const int64_t off = ok ? slot * HD + (c + j * LPK) * VE : 0;
          decode_attn::cp_async16(stg(st, u, j, 0), kbase + off, ok ? 16u : 0u);
          decode_attn::cp_async16(stg(st, u, j, 1), vbase + off, ok ? 16u : 0u);
        }
      }
    }
    decode_attn::cp_async_commit();  // one group per step, even an empty one, so wait_group counts steps
  };

  const int64_t stride = (int64_t)W * STEP;
  int64_t fetch = k_begin + (int64_t)warp * STEP;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st, fetch += stride) issue(st, fetch);
  int stage = 0;
  for (int64_t b = k_begin + (int64_t)warp * STEP; b < k_end; b += stride) {
    issue((stage + kStages - 1) % kStages, fetch);  // refills the stage consumed last step
    fetch += stride;
    decode_attn::cp_async_wait<kStages - 1>();  // this step's group has landed (this thread's copies)

    // Partial scores of this lane's dims: v[r*U + u] for key u*KPW + seg of the step.
    float v[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] = 0.f;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        float kf[VE];
        decode_attn::unpack_chunk<E>(*stg(stage, u, j, 0), kf);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < VE; ++e) v[r * U + u] = fmaf(q[r][j * VE + e], kf[e], v[r * U + u]);
      }
    // Finished scores: lane c holds idx = c*H + k, or idx = c >> SH (see v2).
    decode_attn::reduce_scatter<0, LL, NV, LPK>(v, c);
#pragma unroll
    for (int k = 0; k < H; ++k) {
      const int idx = NV >= LPK ? c * H + k : c >> SH;
      if (b + (idx % U) * KPW + seg >= k_end) v[k] = -INFINITY;  // keys past the split
    }
    float sc[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i)
      sc[i] = __shfl_sync(0xffffffffu, v[NV >= LPK ? i % H : 0], seg * LPK + (NV >= LPK ? i / H : i << SH));

    // Online softmax per row (log2 domain); mref keeps exp2's argument finite
    // while the segment has seen no key (m = -inf: corr and p are 0).
    float corr[R];
    bool grew = false;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float mx = sc[r * U];
#pragma unroll
      for (int u = 1; u < U; ++u) mx = fmaxf(mx, sc[r * U + u]);
      const float mnew = fmaxf(m[r], mx), mref = mnew == -INFINITY ? 0.f : mnew;
      corr[r] = ex2_ftz(m[r] - mref);
      grew |= corr[r] != 1.f;
      m[r] = mnew;
      float ps = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        sc[r * U + u] = ex2_ftz(sc[r * U + u] - mref);
        ps += sc[r * U + u];
      }
      l[r] = l[r] * corr[r] + ps;
    }
    if (__any_sync(0xffffffffu, grew))
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < FPR; ++i) o[r][i] *= corr[r];
    // o += p v over this lane's dims
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        float vf[VE];
        decode_attn::unpack_chunk<E>(*stg(stage, u, j, 1), vf);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < VE; ++e) o[r][j * VE + e] = fmaf(sc[r * U + u], vf[e], o[r][j * VE + e]);
      }
    stage = (stage + 1) % kStages;
  }
  decode_attn::cp_async_wait<0>();

  // Merge the KPW key segments of the warp (lanes c, c + LPK, ... hold the same dims).
#pragma unroll
  for (int off = LPK; off < 32; off <<= 1)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[r], off), l2 = __shfl_xor_sync(0xffffffffu, l[r], off);
      const float M = fmaxf(m[r], m2);
      const float f1 = m[r] == -INFINITY ? 0.f : ex2_ftz(m[r] - M), f2 = m2 == -INFINITY ? 0.f : ex2_ftz(m2 - M);
      l[r] = l[r] * f1 + l2 * f2;
#pragma unroll
      for (int i = 0; i < FPR; ++i) {
        const float o2 = __shfl_xor_sync(0xffffffffu, o[r][i], off);
        o[r][i] = o[r][i] * f1 + o2 * f2;
      }
      m[r] = M;
    }

  // Merge the warps through shared memory (the staging area is free once every warp is here).
  __syncthreads();
  float* wo = reinterpret_cast<float*>(dsmem);  // [W][R][HD]
  float* wm = wo + W * R * HD;                  // [W][R], then the per-warp factors
  float* wl = wm + W * R;                       // [W][R]
  float* rowML = wl + W * R;                    // [R]: M, then [R]: L
  if (seg == 0 && lane_active)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int j = 0; j < CPL; ++j)
#pragma unroll
        for (int e = 0; e < VE; ++e) wo[(warp * R + r) * HD + (c + j * LPK) * VE + e] = o[r][j * VE + e];
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r) wm[warp * R + r] = m[r], wl[warp * R + r] = l[r];
  __syncthreads();
  if (tid < R) {  // a warp that saw no key (a split shorter than a round) has l = 0
    float M = -INFINITY;
    for (int w = 0; w < W; ++w)
      if (wl[w * R + tid] > 0.f) M = fmaxf(M, wm[w * R + tid]);
    float L = 0.f;
    for (int w = 0; w < W; ++w) {
      const float f = wl[w * R + tid] > 0.f ? ex2_ftz(wm[w * R + tid] - M) : 0.f;
      wm[w * R + tid] = f;  // each thread rewrites only its own row's entries
      L += wl[w * R + tid] * f;
    }
    rowML[tid] = M, rowML[R + tid] = L;
  }
  __syncthreads();
  for (int idx = tid; idx < rows * HD; idx += NT) {
    const int r = idx / HD, d = idx % HD;
    float acc = 0.f;
#pragma unroll
    for (int w = 0; w < W; ++w) acc = fmaf(wo[(w * R + r) * HD + d], wm[w * R + r], acc);
    const int64_t h = n_head_row0 + r;
    if (a.n_splits == 1) {
      const float L = rowML[R + r];
      a.out[h * HD + d] = L > 0.f ? acc / L : 0.f;
    } else {
      const int64_t pi = h * a.n_splits + split;
      a.part_o[pi * HD + d] = acc;
      if (d == 0) a.part_m[pi] = rowML[r], a.part_l[pi] = rowML[R + r];
    }
  }
}

// The exact merge of the splits (DESIGN.md, "The math that must be exact"),
// in log2 units: M = max m_s, L = sum l_s 2^(m_s - M), out = sum o_s 2^(m_s - M) / L.
// Block (query head, 32 dims), 256 threads: the weights 2^(m_s - M) once
// per split into shared memory (0 for an empty split), then 32 groups of 8
// lanes (4 dims each, 16-byte loads) take every 32nd split of the non-empty
// prefix [0, S_act) (S_act = 1 + the last split with l > 0; its o are all
// written), with no branch, so the loads can all be in flight at once; the
// groups' sums meet in shared memory.
// Layout: m, l [n_head][S]; o [n_head][S][hd], 16-byte aligned (carve_partials_v3).
__global__ void __launch_bounds__(kMergeThreads) decode_merge_v3_kernel(const float* __restrict__ pm,
                                                                         const float* __restrict__ pl,
                                                                         const float* __restrict__ po, int S, int hd,
                                                                         float* __restrict__ out) {
  constexpr int kWarpsM = kMergeThreads / 32, kGroups = kMergeThreads / 8;
  __shared__ float wt[kMaxSplits];
  __shared__ float red_m[kWarpsM], red_l[kWarpsM];
  __shared__ int red_n[kWarpsM];
  __shared__ float4 part[kGroups][8];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int64_t h = blockIdx.x;
  const float* mr = pm + h * S;
  const float* lr = pl + h * S;

  float M = -INFINITY;
  int n_act = 0;
  for (int s = tid; s < S; s += kMergeThreads)
    if (lr[s] > 0.f) M = fmaxf(M, mr[s]), n_act = s + 1;
  M = warp_max(M);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) n_act = max(n_act, __shfl_xor_sync(0xffffffffu, n_act, o));
  if (lane == 0) red_m[warp] = M, red_n[warp] = n_act;
  __syncthreads();
  M = red_m[0], n_act = red_n[0];
#pragma unroll
  for (int w = 1; w < kWarpsM; ++w) M = fmaxf(M, red_m[w]), n_act = max(n_act, red_n[w]);
  float L = 0.f;
  for (int s = tid; s < n_act; s += kMergeThreads) {
    const float ls = lr[s], f = ls > 0.f ? ex2_ftz(mr[s] - M) : 0.f;
    wt[s] = f;
    L = fmaf(ls, f, L);
  }
  L = warp_sum(L);
  if (lane == 0) red_l[warp] = L;
  __syncthreads();  // also publishes wt
  L = 0.f;
#pragma unroll
  for (int w = 0; w < kWarpsM; ++w) L += red_l[w];

  const int q = tid % 8, g = tid / 8;
  const float* orow = po + h * S * (int64_t)hd + blockIdx.y * 32 + q * 4;
  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 8
  for (int s = g; s < n_act; s += kGroups) {
    const float f = wt[s];
    const float4 o = *reinterpret_cast<const float4*>(orow + (int64_t)s * hd);
    acc.x = fmaf(o.x, f, acc.x), acc.y = fmaf(o.y, f, acc.y), acc.z = fmaf(o.z, f, acc.z);
    acc.w = fmaf(o.w, f, acc.w);
  }
  part[g][q] = acc;
  __syncthreads();
  if (tid < 32) {  // dim blockIdx.y * 32 + tid: component tid % 4 of lane tid / 4
    const int qq = tid / 4, e = tid % 4;
    float sum = 0.f;
    for (int gg = 0; gg < kGroups; ++gg) {
      const float4 p = part[gg][qq];
      sum += e == 0 ? p.x : e == 1 ? p.y : e == 2 ? p.z : p.w;
    }
    out[h * hd + blockIdx.y * 32 + tid] = L > 0.f ? sum / L : 0.f;
  }
}

// The partials' arrays in one work space of n = n_head x S partials: m [n],
// l [n], then o [n][hd] from a 16-byte boundary (the merge loads float4).
inline size_t partials_bytes(size_t n, int hd) { return (2 * ((n + 3) / 4 * 4) + n * (size_t)hd) * sizeof(float); }
inline void carve_partials_v3(void* workspace, size_t n, float*& m, float*& l, float*& o) {
  const size_t n4 = (n + 3) / 4 * 4;
  m = static_cast<float*>(workspace);
  l = m + n4;
  o = l + n4;
}

}  // namespace topkv::cuda::decode_attn_v3
