// Fused dequantise + dot kernels (AVX2/FMA): the GEMV inner loop of the CPU
// forward pass. Each block's codes are unpacked to 32 int8 in a register,
// widened to fp32 and multiplied with x by FMA; the block (or sub-block) scale
// multiplies the partial sum once, and a min term is subtracted as
// min * sum(x). x stays fp32 (unlike ggml, which quantises x to 8 bits), so
// the result equals the dot of the dequantised row up to fp32 rounding; the
// scalar reference is dot_quant_row_ref (quants.cpp), and test_quants checks
// they agree.
#include <cstring>

#include "src/common/dtype.h"
#include "src/model/ggml_types.h"
#include "src/model/quant_blocks.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define TOPKV_AVX2 1
#endif

namespace topkv::quant {

#ifdef TOPKV_AVX2
namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Widens 8 int8 (low 64 bits of v) to fp32.
inline __m256 i8x8_to_f32(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// sum_j q[j] * x[j] over 32 int8 codes q (byte j = code j) as an 8-lane vector.
inline __m256 dot32(__m256i q, const float* x) {
  __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  __m256 s = _mm256_mul_ps(i8x8_to_f32(lo), _mm256_loadu_ps(x));
  s = _mm256_fmadd_ps(i8x8_to_f32(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), s);
  s = _mm256_fmadd_ps(i8x8_to_f32(hi), _mm256_loadu_ps(x + 16), s);
  return _mm256_fmadd_ps(i8x8_to_f32(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), s);
}
// Two halves of 16 codes with their own scales (Q6_K sub-blocks of 16).
inline __m256 dot32_two_scales(__m256i q, const float* x, float s_lo, float s_hi) {
  __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
  __m256 a = _mm256_mul_ps(i8x8_to_f32(lo), _mm256_loadu_ps(x));
  a = _mm256_fmadd_ps(i8x8_to_f32(_mm_srli_si128(lo, 8)), _mm256_loadu_ps(x + 8), a);
  __m256 b = _mm256_mul_ps(i8x8_to_f32(hi), _mm256_loadu_ps(x + 16));
  b = _mm256_fmadd_ps(i8x8_to_f32(_mm_srli_si128(hi, 8)), _mm256_loadu_ps(x + 24), b);
  return _mm256_fmadd_ps(_mm256_set1_ps(s_lo), a, _mm256_mul_ps(_mm256_set1_ps(s_hi), b));
}
inline __m256 sum32(const float* x) {
  __m256 a = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 8));
  __m256 b = _mm256_add_ps(_mm256_loadu_ps(x + 16), _mm256_loadu_ps(x + 24));
  return _mm256_add_ps(a, b);
}

// 16 packed bytes -> 32 codes: low nibbles are codes 0..15, high 16..31.
inline __m256i nibbles_16(const uint8_t* qs) {
  __m128i b = _mm_loadu_si128((const __m128i*)qs), m = _mm_set1_epi8(15);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}
// 32 bits -> 32 bytes, byte j = 16 if bit j is set else 0 (the 5th bit of Q5_x).
inline __m256i fifth_bits(const uint8_t* qh4) {
  uint32_t h;
  std::memcpy(&h, qh4, 4);
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), spread);
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
  return _mm256_and_si256(set, _mm256_set1_epi8(16));
}

float dot_q8_0(const BlockQ8_0* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    __m256i q = _mm256_loadu_si256((const __m256i*)b[i].qs);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].d)), dot32(q, x), acc);
  }
  return hsum(acc);
}
float dot_q4_0(const BlockQ4_0* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    __m256i q = _mm256_sub_epi8(nibbles_16(b[i].qs), _mm256_set1_epi8(8));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].d)), dot32(q, x), acc);
  }
  return hsum(acc);
}
float dot_q5_0(const BlockQ5_0* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    __m256i q = _mm256_or_si256(nibbles_16(b[i].qs), fifth_bits(b[i].qh));
    q = _mm256_sub_epi8(q, _mm256_set1_epi8(16));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].d)), dot32(q, x), acc);
  }
  return hsum(acc);
}
// Q4_1/Q5_1: d*q + m summed against x = d*(q.x) + m*sum(x).
float dot_q4_1(const BlockQ4_1* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].d)), dot32(nibbles_16(b[i].qs), x), acc);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].m)), sum32(x), acc);
  }
  return hsum(acc);
}
float dot_q5_1(const BlockQ5_1* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i, x += QK) {
    __m256i q = _mm256_or_si256(nibbles_16(b[i].qs), fifth_bits(b[i].qh));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].d)), dot32(q, x), acc);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_to_f32(b[i].m)), sum32(x), acc);
  }
  return hsum(acc);
}

// Q4_K/Q5_K: per chunk of 64 values, 32 bytes of qs give sub-block 2c (low
// nibbles) and 2c+1 (high nibbles); value = d*sc*q - dmin*m.
template <typename Block, bool kFifthBit>
float dot_qk_4or5(const Block* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(15);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d), dmin = f16_to_f32(b[i].dmin);
    __m256i qh;
    if constexpr (kFifthBit) qh = _mm256_loadu_si256((const __m256i*)b[i].qh);
    for (int c = 0; c < 4; ++c, x += 64) {
      uint8_t sc0, m0, sc1, m1;
      unpack_scale_min_k4(2 * c, b[i].scales, sc0, m0);
      unpack_scale_min_k4(2 * c + 1, b[i].scales, sc1, m1);
      __m256i raw = _mm256_loadu_si256((const __m256i*)(b[i].qs + 32 * c));
      __m256i q0 = _mm256_and_si256(raw, low4);
      __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      if constexpr (kFifthBit) {
        const __m256i bit0 = _mm256_set1_epi8((char)(1 << (2 * c))), bit1 = _mm256_set1_epi8((char)(2 << (2 * c)));
        const __m256i sixteen = _mm256_set1_epi8(16);
        q0 = _mm256_or_si256(q0, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit0), bit0), sixteen));
        q1 = _mm256_or_si256(q1, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit1), bit1), sixteen));
      }
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc0), dot32(q0, x), acc);
      acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * m0), sum32(x), acc);
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d * sc1), dot32(q1, x + 32), acc);
      acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * m1), sum32(x + 32), acc);
    }
  }
  return hsum(acc);
}

// Q6_K: per half of 128 values, four groups of 32 codes (see dequant_q6_k).
float dot_q6_k(const BlockQ6_K* b, const float* x, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3), bias = _mm256_set1_epi8(32);
  for (int64_t i = 0; i < nb; ++i) {
    const float d = f16_to_f32(b[i].d);
    for (int h = 0; h < 2; ++h, x += 128) {
      const int8_t* sc = b[i].scales + 8 * h;
      __m256i ql0 = _mm256_loadu_si256((const __m256i*)(b[i].ql + 64 * h));
      __m256i ql1 = _mm256_loadu_si256((const __m256i*)(b[i].ql + 64 * h + 32));
      __m256i qh = _mm256_loadu_si256((const __m256i*)(b[i].qh + 32 * h));
      // top two bits of group k: (qh >> 2k) & 3, moved to bits 4..5
      auto top = [&](int k) {
        __m256i t = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), two);
        return _mm256_slli_epi16(t, 4);  // t < 4, so no bits cross bytes
      };
      __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low4), top(0)),
          _mm256_or_si256(_mm256_and_si256(ql1, low4), top(1)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4), top(2)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4), top(3)),
      };
      for (int k = 0; k < 4; ++k)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d),
                              dot32_two_scales(_mm256_sub_epi8(q[k], bias), x + 32 * k, sc[2 * k], sc[2 * k + 1]),
                              acc);
    }
  }
  return hsum(acc);
}

}  // namespace
#endif

bool dot_row_fast(uint32_t type, const void* row, const float* x, int64_t n, float* out) {
#ifdef TOPKV_AVX2
  switch ((GgmlType)type) {
    case GgmlType::Q8_0: *out = dot_q8_0((const BlockQ8_0*)row, x, n / QK); return true;
    case GgmlType::Q4_0: *out = dot_q4_0((const BlockQ4_0*)row, x, n / QK); return true;
    case GgmlType::Q4_1: *out = dot_q4_1((const BlockQ4_1*)row, x, n / QK); return true;
    case GgmlType::Q5_0: *out = dot_q5_0((const BlockQ5_0*)row, x, n / QK); return true;
    case GgmlType::Q5_1: *out = dot_q5_1((const BlockQ5_1*)row, x, n / QK); return true;
    case GgmlType::Q4_K: *out = dot_qk_4or5<BlockQ4_K, false>((const BlockQ4_K*)row, x, n / QK_K); return true;
    case GgmlType::Q5_K: *out = dot_qk_4or5<BlockQ5_K, true>((const BlockQ5_K*)row, x, n / QK_K); return true;
    case GgmlType::Q6_K: *out = dot_q6_k((const BlockQ6_K*)row, x, n / QK_K); return true;
    default: return false;
  }
#else
  (void)type, (void)row, (void)x, (void)n, (void)out;
  return false;
#endif
}

}  // namespace topkv::quant
