// CPU twins of the quantised GPU kernels (gpu/quant_matvec_ref.h), which run
// the kernels' own arithmetic (gpu/quant_units.h) on the host:
//   - the device layout dequantises to dequantize_row's values bit for bit,
//     every type, random code bits and scales;
//   - q8_1 activations: d = max|x| / 127, |d q - x| <= d / 2, s = d sum(q);
//   - the MMVQ twin equals the dot of the dequantised rows with the
//     dequantised activations (what it computes, up to fp32 rounding) and
//     the dot with the fp32 activations within q8_1's error, over every type,
//     one row to odd row counts, one block to several, T = 1..8, bias and
//     accumulate;
//   - abs_bound bounds every dequantised value.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/quant_matvec_ref.h"
#include "src/common/error.h"
#include "src/model/ggml_types.h"
#include "tests/quant_test_util.h"

using namespace topkv;

namespace {

const GgmlType kQuantTypes[] = {GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0,
                                GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

const char* name(GgmlType t) { return ggml_type_name((uint32_t)t).data(); }

std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.f) {
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// ||got - ref|| / ||ref|| in double.
double rel_err(const std::vector<float>& got, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (got[i] - ref[i]) * (got[i] - ref[i]), den += ref[i] * ref[i];
  }
  return std::sqrt(num / den);
}

// A random matrix in the file's layout and in the device layout.
struct TestMatrix {
  std::vector<uint8_t> file, dev;
  std::vector<float> values;  // dequantize_row of every row, [rows][cols]
};
TestMatrix make_matrix(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestMatrix m;
  m.file = test::random_quant_row(t, rows * cols, rng);
  m.dev.resize(qref::device_bytes(t, rows, cols));
  qref::repack(t, m.file.data(), rows, cols, m.dev.data());
  m.values.resize((size_t)(rows * cols));
  const size_t rb = ggml_row_bytes(t, cols);
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t, m.file.data() + r * rb, m.values.data() + r * cols, cols);
  return m;
}

}  // namespace

TEST_CASE("quant twin: the device layout dequantises to dequantize_row's values bit for bit") {
  std::mt19937 rng(1);
  for (GgmlType t : kQuantTypes)
    for (int64_t blocks : {1, 3, 8}) {
      const int64_t cols = blocks * ggml_type_info(t).block_elems, rows = 5;
      CAPTURE(name(t), cols);
      TestMatrix m = make_matrix(t, rows, cols, rng);
      REQUIRE(qref::device_bytes(t, rows, cols) >= m.file.size());
      REQUIRE(qref::device_bytes(t, rows, cols) < m.file.size() + 48);  // the file's bytes and plane padding
      std::vector<float> row((size_t)cols);
      for (int64_t r = 0; r < rows; ++r) {
        qref::dequant_row(t, m.dev.data(), rows, cols, r, row.data());
        for (int64_t i = 0; i < cols; ++i) {
          const float want = m.values[(size_t)(r * cols + i)];
          if (std::memcmp(&row[(size_t)i], &want, 4) != 0) {
            std::printf("first mismatch: %s row %lld value %lld: dequantize_row %.9g, device layout %.9g\n", name(t),
                        (long long)r, (long long)i, want, row[(size_t)i]);
            FAIL("the device layout dequantises differently");
          }
        }
      }
      const float bound = qref::abs_bound(t, m.file.data(), rows * cols / ggml_type_info(t).block_elems);
      for (float v : m.values) REQUIRE(std::fabs(v) <= bound);
    }
  REQUIRE_FALSE(qref::has_device_layout(GgmlType::F16));
  std::vector<uint8_t> buf(64);
  REQUIRE_THROWS_AS(qref::repack(GgmlType::F32, buf.data(), 1, 16, buf.data()), Error);
  REQUIRE_THROWS_AS(qref::device_bytes(GgmlType::Q4_K, 2, 100), Error);  // not whole super-blocks
}

TEST_CASE("quant twin: q8_1 activations") {
  std::mt19937 rng(2);
  for (int T : {1, 3, 8})
    for (int64_t cols : {32, 96, 640}) {
      auto x = randn((size_t)T * cols, rng, 3.f);
      x[5] = 4000.f;  // a large value: only its block's scale grows
      for (int i = 0; i < 32 && T * cols >= 64; ++i) x[32 + i] = 0.f;  // an all-zero block: d = 0, q = 0
      const qref::Q8Activations a = qref::quantize_q8_1(x.data(), T, cols);
      REQUIRE(a.qs.size() == x.size());
      REQUIRE(a.ds.size() == x.size() / 32);
      const std::vector<float> xh = a.dequantised();
      for (size_t b = 0; b < a.ds.size(); ++b) {
        float amax = 0.f;
        int sum = 0;
        for (int l = 0; l < 32; ++l) amax = std::max(amax, std::fabs(x[b * 32 + l])), sum += a.qs[b * 32 + l];
        CAPTURE(T, cols, b);
        REQUIRE(a.ds[b].d == amax / 127.f);
        REQUIRE(a.ds[b].s == a.ds[b].d * (float)sum);
        for (int l = 0; l < 32; ++l) {
          REQUIRE(std::abs((int)a.qs[b * 32 + l]) <= 127);
          REQUIRE(std::fabs(xh[b * 32 + l] - x[b * 32 + l]) <= 0.5001f * a.ds[b].d + 1e-30f);
        }
      }
    }
  std::vector<float> x(48, 1.f);
  REQUIRE_THROWS_AS(qref::quantize_q8_1(x.data(), 1, 48), Error);  // not whole blocks of 32
  REQUIRE_THROWS_AS(qref::quantize_q8_1(x.data(), 1, 32, 3), Error);  // 1 or 2 terms
}

TEST_CASE("quant twin: q8_1x2 activations, a 16-bit code in two int8 halves") {
  std::mt19937 rng(12);
  double worst1 = 0, worst2 = 0;  // |x_hat - x| over the block's largest |x|
  for (int T : {1, 2, 5})
    for (int64_t cols : {32, 160, 896}) {
      auto x = randn((size_t)T * cols, rng, 3.f);
      x[7] = -2500.f;                                                  // an outlier: its block's scale grows
      for (int i = 0; i < 32 && T * cols >= 96; ++i) x[64 + i] = 0.f;  // an all-zero block: codes and scale 0
      const qref::Q8Activations one = qref::quantize_q8_1(x.data(), T, cols, 1);
      const qref::Q8Activations two = qref::quantize_q8_1(x.data(), T, cols, 2);
      REQUIRE(two.terms == 2);
      REQUIRE(two.qs.size() == 2 * x.size());
      REQUIRE(two.ds.size() == x.size() / 32);  // one scale a block
      const std::vector<float> x1 = one.dequantised(), x2 = two.dequantised();
      for (int t = 0; t < T; ++t)
        for (int64_t b = 0; b < cols / 32; ++b) {
          CAPTURE(T, cols, t, b);
          const qunits::Q8Row r = two.row(t);
          REQUIRE(r.lo == r.qs + cols);  // the lo codes: the next row
          float amax = 0.f;
          int sum = 0;
          for (int l = 0; l < 32; ++l) {
            const int64_t i = b * 32 + l;
            amax = std::max(amax, std::fabs(x[(size_t)t * cols + i]));
            const int q = two.code(t, i);
            REQUIRE(std::abs(q) <= 32512);
            REQUIRE(q == 256 * r.qs[i] + r.lo[i]);
            REQUIRE(std::abs((int)r.qs[i]) <= 127);
            sum += q;
          }
          const qunits::Q8Scale sc = r.ds[b];
          REQUIRE(sc.d == amax / 32512.f);  // max|x| / (127 * 256)
          REQUIRE(sc.s == sc.d * (float)sum);
          for (int l = 0; l < 32; ++l) {
            const size_t i = (size_t)t * cols + b * 32 + l;
            REQUIRE(std::fabs(x2[i] - x[i]) <= 0.5001f * sc.d + 1e-30f);
            if (amax > 0) {
              worst1 = std::max(worst1, (double)std::fabs(x1[i] - x[i]) / amax);
              worst2 = std::max(worst2, (double)std::fabs(x2[i] - x[i]) / amax);
            }
          }
        }
    }
  std::printf("SUMMARY q8_1 activations: worst |x_hat - x| / block max %.2e with one term, %.2e with two\n", worst1,
              worst2);
  CHECK(worst1 > 1e-3);  // one term: ~1/254
  CHECK(worst2 < 2e-5);  // two: ~1/65024
}

// The integer sums at their largest: Q6_K's codes at -32 (or 31) under
// scales of -128 (or 127) times two terms' codes at +-32512 reach
// 16 * 32 * 32512 * 128 = 2,130,706,432 in a run's scaled sum, just below
// 2^31 (quant_units.h's bound). A wrap would flip the sign; the twin (whose
// integer arithmetic the kernels share, bit for bit) must give the exact dot.
TEST_CASE("quant twin: Q6_K's largest codes and scales with two terms stay within int32") {
  const int64_t cols = 256, rows = 1;
  struct Extreme { uint8_t ql, qh; int8_t scale; };  // every code (ql | qh << 4) - 32 and every scale
  for (const Extreme e : {Extreme{0x00, 0x00, -128}, Extreme{0xFF, 0xFF, 127}})
    for (float sign : {1.f, -1.f})
      for (int terms : {1, 2}) {
        CAPTURE((int)e.scale, sign, terms);
        std::vector<uint8_t> file(ggml_row_bytes(GgmlType::Q6_K, cols), 0);
        std::memset(file.data(), e.ql, 128);        // ql: low four bits of every code
        std::memset(file.data() + 128, e.qh, 64);   // qh: high two bits
        std::memset(file.data() + 192, (uint8_t)e.scale, 16);
        const uint16_t one = 0x3C00;                // d = 1.0 (fp16)
        std::memcpy(file.data() + 208, &one, 2);
        std::vector<uint8_t> dev(qref::device_bytes(GgmlType::Q6_K, rows, cols));
        qref::repack(GgmlType::Q6_K, file.data(), rows, cols, dev.data());
        std::vector<float> w((size_t)cols);
        dequantize_row(GgmlType::Q6_K, file.data(), w.data(), cols);
        REQUIRE(std::fabs(w[0]) == (e.scale < 0 ? 32.f * 128.f : 31.f * 127.f));
        const std::vector<float> x((size_t)cols, sign * 0.75f);  // every code at the block's largest
        const qref::Q8Activations a = qref::quantize_q8_1(x.data(), 1, cols, terms);
        REQUIRE(std::abs(a.code(0, 0)) == (terms == 2 ? 32512 : 127));
        const std::vector<float> xh = a.dequantised();
        double want = 0;
        for (int64_t i = 0; i < cols; ++i) want += (double)w[(size_t)i] * xh[(size_t)i];
        float y = 0.f;
        qref::mmvq(GgmlType::Q6_K, dev.data(), rows, cols, a, &y);
        CHECK(std::fabs(y - want) <= 1e-6 * std::fabs(want));
      }
}

// Against the fp32 activations the error of each output is bounded by
// Cauchy-Schwarz: |sum w (x8 - x)| <= ||w|| ||x8 - x||, with |x8 - x| <= d / 2
// per value; the printed statistic is that error over ||w|| ||x||.
TEST_CASE("quant twin: MMVQ against the dot of the dequantised rows, every type, T = 1..8") {
  std::mt19937 rng(3);
  double worst_exact = 0, worst_q8 = 0;
  for (GgmlType t : kQuantTypes) {
    const int64_t be = ggml_type_info(t).block_elems;
    double type_q8 = 0, type_q8x2 = 0;
    for (int64_t rows : {1, 3, 17})
      for (int64_t cols : {be, 3 * be, be == 32 ? int64_t{640} : int64_t{1536}})
        for (int T = 1; T <= 8; ++T)
          for (int mode = 0; mode < 3; ++mode) {  // plain, + bias, + bias and accumulate
            if (mode > 0 && T != 1 && T != 8) continue;
            const int terms = 1 + (int)((rows + T + mode) % 2);  // one term, or the 16-bit code of two
            CAPTURE(name(t), rows, cols, T, mode, terms);
            TestMatrix m = make_matrix(t, rows, cols, rng);
            const auto x = randn((size_t)T * cols, rng, 2.f);
            const auto bias = randn((size_t)rows, rng);
            auto y0 = randn((size_t)T * rows, rng);  // what accumulate adds to
            const qref::Q8Activations a = qref::quantize_q8_1(x.data(), T, cols, terms);
            const std::vector<float> xh = a.dequantised();
            std::vector<float> y = y0;
            qref::mmvq(t, m.dev.data(), rows, cols, a, y.data(), mode > 0 ? bias.data() : nullptr, mode == 2);
            std::vector<double> want((size_t)T * rows);
            for (int tt = 0; tt < T; ++tt) {
              double xx = 0, ee = 0;  // ||x||^2 and the bound on ||x8 - x||^2
              for (int64_t i = 0; i < cols; ++i) {
                const double d = a.row(tt).ds[i / 32].d;
                xx += (double)x[(size_t)(tt * cols + i)] * x[(size_t)(tt * cols + i)], ee += d * d / 4;
              }
              for (int64_t r = 0; r < rows; ++r) {
                double se = 0, sq = 0, ww = 0;
                for (int64_t i = 0; i < cols; ++i) {
                  const double w = m.values[(size_t)(r * cols + i)];
                  se += w * xh[(size_t)(tt * cols + i)], sq += w * x[(size_t)(tt * cols + i)], ww += w * w;
                }
                const size_t at = (size_t)(tt * rows + r);
                const double add = (mode > 0 ? bias[(size_t)r] : 0.0) + (mode == 2 ? y0[at] : 0.0);
                want[at] = se + add;
                const double err = std::fabs(y[at] - (sq + add));
                CHECK(err <= std::sqrt(ww * ee) * 1.0001 + 1e-5 * std::fabs(sq + add));
                double& worst = terms == 1 ? type_q8 : type_q8x2;
                worst = std::max(worst, err / std::sqrt(ww * xx));
              }
            }
            const double e_exact = rel_err(y, want);
            CHECK(e_exact <= 1e-5);
            worst_exact = std::max(worst_exact, e_exact);
          }
    std::printf("SUMMARY quant twin %-5s worst |y - y(fp32 x)| / (||w|| ||x||) %.2e one term, %.2e two\n", name(t),
                type_q8, type_q8x2);
    CHECK(type_q8x2 < type_q8 / 20);
    worst_q8 = std::max(worst_q8, type_q8);
  }
  std::printf("SUMMARY quant twin MMVQ vs the dequantised dot: worst rel err %.2e (tol 1e-5); vs fp32 x: %.2e of "
              "||w|| ||x||\n", worst_exact, worst_q8);
}
