#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <tuple>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>

#include "index/row_store.h"
#include "src/common/binary_io.h"
#include "src/common/buffer_pool.h"
#include "src/common/dtype.h"
#include "src/common/options.h"
#include "src/common/table_codes.h"
#include "src/common/task_group.h"
#include "src/common/vec_math.h"

using namespace topkv;

TEST_CASE("fp16 and bf16 conversions round-trip and round to nearest") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int i = 0; i < 10000; ++i) {
    float x = nd(rng);
    float h = f16_to_f32(f32_to_f16(x));
    REQUIRE(std::fabs(h - x) <= std::fabs(x) * (1.0f / 2048) + 1e-7f);
    float b = bf16_to_f32(f32_to_bf16(x));
    REQUIRE(std::fabs(b - x) <= std::fabs(x) * (1.0f / 256));
  }
  CHECK(f16_to_f32(0x3c00) == 1.0f);
  CHECK(f16_to_f32(0xc000) == -2.0f);
  CHECK(f16_to_f32(0x0001) == Approx(5.960464477539063e-08f));  // smallest subnormal
  CHECK(f32_to_f16(65504.f) == 0x7bff);
  CHECK(std::isinf(f16_to_f32(f32_to_f16(1e6f))));
  CHECK(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

// The E4M3 reference: the representable values, enumerated (no formula shared
// with the code under test), and the nearest one, ties to the even code.
TEST_CASE("fp8 E4M3 conversions: every code decodes exactly, encoding rounds to nearest even and saturates") {
  std::vector<std::pair<float, int>> finite;  // (value, code) of every non-negative finite code
  for (int e = 0; e < 16; ++e)
    for (int m = 0; m < 8; ++m) {
      if (e == 15 && m == 7) continue;  // NaN
      const double v = e == 0 ? m / 512.0 : (1.0 + m / 8.0) * std::pow(2.0, e - 7);
      const int code = e << 3 | m;
      REQUIRE(f8e4m3_to_f32((uint8_t)code) == (float)v);
      REQUIRE(f8e4m3_to_f32((uint8_t)(code | 0x80)) == -(float)v);
      REQUIRE((int)f32_to_f8e4m3((float)v) == code);  // every code round-trips
      finite.push_back({(float)v, code});
    }
  CHECK(std::isnan(f8e4m3_to_f32(0x7f)));
  CHECK(std::isnan(f8e4m3_to_f32(0xff)));
  CHECK(f32_to_f8e4m3(std::nanf("")) == 0x7f);
  CHECK(f8e4m3_to_f32(0x7e) == 448.f);
  CHECK(f32_to_f8e4m3(1e6f) == 0x7e);   // saturates, no infinity
  CHECK(f32_to_f8e4m3(-500.f) == 0xfe);
  CHECK(f32_to_f8e4m3(INFINITY) == 0x7e);
  CHECK(f32_to_f8e4m3(-0.f) == 0x80);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> ex(-12.f, 9.f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(1.f, 0) * std::exp2(ex(rng));
    const int got = f32_to_f8e4m3(x);
    int best = -1;
    double bd = 1e30;
    for (auto [v, code] : finite) {
      const double d = std::fabs((double)v - x);
      if (d < bd || (d == bd && (code & 1) == 0)) bd = d, best = code;
    }
    if (x > 448.f) best = 0x7e;
    REQUIRE(got == best);
    REQUIRE((int)f32_to_f8e4m3(-x) == (best | 0x80));
  }
  // Exact ties: the midpoint of two neighbouring codes goes to the even one,
  // and a hair either side goes to the nearer.
  for (size_t i = 0; i + 1 < finite.size(); ++i) {
    const auto [lo, clo] = finite[i];
    const auto [hi, chi] = finite[i + 1];
    const float mid = (float)(((double)lo + hi) / 2);  // exact: a few bits below fp32's
    INFO("between " << lo << " and " << hi);
    REQUIRE((int)f32_to_f8e4m3(mid) == ((clo & 1) == 0 ? clo : chi));
    REQUIRE((int)f32_to_f8e4m3(std::nextafter(mid, 0.f)) == clo);
    REQUIRE((int)f32_to_f8e4m3(std::nextafter(mid, 1e9f)) == chi);
  }
  // Every 4,099th fp32 bit pattern from 0 to infinity: the nearest code.
  for (uint64_t b = 0; b <= 0x7f800000u; b += 4099) {
    float x;
    const uint32_t u = (uint32_t)b;
    std::memcpy(&x, &u, 4);
    auto it = std::lower_bound(finite.begin(), finite.end(), x, [](auto& p, float v) { return p.first < v; });
    int best;
    if (x >= 464.f) best = 0x7e;
    else if (it == finite.end()) best = finite.back().second;
    else if (it == finite.begin() || it->first == x) best = it->second;
    else {
      const auto& below = *(it - 1);
      const double dl = (double)x - below.first, dh = (double)it->first - x;
      best = dl < dh ? below.second : dh < dl ? it->second : ((below.second & 1) == 0 ? below.second : it->second);
    }
    INFO("bits " << u);
    REQUIRE((int)f32_to_f8e4m3(x) == best);
  }
}

TEST_CASE("dot products of every row type match a double-precision reference") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.5f, 1.f);
  for (int dim : {1, 7, 64, 127, 128, 256, 257}) {
    std::vector<float> a(dim), q(dim);
    for (auto& x : a) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::Q8_0}) {
      if (dtype_blocked(t) && dim % (int)kQ8Block) continue;  // whole blocks only
      std::vector<uint8_t> row(dtype_bytes(t, dim));
      from_f32(t, a.data(), row.data(), dim);
      std::vector<float> back(dim);
      to_f32(t, row.data(), back.data(), dim);
      double ref = 0;
      for (int i = 0; i < dim; ++i) ref += (double)back[i] * q[i];
      REQUIRE(dot_row(t, row.data(), q.data(), dim) == Approx(ref).epsilon(1e-4).margin(1e-4));
      // several queries at once
      std::vector<float> qs(3 * dim), out(3);
      for (auto& x : qs) x = nd(rng);
      dot_rows_multi(t, row.data(), 1, dim, qs.data(), 3, out.data());
      for (int g = 0; g < 3; ++g)
        REQUIRE(out[g] == Approx(dot_row(t, row.data(), qs.data() + g * dim, dim)).epsilon(1e-5).margin(1e-5));
    }
  }
}

// The plain reference of a Q8_0 block (src/common/dtype.h): d = f16(max|x|
// / 127), one step up if 127 d falls short of max|x|; q = round-half-away(x
// / d) (ggml rounds against the fp32 d instead).
static std::vector<uint8_t> q8_0_reference(const std::vector<float>& x) {
  std::vector<uint8_t> out;
  for (size_t b = 0; b < x.size(); b += 32) {
    double amax = 0;
    for (size_t j = 0; j < 32; ++j) amax = std::max(amax, (double)std::fabs(x[b + j]));
    uint16_t h = f32_to_f16((float)amax / 127);
    if ((double)f16_to_f32(h) * 127 < amax) ++h;
    const double d = f16_to_f32(h);
    out.push_back((uint8_t)(h & 0xff)), out.push_back((uint8_t)(h >> 8));  // little-endian, as ggml writes it
    for (size_t j = 0; j < 32; ++j) {
      const double q = d > 0 ? std::round(x[b + j] * (double)(float)(1 / (float)d)) : 0;
      REQUIRE(std::fabs(q) <= 127);
      out.push_back((uint8_t)(int8_t)q);
    }
  }
  return out;
}

TEST_CASE("Q8_0 rows: ggml's block bytes, half a step of rounding, whole blocks only") {
  CHECK(dtype_bytes(DType::Q8_0, 128) == 136);
  CHECK(dtype_bytes(DType::Q8_0, 32) == 34);
  CHECK(dtype_bytes(DType::F8E4M3, 128) == 128);
  CHECK(dtype_bytes(DType::F16, 7) == 14);
  CHECK_THROWS_WITH(dtype_size(DType::Q8_0), Catch::Contains("use dtype_bytes"));
  std::mt19937 rng(23);
  std::normal_distribution<float> nd(0.3f, 2.f);
  for (size_t n : {32, 64, 96, 256, 4096}) {
    CAPTURE(n);
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    x[n / 2] = 90.f;                                           // an outlier: its block's step grows
    if (n >= 64) std::fill(x.begin() + 32, x.begin() + 64, 0.f);  // an all-zero block: d = 0
    if (n >= 96) for (size_t j = 64; j < 96; ++j) x[j] *= 1e-6f;  // tiny values: d in f16's subnormals
    if (n >= 256) for (size_t j = 96; j < 128; ++j) x[j] *= 1e-12f;  // below f16's smallest step
    std::vector<uint8_t> q(dtype_bytes(DType::Q8_0, n));
    from_f32(DType::Q8_0, x.data(), q.data(), n);
    CHECK(q == q8_0_reference(x));
    std::vector<float> back(n);
    to_f32(DType::Q8_0, q.data(), back.data(), n);
    int64_t over = 0;
    for (size_t b = 0; b < n; b += 32) {
      uint16_t h;
      std::memcpy(&h, q.data() + b / 32 * 34, 2);
      const float d = f16_to_f32(h);
      for (size_t j = b; j < b + 32; ++j) {
        const auto c = (int8_t)q[b / 32 * 34 + 2 + (j - b)];
        CHECK(back[j] == d * (float)c);
        CHECK(c >= -127);
        // |x - d q| <= d / 2 (and the product's own rounding)
        over += std::fabs(back[j] - x[j]) > 0.5f * d * (1 + 1e-6f) + 1e-7f * std::fabs(x[j]);
      }
    }
    CHECK(over == 0);
    // axpy of a row: y += a * row, against the decoded row.
    std::vector<float> y(n, 1.f), want(n);
    for (size_t j = 0; j < n; ++j) want[j] = 1.f + 0.75f * back[j];
    axpy_row(DType::Q8_0, 0.75f, q.data(), y.data(), n);
    for (size_t j = 0; j < n; ++j) REQUIRE(y[j] == Approx(want[j]).epsilon(1e-6).margin(1e-6));
  }
  std::vector<float> x(33, 1.f);
  std::vector<uint8_t> q(68);
  CHECK_THROWS_WITH(from_f32(DType::Q8_0, x.data(), q.data(), 33), Catch::Contains("not whole blocks of 32"));
  CHECK_THROWS_WITH(to_f32(DType::Q8_0, q.data(), x.data(), 33), Catch::Contains("not whole blocks of 32"));
  // A store of rows that are not whole blocks is refused with what to use.
  CHECK_THROWS_WITH(RowStore(48, DType::Q8_0), Catch::Contains("use f8, f16 or bf16"));
  RowStore store(64, DType::Q8_0);
  CHECK(store.row_bytes() == 68);
  std::vector<float> rows(3 * 64), got(64);
  for (auto& v : rows) v = nd(rng);
  store.append_f32(rows.data(), 3);
  std::vector<uint8_t> want(dtype_bytes(DType::Q8_0, 64));
  from_f32(DType::Q8_0, rows.data() + 2 * 64, want.data(), 64);
  CHECK(std::memcmp(store.row(2), want.data(), want.size()) == 0);
}

TEST_CASE("option parsing: specs, sweeps, sizes, and errors that name the problem") {
  auto s = parse_spec("hnswlib:M=32, efc=200");
  CHECK(s.name == "hnswlib");
  CHECK(s.params.get_int("M", 16) == 32);
  CHECK(s.params.get_int("efc", 0) == 200);
  CHECK(parse_sweep("16:128:x2") == std::vector<int64_t>{16, 32, 64, 128});
  CHECK(parse_sweep("10,20") == std::vector<int64_t>{10, 20});
  CHECK(parse_size("16G") == 16ull << 30);
  CHECK(parse_size("1.5K") == 1536);
  CHECK_THROWS_WITH(parse_size("12Q"), Catch::Contains("unit"));
  CHECK_THROWS_WITH(Params("M=x").get_int("M", 1), Catch::Contains("not an integer"));
  Params p("M=1,typo=2");
  p.get_int("M", 0);
  CHECK_THROWS_WITH(p.check_all_used("x"), Catch::Contains("typo"));
}

TEST_CASE("binary files: round trip, truncation, corruption, foreign file, newer version") {
  auto dir = std::filesystem::temp_directory_path() / "topkv_test_common";
  std::filesystem::create_directories(dir);
  std::string path = (dir / "a.bin").string();
  {
    BinaryWriter w(path, "TESTFILE", 2);
    w.str("hello");
    w.vec(std::vector<float>{1.f, 2.f, 3.f});
    w.commit();
  }
  {
    BinaryReader r(path, "TESTFILE", 2);
    CHECK(r.str() == "hello");
    CHECK(r.vec<float>() == std::vector<float>{1.f, 2.f, 3.f});
    r.expect_end();
  }
  CHECK_THROWS_WITH(BinaryReader(path, "TESTFILE", 1), Catch::Contains("version 2"));
  CHECK_THROWS_WITH(BinaryReader(path, "OTHERMAG", 2), Catch::Contains("bad magic"));
  auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - 3);
  CHECK_THROWS_WITH(BinaryReader(path, "TESTFILE", 2), Catch::Contains("checksum"));
  std::filesystem::resize_file(path, 5);
  CHECK_THROWS_WITH(BinaryReader(path, "TESTFILE", 2), Catch::Contains("too short"));
  CHECK_THROWS_WITH(BinaryReader((dir / "missing").string(), "TESTFILE", 2), Catch::Contains("cannot open"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("directed rounding: the nearest value of the type on the asked side, refused past its range") {
  // from_f32_directed(up) gives the least value of the type >= x, (down) the
  // greatest <= x: checked against every code of f8 and a brute-force
  // neighbour search for f16 and bf16, over random values of every scale,
  // signs, zeros, subnormals and values the type holds exactly.
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> ex(-20.f, 8.5f);
  std::vector<float> xs = {0.f, -0.f, 1.f, -1.f, 448.f, -448.f, 1.f / 512, -1.f / 512, 1e-7f, -1e-7f, 300.f, -359.f};
  for (int i = 0; i < 4000; ++i) xs.push_back((i & 1 ? -1.f : 1.f) * std::exp2(ex(rng)));
  for (DType t : {DType::F8E4M3, DType::F16, DType::BF16}) {
    // Every finite value of t, ascending (f8's 253, f16's and bf16's from their codes).
    std::vector<float> values;
    const uint32_t codes = t == DType::F8E4M3 ? 256 : 65536;
    for (uint32_t c = 0; c < codes; ++c) {
      float v;
      if (t == DType::F8E4M3) v = f8e4m3_to_f32((uint8_t)c);
      else if (t == DType::F16) v = f16_to_f32((uint16_t)c);
      else v = bf16_to_f32((uint16_t)c);
      if (std::isfinite(v)) values.push_back(v);
    }
    std::sort(values.begin(), values.end());
    const size_t e = dtype_size(t);
    for (float x : xs) {
      CAPTURE(dtype_name(t), x);
      std::vector<uint8_t> up(e), down(e);
      from_f32_directed(t, &x, up.data(), 1, true);
      from_f32_directed(t, &x, down.data(), 1, false);
      float u, dn;
      to_f32(t, up.data(), &u, 1);
      to_f32(t, down.data(), &dn, 1);
      const auto hi = std::lower_bound(values.begin(), values.end(), x);  // least value >= x
      const auto lo = std::upper_bound(values.begin(), values.end(), x);  // one past the greatest <= x
      REQUIRE(hi != values.end());
      REQUIRE(lo != values.begin());
      CHECK(u == *hi);
      CHECK(dn == *(lo - 1));
      CHECK(u >= x);
      CHECK(dn <= x);
    }
  }
  // f32 is a copy; no value of the type on the asked side is an error that says what to use.
  const float big[] = {500.f, -500.f, 1e6f};
  float f32_out[3];
  from_f32_directed(DType::F32, big, f32_out, 3, true);
  CHECK(std::equal(big, big + 3, f32_out));
  uint8_t f8[3];
  CHECK_THROWS_WITH(from_f32_directed(DType::F8E4M3, big, f8, 1, true), Catch::Contains("use a --device-table-type that holds it (i8, f16 or f32)"));
  CHECK_THROWS_WITH(from_f32_directed(DType::F8E4M3, big + 1, f8, 1, false), Catch::Contains("no f8 value at or below"));
  from_f32_directed(DType::F8E4M3, big, f8, 1, false);  // 500 down: 448
  CHECK(f8e4m3_to_f32(f8[0]) == 448.f);
  uint16_t h;
  CHECK_THROWS_WITH(from_f32_directed(DType::F16, big + 2, &h, 1, true), Catch::Contains("an upper bound 1000000 has no f16 value at or above it: use a --device-table-type that holds it (i8 or f32)"));
  const float nan = std::nanf("");
  CHECK_THROWS(from_f32_directed(DType::F16, &nan, &h, 1, true));
  CHECK_THROWS_WITH(from_f32_directed(DType::Q8_0, big, f8, 1, true), Catch::Contains("q8_0 has no directed"));
}

TEST_CASE("i8 tables (encode_table): a scale per dimension, bounds one way, nearest within half a step") {
  // Rows of two parts ([M | m] as page bounds, and one part as centroids)
  // over dimensions of every scale: one near -300 (Qwen2.5's layer 0), one
  // all zeros, one of subnormals, one holding a single value, the rest
  // random magnitudes of 2^-20..2^8; odd row counts, dims 1, 3, 64, 128.
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> ex(-20.f, 8.f), u(-1.f, 1.f);
  for (int dim : {1, 3, 64, 128})
    for (size_t n : {size_t{1}, size_t{7}, size_t{301}})
      for (bool bounds : {true, false}) {
        CAPTURE(dim, n, bounds);
        const size_t len = (bounds ? 2 : 1) * (size_t)dim;
        std::vector<float> mag((size_t)dim);
        for (float& m : mag) m = std::exp2(ex(rng));
        std::vector<float> rows(n * len);
        for (size_t i = 0; i < rows.size(); ++i) {
          const size_t d = i % (size_t)dim;
          float x = mag[d] * u(rng);
          if (d == 0 && dim > 1) x = -200.f + 100.f * u(rng);
          if (d == 1 && dim > 2) x = 0.f;
          if (d == 2 && dim > 3) x = 1e-40f * u(rng);  // subnormal
          if (d == 3 && dim > 4) x = 0.75f;
          rows[i] = x;
        }
        const TableCodes c =
            bounds ? encode_table(DType::I8, rows, dim, {TableRounding::Up, TableRounding::Down}, "a bound")
                   : encode_table(DType::I8, rows, dim, {TableRounding::Nearest}, "a centroid element");
        REQUIRE(c.codes.size() == rows.size());
        REQUIRE(c.scale.size() == (size_t)dim);
        const std::vector<float> y = c.decoded();
        std::vector<float> amax((size_t)dim, 0.f);
        for (size_t i = 0; i < rows.size(); ++i) amax[i % dim] = std::max(amax[i % dim], std::fabs(rows[i]));
        for (int d = 0; d < dim; ++d) {  // the least scale that reaches the dimension's largest magnitude
          const float s = c.scale[(size_t)d];
          const float tiny = std::numeric_limits<float>::denorm_min();
          CHECK(127.f * s >= amax[(size_t)d]);
          CHECK(127.f * s <= amax[(size_t)d] * (1 + 1e-5f) + 127.f * tiny);
          CHECK((s == 0.f) == (amax[(size_t)d] == 0.f));
        }
        for (size_t i = 0; i < rows.size(); ++i) {
          const float x = rows[i], s = c.scale[i % dim];
          const int code = (int8_t)c.codes[i];
          CAPTURE(i, x, s, code);
          REQUIRE(std::abs(code) <= 127);
          REQUIRE(y[i] == (float)code * s);  // the product a bound was checked against
          if (!bounds) {
            CHECK(std::fabs(y[i] - x) <= 0.5f * s * (1 + 1e-5f) + std::numeric_limits<float>::denorm_min());
          } else if ((i % len) < (size_t)dim) {  // M: up, and the least such code
            REQUIRE(y[i] >= x);
            CHECK((s == 0.f || code == -127 || (float)(code - 1) * s < x));
          } else {  // m: down, the greatest such code
            REQUIRE(y[i] <= x);
            CHECK((s == 0.f || code == 127 || (float)(code + 1) * s > x));
          }
        }
      }
  // A non-finite element is refused with what it is; the other types keep
  // their own rounding and errors (from_f32_in_range, from_f32_directed).
  std::vector<float> bad = {1.f, INFINITY, 2.f, 3.f};
  CHECK_THROWS_WITH(encode_table(DType::I8, bad, 2, {TableRounding::Nearest}, "a value mean"),
                    Catch::Contains("a value mean inf is not finite"));
  std::vector<float> big = {500.f, 1.f};
  CHECK_THROWS_WITH(encode_table(DType::F8E4M3, big, 2, {TableRounding::Nearest}, "a value mean"),
                    Catch::Contains("a value mean 500 is past f8's largest value 448"));
  const TableCodes f16 = encode_table(DType::F16, big, 1, {TableRounding::Up, TableRounding::Down}, "a bound");
  CHECK(f16.scale.empty());
  CHECK(f16.decoded() == big);
  CHECK_THROWS_WITH(encode_table(DType::I8, big, 3, {TableRounding::Nearest}, "x"), Catch::Contains("not rows of 1 parts"));
  // No table (no far field, no variances): no codes and no scales to upload.
  const TableCodes none = encode_table(DType::I8, {}, 4, {TableRounding::Nearest}, "a value mean");
  CHECK((none.codes.empty() && none.scale.empty() && none.decoded().empty()));
  // i8 codes are not values without their scales.
  float out;
  const uint8_t code = 5;
  CHECK_THROWS_WITH(to_f32(DType::I8, &code, &out, 1), Catch::Contains("per-dimension scales"));
  CHECK_THROWS_WITH(from_f32_directed(DType::I8, &out, nullptr, 1, true), Catch::Contains("i8"));
}

TEST_CASE("dtype names: compute types and store types each take their own, with every spelling") {
  for (auto [name, t] : std::vector<std::pair<std::string, DType>>{
           {"f32", DType::F32}, {"fp32", DType::F32}, {"float32", DType::F32}, {"f16", DType::F16},
           {"fp16", DType::F16}, {"float16", DType::F16}, {"bf16", DType::BF16}, {"bfloat16", DType::BF16}}) {
    INFO(name);
    CHECK(parse_dtype(name) == t);
    if (t != DType::F32) CHECK(parse_store_dtype(name) == t);
  }
  for (const char* name : {"f8", "fp8", "f8e4m3", "e4m3"}) {
    INFO(name);
    CHECK(parse_store_dtype(name) == DType::F8E4M3);
    CHECK_THROWS_WITH(parse_dtype(name), Catch::Contains("use f32, f16 or bf16"));
  }
  for (const char* name : {"q8_0", "q8", "int8"}) {
    INFO(name);
    CHECK(parse_store_dtype(name) == DType::Q8_0);
    CHECK_THROWS_WITH(parse_dtype(name), Catch::Contains("use f32, f16 or bf16"));
  }
  for (auto [name, t] : std::vector<std::pair<std::string, DType>>{
           {"f32", DType::F32}, {"f16", DType::F16}, {"bf16", DType::BF16}, {"f8", DType::F8E4M3}, {"e4m3", DType::F8E4M3}})
    CHECK(parse_table_dtype(name) == t);
  CHECK(parse_table_dtype("i8") == DType::I8);
  CHECK_THROWS_WITH(parse_table_dtype("q8_0"), Catch::Contains("unknown device table type 'q8_0': use f16, bf16, f32, f8"));
  CHECK_THROWS_WITH(parse_store_dtype("i8"), Catch::Contains("unknown KV store type 'i8'"));
  CHECK_THROWS_WITH(parse_dtype("i8"), Catch::Contains("use f32, f16 or bf16"));
  CHECK(std::string(dtype_name(DType::Q8_0)) == "q8_0");
  CHECK_THROWS_WITH(parse_store_dtype("f32"), Catch::Contains("use f16, bf16, f8 (8-bit E4M3) or q8_0"));
  CHECK_THROWS_WITH(parse_store_dtype("F16"), Catch::Contains("unknown KV store type 'F16'"));
  CHECK_THROWS_WITH(parse_dtype(""), Catch::Contains("unknown element type ''"));
}

TEST_CASE("TaskGroup and parallel_for_blocks: every block once, results seen after the wait, errors rethrown") {
  // Odd ranges and grains, one thread and several (under ThreadSanitizer the
  // same code runs on std::threads: src/common/task_group.h).
  for (const auto& [from, to, grain, threads] :
       {std::tuple<int64_t, int64_t, int64_t, int>{0, 1, 64, 4}, {3, 1000, 7, 3}, {0, 4099, 64, 1}, {-5, 37, 1, 8},
        {10, 10, 4, 2}}) {
    CAPTURE(from, to, grain, threads);
    std::vector<int> hits((size_t)std::max<int64_t>(0, to - from), 0);
    std::atomic<int> over{0};
    parallel_for_blocks(from, to, grain, threads, [&](int64_t lo, int64_t hi) {
      if (lo < from || hi > to || lo >= hi) ++over;
      for (int64_t i = lo; i < hi; ++i) ++hits[(size_t)(i - from)];
    });
    CHECK(over == 0);
    CHECK(std::all_of(hits.begin(), hits.end(), [](int h) { return h == 1; }));
  }
  CHECK_THROWS_WITH(parallel_for_blocks(0, 1000, 10, 4,
                                        [](int64_t lo, int64_t) {
                                          if (lo == 500) throw std::runtime_error("block 500 failed");
                                        }),
                    "block 500 failed");
  // Tasks write their own slots; the caller reads them all after wait().
  std::vector<int64_t> out(37, -1);
  {
    TaskGroup tasks;
    for (int64_t i = 0; i < 37; ++i) tasks.run([&out, i] { out[(size_t)i] = i * i; });
    tasks.wait();
    for (int64_t i = 0; i < 37; ++i) CHECK(out[(size_t)i] == i * i);
    tasks.run([&out] { out[0] = 99; });  // the destructor waits for a task run after a wait
  }
  CHECK(out[0] == 99);
}

TEST_CASE("BufferPool: a released buffer of the same size is taken back, the rest freed, a failed allocation retried "
          "after the waiting buffers are freed") {
  struct Counts {
    int alloc = 0, freed = 0, fail_next = 0;
    std::vector<void*> live;
  };
  auto c = std::make_shared<Counts>();
  auto alloc = [c](size_t bytes) -> void* {
    if (c->fail_next > 0) {
      --c->fail_next;
      throw std::runtime_error("out of pinned memory");
    }
    ++c->alloc;
    void* p = ::operator new(bytes);
    c->live.push_back(p);
    return p;
  };
  auto free_fn = [c](void* p) {
    ++c->freed;
    c->live.erase(std::find(c->live.begin(), c->live.end(), p));
    ::operator delete(p);
  };
  std::mt19937 rng(7);
  std::shared_ptr<uint8_t> outlives;  // released after the pool object is gone
  {
    BufferPool pool(alloc, free_fn, /*max_free_bytes=*/3000);
    std::shared_ptr<uint8_t> a = pool.get(1000), b = pool.get(1000), d = pool.get(999);
    CHECK(c->alloc == 3);
    for (size_t i = 0; i < 1000; ++i) a.get()[i] = (uint8_t)rng();
    const std::vector<uint8_t> written(a.get(), a.get() + 1000);
    void* const a_at = a.get();
    a.reset();
    CHECK(pool.free_bytes() == 1000);
    // The same size takes it back, its bytes as the last owner left them.
    std::shared_ptr<uint8_t> a2 = pool.get(1000);
    CHECK(a2.get() == a_at);
    CHECK(std::equal(written.begin(), written.end(), a2.get()));
    CHECK(c->alloc == 3);
    CHECK(pool.free_bytes() == 0);
    // Another size allocates anew.
    std::shared_ptr<uint8_t> e = pool.get(17);
    CHECK(c->alloc == 4);
    // 1000 + 1000 + 999 wait; then 17 more would pass the cap: freed at once.
    a2.reset(), b.reset(), d.reset();
    CHECK(pool.free_bytes() == 2999);
    CHECK(c->freed == 0);
    e.reset();
    CHECK(c->freed == 1);
    CHECK(pool.free_bytes() == 2999);
    // An allocation that fails frees the waiting buffers and is tried once more.
    c->fail_next = 1;
    std::shared_ptr<uint8_t> f = pool.get(5000);
    CHECK(c->freed == 4);
    CHECK(pool.free_bytes() == 0);
    // With nothing waiting the failure stands.
    c->fail_next = 1;
    CHECK_THROWS_WITH(pool.get(5000), Catch::Contains("out of pinned memory"));
    // A buffer larger than the cap is freed when released.
    f.reset();
    CHECK(c->freed == 5);
    CHECK(pool.free_bytes() == 0);
    outlives = pool.get(1000);
    std::shared_ptr<uint8_t> waits = pool.get(999);
    waits.reset();
    CHECK(pool.free_bytes() == 999);
    pool.trim();
    CHECK(pool.free_bytes() == 0);
    CHECK(c->freed == 6);
  }
  CHECK(c->live.size() == 1);  // the one still held
  outlives.reset();
  CHECK(c->live.empty());  // freed with the pool's state, which lived as long as its last buffer
  CHECK(c->freed == 7);
}
