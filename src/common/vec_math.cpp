#include <algorithm>
#include "src/common/vec_math.h"

#include <cstring>
#include <vector>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define TOPKV_AVX2 1
#endif

namespace topkv {

#ifdef TOPKV_AVX2
static inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}
static inline __m256 load_bf16x8(const uint16_t* p) {
  __m128i h = _mm_loadu_si128((const __m128i*)p);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p));
}
#endif

float dot_f32(const float* a, const float* b, size_t n) {
  size_t i = 0;
  float s = 0.f;
#ifdef TOPKV_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  s = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float dot_f16(const uint16_t* row, const float* q, size_t n) {
  size_t i = 0;
  float s = 0.f;
#ifdef TOPKV_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(load_f16x8(row + i), _mm256_loadu_ps(q + i), acc0);
    acc1 = _mm256_fmadd_ps(load_f16x8(row + i + 8), _mm256_loadu_ps(q + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_f16x8(row + i), _mm256_loadu_ps(q + i), acc0);
  s = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) s += f16_to_f32(row[i]) * q[i];
  return s;
}

float dot_bf16(const uint16_t* row, const float* q, size_t n) {
  size_t i = 0;
  float s = 0.f;
#ifdef TOPKV_AVX2
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(load_bf16x8(row + i), _mm256_loadu_ps(q + i), acc0);
    acc1 = _mm256_fmadd_ps(load_bf16x8(row + i + 8), _mm256_loadu_ps(q + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(load_bf16x8(row + i), _mm256_loadu_ps(q + i), acc0);
  s = hsum(_mm256_add_ps(acc0, acc1));
#endif
  for (; i < n; ++i) s += bf16_to_f32(row[i]) * q[i];
  return s;
}

float dot_f8e4m3(const uint8_t* row, const float* q, size_t n) {
  float tmp[256];  // decoded in blocks (a table per code), then the fp32 dot
  float s = 0.f;
  for (size_t i = 0; i < n; i += 256) {
    const size_t m = std::min<size_t>(256, n - i);
    to_f32(DType::F8E4M3, row + i, tmp, m);
    s += dot_f32(tmp, q + i, m);
  }
  return s;
}

#ifdef TOPKV_AVX2
// 8 int8 codes at p as fp32.
static inline __m256 load_i8x8(const uint8_t* p) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
#endif

// Q8_0 (src/common/dtype.h): per block d * (q . x), the codes widened to fp32.
float dot_q8_0(const uint8_t* row, const float* q, size_t n) {
  float s = 0.f;
  for (size_t b = 0; b < n / kQ8Block; ++b, row += kQ8BlockBytes, q += kQ8Block) {
    uint16_t dh;
    std::memcpy(&dh, row, 2);
    const uint8_t* c = row + 2;
#ifdef TOPKV_AVX2
    __m256 acc = _mm256_mul_ps(load_i8x8(c), _mm256_loadu_ps(q));
    acc = _mm256_fmadd_ps(load_i8x8(c + 8), _mm256_loadu_ps(q + 8), acc);
    acc = _mm256_fmadd_ps(load_i8x8(c + 16), _mm256_loadu_ps(q + 16), acc);
    acc = _mm256_fmadd_ps(load_i8x8(c + 24), _mm256_loadu_ps(q + 24), acc);
    const float block = hsum(acc);
#else
    float block = 0.f;
    for (size_t j = 0; j < kQ8Block; ++j) block += (float)(int8_t)c[j] * q[j];
#endif
    s += f16_to_f32(dh) * block;
  }
  return s;
}

void dot_rows_multi(DType t, const void* rows, size_t n_rows, size_t dim, const float* queries,
                    size_t nq, float* out) {
  const size_t row_bytes = dtype_bytes(t, dim);
  const auto* base = static_cast<const uint8_t*>(rows);
  if (t == DType::F32 || nq == 1) {
    for (size_t r = 0; r < n_rows; ++r)
      for (size_t g = 0; g < nq; ++g)
        out[r * nq + g] = dot_row(t, base + r * row_bytes, queries + g * dim, dim);
    return;
  }
  // Half-precision rows: convert each row once, then dot it with every query.
  std::vector<float> tmp(dim);
  for (size_t r = 0; r < n_rows; ++r) {
    to_f32(t, base + r * row_bytes, tmp.data(), dim);
    for (size_t g = 0; g < nq; ++g) out[r * nq + g] = dot_f32(tmp.data(), queries + g * dim, dim);
  }
}

void axpy_f32(float a, const float* x, float* y, size_t n) {
  size_t i = 0;
#ifdef TOPKV_AVX2
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
#endif
  for (; i < n; ++i) y[i] += a * x[i];
}

void axpy_row(DType t, float a, const void* row, float* y, size_t n) {
  if (t == DType::F32) return axpy_f32(a, static_cast<const float*>(row), y, n);
  if (t == DType::F8E4M3 || t == DType::Q8_0) {  // 256 = 8 whole Q8_0 blocks
    float tmp[256];
    for (size_t i = 0; i < n; i += 256) {
      const size_t m = std::min<size_t>(256, n - i);
      to_f32(t, static_cast<const uint8_t*>(row) + dtype_bytes(t, i), tmp, m);
      axpy_f32(a, tmp, y + i, m);
    }
    return;
  }
  const auto* h = static_cast<const uint16_t*>(row);
  size_t i = 0;
#ifdef TOPKV_AVX2
  __m256 va = _mm256_set1_ps(a);
  for (; i + 8 <= n; i += 8) {
    __m256 x = t == DType::F16 ? load_f16x8(h + i) : load_bf16x8(h + i);
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, x, _mm256_loadu_ps(y + i)));
  }
#endif
  for (; i < n; ++i) y[i] += a * (t == DType::F16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]));
}

}  // namespace topkv
