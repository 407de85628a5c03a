#include <catch2/catch.hpp>
#include <cmath>
#include <random>

#include "bench/recall_metrics.h"
#include "src/common/error.h"

using namespace topkv;

namespace {

std::shared_ptr<RowStore> store(int d, const std::vector<float>& rows, DType t = DType::F32) {
  auto s = std::make_shared<RowStore>(d, t);
  s->append_f32(rows.data(), (int64_t)(rows.size() / d));
  return s;
}

SearchResult result(std::vector<int64_t> ids, int nq = 1) {
  SearchResult r;
  r.nq = nq;
  r.ids = std::move(ids);
  r.scores.assign(r.ids.size() * nq, 0.f);  // never read by the metrics
  return r;
}

// Keys on a line: q = (1, 0) scores them 3, 2, 2 (a tie), 0, -1.
struct LineCase {
  std::shared_ptr<RowStore> K = store(2, {3, 0, 2, 0, 2, 0, 0, 1, -1, 0});
  std::shared_ptr<RowStore> V = store(2, {1, 0, 0, 1, 1, 1, -2, 5, 4, -4});
  std::vector<float> q = {1, 0};
  const float scale = 0.7f;
  QueryTruth truth = exact_truth_reference(q.data(), *K, *V, scale, 2);
  double w(int i) const { return std::exp(scale * K->dot(i, q.data())); }
};

}  // namespace

TEST_CASE("recall@k: hits, misses, ties at the k-th score, more ids than k") {
  LineCase c;
  REQUIRE(c.truth.topk_ids == std::vector<int64_t>{0, 1});
  auto recall = [&](std::vector<int64_t> ids, int k = 2) {
    auto t = exact_truth_reference(c.q.data(), *c.K, *c.V, c.scale, k);
    return evaluate_query(result(std::move(ids)), 0, c.q.data(), t, *c.K, *c.V, c.scale, k).recall;
  };
  CHECK(recall({0, 1}) == 1.0);
  CHECK(recall({0, 2}) == 1.0);   // key 2 ties key 1 at the k-th score
  CHECK(recall({1, 2}) == 0.5);   // both tie the 2nd best but the best is missing: one slot for ties
  CHECK(recall({0, 3}) == 0.5);
  CHECK(recall({3, 4}) == 0.0);
  CHECK(recall({}) == 0.0);
  CHECK(recall({0, 1, 2, 3, 4}) == 1.0);  // capped at k
  CHECK(recall({0}, 1) == 1.0);
  CHECK(recall({1}, 1) == 0.0);
  CHECK(recall({0, 1, 2, 3, 4}, 10) == 1.0);  // k above n: measured against all n keys
  CHECK(recall({0, 1}, 10) == Approx(0.4));
}

TEST_CASE("attention-mass recall and output error match hand computation") {
  LineCase c;
  double z = 0;
  for (int i = 0; i < 5; ++i) z += c.w(i);
  CHECK(c.truth.log_z == Approx(std::log(z)).epsilon(1e-6));
  CHECK(c.truth.topk_mass == Approx((c.w(0) + c.w(1)) / z).epsilon(1e-6));
  // exact output
  double ex[2] = {0, 0};
  for (int i = 0; i < 5; ++i) {
    std::vector<float> v(2);
    c.V->row_f32(i, v.data());
    ex[0] += c.w(i) * v[0] / z, ex[1] += c.w(i) * v[1] / z;
  }
  CHECK(c.truth.output[0] == Approx(ex[0]).epsilon(1e-5));
  CHECK(c.truth.output[1] == Approx(ex[1]).epsilon(1e-5));

  auto m = evaluate_query(result({0, 3}), 0, c.q.data(), c.truth, *c.K, *c.V, c.scale, 2);
  CHECK(m.mass_recall == Approx((c.w(0) + c.w(3)) / z).epsilon(1e-5));
  // attention over keys 0 and 3 only: values (1,0) and (-2,5)
  double a[2] = {(c.w(0) * 1 + c.w(3) * -2) / (c.w(0) + c.w(3)), (c.w(3) * 5) / (c.w(0) + c.w(3))};
  double err = std::hypot(a[0] - ex[0], a[1] - ex[1]) / std::hypot(ex[0], ex[1]);
  CHECK(m.output_error == Approx(err).epsilon(1e-4));

  auto all = evaluate_query(result({0, 1, 2, 3, 4}), 0, c.q.data(), c.truth, *c.K, *c.V, c.scale, 2);
  CHECK(all.mass_recall == Approx(1.0).epsilon(1e-6));
  CHECK(all.output_error < 1e-6);
}

TEST_CASE("far clusters (multipole) enter as weighted rows: exact when a cluster's keys are identical") {
  // Three near keys, and a cluster of 4 identical far keys with identical values.
  const std::vector<float> kf = {0.5f, -1.f, 2.f}, vf = {3.f, -1.f, 0.25f};
  std::vector<float> K = {1, 2, 3, -1, 0.5f, 2, 0, 0, 1}, V = {1, 1, 1, -1, 2, 0, 0.5f, 0.5f, -3};
  for (int i = 0; i < 4; ++i) K.insert(K.end(), kf.begin(), kf.end()), V.insert(V.end(), vf.begin(), vf.end());
  auto Ks = store(3, K), Vs = store(3, V);
  ClusterSummaries cs;
  cs.dim = cs.value_dim = 3;
  cs.counts = {7, 4};  // cluster 0 is a decoy: it must not be used
  cs.key_centroids = {9, 9, 9, 0.5f, -1.f, 2.f};
  cs.value_means = {9, 9, 9, 3.f, -1.f, 0.25f};
  const std::vector<float> q = {0.3f, -0.7f, 1.1f, -0.4f, 0.2f, 0.9f};  // two query heads
  const float scale = 0.9f;
  for (int g = 0; g < 2; ++g) {
    const float* qg = q.data() + g * 3;
    auto truth = exact_truth_reference(qg, *Ks, *Vs, scale, 2);
    auto r = result({0, 1, 2}, 2);
    auto near_only = evaluate_query(r, g, qg, truth, *Ks, *Vs, scale, 2);
    CHECK(near_only.output_error > 0.05);
    r.far_clusters = {1};
    r.far_scores = {q[0] * kf[0] + q[1] * kf[1] + q[2] * kf[2], q[3] * kf[0] + q[4] * kf[1] + q[5] * kf[2]};
    r.summaries = &cs;
    auto with_far = evaluate_query(r, g, qg, truth, *Ks, *Vs, scale, 2);
    CHECK(with_far.output_error < 1e-5);
    CHECK(with_far.mass_recall == Approx(near_only.mass_recall));  // far mass is approximated, not recalled
    // Errors: far clusters without their summaries, a cluster index out of range.
    r.summaries = nullptr;
    CHECK_THROWS_AS(evaluate_query(r, g, qg, truth, *Ks, *Vs, scale, 2), Error);
    r.summaries = &cs;
    r.far_clusters = {2};
    CHECK_THROWS_AS(evaluate_query(r, g, qg, truth, *Ks, *Vs, scale, 2), Error);
  }
}

TEST_CASE("fraction scored and bad inputs") {
  SearchResult r = result({1, 2}, 4);
  r.stats.keys_scored = 300;
  r.stats.tail_scanned = 100;
  CHECK(fraction_scored(r, 1000) == Approx(0.1));
  CHECK(fraction_scored(r, 0) == 0.0);
  LineCase c;
  CHECK_THROWS_AS(evaluate_query(result({0}), 1, c.q.data(), c.truth, *c.K, *c.V, c.scale, 2), Error);
  CHECK_THROWS_AS(evaluate_query(result({7}), 0, c.q.data(), c.truth, *c.K, *c.V, c.scale, 2), Error);
  CHECK_THROWS_AS(exact_truth_reference(c.q.data(), *c.K, *c.V, c.scale, 0), Error);
}

TEST_CASE("exact ground truth (parallel, one pass per GQA group) matches the reference") {
  std::mt19937 rng(17);
  std::normal_distribution<float> nd(0.3f, 1.f);
  struct Shape {
    int64_t n;
    int d, G;
    DType t;
  };
  std::vector<Shape> shapes = {{1, 64, 1, DType::F32}, {5, 128, 4, DType::F16}, {999, 256, 8, DType::BF16},
                               {1000, 64, 4, DType::F16}, {70001, 64, 2, DType::F16}};
  for (auto sh : shapes) {
    std::vector<float> k((size_t)sh.n * sh.d), v((size_t)sh.n * sh.d);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    AttentionHead h;
    h.keys = store(sh.d, k, sh.t);
    h.values = store(sh.d, v, sh.t);
    h.group = sh.G;
    h.n_queries = 3;
    h.queries.resize((size_t)3 * sh.G * sh.d);
    for (auto& x : h.queries) x = 2.f * nd(rng);
    const float scale = 1.f / std::sqrt((float)sh.d);
    auto truth = exact_truth(h, scale, 10, 2);
    REQUIRE(truth.size() == (size_t)3 * sh.G);
    for (size_t i = 0; i < truth.size(); ++i) {
      const float* q = h.queries.data() + i * sh.d;
      auto ref = exact_truth_reference(q, *h.keys, *h.values, scale, 10);
      INFO("n=" << sh.n << " d=" << sh.d << " G=" << sh.G << " query " << i);
      REQUIRE(truth[i].topk_ids == ref.topk_ids);
      for (size_t t = 0; t < ref.topk_scores.size(); ++t)
        CHECK(truth[i].topk_scores[t] == Approx(ref.topk_scores[t]).epsilon(1e-4).margin(1e-4));
      CHECK(truth[i].log_z == Approx(ref.log_z).epsilon(1e-5));
      CHECK(truth[i].topk_mass == Approx(ref.topk_mass).epsilon(1e-4));
      double err = 0, norm = 0;
      for (int c = 0; c < sh.d; ++c)
        err += std::pow(truth[i].output[c] - ref.output[c], 2), norm += std::pow(ref.output[c], 2);
      CHECK(std::sqrt(err) <= 1e-4 * std::sqrt(norm) + 1e-6);
      // a perfect result scores perfectly
      auto m = evaluate_query(result(ref.topk_ids), 0, q, truth[i], *h.keys, *h.values, scale, 10);
      CHECK(m.recall == 1.0);
      CHECK(m.mass_recall == Approx(ref.topk_mass).epsilon(1e-4));
    }
  }
}
