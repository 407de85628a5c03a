// Quantised weights on the device: their layout, the q8_1 activations, and
// the arithmetic of the decode GEMV (MMVQ) and of the dequantisation, written
// once for both compilers: nvcc builds the kernels from these functions
// (gpu/kernels_quant_gemv.cu, gpu/kernels_dequant.cu) and the host compiler
// builds their CPU twins (gpu/quant_matvec_ref.cpp), so the tests on a
// machine without a GPU check the very bit manipulations the device runs.
// Float arithmetic goes through fmul/fadd/fsub, which are never fused into an
// FMA on either side, so twin and kernel round identically.
//
// ---- device layout of a quantised matrix (CudaBackend::prepare_weight) ------
// The file's blocks (src/model/quant_blocks.h, ggml's) are split into up to
// three planes so that the bulk of every block starts on a 16-byte boundary
// and is read with one 16-byte load per lane. Plane p holds, for every block
// g = row * blocks_per_row + b in row-major order, kPlaneBytes[p] bytes; the
// planes follow each other, each starting 16-byte aligned:
//   Q8_0  plane 0: qs[32]                     plane 1: d (fp16)
//   Q4_0  plane 0: qs[16]                     plane 1: d
//   Q4_1  plane 0: qs[16]                     plane 1: d, m
//   Q5_0  plane 0: qs[16]   plane 1: qh[4]    plane 2: d
//   Q5_1  plane 0: qs[16]   plane 1: qh[4]    plane 2: d, m
//   Q4_K  plane 0: the 144-byte block as in the file (already 16-byte sized)
//   Q5_K  plane 0: the 176-byte block as in the file
//   Q6_K  plane 0: ql[128] qh[64] scales[16] (the block less d)   plane 1: d
// Every byte of the file's blocks is kept and nothing else (but up to 15
// bytes of padding before planes 1 and 2), so a weight takes the file's size.
// Weight::type stays the GGML type; Weight::data points at plane 0.
//
// ---- activations: q8_1 -------------------------------------------------------
// x[T][cols] (fp32) is quantised in blocks of 32 as ggml's quantize_q8_1:
// d = max|x| / 127, q = round(x / d). ggml's block_q8_1 keeps (d, sum x) as
// two fp16; here each block keeps Q8Scale{d, s} in fp32 with s = d * sum(q):
// a sum of 32 Gemma activations overflows fp16 (> 65504), and with s taken
// from the quantised values every product below is exactly the dot of the
// dequantised weight row with the dequantised activations (d * q), up to
// fp32 rounding (tests/test_quant_matvec_ref.cpp checks that to ~1e-6).
// Planes: qs [T][cols] int8, then ds [T][cols / 32] Q8Scale.
//
// Two terms (q8_1x2, the CUDA backend's default): a 16-bit code in two int8
// halves. The block's scale is d = max|x| / (127 * 256), Q = round(x / d)
// (|Q| <= 32512), hi = (Q + 128) >> 8 and lo = Q - 256 hi (both in -128..127),
// s = d * sum(Q); token t's hi codes are row 2t of qs, its lo codes row
// 2t + 1, its scales row t of ds. A run's integer sum is then
// 256 * dp4a(w, hi) + dp4a(w, lo) = sum w Q (int32: at most 16 * 32 * 32512
// * 128 < 2^31 with Q6_K's codes and scales), and the float arithmetic after
// it is one term's: the cost is the second dp4a chain and its 16-byte loads.
// |x - d Q| <= d / 2 = max|x| / 65024: ~15 bits of the block's largest value
// where one term keeps ~8, finer than fp16 activations. One term rounds a
// decode product by ~1e-2 relative (1-4e-2 on a real model's logits, enough to
// flip a near-tie of greedy decoding against fp16 weights); two leave the
// weights' own rounding.
//
// ---- units --------------------------------------------------------------------
// A lane of the GEMV handles one "unit" at a time: 16 bytes of plane 0 and
// the few scale bytes they need, i.e. 16 values (Q8_0) or 32 values in two
// runs of 16 (every other type). Unit k of block b covers the values at
// run_offset(k, r) + j, j < 16, of the block. Per type (struct Q8_0U ...):
//   kValues   values per block; kUnits units per block; kRuns runs per unit
//   load      the unit's weight bytes (Unit)
//   load_x    the matching activation bytes of one token (XUnit)
//   prep      the unit decoded for dot (Prep: codes, scales), per row
//   dot       sum over the unit's values of w * (d8 * q8), fp32: dot(Prep,
//             XUnit), and dot(Unit, XUnit, k) = dot(prep(Unit, k), XUnit)
//   dequant   the unit's values, bit for bit dequantize_row's (quants.cpp)
#pragma once
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#ifdef __CUDACC__
#include <cuda_fp16.h>
#define TOPKV_HD __host__ __device__ __forceinline__
#define TOPKV_UNROLL _Pragma("unroll")
#else
#define TOPKV_HD inline
#define TOPKV_UNROLL
#endif

#include "src/common/dtype.h"
#include "src/model/ggml_types.h"

namespace topkv::qunits {

// ---- scalar helpers, the same on host and device --------------------------------
TOPKV_HD float fmul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TOPKV_HD float fadd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
TOPKV_HD float fsub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
TOPKV_HD float fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
TOPKV_HD float half_to_float(uint16_t h) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(h));
#else
  return f16_to_f32(h);
#endif
}
// c + sum of the four signed byte products of a and b.
TOPKV_HD int dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 4; ++i)
    c += (int)(int8_t)(uint8_t)((uint32_t)a >> 8 * i) * (int)(int8_t)(uint8_t)((uint32_t)b >> 8 * i);
  return c;
#endif
}
TOPKV_HD int lo_nibbles(uint32_t v) { return (int)(v & 0x0F0F0F0Fu); }
TOPKV_HD int hi_nibbles(uint32_t v) { return (int)((v >> 4) & 0x0F0F0F0Fu); }
// Bits 0..3 of `bits4` moved to bit 4 of bytes 0..3 (the 5th bit of Q5_0/Q5_1
// codes): the multiply places copies at 0, 7, 14, 21 without carries.
TOPKV_HD int fifth_bits(uint32_t bits4) { return (int)(((bits4 & 15u) * 0x00204081u & 0x01010101u) << 4); }
// Bytes v - 32 for bytes v in 0..63 (Q6_K codes): (v + 96) ^ 128 per byte, no carries.
TOPKV_HD int minus32(int v) { return (int)(((uint32_t)v + 0x60606060u) ^ 0x80808080u); }
TOPKV_HD int byte_of(uint32_t v, int i) { return (int)(int8_t)(uint8_t)(v >> 8 * i); }  // signed byte i
TOPKV_HD int ubyte_of(uint32_t v, int i) { return (int)(uint8_t)(v >> 8 * i); }        // unsigned byte i

// 16 bytes as four 32-bit words (one 16-byte load on the device).
struct I4 {
  uint32_t v[4];
};
// Activation block scale: d = max|x| / 127, s = d * sum(q) over the 32 values.
struct Q8Scale {
  float d, s;
};
// One token's q8_1 activations: qs its codes (one term) or hi codes (two),
// lo its lo codes (two terms; unused with one).
struct Q8Row {
  const int8_t* qs;    // [cols]
  const Q8Scale* ds;   // [cols / 32]
  const int8_t* lo;    // [cols] or null
};

// ---- loads ------------------------------------------------------------------------
// The device reads weights with streaming loads (read once per call: they
// must not evict the activations) and activations through the read-only
// cache; the host twin copies bytes.
struct LoadWeight {
  TOPKV_HD static I4 i4(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    const uint4 v = __ldcs(reinterpret_cast<const uint4*>(p));
    return I4{{v.x, v.y, v.z, v.w}};
#else
    I4 r;
    std::memcpy(r.v, p, 16);
    return r;
#endif
  }
  TOPKV_HD static uint32_t u32(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return __ldcs(reinterpret_cast<const unsigned int*>(p));
#else
    uint32_t r;
    std::memcpy(&r, p, 4);
    return r;
#endif
  }
  TOPKV_HD static void u2(const uint8_t* p, uint32_t& a, uint32_t& b) {
#ifdef __CUDA_ARCH__
    const uint2 v = __ldcs(reinterpret_cast<const uint2*>(p));
    a = v.x, b = v.y;
#else
    std::memcpy(&a, p, 4);
    std::memcpy(&b, p + 4, 4);
#endif
  }
  TOPKV_HD static uint16_t u16(const uint8_t* p) {
#ifdef __CUDA_ARCH__
    return __ldcs(reinterpret_cast<const unsigned short*>(p));
#else
    uint16_t r;
    std::memcpy(&r, p, 2);
    return r;
#endif
  }
};
struct LoadAct {
  TOPKV_HD static I4 i4(const int8_t* p) {
#ifdef __CUDA_ARCH__
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p));
    return I4{{v.x, v.y, v.z, v.w}};
#else
    I4 r;
    std::memcpy(r.v, p, 16);
    return r;
#endif
  }
  TOPKV_HD static Q8Scale scale(const Q8Scale* p) {
#ifdef __CUDA_ARCH__
    const float2 v = __ldg(reinterpret_cast<const float2*>(p));
    return Q8Scale{v.x, v.y};
#else
    return *p;
#endif
  }
};

// ---- q8_1 quantisation of one block of 32 (quantize_q8_1's arithmetic) ----------
// Terms per token: 1 (q8_1, ggml's) or 2 (q8_1x2: a 16-bit code in two int8 halves).
constexpr int kQ8MaxTerms = 2;
// The largest code: 127, or 127 * 256 for the 16-bit code of two terms.
TOPKV_HD float q8_max_code(int terms) { return terms == 2 ? 32512.f : 127.f; }
TOPKV_HD float q8_scale(float amax, int terms = 1) { return fdiv(amax, q8_max_code(terms)); }
TOPKV_HD int q8_code(float x, float d, float amax) { return amax == 0.f ? 0 : (int)roundf(fdiv(x, d)); }
// The int8 halves of a 16-bit code: q = 256 hi + lo.
TOPKV_HD int q16_hi(int q) { return (q + 128) >> 8; }
TOPKV_HD int q16_lo(int q) { return q - 256 * q16_hi(q); }
// Where block b of token t starts in qs [T * terms][cols], and code q of its
// value l stored there: q, or hi there and lo in the token's next row.
TOPKV_HD int8_t* q8_block_codes(int8_t* qs, int64_t t, int64_t b, int64_t cols, int terms) {
  return qs + t * terms * cols + b * 32;
}
// Token t's activations read back: its codes (hi codes with two terms), its
// lo codes in the next row (two terms; null with one) and its scales.
TOPKV_HD Q8Row q8_row(const int8_t* qs, const Q8Scale* ds, int t, int64_t cols, int terms) {
  const int8_t* q = qs + (int64_t)t * terms * cols;
  return Q8Row{q, ds + (int64_t)t * (cols / 32), terms == 2 ? q + cols : nullptr};
}
// Calls f(std::integral_constant<int, S>{}) with S = terms (1 or 2): the
// kernels and the twin take the terms as a template parameter.
template <class F> void with_q8_terms(int terms, F&& f) {
  if (terms == 2)
    f(std::integral_constant<int, 2>{});
  else
    f(std::integral_constant<int, 1>{});
}
TOPKV_HD void put_q8_code(int8_t* block, int64_t cols, int l, int q, int terms) {
  if (terms == 2) {
    block[l] = (int8_t)q16_hi(q);
    block[cols + l] = (int8_t)q16_lo(q);
  } else {
    block[l] = (int8_t)q;
  }
}

// ---- the device layout -----------------------------------------------------------
constexpr int kMaxPlanes = 3;
// Bytes per block in each plane (0: no such plane); all zero for a type
// without a device layout (F32, F16, BF16).
struct PlaneBytes {
  int b[kMaxPlanes];
};
TOPKV_HD PlaneBytes plane_bytes(GgmlType t) {
  switch (t) {
    case GgmlType::Q8_0: return PlaneBytes{{32, 2, 0}};
    case GgmlType::Q4_0: return PlaneBytes{{16, 2, 0}};
    case GgmlType::Q4_1: return PlaneBytes{{16, 4, 0}};
    case GgmlType::Q5_0: return PlaneBytes{{16, 4, 2}};
    case GgmlType::Q5_1: return PlaneBytes{{16, 4, 4}};
    case GgmlType::Q4_K: return PlaneBytes{{144, 0, 0}};
    case GgmlType::Q5_K: return PlaneBytes{{176, 0, 0}};
    case GgmlType::Q6_K: return PlaneBytes{{208, 2, 0}};
    default: return PlaneBytes{{0, 0, 0}};
  }
}
TOPKV_HD bool has_device_layout(GgmlType t) { return plane_bytes(t).b[0] != 0; }
TOPKV_HD int block_values(GgmlType t) {
  return t == GgmlType::Q4_K || t == GgmlType::Q5_K || t == GgmlType::Q6_K ? 256 : 32;
}
TOPKV_HD size_t align16(size_t n) { return (n + 15) / 16 * 16; }
// Byte offset of each plane from the start of a rows x cols matrix, and its total size.
TOPKV_HD void plane_offsets(GgmlType t, int64_t rows, int64_t cols, size_t off[kMaxPlanes], size_t* total) {
  const PlaneBytes pb = plane_bytes(t);
  const size_t blocks = (size_t)rows * (size_t)(cols / block_values(t));
  size_t at = 0;
  for (int p = 0; p < kMaxPlanes; ++p) {
    at = align16(at);
    off[p] = at;
    at += blocks * (size_t)pb.b[p];
  }
  *total = at;
}

// A quantised matrix in the device layout (device or host memory).
struct QuantMatrix {
  const uint8_t* plane[kMaxPlanes];
  int64_t rows, cols;
};
TOPKV_HD QuantMatrix quant_matrix(GgmlType t, const uint8_t* base, int64_t rows, int64_t cols) {
  size_t off[kMaxPlanes], total;
  plane_offsets(t, rows, cols, off, &total);
  return QuantMatrix{{base + off[0], base + off[1], base + off[2]}, rows, cols};
}

// Activations of one unit: run 0 from q8 block `a` (16 values) and run 1
// from block `b`; Q8_0 units have run 0 only. a2, b2: the lo codes of two
// terms (S = 2), unset with one.
struct XUnit {
  I4 a, b, a2, b2;
  float da, sa, db, sb;
};
// The 16 values at `half` (0/1) of q8 block `blk` (their lo codes into q2
// when S = 2) and that block's scale.
template <int S>
TOPKV_HD void load_x_run(const Q8Row& x, int64_t blk, int half, I4& q, I4& q2, float& d, float& s) {
  q = LoadAct::i4(x.qs + blk * 32 + half * 16);
  if constexpr (S == 2) q2 = LoadAct::i4(x.lo + blk * 32 + half * 16);
  const Q8Scale sc = LoadAct::scale(x.ds + blk);
  d = sc.d, s = sc.s;
}
// sum w x over 16 signed-byte codes (four words of four) with the 16
// activation codes x.
template <class Word> TOPKV_HD int dot16(const Word (&w)[4], const I4& x) {
  int acc = 0;
  TOPKV_UNROLL
  for (int i = 0; i < 4; ++i) acc = dp4a((int)w[i], (int)x.v[i], acc);
  return acc;
}
// The same over a token's activations of S terms: one dp4a chain, or
// 256 * (hi chain) + (lo chain) = sum w Q.
template <int S, class Word> TOPKV_HD int dot16s(const Word (&w)[4], const I4& x, const I4& x2) {
  if constexpr (S == 2) return dot16(w, x) * 256 + dot16(w, x2);
  return dot16(w, x);
}

}  // namespace topkv::qunits

#include "gpu/quant_units_types.h"
