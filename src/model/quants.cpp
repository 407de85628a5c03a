// GGML types: names, block geometry, and the scalar dequantisers (the
// reference every fast path is tested against). Layouts and formulas follow
// ggml-org/ggml src/ggml-quants.c dequantize_row_*; MODELS.md summarises them.
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "src/common/dtype.h"
#include "src/common/error.h"
#include "src/common/vec_math.h"
#include "src/model/ggml_types.h"
#include "src/model/quant_blocks.h"

namespace topkv {

using namespace quant;

// Names of every ggml type code (ggml.h enum ggml_type), so a file using one
// topkv does not read is rejected by name. Codes 4, 5, 31-33, 36-38 were
// removed from ggml; their old names are kept for clearer messages.
static const char* const kTypeNames[] = {
    "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
    "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
    "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
    "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8",
    "MXFP4", "NVFP4", "Q1_0",
};
constexpr uint32_t kNumTypeNames = sizeof(kTypeNames) / sizeof(kTypeNames[0]);

bool ggml_type_supported(uint32_t code) {
  switch ((GgmlType)code) {
    case GgmlType::F32: case GgmlType::F16: case GgmlType::BF16: case GgmlType::Q8_0:
    case GgmlType::Q4_0: case GgmlType::Q4_1: case GgmlType::Q5_0: case GgmlType::Q5_1:
    case GgmlType::Q4_K: case GgmlType::Q5_K: case GgmlType::Q6_K: return true;
  }
  return false;
}

std::string_view ggml_type_name(uint32_t code) {
  return code < kNumTypeNames ? kTypeNames[code] : "unknown";
}

GgmlType ggml_type_from_name(std::string_view name) {
  std::string up(name);
  for (auto& ch : up) ch = (char)std::toupper((unsigned char)ch);
  for (uint32_t code = 0; code < kNumTypeNames; ++code)
    if (up == kTypeNames[code] && ggml_type_supported(code)) return (GgmlType)code;
  fail("unknown or unsupported weight type '{}' (supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, "
       "q5_k, q6_k)", name);
}

GgmlTypeInfo ggml_type_info(GgmlType t) {
  const char* name = kTypeNames[0];
  if ((uint32_t)t < kNumTypeNames) name = kTypeNames[(uint32_t)t];
  switch (t) {
    case GgmlType::F32: return {name, 1, 4};
    case GgmlType::F16: case GgmlType::BF16: return {name, 1, 2};
    case GgmlType::Q8_0: return {name, QK, sizeof(BlockQ8_0)};
    case GgmlType::Q4_0: return {name, QK, sizeof(BlockQ4_0)};
    case GgmlType::Q4_1: return {name, QK, sizeof(BlockQ4_1)};
    case GgmlType::Q5_0: return {name, QK, sizeof(BlockQ5_0)};
    case GgmlType::Q5_1: return {name, QK, sizeof(BlockQ5_1)};
    case GgmlType::Q4_K: return {name, QK_K, sizeof(BlockQ4_K)};
    case GgmlType::Q5_K: return {name, QK_K, sizeof(BlockQ5_K)};
    case GgmlType::Q6_K: return {name, QK_K, sizeof(BlockQ6_K)};
  }
  fail("GGML type {} (code {}) is not supported", ggml_type_name((uint32_t)t), (uint32_t)t);
}

size_t ggml_row_bytes(GgmlType t, int64_t n) {
  GgmlTypeInfo ti = ggml_type_info(t);
  TOPKV_CHECK(n >= 0 && n % ti.block_elems == 0, "a row of {} elements is not a multiple of the {} block size {}",
              n, ti.name, ti.block_elems);
  return (size_t)(n / ti.block_elems) * ti.block_bytes;
}

// ---- scalar dequantisation, one block at a time -------------------------------

static void dequant_q8_0(const BlockQ8_0& b, float* y) { to_f32(DType::Q8_0, &b, y, QK); }
static void dequant_q4_0(const BlockQ4_0& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = d * ((b.qs[j] & 15) - 8);
    y[j + QK / 2] = d * ((b.qs[j] >> 4) - 8);
  }
}
static void dequant_q4_1(const BlockQ4_1& b, float* y) {
  const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = d * (b.qs[j] & 15) + m;
    y[j + QK / 2] = d * (b.qs[j] >> 4) + m;
  }
}
// The 5th bit of value j (0..31) is bit j of the little-endian qh word.
template <typename Block>
static void q5_values(const Block& b, int* q) {
  uint32_t qh;
  std::memcpy(&qh, b.qh, 4);
  for (int j = 0; j < QK / 2; ++j) {
    q[j] = (b.qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
    q[j + QK / 2] = (b.qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
  }
}
static void dequant_q5_0(const BlockQ5_0& b, float* y) {
  const float d = f16_to_f32(b.d);
  int q[QK];
  q5_values(b, q);
  for (int j = 0; j < QK; ++j) y[j] = d * (q[j] - 16);
}
static void dequant_q5_1(const BlockQ5_1& b, float* y) {
  const float d = f16_to_f32(b.d), m = f16_to_f32(b.m);
  int q[QK];
  q5_values(b, q);
  for (int j = 0; j < QK; ++j) y[j] = d * q[j] + m;
}
// Q4_K / Q5_K: chunk c (64 values) uses sub-blocks 2c (low nibbles of
// qs[32c..32c+32)) and 2c+1 (high nibbles); Q5_K adds 16 when bit 2c / 2c+1
// of qh[l] is set.
template <typename Block, bool kFifthBit>
static void dequant_qk_4or5(const Block& b, float* y) {
  const float d = f16_to_f32(b.d), dmin = f16_to_f32(b.dmin);
  for (int c = 0; c < 4; ++c) {
    const uint8_t* qs = b.qs + 32 * c;
    for (int half = 0; half < 2; ++half) {
      uint8_t sc, m;
      unpack_scale_min_k4(2 * c + half, b.scales, sc, m);
      const float ds = d * sc, mm = dmin * m;
      for (int l = 0; l < 32; ++l) {
        int q = half ? qs[l] >> 4 : qs[l] & 15;
        if constexpr (kFifthBit) q += ((b.qh[l] >> (2 * c + half)) & 1) << 4;
        y[64 * c + 32 * half + l] = ds * q - mm;
      }
    }
  }
}
// Q6_K: each half of 128 values takes 64 bytes of ql and 32 of qh. Value
// 32k + l (k = 0..3, l < 32) has its low 4 bits in the low nibble of ql[l]
// (k=0) or ql[l+32] (k=1), the high nibble of ql[l] (k=2) or ql[l+32] (k=3),
// and its top 2 bits in bits 2k, 2k+1 of qh[l]; minus 32. One int8 scale per
// 16 values.
static void dequant_q6_k(const BlockQ6_K& b, float* y) {
  const float d = f16_to_f32(b.d);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = b.ql + 64 * h;
    const uint8_t* qh = b.qh + 32 * h;
    const int8_t* sc = b.scales + 8 * h;
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q0 = ((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q1 = ((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q2 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q3 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[128 * h + l] = d * sc[is] * q0;
      y[128 * h + l + 32] = d * sc[is + 2] * q1;
      y[128 * h + l + 64] = d * sc[is + 4] * q2;
      y[128 * h + l + 96] = d * sc[is + 6] * q3;
    }
  }
}

// Dequantises block `i` of a row of type t into y (block_elems values).
static void dequant_block(GgmlType t, const uint8_t* row, int64_t i, float* y) {
  switch (t) {
    case GgmlType::Q8_0: dequant_q8_0(reinterpret_cast<const BlockQ8_0*>(row)[i], y); break;
    case GgmlType::Q4_0: dequant_q4_0(reinterpret_cast<const BlockQ4_0*>(row)[i], y); break;
    case GgmlType::Q4_1: dequant_q4_1(reinterpret_cast<const BlockQ4_1*>(row)[i], y); break;
    case GgmlType::Q5_0: dequant_q5_0(reinterpret_cast<const BlockQ5_0*>(row)[i], y); break;
    case GgmlType::Q5_1: dequant_q5_1(reinterpret_cast<const BlockQ5_1*>(row)[i], y); break;
    case GgmlType::Q4_K: dequant_qk_4or5<BlockQ4_K, false>(reinterpret_cast<const BlockQ4_K*>(row)[i], y); break;
    case GgmlType::Q5_K: dequant_qk_4or5<BlockQ5_K, true>(reinterpret_cast<const BlockQ5_K*>(row)[i], y); break;
    case GgmlType::Q6_K: dequant_q6_k(reinterpret_cast<const BlockQ6_K*>(row)[i], y); break;
    default: fail("internal: dequant_block on non-block type {}", ggml_type_name((uint32_t)t));
  }
}

static DType plain_dtype(GgmlType t) {
  return t == GgmlType::F32 ? DType::F32 : t == GgmlType::F16 ? DType::F16 : DType::BF16;
}
static bool is_plain(GgmlType t) {
  return t == GgmlType::F32 || t == GgmlType::F16 || t == GgmlType::BF16;
}

void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n) {
  GgmlTypeInfo ti = ggml_type_info(t);
  TOPKV_CHECK(n % ti.block_elems == 0, "dequantize_row: {} elements is not a multiple of the {} block size {}", n,
              ti.name, ti.block_elems);
  if (is_plain(t)) return to_f32(plain_dtype(t), src, dst, (size_t)n);
  const auto* row = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n / ti.block_elems; ++i) dequant_block(t, row, i, dst + i * ti.block_elems);
}

float dot_quant_row_ref(GgmlType t, const void* row, const float* x, int64_t n) {
  GgmlTypeInfo ti = ggml_type_info(t);
  TOPKV_CHECK(n % ti.block_elems == 0, "dot_quant_row: {} elements is not a multiple of the {} block size {}", n,
              ti.name, ti.block_elems);
  if (is_plain(t)) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) {
      float v;
      to_f32(plain_dtype(t), static_cast<const uint8_t*>(row) + i * ti.block_bytes, &v, 1);
      s += (double)v * x[i];
    }
    return (float)s;
  }
  float y[QK_K];
  double s = 0;
  for (int64_t i = 0; i < n / ti.block_elems; ++i) {
    dequant_block(t, static_cast<const uint8_t*>(row), i, y);
    for (int64_t j = 0; j < ti.block_elems; ++j) s += (double)y[j] * x[i * ti.block_elems + j];
  }
  return (float)s;
}

float dot_quant_row(GgmlType t, const void* row, const float* x, int64_t n) {
  switch (t) {
    case GgmlType::F32: return dot_f32(static_cast<const float*>(row), x, (size_t)n);
    case GgmlType::F16: return dot_f16(static_cast<const uint16_t*>(row), x, (size_t)n);
    case GgmlType::BF16: return dot_bf16(static_cast<const uint16_t*>(row), x, (size_t)n);
    default: break;
  }
  GgmlTypeInfo ti = ggml_type_info(t);
  TOPKV_CHECK(n % ti.block_elems == 0, "dot_quant_row: {} elements is not a multiple of the {} block size {}", n,
              ti.name, ti.block_elems);
  float out;
  if (dot_row_fast((uint32_t)t, row, x, n, &out)) return out;
  return dot_quant_row_ref(t, row, x, n);
}

}  // namespace topkv
