#include "src/common/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <optional>

#include "src/common/error.h"

namespace topkv {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
    case DType::F8E4M3: return "f8";
    case DType::Q8_0: return "q8_0";
    case DType::I8: return "i8";
  }
  return "?";
}

void fail_blocked_dtype_size(DType t) {
  fail("internal: {} has no size per element (blocks of {} in {} bytes): use dtype_bytes", dtype_name(t), kQ8Block,
       kQ8BlockBytes);
}

void fail_not_a_row_type(DType t) {
  fail("internal: {} is a device table type (codes with per-dimension scales), not the type of a stored row",
       dtype_name(t));
}

namespace {
// Every name an element type is given on the command line and in configs.
struct DTypeName {
  std::string_view name;
  DType type;
};
constexpr DTypeName kDTypeNames[] = {
    {"f32", DType::F32},   {"fp32", DType::F32},      {"float32", DType::F32}, {"f16", DType::F16},
    {"fp16", DType::F16},  {"float16", DType::F16},   {"bf16", DType::BF16},   {"bfloat16", DType::BF16},
    {"f8", DType::F8E4M3}, {"fp8", DType::F8E4M3},    {"f8e4m3", DType::F8E4M3}, {"e4m3", DType::F8E4M3},
    {"q8_0", DType::Q8_0}, {"q8", DType::Q8_0},       {"int8", DType::Q8_0}, {"i8", DType::I8}};

std::optional<DType> dtype_named(std::string_view s) {
  for (const DTypeName& n : kDTypeNames)
    if (n.name == s) return n.type;
  return std::nullopt;
}
}  // namespace

// Compute and cache types: 8-bit is a storage format only.
DType parse_dtype(std::string_view s) {
  const std::optional<DType> t = dtype_named(s);
  if (!t || *t == DType::F8E4M3 || *t == DType::Q8_0 || *t == DType::I8)
    fail("unknown element type '{}': use f32, f16 or bf16", s);
  return *t;
}

// The host store holds 16- or 8-bit rows (f32 would double it for nothing).
DType parse_store_dtype(std::string_view s) {
  const std::optional<DType> t = dtype_named(s);
  if (!t || *t == DType::F32 || *t == DType::I8)
    fail("unknown KV store type '{}': use f16, bf16, f8 (8-bit E4M3) or q8_0 (int8, a scale per 32)", s);
  return *t;
}

DType parse_table_dtype(std::string_view s) {
  const std::optional<DType> t = dtype_named(s);
  if (!t || *t == DType::Q8_0)
    fail("unknown device table type '{}': use f16, bf16, f32, f8 (8-bit E4M3) or i8 (int8, a scale per dimension), "
         "or auto in a policy (f16 while the GPU holds the tables, else i8)", s);
  return *t;
}

namespace {
std::array<float, 256> make_f8e4m3_table() {
  std::array<float, 256> t{};
  for (int c = 0; c < 256; ++c) {
    const int e = (c >> 3) & 15, m = c & 7;
    float v = e == 0 ? std::ldexp((float)m, -9) : std::ldexp(1.f + (float)m / 8.f, e - 7);
    if (e == 15 && m == 7) v = std::numeric_limits<float>::quiet_NaN();
    t[(size_t)c] = (c & 0x80) ? -v : v;
  }
  return t;
}
const std::array<float, 256> kF8E4M3 = make_f8e4m3_table();
}  // namespace

float f8e4m3_to_f32(uint8_t v) { return kF8E4M3[v]; }

uint8_t f32_to_f8e4m3(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint8_t sign = (uint8_t)(u >> 24 & 0x80);
  const uint32_t a = u & 0x7fffffffu;  // |f|'s bits: ordered as the values
  if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);  // NaN
  // 464 (0x43e80000) is the midpoint of 448 and 480 (the NaN code): from there
  // up (infinity too) the value saturates; below it the rounding stays <= 448.
  if (a >= 0x43e80000u) return (uint8_t)(sign | 0x7e);
  if (a < 0x3c800000u) {  // below 2^-6: E4M3's subnormals, m * 2^-9
    float x;
    std::memcpy(&x, &a, 4);
    return (uint8_t)(sign | (int)std::nearbyint(x * 512.f));  // 8 is 2^-6, the first normal code
  }
  // A normal: keep fp32's exponent and top 3 mantissa bits, rounding the 20
  // dropped bits to nearest, ties to the even code. A carry out of the
  // mantissa moves into the exponent, as it should; then the bias goes from
  // fp32's 127 to E4M3's 7.
  const uint32_t r = (a + 0x7ffffu + (a >> 20 & 1u)) >> 20;
  return (uint8_t)(sign | (r - ((127u - 7u) << 3)));
}

namespace {
// A 16-bit element at any address: a safetensors tensor written by another
// tool may start at an odd offset (the spec does not align), and a plain
// uint16_t load there is undefined behaviour (found by UBSan, issue 17).
inline uint16_t load16(const void* base, size_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(base) + 2 * i, 2);
  return v;
}
}  // namespace

namespace {
// Q8_0 blocks: ggml's block_q8_0 bytes; the encoding is its
// quantize_row_q8_0_ref with the two changes dtype.h gives (d never short of
// max|x| / 127, x rounded against the stored d). Scales are read and written
// with memcpy: a block's f16 scale sits at an even offset only.
void check_whole_blocks(size_t n) {
  TOPKV_CHECK(n % kQ8Block == 0, "internal: {} q8_0 elements are not whole blocks of {}", n, kQ8Block);
}
void q8_0_to_f32(const uint8_t* src, float* dst, size_t n) {
  check_whole_blocks(n);
  for (size_t b = 0; b < n / kQ8Block; ++b, src += kQ8BlockBytes, dst += kQ8Block) {
    const float d = f16_to_f32(load16(src, 0));
    const auto* q = reinterpret_cast<const int8_t*>(src + 2);
    for (size_t j = 0; j < kQ8Block; ++j) dst[j] = d * (float)q[j];
  }
}
void q8_0_from_f32(const float* src, uint8_t* dst, size_t n) {
  check_whole_blocks(n);
  for (size_t b = 0; b < n / kQ8Block; ++b, src += kQ8Block, dst += kQ8BlockBytes) {
    float amax = 0;
    for (size_t j = 0; j < kQ8Block; ++j) amax = std::max(amax, std::fabs(src[j]));
    uint16_t dh = f32_to_f16(amax / 127);
    if (f16_to_f32(dh) * 127 < amax) ++dh;  // the next f16 up (from 0: the smallest step): no q past 127
    const float d = f16_to_f32(dh), id = d != 0 ? 1 / d : 0;
    std::memcpy(dst, &dh, 2);
    for (size_t j = 0; j < kQ8Block; ++j)
      dst[2 + j] = (uint8_t)(int8_t)std::clamp(std::lround(src[j] * id), -127L, 127L);
  }
}
}  // namespace

namespace {
[[noreturn]] void fail_i8_conversion() {
  fail("internal: i8 table codes are values only with their per-dimension scales (src/common/table_codes.h)");
}
}  // namespace

void to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
    case DType::I8: fail_i8_conversion();
    case DType::Q8_0: return q8_0_to_f32(static_cast<const uint8_t*>(src), dst, n);
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::F16: {
      auto* s = static_cast<const uint16_t*>(src);
      size_t i = 0;
#if defined(__F16C__) && defined(__AVX__)
      for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + i))));
#endif
      for (; i < n; ++i) dst[i] = f16_to_f32(load16(s, i));
      return;
    }
    case DType::BF16: {
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load16(src, i));
      return;
    }
    case DType::F8E4M3: {
      auto* s = static_cast<const uint8_t*>(src);
      for (size_t i = 0; i < n; ++i) dst[i] = kF8E4M3[s[i]];
      return;
    }
  }
}

void from_f32(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
    case DType::I8: fail_i8_conversion();
    case DType::Q8_0: return q8_0_from_f32(src, static_cast<uint8_t*>(dst), n);
    case DType::F32: std::memcpy(dst, src, n * 4); return;
    case DType::F16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f16(src[i]);
      return;
    }
    case DType::BF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_bf16(src[i]);
      return;
    }
    case DType::F8E4M3: {
      auto* d = static_cast<uint8_t*>(dst);
      for (size_t i = 0; i < n; ++i) d[i] = f32_to_f8e4m3(src[i]);
      return;
    }
  }
}

namespace {
// The largest finite value of an element type, and the table types to name
// in an error about it: those with a wider range, and i8 (a scale per
// dimension: no fixed range).
float largest_finite(DType t) {
  return t == DType::F8E4M3 ? 448.f : t == DType::F16 ? 65504.f : std::numeric_limits<float>::max();
}
const char* table_types_holding(DType t) { return t == DType::F8E4M3 ? "i8, f16 or f32" : "i8 or f32"; }

// The codes of f16, bf16 and E4M3 are sign and magnitude, and a magnitude's
// codes are ordered as its values: the next value up from a positive code is
// the code + 1, from a negative one the code - 1 (-0 and +0 both go to the
// smallest positive value). Down is up mirrored through the sign.
uint32_t next_code(uint32_t c, uint32_t sign_bit, bool up) {
  if (!up) return next_code(c ^ sign_bit, sign_bit, true) ^ sign_bit;
  if ((c & ~sign_bit) == 0) return 1;
  return c & sign_bit ? c - 1 : c + 1;
}
float decode_one(DType t, uint32_t c) {
  if (t == DType::F8E4M3) return f8e4m3_to_f32((uint8_t)c);
  return t == DType::F16 ? f16_to_f32((uint16_t)c) : bf16_to_f32((uint16_t)c);
}
uint32_t encode_one(DType t, float x) {
  if (t == DType::F8E4M3) return f32_to_f8e4m3(x);
  return t == DType::F16 ? f32_to_f16(x) : f32_to_bf16(x);
}
}  // namespace

void from_f32_directed(DType t, const float* src, void* dst, size_t n, bool up) {
  TOPKV_CHECK(t != DType::Q8_0 && t != DType::I8,
              "internal: {} has no directed rounding here (q8_0 is not an element type; i8: table_codes.h)",
              dtype_name(t));
  if (t == DType::F32) return std::memcpy(dst, src, n * 4), void();
  const size_t size = dtype_size(t);
  const uint32_t sign_bit = size == 1 ? 0x80u : 0x8000u;
  for (size_t i = 0; i < n; ++i) {
    const float x = src[i];
    uint32_t c = encode_one(t, x);
    float y = decode_one(t, c);
    if (up ? y < x : y > x) c = next_code(c, sign_bit, up), y = decode_one(t, c);
    TOPKV_CHECK(std::isfinite(y) && (up ? y >= x : y <= x),
                "{} {} has no {} value {} it: use a --device-table-type that holds it ({})",
                up ? "an upper bound" : "a lower bound", x, dtype_name(t), up ? "at or above" : "at or below",
                table_types_holding(t));
    if (size == 1) static_cast<uint8_t*>(dst)[i] = (uint8_t)c;
    else {
      const auto h = (uint16_t)c;
      std::memcpy(static_cast<uint8_t*>(dst) + 2 * i, &h, 2);
    }
  }
}

void from_f32_in_range(DType t, const float* src, void* dst, size_t n, const char* what) {
  TOPKV_CHECK(t != DType::Q8_0 && t != DType::I8, "internal: {} tables are not encoded here", dtype_name(t));
  from_f32(t, src, dst, n);
  if (t == DType::F32) return;
  const float top = largest_finite(t);
  for (size_t i = 0; i < n; ++i)
    TOPKV_CHECK(std::fabs(src[i]) <= top,
                "{} {} is past {}'s largest value {}: use a --device-table-type that holds it ({})", what, src[i],
                dtype_name(t), top, table_types_holding(t));
}

}  // namespace topkv
