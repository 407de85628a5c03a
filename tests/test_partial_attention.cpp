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
