// Every op of the CPU backend against its plain-loop twin (src/model/reference.h)
// on random inputs, over awkward sizes, and the bad-input paths.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "src/common/error.h"
#include "src/model/backend.h"
#include "src/model/reference.h"
#include "tests/test_util.h"

using namespace topkv;

using test::randn;

namespace {

float max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

float max_abs(const std::vector<float>& a) {
  float m = 0;
  for (float x : a) m = std::max(m, std::abs(x));
  return m;
}

// A weight of `rows` x `cols` in type t made from random values, with the
// fp32 values it dequantises to (what the reference multiplies by).
struct TestWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> f32;
  Weight w;
};
TestWeight make_weight(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng) {
  TestWeight tw;
  const auto src = randn((size_t)(rows * cols), rng, 0.5f);
  const size_t rb = ggml_row_bytes(t, cols);
  tw.bytes.resize(rb * rows);
  tw.f32.resize(src.size());
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row(t, src.data() + r * cols, tw.bytes.data() + r * rb, cols);
    dequantize_row(t, tw.bytes.data() + r * rb, tw.f32.data() + r * cols, cols);
  }
  tw.w.name = "test";
  tw.w.type = t, tw.w.rows = rows, tw.w.cols = cols, tw.w.data = tw.bytes.data(), tw.w.row_bytes = rb;
  return tw;
}

Weight f32_weight(const std::vector<float>& v) {
  Weight w;
  w.name = "norm";
  w.type = GgmlType::F32, w.rows = 1, w.cols = (int64_t)v.size();
  w.data = reinterpret_cast<const uint8_t*>(v.data()), w.row_bytes = v.size() * sizeof(float);
  return w;
}

}  // namespace

TEST_CASE("matmul matches the plain loop for every weight type, GEMV and GEMM paths") {
  auto be = make_cpu_backend();
  std::mt19937 rng(11);
  const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                            GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q5_K,
                            GgmlType::Q6_K};
  for (GgmlType t : types)
    for (int64_t rows : {1, 63, 130})
      for (int T : {1, 2, 3, 4, 5, 17, 64}) {
        const int64_t cols = ggml_type_info(t).block_elems > 32 ? 512 : 96;
        CAPTURE(ggml_type_name((uint32_t)t), rows, cols, T);
        TestWeight tw = make_weight(t, rows, cols, rng);
        const auto x = randn((size_t)T * cols, rng);
        std::vector<float> ref((size_t)T * rows), got((size_t)T * rows, NAN);
        ref::matmul(x.data(), tw.f32.data(), rows, cols, T, ref.data());
        be->matmul(x.data(), tw.w, T, got.data());
        REQUIRE(max_abs_diff(ref, got) <= 1e-4f * (1.f + max_abs(ref)));
        // --weights f32: the same product from a dequantised copy.
        Weight wf = be->prepare_weight(tw.w, WeightMode::F32);
        REQUIRE(wf.type == GgmlType::F32);
        std::fill(got.begin(), got.end(), NAN);
        be->matmul(x.data(), wf, T, got.data());
        REQUIRE(max_abs_diff(ref, got) <= 1e-4f * (1.f + max_abs(ref)));
      }
}

TEST_CASE("matmul epilogue: bias and accumulate on the GEMV and GEMM paths") {
  auto be = make_cpu_backend();
  std::mt19937 rng(12);
  for (GgmlType t : {GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K})
    for (int64_t rows : {1, 67})
      for (int T : {1, 3, 4, 9}) {
        const int64_t cols = t == GgmlType::Q4_K ? 256 : 64;
        CAPTURE(ggml_type_name((uint32_t)t), rows, T);
        TestWeight tw = make_weight(t, rows, cols, rng);
        const auto x = randn((size_t)T * cols, rng);
        const auto bias_v = randn((size_t)rows, rng), y0 = randn((size_t)T * rows, rng);
        const Weight bias = f32_weight(bias_v);
        std::vector<float> prod((size_t)T * rows);
        ref::matmul(x.data(), tw.f32.data(), rows, cols, T, prod.data());
        for (bool acc : {false, true})
          for (bool with_bias : {false, true}) {
            CAPTURE(acc, with_bias);
            std::vector<float> want(prod), got(y0);
            for (int tt = 0; tt < T; ++tt)
              for (int64_t r = 0; r < rows; ++r)
                want[tt * rows + r] += (with_bias ? bias_v[r] : 0.f) + (acc ? y0[tt * rows + r] : 0.f);
            be->matmul(x.data(), tw.w, T, got.data(), MatmulEpilogue{with_bias ? &bias : nullptr, acc});
            REQUIRE(max_abs_diff(want, got) <= 1e-4f * (1.f + max_abs(want)));
          }
      }
  // A bias of the wrong length is refused.
  TestWeight tw = make_weight(GgmlType::F32, 5, 32, rng);
  const auto short_bias = randn(4, rng), x = randn(32, rng);
  std::vector<float> y(5);
  const Weight b = f32_weight(short_bias);
  REQUIRE_THROWS_WITH(be->matmul(x.data(), tw.w, 1, y.data(), MatmulEpilogue{&b, false}), Catch::Contains("bias"));
}

TEST_CASE("matmul_group runs each job as matmul, and refuses weights of different widths") {
  auto be = make_cpu_backend();
  std::mt19937 rng(14);
  const int64_t cols = 256;
  TestWeight a = make_weight(GgmlType::Q5_0, 33, cols, rng), b = make_weight(GgmlType::Q8_0, 7, cols, rng),
             c = make_weight(GgmlType::Q4_K, 12, cols, rng);
  const auto bias_v = randn(33, rng);
  const Weight bias = f32_weight(bias_v);
  for (int T : {1, 5}) {
    const auto x = randn((size_t)T * cols, rng);
    std::vector<std::vector<float>> got, want;
    for (const TestWeight* w : {&a, &b, &c}) {
      got.push_back(randn((size_t)T * w->w.rows, rng));
      want.push_back(got.back());
    }
    const MatmulEpilogue eps[] = {{&bias, false}, {nullptr, true}, {nullptr, false}};
    const MatmulJob jobs[] = {
        {&a.w, got[0].data(), eps[0]}, {&b.w, got[1].data(), eps[1]}, {&c.w, got[2].data(), eps[2]}};
    be->matmul_group(x.data(), T, jobs);
    be->matmul(x.data(), a.w, T, want[0].data(), eps[0]);
    be->matmul(x.data(), b.w, T, want[1].data(), eps[1]);
    be->matmul(x.data(), c.w, T, want[2].data(), eps[2]);
    for (int j = 0; j < 3; ++j) REQUIRE(got[j] == want[j]);
  }
  TestWeight narrow = make_weight(GgmlType::Q8_0, 4, 128, rng);
  std::vector<float> x(cols), y(64);
  const MatmulJob bad[] = {{&a.w, y.data(), {}}, {&narrow.w, y.data(), {}}};
  REQUIRE_THROWS_WITH(be->matmul_group(x.data(), 1, bad), Catch::Contains("columns"));
}

TEST_CASE("embedding rows are dequantised and scaled") {
  auto be = make_cpu_backend();
  std::mt19937 rng(5);
  for (GgmlType t : {GgmlType::F32, GgmlType::Q8_0, GgmlType::Q4_K}) {
    const int64_t vocab = 37, d = 256;
    TestWeight tw = make_weight(t, vocab, d, rng);
    const std::vector<int32_t> ids{0, 36, 5, 5, 17};
    std::vector<float> got(ids.size() * d);
    be->embed(tw.w, ids.data(), (int)ids.size(), 1.5f, got.data());
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t j = 0; j < d; ++j) REQUIRE(got[i * d + j] == Approx(1.5f * tw.f32[ids[i] * d + j]).margin(1e-6));
    const int32_t bad[] = {3, 37};
    REQUIRE_THROWS_AS(be->embed(tw.w, bad, 2, 1.f, got.data()), Error);
    const int32_t neg[] = {-1};
    REQUIRE_THROWS_AS(be->embed(tw.w, neg, 1, 1.f, got.data()), Error);
  }
}

TEST_CASE("RMSNorm over rows and per head") {
  auto be = make_cpu_backend();
  std::mt19937 rng(7);
  for (int dim : {1, 64, 100, 256, 640})
    for (int64_t rows : {1, 3, 64}) {
      const auto x = randn((size_t)rows * dim, rng, 3.f, 0.5f);
      const auto w = randn(dim, rng, 1.f, 1.f);
      std::vector<float> ref(x.size()), got(x);
      ref::rms_norm(x.data(), w.data(), rows, dim, 1e-6f, ref.data());
      be->rms_norm(got.data(), f32_weight(w), rows, dim, 1e-6f, got.data());  // in place
      REQUIRE(max_abs_diff(ref, got) <= 1e-5f * (1.f + max_abs(ref)));
    }
  std::vector<float> x(64, 1.f), w(32, 1.f);
  REQUIRE_THROWS_AS(be->rms_norm(x.data(), f32_weight(w), 1, 64, 1e-6f, x.data()), Error);
}

TEST_CASE("RoPE: interleaved and NeoX pairing, partial rotation, factors, far positions") {
  auto be = make_cpu_backend();
  std::mt19937 rng(9);
  std::vector<float> factors(128);
  for (auto& f : factors) f = 1.f + (float)(rng() % 8);
  for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::NeoX})
    for (int hd : {64, 128, 256})
      for (int n_rot : {hd, hd / 2})
        for (int64_t pos0 : {0, 1, 4097, 1000003}) {
          RopeParams p;
          p.style = style, p.n_rot = n_rot, p.base = hd == 256 ? 1e6f : 10000.f;
          p.freq_scale = n_rot == hd ? 1.f : 0.125f;
          p.freq_factors = hd == 128 ? factors.data() : nullptr;
          const int T = 5, heads = 3;
          const auto x = randn((size_t)T * heads * hd, rng);
          std::vector<float> ref(x), got(x);
          ref::rope(ref.data(), T, heads, hd, pos0, p);
          be->rope(got.data(), T, heads, hd, pos0, p);
          CAPTURE(hd, n_rot, pos0, (int)style);
          REQUIRE(max_abs_diff(ref, got) <= 2e-5f * (1.f + max_abs(ref)));
          // Rotation keeps the norm of each pair, hence of each head.
          for (int h = 0; h < T * heads; ++h) {
            double a = 0, b = 0;
            for (int i = 0; i < hd; ++i) a += (double)x[h * hd + i] * x[h * hd + i], b += (double)got[h * hd + i] * got[h * hd + i];
            REQUIRE(b == Approx(a).epsilon(1e-5));
          }
        }
}

TEST_CASE("gated activations and residual add") {
  auto be = make_cpu_backend();
  std::mt19937 rng(13);
  for (GluKind k : {GluKind::SiLU, GluKind::GeluTanh})
    for (int64_t n : {1, 7, 2048, 100003}) {
      const auto g = randn(n, rng, 3.f), u = randn(n, rng);
      std::vector<float> ref(n), got(g);
      ref::glu(k, g.data(), u.data(), n, ref.data());
      be->glu(k, got.data(), u.data(), n, got.data());  // out aliases gate
      REQUIRE(max_abs_diff(ref, got) <= 1e-5f * (1.f + max_abs(ref)));
    }
  const auto a = randn(1001, rng), b = randn(1001, rng);
  std::vector<float> y(b);
  be->add(a.data(), 1001, y.data());
  for (int i = 0; i < 1001; ++i) REQUIRE(y[i] == a[i] + b[i]);
}

// Chunks written into a cache (a ring when capacity < positions), attention
// of each chunk against the plain softmax over the explicit history.
TEST_CASE("attention over the KV cache: chunks, ring wrap, windows, GQA, f16") {
  auto be = make_cpu_backend();
  std::mt19937 rng(17);
  struct Case { int hd, n_kv, group; int64_t window, capacity; std::vector<int> chunks; DType dt; };
  const std::vector<Case> cases = {
      {64, 1, 1, 0, 40, {1, 7, 13, 1, 1, 17}, DType::F32},
      {128, 2, 4, 0, 64, {33, 1, 2, 28}, DType::F16},
      {256, 1, 4, 8, 8 + 5 - 1, {5, 3, 1, 5, 5, 1, 1, 4, 5}, DType::F32},  // ring wraps many times
      {64, 4, 8, 16, 16 + 9 - 1, {9, 9, 1, 9, 2, 9}, DType::F16},
      {128, 1, 1, 1, 1 + 3 - 1, {3, 1, 3, 2}, DType::F32},                   // window of one: itself
      // Long: several query blocks (64) and key tiles (512) per chunk, and
      // decode steps over more than one key split (1024).
      {64, 2, 2, 0, 1400, {700, 5, 300, 1, 250, 2, 130, 1}, DType::F16},
      {128, 1, 4, 600, 600 + 200 - 1, {200, 200, 3, 200, 190}, DType::F32},
      {64, 1, 4, 1100, 1100 + 200 - 1, {1000, 3, 200, 1, 200, 2, 1}, DType::F32},
  };
  for (const Case& c : cases) {
    const int n_head = c.n_kv * c.group;
    CAPTURE(c.hd, c.n_kv, c.group, c.window, c.capacity, (int)c.dt);
    KvLayerCache cache = be->alloc_kv(c.n_kv, c.hd, c.capacity, c.dt);
    std::vector<float> all_k, all_v;  // [pos][n_kv][hd], rounded as the cache stores them
    int64_t pos = 0;
    const float scale = 1.f / std::sqrt((float)c.hd);
    for (int T : c.chunks) {
      auto k = randn((size_t)T * c.n_kv * c.hd, rng, 1.f, 0.2f), v = randn(k.size(), rng);
      const auto q = randn((size_t)T * n_head * c.hd, rng, 2.f);
      be->kv_write(cache, k.data(), v.data(), T, pos);
      if (c.dt == DType::F16)
        for (auto* a : {&k, &v})
          for (auto& e : *a) e = f16_to_f32(f32_to_f16(e));
      all_k.insert(all_k.end(), k.begin(), k.end());
      all_v.insert(all_v.end(), v.begin(), v.end());
      std::vector<float> got(q.size(), NAN), ref(q.size());
      be->attention(q.data(), T, n_head, pos, cache, c.window, scale, got.data());
      const size_t kvd = (size_t)c.n_kv * c.hd, qd = (size_t)n_head * c.hd;
      for (int t = 0; t < T; ++t) {
        const int64_t p = pos + t, n = c.window > 0 ? std::min<int64_t>(p + 1, c.window) : p + 1;
        ref::attention(q.data() + t * qd, n_head, c.n_kv, c.hd, all_k.data() + (p + 1 - n) * kvd,
                       all_v.data() + (p + 1 - n) * kvd, n, scale, ref.data() + t * qd);
      }
      REQUIRE(max_abs_diff(ref, got) <= 2e-5f * (1.f + max_abs(ref)));
      pos += T;
    }
  }
}

TEST_CASE("attention refuses a cache too small for the chunk") {
  auto be = make_cpu_backend();
  KvLayerCache cache = be->alloc_kv(1, 64, 8, DType::F32);
  std::vector<float> q(9 * 64, 0.5f), out(q.size());
  // Full attention over 9 positions needs 9 slots.
  REQUIRE_THROWS_AS(be->attention(q.data(), 9, 1, 0, cache, 0, 0.125f, out.data()), Error);
  // A window of 4 with a 6-token chunk needs 4 + 6 - 1 = 9 slots at position 10.
  REQUIRE_THROWS_AS(be->attention(q.data(), 6, 1, 10, cache, 4, 0.125f, out.data()), Error);
  REQUIRE_THROWS_AS(be->attention(q.data(), 1, 3, 0, be->alloc_kv(2, 64, 8, DType::F32), 0, 0.1f, out.data()),
                    Error);  // 3 heads over 2 KV heads
}

TEST_CASE("weight mode names") {
  REQUIRE(parse_weight_mode("quant") == WeightMode::Quant);
  REQUIRE(parse_weight_mode("f32") == WeightMode::F32);
  REQUIRE(parse_weight_mode("f16") == WeightMode::F16);
  for (const char* n : {"quant", "f16", "f32"}) REQUIRE(weight_mode_name(parse_weight_mode(n)) == std::string(n));
  REQUIRE_THROWS_AS(parse_weight_mode("fp16"), Error);
  // f16 weights are the CUDA backend's; the CPU backend refuses them by name.
  auto be = make_cpu_backend();
  std::mt19937 rng(3);
  TestWeight tw = make_weight(GgmlType::Q8_0, 2, 32, rng);
  REQUIRE_THROWS_WITH(be->prepare_weight(tw.w, WeightMode::F16), Catch::Contains("CUDA backend"));
}
