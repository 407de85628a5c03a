// Element types of host-side rows (keys, values, queries) and their
// conversions. fp16 is IEEE binary16; bf16 is the upper half of an fp32,
// rounded to nearest even.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#if defined(__F16C__)
#include <immintrin.h>
#endif

namespace topkv {

// F8E4M3: OCP 8-bit floating point E4M3 ("E4M3FN": 1 sign, 4 exponent bits
// with bias 7, 3 mantissa bits; no infinities, S.1111.111 is NaN; largest
// finite 448, smallest subnormal 2^-9). Only the host KV store holds it
// (--store-type f8): half the bytes of f16 per key and value, read over PCIe
// and held in host memory.
//
// Q8_0: int8 with one scale per group of 32 (ggml's block_q8_0, byte for
// byte: `f16 d; int8 q[32]`, x = d * q, 34 bytes per 32 elements, 8.5 bits an
// element). Also a host-store type only (--store-type q8_0): E4M3 keeps 3
// mantissa bits of every element, Q8_0 ~7 bits of the block's largest, so its
// rows are ~16x closer to the f16 ones for 6% more bytes than f8. A blocked
// type: a run of n elements (n a multiple of 32) is n / 32 whole blocks, so
// rows of a multiple-of-32 head_dim lie back to back as for the other types
// and every bulk conversion below takes a run of rows; never a part of a
// block (dtype_bytes).
//
// I8: int8 codes of a device summary table, one fp32 scale per dimension
// beside them (--device-table-type i8; src/common/table_codes.h). The codes
// alone are not values, so the bulk conversions below refuse it.
enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, F8E4M3 = 3, Q8_0 = 4, I8 = 5 };

constexpr size_t kQ8Block = 32, kQ8BlockBytes = 34;  // elements, bytes of one Q8_0 block
inline bool dtype_blocked(DType t) { return t == DType::Q8_0; }
[[noreturn]] void fail_blocked_dtype_size(DType t);
[[noreturn]] void fail_not_a_row_type(DType t);  // I8: a device table's codes, never a stored row
// Bytes of one element; a blocked type has none (use dtype_bytes).
inline size_t dtype_size(DType t) {
  if (dtype_blocked(t)) fail_blocked_dtype_size(t);
  return t == DType::F32 ? 4 : t == DType::F8E4M3 || t == DType::I8 ? 1 : 2;
}
// Bytes of a run of n elements (for Q8_0, n a multiple of kQ8Block).
inline size_t dtype_bytes(DType t, size_t n) {
  return dtype_blocked(t) ? n / kQ8Block * kQ8BlockBytes : n * dtype_size(t);
}
const char* dtype_name(DType t);
DType parse_dtype(std::string_view name);  // "f32"|"fp32"|"f16"|"fp16"|"bf16"; throws Error
// A host KV store's element type: f16, bf16, f8 ("f8e4m3", "fp8") or q8_0
// ("int8", "q8"); throws Error.
DType parse_store_dtype(std::string_view name);
// A device summary table's element type (--device-table-type): f32, f16,
// bf16, f8 (E4M3) or i8 (int8, a scale per dimension); throws Error.
DType parse_table_dtype(std::string_view name);

// E4M3 <-> fp32. Decoding is exact (a table of the 256 codes); encoding
// rounds to nearest, ties to even, and saturates at +-448 (as CUDA's
// __nv_cvt_float_to_fp8 with __NV_SATFINITE); NaN stays NaN.
float f8e4m3_to_f32(uint8_t v);
uint8_t f32_to_f8e4m3(float f);

inline float f16_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do { man <<= 1; ++e; } while (!(man & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | man << 13;
  } else {
    bits = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
#endif
}

inline uint16_t f32_to_f16(float f) {
#if defined(__F16C__)
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t man = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t half = man >> shift, rem = man & ((1u << shift) - 1), mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) ++half;
    return (uint16_t)(sign | half);
  }
  uint32_t half = sign | (uint32_t)exp << 10 | man >> 13, rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) ++half;
  return (uint16_t)half;
#endif
}

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t f32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

// Bulk conversions between a run of `n` elements of type `t` and fp32. For
// Q8_0, n is a multiple of 32 (whole blocks); I8 is refused (its scales
// are the table's: src/common/table_codes.h); to_f32 gives d * q as ggml
// does. from_f32 picks d = f16(max|x| / 127) as ggml's quantize_row_q8_0_ref
// does, moved one f16 step up where that falls short of max|x| / 127, and
// rounds x against the d it stores (q = round-half-away(x / d)), not against
// the fp32 one: so |x - d q| <= d / 2 for every element, also for the tiny
// values some value heads hold, where ggml's f16-subnormal (or zero) d
// misplaces every q of the block.
void to_f32(DType t, const void* src, float* dst, size_t n);
void from_f32(DType t, const float* src, void* dst, size_t n);
// from_f32 rounded one way: each element becomes the nearest value of `t`
// not below it (up) or not above it (down), so that a bound stays a bound
// (Quest's page bounds in narrower device tables). Element types only (not
// Q8_0); throws Error where no finite value of `t` is on that side (past
// f8's 448, f16's 65504). Not I8 (table_codes.h rounds it).
void from_f32_directed(DType t, const float* src, void* dst, size_t n, bool up);
// from_f32 (to nearest) for tables that must not be clipped: throws Error,
// naming `what`, where an element is past the type's finite range (f8 would
// saturate it at 448, f16 round it to infinity). Element types only (not I8).
void from_f32_in_range(DType t, const float* src, void* dst, size_t n, const char* what);

}  // namespace topkv
