#include "src/common/dtype.h"

#include <cstring>

#include "src/common/error.h"

namespace topkv {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "f32";
    case DType::F16: return "f16";
    case DType::BF16: return "bf16";
  }
  return "?";
}

DType parse_dtype(std::string_view s) {
  if (s == "f32" || s == "fp32" || s == "float32") return DType::F32;
  if (s == "f16" || s == "fp16" || s == "float16") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  fail("unknown element type '{}': use f32, f16 or bf16", s);
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

void to_f32(DType t, const void* src, float* dst, size_t n) {
  switch (t) {
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
  }
}

void from_f32(DType t, const float* src, void* dst, size_t n) {
  switch (t) {
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
  }
}

}  // namespace topkv
