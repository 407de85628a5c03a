// Device pieces shared by the kernels that read store rows or build attention
// partials from them (kernels_rows_attention.cu, kernels_summary_search.cu,
// kernels_summary_rerank.cu): a lane's share of a row in fp32 for every store
// type (q8_0 blocks included, and back-to-back q8_0 rows read by whole lines),
// one query head's online-softmax update, and the block epilogue that merges
// its warps' partials and writes one (m, l, o) per query head. Included by
// .cu files only.
#pragma once
#include <type_traits>

#include "gpu/cuda_common.cuh"

namespace topkv::cuda {

// Lane's N contiguous elements at p as fp32 (16-byte loads where they fit).
// 16-bit elements in 4- or 8-byte loads where 16 do not fit (head_dim 128 or
// 64 over a warp: 4 or 2 elements a lane): one load instead of one per element
// (the quest score kernel read its f16 page bounds at 1.4 TB/s with 2-byte loads).
// f8 in 4-byte loads (four codes to a float4) where N allows; i8 table codes
// the same, as the codes' values (LaneScale applies the scales). Every wide load
// needs p aligned to it: rows and table rows lie at multiples of head_dim
// elements from an aligned base, and a lane's share starts at lane * N.
template <class E> __device__ __forceinline__ float2 pair_to_float2(uint32_t w) {
  if constexpr (std::is_same_v<E, __half>) return __half22float2(*reinterpret_cast<const __half2*>(&w));
  else return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
}

// Four int8 codes (the bytes of w) as exact fp32 values without the
// int-to-float unit (a quarter-rate instruction; with it the i8 score kernel
// ran 25% slower than f8's, bench/results/gpu_session24/out_a): each code,
// made unsigned (+128), becomes the low byte of 2^23's mantissa in one byte
// permute, and 2^23 + 128 comes off in one add.
__device__ __forceinline__ void i8x4_to_float(uint32_t w, float* out) {
  w ^= 0x80808080u;
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7540u + k)) - 8388736.f;
}

template <class E, int N> __device__ __forceinline__ void load_lane(const E* p, float* out) {
  constexpr int bytes = N * (int)sizeof(E);
  constexpr bool pairs = sizeof(E) == 2;  // __half or __nv_bfloat16
  if constexpr (std::is_same_v<E, __nv_fp8_e4m3> && N % 4 == 0) {  // f8 tables and rows: 4 codes a load
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 f = static_cast<float4>(reinterpret_cast<const __nv_fp8x4_e4m3*>(p)[i]);
      out[4 * i] = f.x, out[4 * i + 1] = f.y, out[4 * i + 2] = f.z, out[4 * i + 3] = f.w;
    }
  } else if constexpr (std::is_same_v<E, int8_t> && N % 4 == 0) {  // i8 table codes, 4 a load (LaneScale below)
#pragma unroll
    for (int i = 0; i < N / 4; ++i) i8x4_to_float(reinterpret_cast<const uint32_t*>(p)[i], out + 4 * i);
  } else if constexpr (std::is_same_v<E, int8_t> && N == 2) {
    float f[4];
    i8x4_to_float(*reinterpret_cast<const uint16_t*>(p), f);
    out[0] = f[0], out[1] = f[1];
  } else if constexpr (bytes % 16 == 0) {
#pragma unroll
    for (int i = 0; i < bytes / 16; ++i) Vec16<E>::load(p + i * Vec16<E>::n, out + i * Vec16<E>::n);
  } else if constexpr (pairs && bytes == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    const float2 a = pair_to_float2<E>(v.x), b = pair_to_float2<E>(v.y);
    out[0] = a.x, out[1] = a.y, out[2] = b.x, out[3] = b.y;
  } else if constexpr (pairs && bytes == 4) {
    const float2 a = pair_to_float2<E>(*reinterpret_cast<const uint32_t*>(p));
    out[0] = a.x, out[1] = a.y;
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_float(p[i]);
  }
}

// A lane's share [lane*N, +N) of an i8 table's per-dimension scales
// (src/common/table_codes.h), read once a kernel: apply() turns the codes
// load_lane gave into values (code * scale in fp32, as the host's
// TableCodes::decoded), or a sum of codes times weights into the sum of
// values (the far rows' output). For every other table type it holds and
// does nothing.
template <class E, int N> struct LaneScale {
  static constexpr bool kI8 = std::is_same_v<E, int8_t>;
  float s[kI8 ? N : 1];
  __device__ __forceinline__ LaneScale(const float* scale, int lane) {
    if constexpr (kI8) {
#pragma unroll
      for (int i = 0; i < N; ++i) s[i] = scale[lane * N + i];
    }
  }
  __device__ __forceinline__ void apply(float* v) const {
    if constexpr (kI8) {
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] *= s[i];
    }
  }
};

// Bytes of one row of HD elements of E (E an element type or Q8Row,
// gpu/cuda_common.cuh).
template <class E, int HD> constexpr int row_bytes_of() {
  if constexpr (std::is_same_v<E, Q8Row>) return HD / (int)kQ8Block * (int)kQ8BlockBytes;
  else return HD * (int)sizeof(E);
}

// Lane's N contiguous elements [lane*N, +N) of the row at p as fp32, for
// rows of any store type. A q8_0 lane share lies inside one block (N is 2,
// 4 or 8 and divides 32): the block's scale times the codes, read in 2-byte
// loads (a block is 34 bytes, so its codes are only 2-byte aligned).
template <class E, int N> __device__ __forceinline__ void load_row_lane(const void* p, int lane, float* out) {
  if constexpr (std::is_same_v<E, Q8Row>) {
    static_assert(N % 2 == 0 && (int)kQ8Block % N == 0, "a lane's share must lie inside one q8_0 block");
    const int e = lane * N, b = e / (int)kQ8Block;
    const uint8_t* blk = static_cast<const uint8_t*>(p) + (size_t)b * kQ8BlockBytes;
    const float d = q8_0_scale(blk);
    const uint16_t* q = reinterpret_cast<const uint16_t*>(blk + 2 + e % (int)kQ8Block);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const uint16_t w = q[i];
      out[2 * i] = d * (float)(int8_t)(w & 0xff);
      out[2 * i + 1] = d * (float)(int8_t)(w >> 8);
    }
  } else {
    load_lane<E, N>(static_cast<const E*>(p) + lane * N, out);
  }
}

// A q8_0 row in one coalesced load per lane: HD / 32 blocks of 34 bytes are 17
// units of HD / 16 bytes (4, 8 or 16: one 32-, 64- or 128-bit load), so lanes
// 0-16 each load one unit where the row is that aligned (a store's chunks and
// the staged and cached copies are: their rows lie at multiples of the row's
// bytes from an aligned base). The per-lane read above takes three loads a
// lane (the scale, two code loads), each over the whole row; this one takes
// one. The units go through shared memory (a lane's codes straddle units)
// and load_row_lane reads its share from there. Measured over PCIe (bench
// gpu-ops --only rows, one Llama-8B layer, H100): 91.1 us against 95.3 a
// lane at a time, f8 57.7: not the loads; most likely the row's two 128-byte
// lines (an f8 row is one).
template <int HD> struct Q8Unit {
  static constexpr int kBytes = HD / 16;
  using T = std::conditional_t<kBytes == 4, uint32_t, std::conditional_t<kBytes == 8, uint2, uint4>>;
  static_assert(HD / (int)kQ8Block * (int)kQ8BlockBytes == 17 * kBytes, "a q8_0 row is 17 units");
  __device__ static bool aligned(const void* p) { return ((uintptr_t)p & (kBytes - 1)) == 0; }
  // Lanes 0-16: unit `lane` of the row at p; the others return zeros.
  __device__ static T load(const void* p, int lane) { return lane < 17 ? static_cast<const T*>(p)[lane] : T{}; }
  __device__ static void stage(uint8_t* row, const T& u, int lane) {
    if (lane < 17) reinterpret_cast<T*>(row)[lane] = u;
  }
};

// Lane shares of N rows (p[i] null: row i is skipped, out[i] left as it is)
// with every row's loads in flight before any is used: q8_0 rows that are
// unit-aligned go through `stage` (this warp's N * row_bytes_of<E, HD>()
// bytes of shared memory, 16-byte aligned), the others a lane at a time.
// Every lane of the warp calls it (q8_0: __syncwarp around the stage).
template <class E, int HD, int N>
__device__ __forceinline__ void load_rows_lanes(const void* const (&p)[N], int lane, uint8_t* stage,
                                                float (&out)[N][HD / 32]) {
  constexpr int DPL = HD / 32;
  if constexpr (std::is_same_v<E, Q8Row>) {
    using U = Q8Unit<HD>;
    constexpr int RB = row_bytes_of<E, HD>();
    typename U::T unit[N];
    bool whole[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      whole[i] = p[i] && U::aligned(p[i]);
      if (whole[i]) unit[i] = U::load(p[i], lane);
      else if (p[i]) load_row_lane<E, DPL>(p[i], lane, out[i]);
    }
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (whole[i]) U::stage(stage + i * RB, unit[i], lane);
    __syncwarp();
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (whole[i]) load_row_lane<E, DPL>(stage + i * RB, lane, out[i]);
    __syncwarp();  // read before the warp's next rows overwrite the stage
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i)
      if (p[i]) load_row_lane<E, DPL>(p[i], lane, out[i]);
  }
}

// Shared bytes a warp needs to stage N rows of E for load_rows_lanes (16 where
// nothing is staged, to keep the declaration legal).
template <class E, int HD, int N> constexpr int stage_bytes_of() {
  return std::is_same_v<E, Q8Row> ? N * row_bytes_of<E, HD>() : 16;
}

// q8_0 rows that lie back to back (the rows of a Quest page or of a store
// chunk's run, as the row list names them in order), read as the aligned
// 128-byte lines that hold them, each line by one load instruction of the
// warp: R rows of HD = 128 touch 5 or 6 lines where one row at a time
// touches 2 each (8). Over PCIe a read costs by the lines it touches, not its
// bytes (an f8 row placed across two lines cost 1.48x an aligned one, bench
// gpu-ops --only rows, session 22). A line holds bytes of a listed row, so
// reading all of it stays inside mapped memory (a line never crosses a page).
template <int HD, int R> struct Q8Run {
  static constexpr int kRowBytes = row_bytes_of<Q8Row, HD>();
  static constexpr int kLines = (R * kRowBytes + 127) / 128 + 1;  // most lines R rows can touch
  static constexpr int kPieces = kLines * 8;                       // 16-byte pieces
  static constexpr int kPerLane = (kPieces + 31) / 32;
  // Rows p[0], p[stride], ... (R of them; null: no row) all back to back
  // from p[0]: their count, or 0 for fewer than two, a gap or a row elsewhere.
  __device__ static int length(const void* const* p, int stride) {
    int n = 0;
    bool run = true;
#pragma unroll
    for (int i = 0; i < R; ++i) {
      const void* r = p[i * stride];
      if (!r) continue;
      run = run && n == i && static_cast<const uint8_t*>(r) == static_cast<const uint8_t*>(p[0]) + i * kRowBytes;
      ++n;
    }
    return run && n >= 2 ? n : 0;
  }
  struct Lines {
    uint4 v[kPerLane];
    int off;     // row 0's offset from the first line
    int pieces;  // 16-byte pieces loaded
  };
  // This lane's pieces of the lines that hold n rows from p0 (loads only).
  __device__ static Lines load(const void* p0, int n, int lane) {
    Lines x;
    const uintptr_t a = reinterpret_cast<uintptr_t>(p0), base = a & ~uintptr_t{127};
    x.pieces = (int)((a + (uintptr_t)n * kRowBytes - base + 15) / 16);
    x.off = (int)(a - base);
    const uint4* src = reinterpret_cast<const uint4*>(base);
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i < x.pieces) x.v[i] = src[lane + 32 * i];
    return x;
  }
  __device__ static void stage(uint8_t* at, const Lines& x, int lane) {
#pragma unroll
    for (int i = 0; i < kPerLane; ++i)
      if (lane + 32 * i < x.pieces) reinterpret_cast<uint4*>(at)[lane + 32 * i] = x.v[i];
  }
};

// Lane shares of R rows' K and V (p[2u] K, p[2u + 1] V of row u; null past
// the last row) as load_rows_lanes gives them, but q8_0 rows back to back in
// both K and V come through Q8Run: the lines of both runs in flight, then
// staged. Other rows, and every other type, go to load_rows_lanes. `stage`:
// this warp's stage_run_bytes_of<E, HD, R>() bytes, 16-byte aligned.
template <class E, int HD, int R>
__device__ __forceinline__ void load_row_pairs(const void* const (&p)[2 * R], int lane, uint8_t* stage,
                                               float (&out)[2 * R][HD / 32]) {
  if constexpr (std::is_same_v<E, Q8Row>) {
    using Run = Q8Run<HD, R>;
    const int n = Run::length(p, 2);
    if (n && Run::length(p + 1, 2) == n) {  // warp-uniform: the pointers are the warp's
      const typename Run::Lines k = Run::load(p[0], n, lane), v = Run::load(p[1], n, lane);
      uint8_t* sv = stage + Run::kLines * 128;
      Run::stage(stage, k, lane), Run::stage(sv, v, lane);
      __syncwarp();
#pragma unroll
      for (int u = 0; u < R; ++u)
        if (u < n) {
          load_row_lane<E, HD / 32>(stage + k.off + u * Run::kRowBytes, lane, out[2 * u]);
          load_row_lane<E, HD / 32>(sv + v.off + u * Run::kRowBytes, lane, out[2 * u + 1]);
        }
      __syncwarp();  // read before the warp's next rows overwrite the stage
      return;
    }
  }
  load_rows_lanes<E, HD>(p, lane, stage, out);
}

// Shared bytes a warp needs for load_row_pairs of R rows.
template <class E, int HD, int R> constexpr int stage_run_bytes_of() {
  if constexpr (std::is_same_v<E, Q8Row>) {
    const int runs = 2 * Q8Run<HD, R>::kLines * 128, rows = stage_bytes_of<E, HD, 2 * R>();
    return runs > rows ? runs : rows;
  } else {
    return stage_bytes_of<E, HD, 2 * R>();
  }
}

// (m, l, o) <- (m, l, o) + one row of logit s and value share v (this lane's DPL dims).
template <int DPL>
__device__ __forceinline__ void online_add(float s, const float (&v)[DPL], float& m, float& l, float (&o)[DPL]) {
  const float m_new = fmaxf(m, s), c = __expf(m - m_new), p = __expf(s - m_new);
  l = l * c + p;
#pragma unroll
  for (int i = 0; i < DPL; ++i) o[i] = fmaf(p, v[i], o[i] * c);
  m = m_new;
}

template <int HD, int kWarps, int kMaxGroup> struct BlockPartials {
  float m[kWarps][kMaxGroup], l[kWarps][kMaxGroup], o[kWarps][kMaxGroup][HD];
};

// Each warp holds partials for ng query heads (lane owns dims [lane*DPL, +DPL));
// the block merges them exactly and writes the partial of query head
// row0 + g into slot row * parts + slot of part_m/l [rows][parts] and
// part_o [rows][parts][HD]. Every thread of the block must call it.
template <int HD, int kWarps, int kMaxGroup, int DPL>
__device__ void store_block_partials(BlockPartials<HD, kWarps, kMaxGroup>& sm, const float (&m)[kMaxGroup],
                                     const float (&l)[kMaxGroup], const float (&o)[kMaxGroup][DPL], int ng,
                                     size_t row0, int slot, int parts, float* part_m, float* part_l,
                                     float* part_o) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= ng) break;
    if (lane == 0) sm.m[warp][g] = m[g], sm.l[warp][g] = l[g];
#pragma unroll
    for (int i = 0; i < DPL; ++i) sm.o[warp][g][lane * DPL + i] = o[g][i];
  }
  __syncthreads();
  for (int g = 0; g < ng; ++g) {
    float M = -INFINITY;
    for (int w = 0; w < kWarps; ++w)
      if (sm.l[w][g] > 0.f) M = fmaxf(M, sm.m[w][g]);
    float f[kWarps], L = 0.f;
    for (int w = 0; w < kWarps; ++w) {
      f[w] = sm.l[w][g] > 0.f ? __expf(sm.m[w][g] - M) : 0.f;
      L += sm.l[w][g] * f[w];
    }
    const size_t at = (row0 + g) * parts + slot;
    if (threadIdx.x == 0) part_m[at] = M, part_l[at] = L;
    for (int d = threadIdx.x; d < HD; d += kWarps * 32) {
      float acc = 0.f;
      for (int w = 0; w < kWarps; ++w) acc = fmaf(sm.o[w][g][d], f[w], acc);
      part_o[at * HD + d] = acc;
    }
  }
}

}  // namespace topkv::cuda
