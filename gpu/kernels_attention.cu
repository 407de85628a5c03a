// Fused causal attention over the KV cache (FlashAttention, Dao et al. 2022,
// online softmax; flash-decoding split-KV for short query chunks over long
// caches), twin of CpuBackend::attention. Scores, softmax and the value sum
// run in fp32 on the CUDA cores, so the result matches the CPU to ~1e-6.
//
// Work: the query rows of one KV head are its (token, query head) pairs,
// row = t * group + g (GQA: the group's heads share every K/V tile). A block
// of kWarps warps takes NQ = kWarps * R rows and walks the keys its rows can
// see, kBK = 32 keys per tile:
//   1. the tile's K and V rows (ring slot = position % capacity) are loaded,
//      16 bytes per access, converted to fp32 into shared memory; the next
//      tile's loads are issued into registers before this tile's math, so
//      the cache stream overlaps the arithmetic;
//   2. scores: lane j owns key j of the tile and dots it with each of the
//      warp's R query rows (K rows padded by 4 floats so the float4 reads of
//      a warp hit distinct banks; the q reads are broadcasts); positions
//      outside a row's causal / sliding window get -inf;
//   3. online softmax per row: m = max(m, tile max), rescale l and o by
//      e^(m_old - m), p_j = e^(s_j - m) (l kept per lane, summed at the end);
//   4. o += P V: lane owns dims lane + 32 i, P read back as float4 broadcasts.
// With one split the block writes out = o / l. With n_splits > 1 (decode),
// blockIdx.z takes a contiguous range of key positions and writes the
// partial (m, l, o) of each row; merge_partials combines them exactly.
//
// Bound: 4 * head_dim flops per (row, visible key) on fp32 FMA units
// (prefill), or the cache read 2 * head_dim * elem bytes per visible key and
// KV head (decode). Tensor-core (mma) tiles for long prefill chunks are the
// next step and are not written yet.
#include <algorithm>
#include <atomic>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBK = 32;                // keys per tile: one per lane
constexpr int64_t kMinSplitKeys = 256;  // a split smaller than this costs more to merge than it saves
constexpr int kMaxSplits = 256;

struct KernelArgs {
  const float* q;
  float* out;
  const void* k;
  const void* v;
  int T, n_head, group;
  int64_t pos0, capacity, window;
  int64_t key_lo, split_keys;  // split s covers positions key_lo + s*split_keys .. + split_keys - 1
  int64_t key_hi;              // the last key position of the call (attention_key_range)
  float scale;
  int n_splits;
  int to_parts;  // write partials even with one split (a key-range call merging into a running partial)
  float *part_m, *part_l, *part_o;  // [T*n_head][n_splits] (x head_dim for o)
};

template <int HD, int R> struct Layout {
  static constexpr int NQ = kWarps * R;
  static constexpr int KS = HD + 4;  // padded row stride of Q and K tiles (floats)
  static constexpr int q_off = 0, k_off = NQ * KS, v_off = k_off + kBK * KS, p_off = v_off + kBK * HD;
  static constexpr size_t bytes = (size_t)(p_off + NQ * kBK) * sizeof(float);
};

template <class KV, int HD, int R>
__global__ void __launch_bounds__(kThreads) attention_kernel(const KernelArgs a) {
  using L = Layout<HD, R>;
  constexpr int NQ = L::NQ, KS = L::KS, DPL = HD / 32;  // dims per lane
  constexpr int VE = 16 / sizeof(KV);                    // cache elements per 16-byte load
  constexpr int NCH = kBK * HD / VE / kThreads;          // 16-byte loads per thread per tile (K, and V)
  static_assert(kBK * HD % (VE * kThreads) == 0, "tile must split evenly over the threads");
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* Qs = smem + L::q_off;  // [NQ][KS], pre-scaled
  float* Ks = smem + L::k_off;  // [kBK][KS]
  float* Vs = smem + L::v_off;  // [kBK][HD]
  float* Ps = smem + L::p_off;  // [NQ][kBK]

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int kh = blockIdx.y, split = blockIdx.z;
  const int group = a.group, rows_total = a.T * group;
  const int r0 = blockIdx.x * NQ;
  const KV* kbase = static_cast<const KV*>(a.k) + (int64_t)kh * a.capacity * HD;
  const KV* vbase = static_cast<const KV*>(a.v) + (int64_t)kh * a.capacity * HD;

  for (int idx = tid; idx < NQ * HD; idx += kThreads) {
    const int rr = idx / HD, d = idx % HD, row = r0 + rr;
    float val = 0.f;
    if (row < rows_total) {
      const int t = row / group, h = kh * group + row % group;
      val = a.q[((int64_t)t * a.n_head + h) * HD + d] * a.scale;
    }
    Qs[rr * KS + d] = val;
  }

  // Keys any row of this block sees, within this block's split.
  const int row_last = min(rows_total, r0 + NQ) - 1;
  const int64_t p_first = a.pos0 + r0 / group, p_last = a.pos0 + row_last / group;
  const int64_t split_lo = a.key_lo + (int64_t)split * a.split_keys;
  const int64_t lo = max(a.window > 0 ? max((int64_t)0, p_first - a.window + 1) : (int64_t)0, split_lo);
  const int64_t hi = min(min(p_last, split_lo + a.split_keys - 1), a.key_hi);

  float m[R], l[R], o[R][DPL];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    m[i] = -INFINITY, l[i] = 0.f;
#pragma unroll
    for (int d = 0; d < DPL; ++d) o[i][d] = 0.f;
  }
  const bool warp_active = r0 + warp * R < rows_total;  // warp-uniform

  // 1. K/V tile loads. With kPrefetch the next tile's raw 16-byte chunks wait
  // in registers while this tile's math runs; fp32 caches with head_dim 256
  // would need 128 registers for that, so they load and store in one pass.
  constexpr bool kPrefetch = NCH <= 8;
  uint4 kraw[kPrefetch ? NCH : 1], vraw[kPrefetch ? NCH : 1];
  auto load_chunk = [&](int64_t kt, int c, uint4& kr, uint4& vr) {
    const int idx = tid + c * kThreads, j = idx / (HD / VE), d = idx % (HD / VE) * VE;
    const int64_t kp = kt + j;
    if (kp <= hi) {
      const int64_t off = (kp % a.capacity) * HD + d;
      kr = *reinterpret_cast<const uint4*>(kbase + off);
      vr = *reinterpret_cast<const uint4*>(vbase + off);
    } else {
      kr = vr = make_uint4(0, 0, 0, 0);  // zero bits are 0.0 in every type; p = 0 there
    }
  };
  auto store_chunk = [&](int c, const uint4& kr, const uint4& vr) {
    const int idx = tid + c * kThreads, j = idx / (HD / VE), d = idx % (HD / VE) * VE;
    float kf[VE], vf[VE];
    if constexpr (sizeof(KV) == 4) {
      kf[0] = __uint_as_float(kr.x), kf[1] = __uint_as_float(kr.y), kf[2] = __uint_as_float(kr.z);
      kf[3] = __uint_as_float(kr.w);
      vf[0] = __uint_as_float(vr.x), vf[1] = __uint_as_float(vr.y), vf[2] = __uint_as_float(vr.z);
      vf[3] = __uint_as_float(vr.w);
    } else {
      Vec16<KV>::unpack(kr, kf);
      Vec16<KV>::unpack(vr, vf);
    }
#pragma unroll
    for (int e = 0; e < VE; e += 4) {
      *reinterpret_cast<float4*>(Ks + j * KS + d + e) = make_float4(kf[e], kf[e + 1], kf[e + 2], kf[e + 3]);
      *reinterpret_cast<float4*>(Vs + j * HD + d + e) = make_float4(vf[e], vf[e + 1], vf[e + 2], vf[e + 3]);
    }
  };

  if constexpr (kPrefetch) {
    if (lo <= hi)
#pragma unroll
      for (int c = 0; c < NCH; ++c) load_chunk(lo, c, kraw[c], vraw[c]);
  }
  for (int64_t kt = lo; kt <= hi; kt += kBK) {
    __syncthreads();  // the previous tile is consumed (and Qs written, first time)
    if constexpr (kPrefetch) {
#pragma unroll
      for (int c = 0; c < NCH; ++c) store_chunk(c, kraw[c], vraw[c]);
    } else {
#pragma unroll 4
      for (int c = 0; c < NCH; ++c) {
        load_chunk(kt, c, kraw[0], vraw[0]);
        store_chunk(c, kraw[0], vraw[0]);
      }
    }
    __syncthreads();
    if constexpr (kPrefetch) {
      if (kt + kBK <= hi)
#pragma unroll
        for (int c = 0; c < NCH; ++c) load_chunk(kt + kBK, c, kraw[c], vraw[c]);
    }
    if (!warp_active) continue;

    // 2. scores of key kt + lane for the warp's rows
    float s[R];
#pragma unroll
    for (int i = 0; i < R; ++i) s[i] = 0.f;
    const float* kr = Ks + lane * KS;
#pragma unroll 4
    for (int d = 0; d < HD; d += 4) {
      const float4 kk = *reinterpret_cast<const float4*>(kr + d);
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const float4 qq = *reinterpret_cast<const float4*>(Qs + (warp * R + i) * KS + d);
        s[i] = fmaf(qq.x, kk.x, s[i]);
        s[i] = fmaf(qq.y, kk.y, s[i]);
        s[i] = fmaf(qq.z, kk.z, s[i]);
        s[i] = fmaf(qq.w, kk.w, s[i]);
      }
    }
    // 3. masks and the online softmax update
    const int64_t kp = kt + lane;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const int row = r0 + warp * R + i;
      bool ok = row < rows_total && kp <= hi;
      if (ok) {
        const int64_t p = a.pos0 + row / group;
        ok = kp <= p && (a.window <= 0 || kp > p - a.window);
      }
      const float si = ok ? s[i] : -INFINITY;
      const float mn = fmaxf(m[i], warp_max(si));
      float pe = 0.f, corr = 1.f;
      if (mn != -INFINITY) {
        pe = expf(si - mn);      // 0 for a masked key
        corr = expf(m[i] - mn);  // 0 while the row had seen nothing
      }
      l[i] = l[i] * corr + pe;
#pragma unroll
      for (int d = 0; d < DPL; ++d) o[i][d] *= corr;
      m[i] = mn;
      Ps[(warp * R + i) * kBK + lane] = pe;
    }
    __syncwarp();
    // 4. o += P V
#pragma unroll 2
    for (int j = 0; j < kBK; j += 4) {
      float vv[4][DPL];
#pragma unroll
      for (int jj = 0; jj < 4; ++jj)
#pragma unroll
        for (int d = 0; d < DPL; ++d) vv[jj][d] = Vs[(j + jj) * HD + lane + 32 * d];
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const float4 pp = *reinterpret_cast<const float4*>(Ps + (warp * R + i) * kBK + j);
#pragma unroll
        for (int d = 0; d < DPL; ++d) {
          o[i][d] = fmaf(pp.x, vv[0][d], o[i][d]);
          o[i][d] = fmaf(pp.y, vv[1][d], o[i][d]);
          o[i][d] = fmaf(pp.z, vv[2][d], o[i][d]);
          o[i][d] = fmaf(pp.w, vv[3][d], o[i][d]);
        }
      }
    }
  }

  if (!warp_active) return;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const int row = r0 + warp * R + i;
    if (row >= rows_total) break;  // warp-uniform
    const float lsum = warp_sum(l[i]);
    const int t = row / group, h = kh * group + row % group;
    const int64_t pr = (int64_t)t * a.n_head + h;  // output row [t][h]
    if (a.n_splits == 1 && !a.to_parts) {
      float* orow = a.out + pr * HD;
#pragma unroll
      for (int d = 0; d < DPL; ++d) orow[lane + 32 * d] = lsum > 0.f ? o[i][d] / lsum : 0.f;
    } else {
      const int64_t pi = pr * a.n_splits + split;
      if (lane == 0) a.part_m[pi] = m[i], a.part_l[pi] = lsum;
      float* orow = a.part_o + pi * HD;
#pragma unroll
      for (int d = 0; d < DPL; ++d) orow[lane + 32 * d] = o[i][d];
    }
  }
}

// Query rows per warp: 2 for decode-sized calls (few rows, mostly memory
// bound), else as many as the registers allow (o holds R x head_dim/32).
int rows_per_warp(const AttentionArgs& a) {
  if (a.T * (a.n_head / a.n_kv) <= 2 * kWarps) return 2;
  return a.head_dim >= 256 ? 4 : 8;
}

template <class KV, int HD, int R>
void launch(const KernelArgs& ka, dim3 grid, cudaStream_t stream) {
  constexpr size_t smem = Layout<HD, R>::bytes;
  // More than 48 KB of dynamic shared memory must be allowed per function
  // and device; remember which devices have it (bit per ordinal).
  static std::atomic<uint64_t> configured{0};
  int dev = 0;
  TOPKV_CUDA_CHECK(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? uint64_t{1} << dev : 0;
  if (!bit || !(configured.load(std::memory_order_relaxed) & bit)) {
    TOPKV_CUDA_CHECK(
        cudaFuncSetAttribute(attention_kernel<KV, HD, R>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    configured.fetch_or(bit);
  }
  attention_kernel<KV, HD, R><<<grid, kThreads, smem, stream>>>(ka);
  TOPKV_CUDA_CHECK_LAUNCH();
}

template <class KV, int HD>
void launch_hd(const KernelArgs& ka, int R, dim3 grid, cudaStream_t stream) {
  constexpr int kLargeR = HD >= 256 ? 4 : 8;
  if (R == 2)
    launch<KV, HD, 2>(ka, grid, stream);
  else
    launch<KV, HD, kLargeR>(ka, grid, stream);
}

}  // namespace

bool attention_head_dim_supported(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

AttentionPlan plan_attention(const AttentionArgs& a, int sm_count) {
  const int group = a.n_head / a.n_kv, rows_total = a.T * group, nq = kWarps * rows_per_warp(a);
  const int64_t row_tiles = (rows_total + nq - 1) / nq;
  int64_t key_lo = 0, key_hi = 0;
  attention_key_range(a, &key_lo, &key_hi);
  const int64_t n_keys = std::max<int64_t>(key_hi - key_lo + 1, 1);
  AttentionPlan p;
  const int64_t base_blocks = row_tiles * a.n_kv, target = 2 * (int64_t)std::max(sm_count, 1);
  int64_t splits = 1;
  if (base_blocks < target)
    splits = std::min({(target + base_blocks - 1) / base_blocks, (n_keys + kMinSplitKeys - 1) / kMinSplitKeys,
                       (int64_t)kMaxSplits});
  splits = std::max<int64_t>(splits, 1);
  const int64_t per = (n_keys + splits - 1) / splits;
  p.split_keys = (per + kBK - 1) / kBK * kBK;
  p.n_splits = (int)((n_keys + p.split_keys - 1) / p.split_keys);
  if (p.n_splits > 1 || a.acc_m)
    p.workspace_bytes = (size_t)a.T * a.n_head * p.n_splits * (size_t)(a.head_dim + 2) * sizeof(float);
  return p;
}

void attention(const AttentionArgs& a, const AttentionPlan& plan, void* workspace, cudaStream_t stream) {
  if (a.T <= 0) return;
  TOPKV_CHECK(attention_head_dim_supported(a.head_dim),
              "no CUDA attention kernel for head_dim {} (compiled: 32, 64, 96, 128, 256)", a.head_dim);
  const int group = a.n_head / a.n_kv, R = rows_per_warp(a), nq = kWarps * R;
  KernelArgs ka{};
  ka.q = a.q, ka.out = a.out, ka.k = a.k, ka.v = a.v;
  ka.T = a.T, ka.n_head = a.n_head, ka.group = group;
  ka.pos0 = a.pos0, ka.capacity = a.capacity, ka.window = a.window, ka.scale = a.scale;
  attention_key_range(a, &ka.key_lo, &ka.key_hi);
  ka.split_keys = plan.split_keys, ka.n_splits = plan.n_splits, ka.to_parts = a.acc_m != nullptr;
  const size_t n_part = (size_t)a.T * a.n_head * plan.n_splits;
  if (plan.n_splits > 1 || ka.to_parts) {
    TOPKV_CHECK(workspace, "split attention needs {} bytes of work space", plan.workspace_bytes);
    carve_partials(workspace, n_part, ka.part_m, ka.part_l, ka.part_o);
  }
  const int64_t row_tiles = ((int64_t)a.T * group + nq - 1) / nq;
  TOPKV_CHECK(row_tiles < INT32_MAX && a.n_kv <= 65535 && plan.n_splits <= 65535,
              "attention grid {} x {} x {} is too large", row_tiles, a.n_kv, plan.n_splits);
  const dim3 grid((unsigned)row_tiles, (unsigned)a.n_kv, (unsigned)plan.n_splits);
  with_elem_type(a.kv_type, [&](auto e) {
    using KV = decltype(e);
    switch (a.head_dim) {
      case 32: launch_hd<KV, 32>(ka, R, grid, stream); break;
      case 64: launch_hd<KV, 64>(ka, R, grid, stream); break;
      case 96: launch_hd<KV, 96>(ka, R, grid, stream); break;
      case 128: launch_hd<KV, 128>(ka, R, grid, stream); break;
      default: launch_hd<KV, 256>(ka, R, grid, stream); break;
    }
  });
  if (ka.to_parts)
    merge_partials_into(ka.part_m, ka.part_l, ka.part_o, (int64_t)a.T * a.n_head, plan.n_splits, a.head_dim,
                        a.acc_m, a.acc_l, a.acc_o, stream);
  else if (plan.n_splits > 1)
    merge_partials(ka.part_m, ka.part_l, ka.part_o, (int64_t)a.T * a.n_head, plan.n_splits, a.head_dim, a.out,
                   stream);
}

}  // namespace topkv::cuda
