// The log-sum-exp merge must be exact: attention over disjoint parts merged
// equals attention over their union, whatever the split.
#include <catch2/catch.hpp>
#include <random>

#include "offload/partial_attention.h"

using namespace topkv;

TEST_CASE("merging partials over disjoint parts equals exact attention") {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int d : {64, 128, 256})
    for (int n : {1, 2, 17, 300}) {
      RowStore K(d, DType::F16), V(d, DType::F16);
      std::vector<float> rows((size_t)n * d);
      for (auto& x : rows) x = nd(rng) + 0.3f;
      K.append_f32(rows.data(), n);
      for (auto& x : rows) x = nd(rng);
      V.append_f32(rows.data(), n);
      std::vector<float> q(d);
      for (auto& x : q) x = nd(rng) * 2.f;  // sharp softmax
      float scale = 1.f / std::sqrt((float)d);
      std::vector<float> ref(d), got(d);
      attention_exact(q.data(), scale, K, V, n, ref.data());

      // random split into three parts; part 3 is added row by row
      std::vector<int> part(n);
      for (auto& p : part) p = (int)(rng() % 3);
      AttnPartial a(d), b(d), c(d);
      for (int i = 0; i < n; ++i) {
        float s = K.dot(i, q.data()) * scale;
        int64_t id = i;
        partial_add_rows(part[i] == 0 ? a : part[i] == 1 ? b : c, &s, V, &id, 1);
      }
      partial_merge(a, b);
      partial_merge(c, a);  // order does not matter
      partial_finish(c, got.data());
      for (int j = 0; j < d; ++j) REQUIRE(got[j] == Approx(ref[j]).margin(1e-5));
    }
}

TEST_CASE("a weighted row (log N) stands for N identical rows") {
  const int d = 8;
  std::vector<float> v(d), w(d);
  for (int j = 0; j < d; ++j) v[j] = (float)j - 3.5f, w[j] = 1.f;
  // 5 copies of (score 1.0, v) + one row (score 2.0, w)
  AttnPartial many(d), one(d);
  for (int i = 0; i < 5; ++i) {
    float s = 1.f;
    partial_add(many, &s, nullptr, v.data(), 1);
  }
  float s2 = 2.f, s1 = 1.f, lw = std::log(5.f), z = 0.f;
  partial_add(many, &s2, nullptr, w.data(), 1);
  partial_add(one, &s1, &lw, v.data(), 1);
  partial_add(one, &s2, &z, w.data(), 1);
  std::vector<float> a(d), b(d);
  partial_finish(many, a.data());
  partial_finish(one, b.data());
  for (int j = 0; j < d; ++j) REQUIRE(a[j] == Approx(b[j]).margin(1e-6));
}

TEST_CASE("empty partials merge as identity") {
  AttnPartial a(4), b(4);
  float s = 0.5f, v[4] = {1, 2, 3, 4};
  partial_add(b, &s, nullptr, v, 1);
  partial_merge(a, AttnPartial(4));
  CHECK(a.empty());
  partial_merge(a, b);
  float out[4];
  partial_finish(a, out);
  CHECK(out[3] == Approx(4.f));
}

// partial_exact_group (one pass over the rows for a KV head's G query heads)
// against attention computed plainly in double precision per query, for every
// row type, head dims 64/128/256, GQA groups 1/3/7, and lengths around its
// 4096-row blocks and the store's chunks; the scores it hands back too.
TEST_CASE("exact attention for a group of query heads equals each query's, in one pass over the rows") {
  std::mt19937 rng(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (DType t : {DType::F16, DType::BF16, DType::F8E4M3, DType::Q8_0})
    for (int d : {64, 128, 256})
      for (int G : {1, 3, 7})
        for (int64_t n : {int64_t(1), int64_t(5), int64_t(4096), int64_t(4097), int64_t(9001)}) {
          if (d == 256 && n > 4097) continue;  // the large case once per type is enough at 256
          CAPTURE(dtype_name(t), d, G, n);
          RowStore K(d, t), V(d, t);
          std::vector<float> rows((size_t)n * d);
          for (auto& x : rows) x = nd(rng) + 0.3f;
          K.append_f32(rows.data(), n);
          for (auto& x : rows) x = nd(rng);
          V.append_f32(rows.data(), n);
          std::vector<float> q((size_t)G * d);
          for (auto& x : q) x = nd(rng) * 1.5f;
          const float scale = 1.f / std::sqrt((float)d);
          std::vector<AttnPartial> got;
          std::vector<float> scores((size_t)G * n);
          partial_exact_group(q.data(), G, scale, K, V, n, got, scores.data());
          REQUIRE(got.size() == (size_t)G);
          std::vector<float> krow(d), vrow(d), out(d);
          for (int g = 0; g < G; ++g) {
            const float* qg = q.data() + (size_t)g * d;
            std::vector<double> s((size_t)n), o((size_t)d, 0.0);
            double mx = -1e300, l = 0;
            for (int64_t i = 0; i < n; ++i) {
              K.row_f32(i, krow.data());
              double dot = 0;
              for (int j = 0; j < d; ++j) dot += (double)krow[(size_t)j] * qg[j];
              s[(size_t)i] = dot * scale, mx = std::max(mx, s[(size_t)i]);
              REQUIRE(scores[(size_t)g * n + i] == Approx(s[(size_t)i]).margin(1e-4));
            }
            for (int64_t i = 0; i < n; ++i) {
              const double w = std::exp(s[(size_t)i] - mx);
              V.row_f32(i, vrow.data());
              l += w;
              for (int j = 0; j < d; ++j) o[(size_t)j] += w * vrow[(size_t)j];
            }
            partial_finish(got[(size_t)g], out.data());
            double err = 0, ref = 0;
            for (int j = 0; j < d; ++j) {
              const double r = o[(size_t)j] / l;
              err += (out[(size_t)j] - r) * (out[(size_t)j] - r), ref += r * r;
            }
            REQUIRE(std::sqrt(err / ref) < 1e-5);
            // partial_exact of that query alone: the same partial.
            const AttnPartial one = partial_exact(qg, scale, K, V, n);
            CHECK(one.m == Approx(got[(size_t)g].m).margin(1e-5));
            CHECK(one.l == Approx(got[(size_t)g].l).epsilon(1e-5));
          }
        }
}
