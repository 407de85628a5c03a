// fp32 -> GGML blocks, for the GGUF writer and synthetic models.
// F16..Q5_1 follow ggml's reference quantize_row_*_ref (round to nearest, the
// scale chosen from the block's extreme value). The K-quants use a simple
// valid encoder: per sub-block scale and min from its min/max, then the
// scales themselves quantised to 6 (Q4_K/Q5_K) or 8 (Q6_K) bits against one
// fp16 super-scale. This is NOT ggml's optimised make_qkx2_quants /
// make_qx_quants search (iterative weighted least squares); its error is
// somewhat larger, which is fine for synthetic weights and round-trip tests.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/common/dtype.h"
#include "src/common/error.h"
#include "src/model/ggml_types.h"
#include "src/model/quant_blocks.h"

namespace topkv {

using namespace quant;

static int nearest(float v) { return (int)std::lround(v); }

// Value of largest magnitude, with its sign (ggml's "max" in the _0 types).
static float signed_absmax(const float* x, int n) {
  float amax = 0, m = 0;
  for (int j = 0; j < n; ++j)
    if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); m = x[j]; }
  return m;
}

static void quant_q8_0(const float* x, BlockQ8_0& b) {
  float amax = 0;
  for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127, id = d ? 1 / d : 0;
  b.d = f32_to_f16(d);
  for (int j = 0; j < QK; ++j) b.qs[j] = (int8_t)nearest(x[j] * id);
}

// Q4_0/Q5_0: d = max / -2^(bits-1) so the extreme value lands exactly on the
// most negative code; values of the other sign clip at 2^(bits-1)-1.
template <int kBits>
static void quant_sym(const float* x, float& d_out, int* q) {
  constexpr int kHalf = 1 << (kBits - 1), kMax = (1 << kBits) - 1;
  const float d = signed_absmax(x, QK) / -kHalf, id = d ? 1 / d : 0;
  d_out = d;
  for (int j = 0; j < QK; ++j) q[j] = std::clamp((int)(x[j] * id + kHalf + 0.5f), 0, kMax);
}
// Q4_1/Q5_1: d = (max - min) / (2^bits - 1), offset m = min.
template <int kBits>
static void quant_affine(const float* x, float& d_out, float& m_out, int* q) {
  constexpr int kMax = (1 << kBits) - 1;
  float lo = x[0], hi = x[0];
  for (int j = 1; j < QK; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
  const float d = (hi - lo) / kMax, id = d ? 1 / d : 0;
  d_out = d;
  m_out = lo;
  for (int j = 0; j < QK; ++j) q[j] = std::clamp((int)((x[j] - lo) * id + 0.5f), 0, kMax);
}
static void pack_nibbles(const int* q, uint8_t* qs) {
  for (int j = 0; j < QK / 2; ++j) qs[j] = (uint8_t)((q[j] & 15) | ((q[j + QK / 2] & 15) << 4));
}
static void pack_fifth_bits(const int* q, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < QK; ++j) h |= (uint32_t)((q[j] >> 4) & 1) << j;
  std::memcpy(qh, &h, 4);
}

static void quant_q4_0(const float* x, BlockQ4_0& b) {
  float d;
  int q[QK];
  quant_sym<4>(x, d, q);
  b.d = f32_to_f16(d);
  pack_nibbles(q, b.qs);
}
static void quant_q5_0(const float* x, BlockQ5_0& b) {
  float d;
  int q[QK];
  quant_sym<5>(x, d, q);
  b.d = f32_to_f16(d);
  pack_nibbles(q, b.qs);
  pack_fifth_bits(q, b.qh);
}
static void quant_q4_1(const float* x, BlockQ4_1& b) {
  float d, m;
  int q[QK];
  quant_affine<4>(x, d, m, q);
  b.d = f32_to_f16(d);
  b.m = f32_to_f16(m);
  pack_nibbles(q, b.qs);
}
static void quant_q5_1(const float* x, BlockQ5_1& b) {
  float d, m;
  int q[QK];
  quant_affine<5>(x, d, m, q);
  b.d = f32_to_f16(d);
  b.m = f32_to_f16(m);
  pack_nibbles(q, b.qs);
  pack_fifth_bits(q, b.qh);
}

// Inverse of unpack_scale_min_k4 (quant_blocks.h).
static void pack_scale_min_k4(const int* sc, const int* m, uint8_t* s) {
  std::memset(s, 0, 12);
  for (int j = 0; j < 8; ++j) {
    if (j < 4) {
      s[j] |= (uint8_t)(sc[j] & 63);
      s[j + 4] |= (uint8_t)(m[j] & 63);
    } else {
      s[j + 4] = (uint8_t)((sc[j] & 15) | ((m[j] & 15) << 4));
      s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
      s[j] |= (uint8_t)((m[j] >> 4) << 6);
    }
  }
}

// Q4_K / Q5_K (kMax = 15 / 31). Sub-block s covers x[32s..32s+32): its
// min is min(0, min x) (stored negated, so m >= 0 as ggml requires) and its
// scale spans min..max. Scales and mins are then coded as 6-bit multiples of
// the fp16 super-scales d and dmin, and each value is re-quantised against the
// decoded (sc, m) so the codes match what the dequantiser will compute.
template <int kMax>
static void quant_qk_4or5(const float* x, uint16_t& d16, uint16_t& dmin16, uint8_t* scales, int* q) {
  float scale[8], mins[8], max_scale = 0, max_min = 0;
  for (int s = 0; s < 8; ++s) {
    float lo = 0, hi = x[32 * s];
    for (int l = 0; l < 32; ++l) lo = std::min(lo, x[32 * s + l]), hi = std::max(hi, x[32 * s + l]);
    scale[s] = (hi - lo) / kMax;
    mins[s] = -lo;
    max_scale = std::max(max_scale, scale[s]);
    max_min = std::max(max_min, mins[s]);
  }
  d16 = f32_to_f16(max_scale / 63);
  dmin16 = f32_to_f16(max_min / 63);
  const float d = f16_to_f32(d16), dmin = f16_to_f32(dmin16);
  int sc[8], m[8];
  for (int s = 0; s < 8; ++s) {
    sc[s] = d > 0 ? std::clamp(nearest(scale[s] / d), 0, 63) : 0;
    m[s] = dmin > 0 ? std::clamp(nearest(mins[s] / dmin), 0, 63) : 0;
    const float ds = d * sc[s], mm = dmin * m[s];
    for (int l = 0; l < 32; ++l)
      q[32 * s + l] = ds > 0 ? std::clamp(nearest((x[32 * s + l] + mm) / ds), 0, kMax) : 0;
  }
  pack_scale_min_k4(sc, m, scales);
}

static void quant_q4_k(const float* x, BlockQ4_K& b) {
  int q[QK_K];
  quant_qk_4or5<15>(x, b.d, b.dmin, b.scales, q);
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) b.qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}
static void quant_q5_k(const float* x, BlockQ5_K& b) {
  int q[QK_K];
  quant_qk_4or5<31>(x, b.d, b.dmin, b.scales, q);
  std::memset(b.qh, 0, sizeof(b.qh));
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      const int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
      b.qs[32 * c + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
      b.qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
    }
}

// Q6_K: 16 sub-blocks of 16 values; sub-block scale = signed extreme / -32
// (as Q4_0 does), coded as int8 multiples of the fp16 super-scale d.
static void quant_q6_k(const float* x, BlockQ6_K& b) {
  float scale[16], amax = 0, extreme = 0;
  for (int s = 0; s < 16; ++s) {
    scale[s] = signed_absmax(x + 16 * s, 16) / -32;
    if (std::fabs(scale[s]) > amax) amax = std::fabs(scale[s]), extreme = scale[s];
  }
  // d = extreme / -128 lets the largest scale use code -128 (like ggml).
  b.d = f32_to_f16(extreme / -128);
  const float d = f16_to_f32(b.d);
  int q[QK_K];
  for (int s = 0; s < 16; ++s) {
    const int sc = d != 0 ? std::clamp(nearest(scale[s] / d), -128, 127) : 0;
    b.scales[s] = (int8_t)sc;
    const float ds = d * sc;
    for (int l = 0; l < 16; ++l)
      q[16 * s + l] = ds != 0 ? std::clamp(nearest(x[16 * s + l] / ds), -32, 31) + 32 : 32;
  }
  for (int h = 0; h < 2; ++h) {
    uint8_t* ql = b.ql + 64 * h;
    uint8_t* qh = b.qh + 32 * h;
    const int* qq = q + 128 * h;
    for (int l = 0; l < 32; ++l) {
      ql[l] = (uint8_t)((qq[l] & 15) | ((qq[l + 64] & 15) << 4));
      ql[l + 32] = (uint8_t)((qq[l + 32] & 15) | ((qq[l + 96] & 15) << 4));
      qh[l] = (uint8_t)((qq[l] >> 4) | ((qq[l + 32] >> 4) << 2) | ((qq[l + 64] >> 4) << 4) | ((qq[l + 96] >> 4) << 6));
    }
  }
}

template <typename Block>
static void quant_blocks(const float* src, void* dst, int64_t n, int qk, void (*f)(const float*, Block&)) {
  auto* b = static_cast<Block*>(dst);
  for (int64_t i = 0; i < n / qk; ++i) f(src + i * qk, b[i]);
}

void quantize_row(GgmlType t, const float* src, void* dst, int64_t n) {
  GgmlTypeInfo ti = ggml_type_info(t);
  TOPKV_CHECK(n % ti.block_elems == 0, "quantize_row: {} elements is not a multiple of the {} block size {}", n,
              ti.name, ti.block_elems);
  switch (t) {
    case GgmlType::F32: std::memcpy(dst, src, (size_t)n * 4); break;
    case GgmlType::F16: from_f32(DType::F16, src, dst, (size_t)n); break;
    case GgmlType::BF16: from_f32(DType::BF16, src, dst, (size_t)n); break;
    case GgmlType::Q8_0: quant_blocks<BlockQ8_0>(src, dst, n, QK, quant_q8_0); break;
    case GgmlType::Q4_0: quant_blocks<BlockQ4_0>(src, dst, n, QK, quant_q4_0); break;
    case GgmlType::Q4_1: quant_blocks<BlockQ4_1>(src, dst, n, QK, quant_q4_1); break;
    case GgmlType::Q5_0: quant_blocks<BlockQ5_0>(src, dst, n, QK, quant_q5_0); break;
    case GgmlType::Q5_1: quant_blocks<BlockQ5_1>(src, dst, n, QK, quant_q5_1); break;
    case GgmlType::Q4_K: quant_blocks<BlockQ4_K>(src, dst, n, QK_K, quant_q4_k); break;
    case GgmlType::Q5_K: quant_blocks<BlockQ5_K>(src, dst, n, QK_K, quant_q5_k); break;
    case GgmlType::Q6_K: quant_blocks<BlockQ6_K>(src, dst, n, QK_K, quant_q6_k); break;
  }
}

}  // namespace topkv
