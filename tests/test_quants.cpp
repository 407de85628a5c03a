// GGML row kernels: hand-built blocks with known values (bytes written here,
// independently of the encoder), fused dot == dot of the dequantised row,
// quantise -> dequantise error bounds, unsupported types rejected by name.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "src/common/dtype.h"
#include "src/common/error.h"
#include "src/model/ggml_types.h"
#include "tests/quant_test_util.h"

using namespace topkv;

namespace {

constexpr uint16_t kHalf1 = 0x3c00, kHalfHalf = 0x3800, kHalfQuarter = 0x3400, kHalf2 = 0x4000,
                   kHalfMinus1 = 0xbc00;

void put16(std::vector<uint8_t>& b, size_t at, uint16_t v) {
  b[at] = (uint8_t)(v & 0xff);
  b[at + 1] = (uint8_t)(v >> 8);
}

std::vector<float> dequant(GgmlType t, const std::vector<uint8_t>& b, int64_t n) {
  std::vector<float> y(n);
  dequantize_row(t, b.data(), y.data(), n);
  return y;
}

// Random code bits, sane scales (tests/quant_test_util.h).
std::vector<uint8_t> random_row(GgmlType t, int64_t n, std::mt19937& rng) { return test::random_quant_row(t, n, rng); }

const GgmlType kAllTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                              GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                              GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

}  // namespace

TEST_CASE("type table: names, block geometry, row sizes, and unsupported types rejected by name") {
  struct { GgmlType t; const char* name; int64_t elems; size_t bytes; } expect[] = {
      {GgmlType::F32, "F32", 1, 4},      {GgmlType::F16, "F16", 1, 2},      {GgmlType::BF16, "BF16", 1, 2},
      {GgmlType::Q8_0, "Q8_0", 32, 34},  {GgmlType::Q4_0, "Q4_0", 32, 18},  {GgmlType::Q4_1, "Q4_1", 32, 20},
      {GgmlType::Q5_0, "Q5_0", 32, 22},  {GgmlType::Q5_1, "Q5_1", 32, 24},  {GgmlType::Q4_K, "Q4_K", 256, 144},
      {GgmlType::Q5_K, "Q5_K", 256, 176}, {GgmlType::Q6_K, "Q6_K", 256, 210},
  };
  for (auto& e : expect) {
    CHECK(ggml_type_supported((uint32_t)e.t));
    GgmlTypeInfo ti = ggml_type_info(e.t);
    CHECK(std::string(ti.name) == e.name);
    CHECK(ggml_type_name((uint32_t)e.t) == e.name);
    CHECK(ti.block_elems == e.elems);
    CHECK(ti.block_bytes == e.bytes);
    CHECK(ggml_row_bytes(e.t, 2048) == 2048 / e.elems * e.bytes);
  }
  CHECK(ggml_row_bytes(GgmlType::Q5_0, 640) == 440);
  CHECK_THROWS_WITH(ggml_row_bytes(GgmlType::Q4_K, 640), Catch::Contains("multiple") && Catch::Contains("Q4_K"));
  // other ggml types are known by name but not supported
  struct { uint32_t code; const char* name; } others[] = {
      {9, "Q8_1"}, {10, "Q2_K"}, {11, "Q3_K"}, {15, "Q8_K"}, {16, "IQ2_XXS"}, {20, "IQ4_NL"},
      {23, "IQ4_XS"}, {28, "F64"}, {29, "IQ1_M"}, {34, "TQ1_0"}, {39, "MXFP4"}};
  for (auto& o : others) {
    CHECK_FALSE(ggml_type_supported(o.code));
    CHECK(ggml_type_name(o.code) == o.name);
    CHECK_THROWS_WITH(ggml_type_info((GgmlType)o.code), Catch::Contains(o.name));
  }
  CHECK_FALSE(ggml_type_supported(4));
  CHECK_FALSE(ggml_type_supported(1000));
  CHECK(ggml_type_name(1000) == "unknown");
}

TEST_CASE("hand-built Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 blocks dequantise to the exact values") {
  SECTION("Q8_0: d * q") {
    std::vector<uint8_t> b(34);
    put16(b, 0, kHalfHalf);
    for (int j = 0; j < 32; ++j) b[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    auto y = dequant(GgmlType::Q8_0, b, 32);
    for (int j = 0; j < 32; ++j) REQUIRE(y[j] == 0.5f * (j * 8 - 128));
  }
  SECTION("Q4_0: low nibble of qs[j] is value j, high nibble value j+16; d * (q - 8)") {
    std::vector<uint8_t> b(18);
    put16(b, 0, kHalf2);
    for (int j = 0; j < 16; ++j) b[2 + j] = (uint8_t)(j | ((15 - j) << 4));
    auto y = dequant(GgmlType::Q4_0, b, 32);
    for (int j = 0; j < 16; ++j) {
      REQUIRE(y[j] == 2.f * (j - 8));
      REQUIRE(y[j + 16] == 2.f * ((15 - j) - 8));
    }
  }
  SECTION("Q4_1: d * q + m") {
    std::vector<uint8_t> b(20);
    put16(b, 0, kHalf1);
    put16(b, 2, kHalfMinus1);
    for (int j = 0; j < 16; ++j) b[4 + j] = (uint8_t)(((j * 3) & 15) | (j << 4));
    auto y = dequant(GgmlType::Q4_1, b, 32);
    for (int j = 0; j < 16; ++j) {
      REQUIRE(y[j] == (float)((j * 3) & 15) - 1.f);
      REQUIRE(y[j + 16] == (float)j - 1.f);
    }
  }
  // qh = 0xF00FA5C3 little-endian: bit j is the 5th bit of value j.
  const uint32_t qh = 0xF00FA5C3u;
  const uint8_t qh_bytes[4] = {0xC3, 0xA5, 0x0F, 0xF0};
  SECTION("Q5_0: d * (q - 16), 5th bit from qh") {
    std::vector<uint8_t> b(22);
    put16(b, 0, kHalf1);
    std::memcpy(&b[2], qh_bytes, 4);
    for (int j = 0; j < 16; ++j) b[6 + j] = (uint8_t)(j | ((15 - j) << 4));
    auto y = dequant(GgmlType::Q5_0, b, 32);
    for (int j = 0; j < 16; ++j) {
      REQUIRE(y[j] == (float)((j | (int)((qh >> j) & 1) << 4) - 16));
      REQUIRE(y[j + 16] == (float)(((15 - j) | (int)((qh >> (j + 16)) & 1) << 4) - 16));
    }
  }
  SECTION("Q5_1: d * q + m, 5th bit from qh") {
    std::vector<uint8_t> b(24);
    put16(b, 0, kHalfHalf);
    put16(b, 2, kHalfQuarter);
    std::memcpy(&b[4], qh_bytes, 4);
    for (int j = 0; j < 16; ++j) b[8 + j] = (uint8_t)((15 - j) | (j << 4));
    auto y = dequant(GgmlType::Q5_1, b, 32);
    for (int j = 0; j < 16; ++j) {
      REQUIRE(y[j] == 0.5f * (((15 - j) | (int)((qh >> j) & 1) << 4)) + 0.25f);
      REQUIRE(y[j + 16] == 0.5f * ((j | (int)((qh >> (j + 16)) & 1) << 4)) + 0.25f);
    }
  }
}

// 6-bit scales {1,2,3,4,5,6,7,63} and mins {0,1,2,3,33,40,50,63}, packed by
// hand: bytes 0-3 scales 0-3 (+ top bits of scales 4-7), bytes 4-7 mins 0-3
// (+ top bits of mins 4-7), bytes 8-11 low nibbles of scale/min 4-7.
static const int kSc[8] = {1, 2, 3, 4, 5, 6, 7, 63}, kMin[8] = {0, 1, 2, 3, 33, 40, 50, 63};
static const uint8_t kScaleBytes[12] = {0x01, 0x02, 0x03, 0xC4, 0x80, 0x81, 0xC2, 0xC3, 0x15, 0x86, 0x27, 0xFF};

TEST_CASE("hand-built Q4_K and Q5_K blocks dequantise to d*sc*q - dmin*m") {
  // d = 1, dmin = 0.5; qs[32c + l] = (l%16) | (15 - l%16) << 4
  auto qs_byte = [](int l) { return (uint8_t)((l % 16) | ((15 - l % 16) << 4)); };
  SECTION("Q4_K") {
    std::vector<uint8_t> b(144);
    put16(b, 0, kHalf1);
    put16(b, 2, kHalfHalf);
    std::memcpy(&b[4], kScaleBytes, 12);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) b[16 + 32 * c + l] = qs_byte(l);
    auto y = dequant(GgmlType::Q4_K, b, 256);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        REQUIRE(y[64 * c + l] == (float)kSc[2 * c] * (l % 16) - 0.5f * kMin[2 * c]);
        REQUIRE(y[64 * c + 32 + l] == (float)kSc[2 * c + 1] * (15 - l % 16) - 0.5f * kMin[2 * c + 1]);
      }
  }
  SECTION("Q5_K: bit 2c / 2c+1 of qh[l] adds 16") {
    std::vector<uint8_t> b(176);
    put16(b, 0, kHalf1);
    put16(b, 2, kHalfHalf);
    std::memcpy(&b[4], kScaleBytes, 12);
    for (int l = 0; l < 32; ++l) b[16 + l] = (uint8_t)(l * 37 + 11);  // qh
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) b[48 + 32 * c + l] = qs_byte(l);
    auto y = dequant(GgmlType::Q5_K, b, 256);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        const uint8_t qh = (uint8_t)(l * 37 + 11);
        const int q0 = l % 16 + (((qh >> (2 * c)) & 1) ? 16 : 0);
        const int q1 = 15 - l % 16 + (((qh >> (2 * c + 1)) & 1) ? 16 : 0);
        REQUIRE(y[64 * c + l] == (float)kSc[2 * c] * q0 - 0.5f * kMin[2 * c]);
        REQUIRE(y[64 * c + 32 + l] == (float)kSc[2 * c + 1] * q1 - 0.5f * kMin[2 * c + 1]);
      }
  }
}

TEST_CASE("hand-built Q6_K block dequantises to d * scales[v/16] * (q - 32)") {
  // layout: ql[128] qh[64] scales[16] d
  std::vector<uint8_t> b(210);
  for (int i = 0; i < 128; ++i) b[i] = (uint8_t)(i * 29 + 7);
  for (int i = 0; i < 64; ++i) b[128 + i] = (uint8_t)(i * 53 + 3);
  const int8_t scales[16] = {1, -2, 3, -4, 5, -6, 7, -8, 127, -128, 11, -12, 13, -14, 15, -16};
  std::memcpy(&b[192], scales, 16);
  put16(b, 208, kHalfQuarter);
  auto y = dequant(GgmlType::Q6_K, b, 256);
  for (int v = 0; v < 256; ++v) {
    // value v = 128h + 32k + l: low 4 bits from ql[64h + l] (k=0,2) or
    // ql[64h + 32 + l] (k=1,3), low nibble for k<2, high for k>=2; top 2 bits
    // are bits 2k..2k+1 of qh[32h + l].
    const int h = v / 128, k = (v % 128) / 32, l = v % 32;
    const uint8_t qlb = b[64 * h + (k & 1) * 32 + l];
    const int low = k < 2 ? (qlb & 15) : (qlb >> 4);
    const int top = (b[128 + 32 * h + l] >> (2 * k)) & 3;
    const int q = (low | (top << 4)) - 32;
    REQUIRE(y[v] == 0.25f * scales[v / 16] * q);
  }
}

TEST_CASE("plain types: F32, F16, BF16 rows") {
  std::vector<float> v = {1.5f, -2.25f, 65504.f, 3.0e-5f, 0.f, -1.f};
  std::vector<uint8_t> b(ggml_row_bytes(GgmlType::F16, 6));
  quantize_row(GgmlType::F16, v.data(), b.data(), 6);
  auto y = dequant(GgmlType::F16, b, 6);
  for (int i = 0; i < 6; ++i) REQUIRE(y[i] == f16_to_f32(f32_to_f16(v[i])));
  b.resize(12);
  quantize_row(GgmlType::BF16, v.data(), b.data(), 6);
  y = dequant(GgmlType::BF16, b, 6);
  for (int i = 0; i < 6; ++i) REQUIRE(y[i] == bf16_to_f32(f32_to_bf16(v[i])));
  b.resize(24);
  quantize_row(GgmlType::F32, v.data(), b.data(), 6);
  REQUIRE(dequant(GgmlType::F32, b, 6) == v);
}

TEST_CASE("fused dot_quant_row equals the dot of the dequantised row for every type") {
  std::mt19937 rng(1234);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (GgmlType t : kAllTypes) {
    const int64_t be = ggml_type_info(t).block_elems;
    for (int64_t blocks : {1, 2, 3, 5, 8}) {
      const int64_t n = be == 1 ? blocks * 13 + 1 : blocks * be;  // odd lengths for plain types
      INFO(ggml_type_info(t).name << " n=" << n);
      auto row = random_row(t, n, rng);
      std::vector<float> x(n), y(n);
      for (auto& v : x) v = nd(rng);
      dequantize_row(t, row.data(), y.data(), n);
      double ref = 0, mag = 0;
      for (int64_t i = 0; i < n; ++i) ref += (double)y[i] * x[i], mag += std::fabs((double)y[i] * x[i]);
      const float fast = dot_quant_row(t, row.data(), x.data(), n);
      const float plain = dot_quant_row_ref(t, row.data(), x.data(), n);
      REQUIRE(std::fabs(plain - ref) <= 1e-6 * mag + 1e-12);
      REQUIRE(std::fabs(fast - ref) <= 2e-5 * mag + 1e-12);
    }
  }
  // Gemma 3 270M shapes: rows of 640 (Q5_0, Q8_0), 1024 (Q4_K), 2048 (Q6_K)
  for (auto [t, n] : {std::pair{GgmlType::Q5_0, 640}, {GgmlType::Q8_0, 640}, {GgmlType::Q4_K, 1024},
                      {GgmlType::Q6_K, 2048}, {GgmlType::Q5_K, 4096}}) {
    auto row = random_row(t, n, rng);
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    REQUIRE(dot_quant_row(t, row.data(), x.data(), n) ==
            Approx(dot_quant_row_ref(t, row.data(), x.data(), n)).epsilon(1e-4).margin(1e-4));
  }
  std::vector<float> x(100);
  std::vector<uint8_t> row(200);
  CHECK_THROWS_AS(dot_quant_row(GgmlType::Q8_0, row.data(), x.data(), 100), Error);
}

TEST_CASE("quantise -> dequantise error is bounded for every type") {
  // Bounds are relative to the largest |value| of the block the value is in:
  // half a quantisation step plus fp16 rounding of the scales, with clipping
  // for the symmetric types (Q4_0: the side opposite the extreme gets 7 of 8
  // steps) and the 6-bit scale coding of the K-quants. The RMS bounds are
  // ~1.3x what this encoder measures on this data (Gaussian with a growing
  // spread and, in the second half, a per-value offset).
  struct { GgmlType t; double max_rel; double rms_rel; } cases[] = {
      {GgmlType::F32, 0, 0},            {GgmlType::F16, 1e-3, 5e-4},    {GgmlType::BF16, 8e-3, 4e-3},
      {GgmlType::Q8_0, 0.0045, 0.007}, {GgmlType::Q4_0, 0.126, 0.10},  {GgmlType::Q4_1, 0.07, 0.095},
      {GgmlType::Q5_0, 0.063, 0.052},  {GgmlType::Q5_1, 0.035, 0.046}, {GgmlType::Q4_K, 0.12, 0.10},
      {GgmlType::Q5_K, 0.06, 0.05},    {GgmlType::Q6_K, 0.035, 0.024},
  };
  std::mt19937 rng(99);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> offset(-1.f, 1.f);
  for (auto& c : cases) {
    const int64_t be = ggml_type_info(c.t).block_elems, n = 8 * 256;
    INFO(ggml_type_info(c.t).name);
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = nd(rng) * (1 + i / 512) + (i >= 1024 ? offset(rng) : 0.f);
    std::vector<uint8_t> q(ggml_row_bytes(c.t, n));
    quantize_row(c.t, x.data(), q.data(), n);
    std::vector<float> y(n);
    dequantize_row(c.t, q.data(), y.data(), n);
    const int64_t group = std::max<int64_t>(be, 32);
    double se = 0, sx = 0;
    for (int64_t g = 0; g < n; g += group) {
      float amax = 0;
      for (int64_t i = g; i < g + group; ++i) amax = std::max(amax, std::fabs(x[i]));
      for (int64_t i = g; i < g + group; ++i) {
        REQUIRE(std::fabs(y[i] - x[i]) <= c.max_rel * amax + 1e-30);
        se += (double)(y[i] - x[i]) * (y[i] - x[i]);
        sx += (double)x[i] * x[i];
      }
    }
    CHECK(std::sqrt(se / sx) <= c.rms_rel);
    // a block of zeros stays zeros, no NaN from 0/0
    std::vector<float> zeros(be == 1 ? 8 : be, 0.f), back(zeros.size(), 1.f);
    std::vector<uint8_t> zq(ggml_row_bytes(c.t, (int64_t)zeros.size()));
    quantize_row(c.t, zeros.data(), zq.data(), (int64_t)zeros.size());
    dequantize_row(c.t, zq.data(), back.data(), (int64_t)zeros.size());
    for (float v : back) REQUIRE(v == 0.f);
  }
}
