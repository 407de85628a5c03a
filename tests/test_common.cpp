#include <catch2/catch.hpp>
#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <tuple>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "src/common/binary_io.h"
#include "src/common/dtype.h"
#include "src/common/options.h"
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
    for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3}) {
      std::vector<uint8_t> row(dim * dtype_size(t));
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
  CHECK_THROWS_WITH(parse_store_dtype("f32"), Catch::Contains("use f16, bf16 or f8"));
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
