// Tensor-core causal attention for prefill chunks (T >= kTcMinTokens): the
// forward pass of FlashAttention-2 (Dao 2023, "FlashAttention-2: Faster
// Attention with Better Parallelism and Work Partitioning", Algorithm 1 and
// section 3.3), over this project's KV cache layout. Twin: CpuBackend::attention
// (the fp32 kernel of kernels_attention.cu stays for T < 16 and decode).
//
// Work partition (FA2 section 3.2): a block of 8 warps takes kTcRows = 128
// query rows of ONE KV head (row = t * group + g, so the GQA group shares
// every K/V tile, as the fp32 kernel does), each warp 16 rows (one m16 tile);
// the block walks the key tiles of bn = 64 (32 for fp32 caches at
// head_dim >= 128) positions its rows can see (attention_tc_tiles.h): causal
// and sliding-window bounds, tiles outside them skipped, tiles on an edge
// masked with -inf. When the row blocks alone do not fill the GPU (few KV
// heads, long context), blockIdx.z splits the keys and merge_partials
// combines the partial (m, l, o) exactly (flash-decoding).
//
// Per key tile (FA2 Algorithm 1, lines 8-10):
//   S = Q K^T    mma.sync m16n8k16, 16-bit inputs, fp32 accumulators; Q was
//                multiplied by scale * log2(e) when loaded, so S is in log2 units
//   online softmax in fp32 registers: m = max(m, rowmax S), p = 2^(S - m),
//                l = l 2^(m_old - m) + rowsum p, O *= 2^(m_old - m)
//   O += P V     P rounded to 16 bits straight from the S accumulators (the C
//                fragment of two n8 tiles is the A fragment of one k16 step)
// and the output O / l (or the partial, m converted back to natural log).
//
// Tiles in shared memory, rows padded by 16 bytes so ldmatrix rows fall in
// distinct banks: Q [128][hd+8], K and V [bn][hd+8] of E = fp16 (bf16 for a
// bf16 cache: no range loss, no conversion). fp16/bf16 caches are copied by
// cp.async straight into the tiles; fp32 caches by cp.async into raw staging
// tiles [bn][hd] that the thread which copied a chunk converts itself (no
// barrier between copy and conversion). Loads overlap math as in FA2's
// implementation: V(j) is in flight during S(j) and the softmax, K(j+1)
// during the softmax and P V(j); three barriers per tile.
//
// Device code of kernels_attention_tc.cu (its launcher and plan), which is
// the only file that includes this one.
#pragma once
#include <type_traits>

#include "gpu/attention_tc_tiles.h"
#include "gpu/cuda_common.cuh"
#include "gpu/mma_sm80.cuh"

namespace topkv::cuda {
namespace tc {

constexpr int kThreads = kTcWarps * 32;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

struct TcArgs {
  const float* q;
  float* out;
  const void* k;
  const void* v;
  int T, n_head, group, rows_total;
  // Positions relative to kb0 = the first key tile's first position (a
  // multiple of the tile), so that they fit an int (a call spans at most
  // `capacity` < 2^30 keys): pos0r = pos0 - kb0, slot0 = kb0 % capacity.
  int pos0r, capacity, slot0, window;  // window 0: no limit
  int key_lo, key_hi;  // the call's key range (tc_clamp_keys), relative like pos0r
  int split_tiles;
  float q_mul;  // scale * log2(e)
  int n_splits;
  float *part_m, *part_l, *part_o;  // [T*n_head][n_splits] (x head_dim for o)
  int to_parts;  // write partials even with one split (a key-range call merging into a running partial)
};

// Shared-memory layout (bytes) and copy geometry of one instantiation.
template <class KV, int HD> struct Tc {
  using E = std::conditional_t<std::is_same_v<KV, __nv_bfloat16>, __nv_bfloat16, __half>;
  static constexpr bool kStaged = std::is_same_v<KV, float>;
  static constexpr int BM = kTcRows, BN = tc_tile_keys((int)sizeof(KV), HD);
  static constexpr int S = HD + 8;                          // 16-bit tile row stride, elements
  static constexpr int VE = 16 / (int)sizeof(KV);           // cache elements per 16-byte chunk
  static constexpr int CPR = HD / VE, RPI = kThreads / CPR;  // chunks per key row, rows per pass
  static constexpr int NCH = BN / RPI;                       // chunks per thread per K (or V) tile
  static constexpr int q_off = 0, k_off = BM * S * 2, v_off = k_off + BN * S * 2;
  static constexpr int raw = kStaged ? BN * HD * 4 : 0;
  static constexpr int kraw_off = v_off + BN * S * 2, vraw_off = kraw_off + raw, bytes = vraw_off + raw;
  // Blocks per SM the registers must allow: 2 (<= 128 registers) fits
  // head_dim 64 without spills; at 128 ptxas spilled 16-72 bytes (O and S
  // alone take 96), so head_dim >= 128 runs one block of 8 warps per SM.
  static constexpr int kMinBlocks = HD >= 128 ? 1 : 2;
  static_assert(BN % RPI == 0 && BN % 16 == 0 && HD % 16 == 0, "tile must split evenly over the threads");
};

template <class KV, int HD>
__global__ void __launch_bounds__(kThreads, Tc<KV, HD>::kMinBlocks) attention_tc_kernel(const TcArgs a) {
  using C = Tc<KV, HD>;
  using E = typename C::E;
  constexpr int BN = C::BN, S = C::S, NT = BN / 8, DT = HD / 8;  // n8 tiles of S and of O
  extern __shared__ __align__(16) uint8_t smem[];
  const uint32_t sb = smem_u32(smem);
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int kh = blockIdx.y, split = blockIdx.z, r0 = blockIdx.x * kTcRows;

  TcBlockKeys b64 = tc_block_keys(a.pos0r, a.group, a.rows_total, r0, a.window);
  tc_clamp_keys(&b64, a.key_lo, a.key_hi);
  int64_t f64, l64;
  tc_block_tiles(b64, BN, 0, a.split_tiles, split, &f64, &l64);
  // The same in ints (relative positions): fewer registers live across the
  // tile loop beside O's head_dim / 2.
  const int lo = (int)b64.lo, hi = (int)b64.hi, p_first = (int)b64.p_first, p_last = (int)b64.p_last;
  const int tile_first = (int)f64, tile_last = (int)l64;

  // Copies the K or V tile of positions kt.. into shared memory at `off`
  // (the 16-bit tile, or the raw staging tile for fp32); keys outside
  // [lo, hi] are zero-filled, never read: their slots may hold other data.
  const int dc = tid % C::CPR, j0 = tid / C::CPR;  // this thread's chunk column and first row
  auto issue = [&](const void* cache, int off, int kt) {
    const KV* src = static_cast<const KV*>(cache) + (int64_t)kh * a.capacity * HD;  // from the parameters: no
    const int s0 = (a.slot0 + kt) % a.capacity;  // registers held across the loop; < 2^31 (kt < capacity + BN)
#pragma unroll
    for (int c = 0; c < C::NCH; ++c) {
      const int j = j0 + c * C::RPI;
      const bool ok = kt + j >= lo && kt + j <= hi;
      const KV* p = ok ? src + (int64_t)tc_slot(s0, j, a.capacity) * HD + dc * C::VE : src;
      const int d = C::kStaged ? (j * C::CPR + dc) * 16 : (j * S + dc * C::VE) * 2;
      cp_async_16(sb + off + d, p, ok ? 16 : 0);
    }
  };
  // fp32 caches: this thread's raw chunks -> 16-bit tile.
  auto convert = [&](int raw_off, int tile_off) {
#pragma unroll
    for (int c = 0; c < C::NCH; ++c) {
      const int j = j0 + c * C::RPI;
      const float4 f = *reinterpret_cast<const float4*>(smem + raw_off + (j * C::CPR + dc) * 16);
      *reinterpret_cast<uint2*>(smem + tile_off + (j * S + dc * 4) * 2) =
          make_uint2(pack2<E>(f.x, f.y), pack2<E>(f.z, f.w));
    }
  };
  const int k_dst = C::kStaged ? C::kraw_off : C::k_off, v_dst = C::kStaged ? C::vraw_off : C::v_off;

  if (tile_first <= tile_last) issue(a.k, k_dst, tile_first * BN);
  cp_async_commit();

  // Q rows, times scale * log2(e), to 16 bits (padding rows: zeros).
  constexpr int QV = HD / 4;
  for (int idx = tid; idx < kTcRows * QV; idx += kThreads) {
    const int rr = idx / QV, c4 = idx % QV, row = r0 + rr;
    float4 f = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row < a.rows_total) {
      const int t = row / a.group, h = kh * a.group + row % a.group;
      f = *reinterpret_cast<const float4*>(a.q + ((int64_t)t * a.n_head + h) * HD + c4 * 4);
      f.x *= a.q_mul, f.y *= a.q_mul, f.z *= a.q_mul, f.w *= a.q_mul;
    }
    *reinterpret_cast<uint2*>(smem + C::q_off + (rr * S + c4 * 4) * 2) =
        make_uint2(pack2<E>(f.x, f.y), pack2<E>(f.z, f.w));
  }

  // This thread's two rows: warp * 16 + g and + 8.
  int trow[2];  // their positions
#pragma unroll
  for (int i = 0; i < 2; ++i) trow[i] = a.pos0r + (r0 + warp * 16 + g + 8 * i) / a.group;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, o[DT][4];
#pragma unroll
  for (int n = 0; n < DT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

  // ldmatrix row addresses (mma_sm80.cuh): Q as A (rows lane % 16, dims
  // 8 (lane / 16)); K as B of two n8 tiles (keys lane % 8 + 8 (lane / 16),
  // dims 8 ((lane / 8) % 2)); V transposed as B of two n8 dim tiles (keys
  // lane % 16, dims 8 (lane / 16)).
  const uint32_t q_frag = sb + C::q_off + ((warp * 16 + (lane & 15)) * S + (lane >> 4) * 8) * 2;
  const uint32_t k_frag = sb + C::k_off + (((lane & 7) + (lane >> 4) * 8) * S + ((lane >> 3) & 1) * 8) * 2;
  const uint32_t v_frag = sb + C::v_off + ((lane & 15) * S + (lane >> 4) * 8) * 2;

  for (int ti = tile_first; ti <= tile_last; ++ti) {
    const int kt = ti * BN;
    cp_async_wait<0>();  // K(ti) has landed
    if constexpr (C::kStaged) {
      convert(C::kraw_off, C::k_off);  // K tile free: barrier B of the previous tile
      issue(a.v, v_dst, kt);            // staging is this thread's own: no barrier needed
      cp_async_commit();
      if (ti < tile_last) issue(a.k, k_dst, kt + BN);
      cp_async_commit();
    }
    __syncthreads();  // A: K(ti) (and Q) visible; every warp is done with V(ti-1)
    if constexpr (!C::kStaged) {
      issue(a.v, v_dst, kt);
      cp_async_commit();
    }

    float s[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < HD / 16; ++ks) {
      uint32_t qa[4];
      ldsm_x4(q_frag + ks * 32, qa);
#pragma unroll
      for (int np = 0; np < BN / 16; ++np) {
        uint32_t kb[4];
        ldsm_x4(k_frag + (np * 16 * S + ks * 16) * 2, kb);
        mma_16816<E>(s[2 * np], qa, kb[0], kb[1]);
        mma_16816<E>(s[2 * np + 1], qa, kb[2], kb[3]);
      }
    }
    __syncthreads();  // B: every warp is done with K(ti)
    if constexpr (!C::kStaged) {  // K(ti+1) flies during the softmax and P V(ti)
      if (ti < tile_last) issue(a.k, k_dst, kt + BN);
      cp_async_commit();
    }

    if (!tc_tile_full(p_first, p_last, kt, BN, a.window)) {
      int lo_r[2], hi_r[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) tc_row_bounds(trow[i], kt, BN, a.window, &lo_r[i], &hi_r[i]);
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = n * 8 + 2 * t4 + (e & 1), i = e >> 1;
          if (j < lo_r[i] || j > hi_r[i]) s[n][e] = -INFINITY;
        }
    }
    float base[2], corr[2], rs[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = m[i];
#pragma unroll
      for (int n = 0; n < NT; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * i], s[n][2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of a row
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      base[i] = mx == -INFINITY ? 0.f : mx;  // a row that has seen nothing yet: p = 0, no NaN
      corr[i] = ex2(m[i] - base[i]);
      m[i] = mx;
    }
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = ex2(s[n][e] - base[e >> 1]);
        rs[e >> 1] += s[n][e];
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) l[i] = l[i] * corr[i] + rs[i];
    // P to 16 bits: the C fragments of n8 tiles 2kk, 2kk+1 are the A fragment
    // of k16 step kk (FA2's register reuse; P never touches shared memory).
    uint32_t pa[BN / 16][4];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      pa[kk][0] = pack2<E>(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = pack2<E>(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = pack2<E>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = pack2<E>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
#pragma unroll
    for (int n = 0; n < DT; ++n) o[n][0] *= corr[0], o[n][1] *= corr[0], o[n][2] *= corr[1], o[n][3] *= corr[1];

    cp_async_wait<1>();  // V(ti) has landed (K(ti+1) may still fly)
    if constexpr (C::kStaged) convert(C::vraw_off, C::v_off);  // V tile free since barrier A
    __syncthreads();  // C: V(ti) visible
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < HD / 16; ++dp) {
        uint32_t vb[4];
        ldsm_x4_trans(v_frag + (kk * 16 * S + dp * 16) * 2, vb);
        mma_16816<E>(o[2 * dp], pa[kk], vb[0], vb[1]);
        mma_16816<E>(o[2 * dp + 1], pa[kk], vb[2], vb[3]);
      }
    }
  }

#pragma unroll
  for (int i = 0; i < 2; ++i) {
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
    l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    const int row = r0 + warp * 16 + g + 8 * i;
    if (row >= a.rows_total) continue;
    const int t = row / a.group, h = kh * a.group + row % a.group;
    const int64_t pr = (int64_t)t * a.n_head + h;  // output row [t][h]
    float* orow;
    float mul = 1.f;
    if (a.n_splits == 1 && !a.to_parts) {
      orow = a.out + pr * HD;
      mul = l[i] > 0.f ? 1.f / l[i] : 0.f;
    } else {
      const int64_t pi = pr * a.n_splits + split;
      if (t4 == 0) a.part_m[pi] = m[i] * kLn2, a.part_l[pi] = l[i];  // -inf stays -inf
      orow = a.part_o + pi * HD;
    }
#pragma unroll
    for (int n = 0; n < DT; ++n)
      *reinterpret_cast<float2*>(orow + n * 8 + 2 * t4) = make_float2(o[n][2 * i] * mul, o[n][2 * i + 1] * mul);
  }
}

}  // namespace tc
}  // namespace topkv::cuda
