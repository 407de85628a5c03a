// The decode attention kernel (one query token, T = 1) over the KV cache, split-KV
// (flash-decoding), twin of CpuBackend::attention for T = 1. Bound: the cache
// read, 2 * head_dim * elem bytes per visible key and KV head, so the kernel
// is built to keep HBM busy rather than to save arithmetic:
//   - grid (split, KV head x row tile): one block per SM-sized slice of the
//     keys; a block holds every query head of its KV head (up to R = 4 or 8
//     rows), so each K/V row is read from HBM exactly once;
//   - each warp streams its own keys through a private cp.async pipeline,
//     kStages deep, 16-byte copies straight into shared memory: 8 KB per
//     warp in flight while the warp computes, ~128 KB per SM. Every lane
//     reads back only the bytes it copied itself, so no barrier is needed in
//     the loop;
//   - lanes split a key row in 16-byte chunks (LPK lanes per key, KPW keys
//     per warp load); the partial scores of a stage are reduce-scattered over
//     the LPK lanes (about NV shuffles for NV scores, not NV log2 LPK) and
//     shared back; the online softmax (m, l, o) is kept per lane for the
//     keys of its segment and merged across segments, warps and finally splits (the exact merge
//     of DESIGN.md) at the end.
// The plan (number of splits) depends only on the cache geometry, never on
// the position: the position may come from device memory (recorded decode
// steps, CUDA graphs), each split finds its key range from it, and splits
// past the visible keys write an empty partial (l = 0) that the merge skips.
// fp32 arithmetic throughout: q is pre-scaled by scale * log2(e), so scores,
// maxima and the partials' m are in log2 units and every exponential is one
// exp2f (2 ulp); matches the CPU (e^(s - m) on natural units) to ~1e-6.
// Included by gpu/kernels_attention_decode.cu only (host plan, launch, merge).
#pragma once
#include <algorithm>
#include <cstdint>

#include "gpu/cuda_common.cuh"

namespace topkv::cuda::decode_attn {

constexpr int kStages = 3;
constexpr int64_t kMinSplitKeys = 256;  // fewer keys per split cost more to merge than they save
constexpr int64_t kSplitAlign = 64;     // split lengths are multiples of every warp step
constexpr int kMaxSplits = 1024;
constexpr int kMergeWarps = 8;

struct DecodeKernelArgs {
  const float* q;  // [n_head][HD]
  float* out;      // [n_head][HD], written when n_splits == 1
  const void* k;   // [n_kv][capacity][HD]
  const void* v;
  const int64_t* dev_pos;  // the position in device memory, or null: use pos
  int64_t pos, capacity, window;
  int group, row_tiles, n_splits;
  float scale;
  float *part_m, *part_l, *part_o;  // [n_head][n_splits] (x HD for o)
};

constexpr int ilog2(int x) { return x <= 1 ? 0 : 1 + ilog2(x / 2); }

// Geometry of one instantiation: E the cache element, HD the head dim, R the
// query rows (heads of one KV head) a block holds.
template <class E, int HD, int R> struct Geo {
  static constexpr int VE = 16 / (int)sizeof(E);   // elements per 16-byte chunk
  static constexpr int C = HD / VE;                // chunks per row
  static constexpr int LPK = C >= 32 ? 32 : C > 16 ? 32 : C > 8 ? 16 : C > 4 ? 8 : 4;  // lanes per key
  static constexpr int CPL = C >= 32 ? C / 32 : 1;  // chunks per lane
  static constexpr int KPW = 32 / LPK;              // keys per warp load
  static constexpr int FPR = CPL * VE;              // floats of a row a lane owns
  static constexpr int U = CPL >= 4 ? 1 : 4 / CPL;  // warp loads per stage: 8 x 16 B per lane
  static constexpr int STEP = U * KPW;              // keys per warp per stage
  static constexpr int NV = U * R;                  // scores per lane per stage (before the reduce-scatter)
  static constexpr int LL = ilog2(LPK);
  static constexpr int H = NV >= LPK ? NV / LPK : 1;                // scores a lane holds after it
  static constexpr int SH = NV >= LPK ? 0 : ilog2(LPK) - ilog2(NV);  // 2^SH lanes hold the same one
  static constexpr int W = R <= 4 ? 16 : 8;         // warps per block (R = 8 needs more registers)
  static constexpr int NT = W * 32;
  static constexpr size_t stage_bytes = (size_t)U * CPL * 2 * 16 * NT;  // K and V chunks of every thread
  static constexpr size_t merge_bytes = ((size_t)W * R * HD + 2 * (size_t)W * R + 2 * R) * sizeof(float);
  static constexpr size_t smem_bytes = std::max(kStages * stage_bytes, merge_bytes);
  static_assert(C * VE == HD && (C < 32 || C % 32 == 0), "head_dim must split into 16-byte chunks over the lanes");
  static_assert(kSplitAlign % STEP == 0, "a split must hold whole warp steps");
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, unsigned src_bytes) {
  const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// Level LVL of the reduce-scatter over LPK lanes (see the kernel, step 3):
// the lanes with bit `off` of c set keep the upper half of the n values
// still held; once one value is left the levels are a plain butterfly.
template <int LVL, int LL, int NV, int LPK> __device__ __forceinline__ void reduce_scatter(float (&v)[NV], int c) {
  if constexpr (LVL < LL) {
    constexpr int off = LPK >> (LVL + 1), n = NV >> LVL;
    if constexpr (n > 1) {
      const bool upper = (c & off) != 0;
#pragma unroll
      for (int i = 0; i < n / 2; ++i) {
        const float send = upper ? v[i] : v[i + n / 2], keep = upper ? v[i + n / 2] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, off);
      }
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], off);
    }
    reduce_scatter<LVL + 1, LL, NV, LPK>(v, c);
  }
}

template <class E> __device__ __forceinline__ void unpack_chunk(const uint4& raw, float* out) {
  if constexpr (sizeof(E) == 4) {
    out[0] = __uint_as_float(raw.x), out[1] = __uint_as_float(raw.y), out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  } else {
    Vec16<E>::unpack(raw, out);
  }
}

template <class E, int HD, int R>
__global__ void __launch_bounds__(Geo<E, HD, R>::NT, 1) decode_attention_kernel(const DecodeKernelArgs a) {
  using G = Geo<E, HD, R>;
  constexpr int VE = G::VE, C = G::C, LPK = G::LPK, CPL = G::CPL, KPW = G::KPW, FPR = G::FPR, U = G::U;
  constexpr int STEP = G::STEP, W = G::W, NT = G::NT, NV = G::NV, H = G::H, SH = G::SH, LL = G::LL;
  extern __shared__ uint4 dsmem[];

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int seg = lane / LPK, c = lane % LPK;  // key slot within a warp load, chunk within the row
  const bool lane_active = c < C;              // head dims 32/96 leave some lanes without a chunk
  const int kh = blockIdx.y / a.row_tiles, rt = blockIdx.y % a.row_tiles, split = blockIdx.x;
  const int g0 = rt * R;                       // first query head of the group in this block
  const int rows = min(R, a.group - g0);
  const int n_head_row0 = kh * a.group + g0;   // query head of row 0

  // This split's keys: the visible range [lo, pos] cut into n_splits pieces
  // of sk keys (at least kMinSplitKeys); later splits may be empty.
  const int64_t pos = a.dev_pos ? *a.dev_pos : a.pos;
  const int64_t lo = a.window > 0 ? max((int64_t)0, pos - a.window + 1) : (int64_t)0;
  const int64_t n = pos - lo + 1;
  const int64_t per = (n + a.n_splits - 1) / a.n_splits;
  const int64_t sk = max(kMinSplitKeys, (per + kSplitAlign - 1) / kSplitAlign * kSplitAlign);
  const int64_t k_begin = lo + (int64_t)split * sk, k_end = min(pos + 1, k_begin + sk);

  if (k_begin >= k_end) {  // empty split (block-uniform): l = 0 marks it for the merge
    if (tid < rows) {
      const int64_t pi = (int64_t)(n_head_row0 + tid) * a.n_splits + split;
      a.part_m[pi] = -INFINITY, a.part_l[pi] = 0.f;
    }
    return;
  }

  // q rows, this lane's dims d = (c + j*LPK)*VE + e, pre-scaled by scale *
  // log2(e): scores are in log2 units, so every exponential is one exp2f.
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
  // Queues the K and V chunks of the warp step at `b` into stage st; keys past
  // the split (and lanes without a chunk) get zeros, so p * v stays finite.
  auto issue = [&](int st, int64_t b) {
    if (b < k_end) {  // warp-uniform
      int64_t slot_b = slot0 + (b - k_begin);
      if (slot_b >= a.capacity) slot_b -= a.capacity;
      if (b + STEP <= k_end && slot_b + STEP <= a.capacity && lane_active) {
        // The usual step: all its keys valid, contiguous slots; offsets are constants from here.
        const E* kp = kbase + (slot_b + seg) * HD + c * VE;
        const E* vp = vbase + (slot_b + seg) * HD + c * VE;
#pragma unroll
        for (int u = 0; u < U; ++u)
#pragma unroll
          for (int j = 0; j < CPL; ++j) {
            cp_async16(stg(st, u, j, 0), kp + (u * KPW * HD + j * LPK * VE), 16u);
            cp_async16(stg(st, u, j, 1), vp + (u * KPW * HD + j * LPK * VE), 16u);
          }
        cp_async_commit();
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
          cp_async16(stg(st, u, j, 0), kbase + off, ok ? 16u : 0u);
          cp_async16(stg(st, u, j, 1), vbase + off, ok ? 16u : 0u);
        }
      }
    }
    cp_async_commit();  // one group per step, even an empty one, so wait_group counts steps
  };

  const int64_t stride = (int64_t)W * STEP;
  int64_t fetch = k_begin + (int64_t)warp * STEP;
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st, fetch += stride) issue(st, fetch);
  int stage = 0;
  for (int64_t b = k_begin + (int64_t)warp * STEP; b < k_end; b += stride) {
    issue((stage + kStages - 1) % kStages, fetch);  // refills the stage consumed last step
    fetch += stride;
    cp_async_wait<kStages - 1>();  // this step's group has landed (this thread's copies)

    // 2. partial scores of this lane's dims, v[r*U + u] (key u*KPW + seg of the step)
    float v[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i) v[i] = 0.f;
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        float kf[VE];
        unpack_chunk<E>(*stg(stage, u, j, 0), kf);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < VE; ++e) v[r * U + u] = fmaf(q[r][j * VE + e], kf[e], v[r * U + u]);
      }
    // 3. reduce-scatter over the LPK lanes of the key: at each level a lane
    // keeps half of its values and adds the partner's copy of that half, so
    // NV sums cost about NV shuffles instead of NV * log2(LPK). Afterwards lane
    // c holds the finished score idx = c*H + k (k < H), or, when there are
    // fewer scores than lanes, idx = c >> SH (in 2^SH lanes alike: the last
    // levels are a plain butterfly, whose sums agree bit for bit).
    reduce_scatter<0, LL, NV, LPK>(v, c);
    // Keys past the split score -inf; then every lane of the key segment gets
    // every finished score (its own dims need all of them).
#pragma unroll
    for (int k = 0; k < H; ++k) {
      const int idx = NV >= LPK ? c * H + k : c >> SH;
      if (b + (idx % U) * KPW + seg >= k_end) v[k] = -INFINITY;
    }
    float sc[NV];
#pragma unroll
    for (int i = 0; i < NV; ++i)
      sc[i] = __shfl_sync(0xffffffffu, v[NV >= LPK ? i % H : 0], seg * LPK + (NV >= LPK ? i / H : i << SH));

    // 4. online softmax per row (log2 domain); mref keeps exp2's argument
    // finite while the segment has seen no key (m = -inf: corr and p are 0).
    float corr[R];
    bool grew = false;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float mx = sc[r * U];
#pragma unroll
      for (int u = 1; u < U; ++u) mx = fmaxf(mx, sc[r * U + u]);
      const float mnew = fmaxf(m[r], mx), mref = mnew == -INFINITY ? 0.f : mnew;
      corr[r] = exp2f(m[r] - mref);
      grew |= corr[r] != 1.f;
      m[r] = mnew;
      float ps = 0.f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        sc[r * U + u] = exp2f(sc[r * U + u] - mref);
        ps += sc[r * U + u];
      }
      l[r] = l[r] * corr[r] + ps;
    }
    if (__any_sync(0xffffffffu, grew))  // the running max rarely moves once a few keys are in
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int i = 0; i < FPR; ++i) o[r][i] *= corr[r];
    // 5. o += p v over this lane's dims
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int j = 0; j < CPL; ++j) {
        float vf[VE];
        unpack_chunk<E>(*stg(stage, u, j, 1), vf);
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int e = 0; e < VE; ++e) o[r][j * VE + e] = fmaf(sc[r * U + u], vf[e], o[r][j * VE + e]);
      }
    stage = (stage + 1) % kStages;
  }
  cp_async_wait<0>();

  // Merge the KPW segments of the warp (lanes c, c + LPK, ... hold the same dims).
#pragma unroll
  for (int off = LPK; off < 32; off <<= 1)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[r], off), l2 = __shfl_xor_sync(0xffffffffu, l[r], off);
      const float M = fmaxf(m[r], m2);
      const float f1 = m[r] == -INFINITY ? 0.f : exp2f(m[r] - M), f2 = m2 == -INFINITY ? 0.f : exp2f(m2 - M);
      l[r] = l[r] * f1 + l2 * f2;
#pragma unroll
      for (int i = 0; i < FPR; ++i) {
        const float o2 = __shfl_xor_sync(0xffffffffu, o[r][i], off);
        o[r][i] = o[r][i] * f1 + o2 * f2;
      }
      m[r] = M;
    }

  // Merge the warps through shared memory (the staging area is free now).
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
  if (tid < R) {
    float M = -INFINITY;
    for (int w = 0; w < W; ++w)
      if (wl[w * R + tid] > 0.f) M = fmaxf(M, wm[w * R + tid]);
    float L = 0.f;
    for (int w = 0; w < W; ++w) {
      const float f = wl[w * R + tid] > 0.f ? exp2f(wm[w * R + tid] - M) : 0.f;
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

}  // namespace topkv::cuda::decode_attn
