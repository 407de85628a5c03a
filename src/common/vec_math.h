// Inner products between stored rows (f32/f16/bf16/f8/q8_0) and fp32 queries: the
// inner loop of exact search, re-scoring and CPU attention. AVX2+FMA+F16C
// when the build targets them (x86-64-v3, the default), scalar otherwise.
#pragma once
#include <cstddef>
#include <cstdint>

#include "src/common/dtype.h"

namespace topkv {

float dot_f32(const float* a, const float* b, size_t n);
float dot_f16(const uint16_t* row, const float* q, size_t n);
float dot_bf16(const uint16_t* row, const float* q, size_t n);
float dot_f8e4m3(const uint8_t* row, const float* q, size_t n);
float dot_q8_0(const uint8_t* row, const float* q, size_t n);  // n: whole blocks of 32

// Dot of one stored row of type `t` with an fp32 query.
inline float dot_row(DType t, const void* row, const float* q, size_t n) {
  switch (t) {
    case DType::F32: return dot_f32(static_cast<const float*>(row), q, n);
    case DType::F16: return dot_f16(static_cast<const uint16_t*>(row), q, n);
    case DType::BF16: return dot_bf16(static_cast<const uint16_t*>(row), q, n);
    case DType::F8E4M3: return dot_f8e4m3(static_cast<const uint8_t*>(row), q, n);
    case DType::Q8_0: return dot_q8_0(static_cast<const uint8_t*>(row), q, n);
    case DType::I8: break;
  }
  fail_not_a_row_type(t);
}

// out[r * nq + g] = rows[r] . queries[g] for `n_rows` contiguous rows of `dim`
// elements and `nq` contiguous fp32 queries. Each row is loaded once for all
// queries (GQA: the query heads of one KV head share the pass over keys).
void dot_rows_multi(DType t, const void* rows, size_t n_rows, size_t dim,
                    const float* queries, size_t nq, float* out);

// y += a * x (fp32), and y += a * row (row of type t converted on the fly).
void axpy_f32(float a, const float* x, float* y, size_t n);
void axpy_row(DType t, float a, const void* row, float* y, size_t n);

}  // namespace topkv
