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
enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, F8E4M3 = 3 };

inline size_t dtype_size(DType t) { return t == DType::F32 ? 4 : t == DType::F8E4M3 ? 1 : 2; }
const char* dtype_name(DType t);
DType parse_dtype(std::string_view name);  // "f32"|"fp32"|"f16"|"fp16"|"bf16"; throws Error
// A host KV store's element type: f16, bf16 or f8 ("f8e4m3", "fp8"); throws Error.
DType parse_store_dtype(std::string_view name);

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

// Bulk conversions between a row of `n` elements of type `t` and fp32.
void to_f32(DType t, const void* src, float* dst, size_t n);
void from_f32(DType t, const float* src, void* dst, size_t n);

}  // namespace topkv
