// LloydKMeans, the CPU twin of the GPU k-means (index/kmeans.h): its starting
// rows, its rounds against a plain recomputation here, its tie and empty-
// cluster rules, and awkward sizes (one row, k = n, odd dimensions).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <set>

#include "index/kmeans.h"

using namespace topkv;

namespace {

std::vector<float> unit_rows(int64_t n, int d, uint64_t seed, int centres = 8) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> c((size_t)centres * d), x((size_t)n * d);
  for (auto& v : c) v = nd(rng);
  for (int64_t i = 0; i < n; ++i) {
    const int t = (int)(rng() % (uint64_t)centres);
    double s = 0;
    for (int j = 0; j < d; ++j) {
      float& v = x[(size_t)i * d + j];
      v = c[(size_t)t * d + j] + 0.4f * nd(rng);
      s += (double)v * v;
    }
    for (int j = 0; j < d; ++j) x[(size_t)i * d + j] /= (float)std::sqrt(s);
  }
  return x;
}

double dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int j = 0; j < d; ++j) s += (double)a[j] * b[j];
  return s;
}

}  // namespace

TEST_CASE("select_rows (k-means starting rows, training samples): m distinct ascending rows, a function of the seed") {
  for (int64_t n : {1, 2, 7, 100, 8192})
    for (int64_t k : {int64_t(1), n / 3 + 1, n}) {
      CAPTURE(n, k);
      const auto r = select_rows(n, k, 42);
      REQUIRE((int64_t)r.size() == k);
      CHECK(std::is_sorted(r.begin(), r.end()));
      CHECK(std::set<int64_t>(r.begin(), r.end()).size() == r.size());
      CHECK(r.front() >= 0);
      CHECK(r.back() < n);
      CHECK(select_rows(n, k, 42) == r);
    }
  CHECK(select_rows(1000, 10, 1) != select_rows(1000, 10, 2));
  CHECK_THROWS_WITH(select_rows(5, 6, 1), Catch::Contains("must be in [1, rows]"));
  CHECK_THROWS_WITH(select_rows(5, 0, 1), Catch::Contains("must be in [1, rows]"));
}

TEST_CASE("Lloyd k-means: each round's labels and centroids as recomputed plainly, unit centroids") {
  const LloydKMeans km;
  struct Case { int64_t n; int d; int64_t k; int iters; };
  for (Case c : {Case{1, 64, 1, 3}, Case{5, 7, 5, 2}, Case{300, 64, 19, 0}, Case{1000, 128, 63, 1},
                 Case{2047, 256, 128, 4}, Case{777, 33, 50, 10}}) {
    CAPTURE(c.n, c.d, c.k, c.iters);
    // As many centres as clusters: rows far from ties, so float and double pick alike.
    const auto x = unit_rows(c.n, c.d, (uint64_t)c.n * 31 + c.d, (int)std::max<int64_t>(8, c.k));
    std::vector<float> cent((size_t)c.k * c.d);
    std::vector<int32_t> lab((size_t)c.n);
    km.cluster(x.data(), c.n, x.data(), c.n, c.d, c.k, c.iters, 9, cent.data(), lab.data());
    // The plain recomputation: start rows, then rounds in double.
    const auto init = select_rows(c.n, c.k, 9);
    std::vector<double> ref((size_t)c.k * c.d);
    for (int64_t j = 0; j < c.k; ++j)
      for (int t = 0; t < c.d; ++t) ref[(size_t)j * c.d + t] = x[(size_t)init[(size_t)j] * c.d + t];
    auto nearest = [&](const float* r) {
      int64_t arg = 0;
      double best = -1e300;
      for (int64_t j = 0; j < c.k; ++j) {
        double s = 0;
        for (int t = 0; t < c.d; ++t) s += (double)r[t] * ref[(size_t)j * c.d + t];
        if (s > best + 1e-9) best = s, arg = j;
      }
      return arg;
    };
    auto renorm = [&](int64_t j) {
      double nrm = 0;
      for (int t = 0; t < c.d; ++t) nrm += ref[(size_t)j * c.d + t] * ref[(size_t)j * c.d + t];
      for (int t = 0; t < c.d; ++t) ref[(size_t)j * c.d + t] /= std::sqrt(nrm);
    };
    int64_t splits = 0;
    for (int it = 0; it < c.iters; ++it) {
      std::vector<double> sum((size_t)c.k * c.d, 0.0);
      std::vector<int64_t> count((size_t)c.k, 0);
      for (int64_t i = 0; i < c.n; ++i) {
        const int64_t j = nearest(x.data() + (size_t)i * c.d);
        for (int t = 0; t < c.d; ++t) sum[(size_t)j * c.d + t] += x[(size_t)i * c.d + t];
        ++count[(size_t)j];
      }
      for (int64_t j = 0; j < c.k; ++j) {
        double nrm = 0;
        for (int t = 0; t < c.d; ++t) nrm += sum[(size_t)j * c.d + t] * sum[(size_t)j * c.d + t];
        if (nrm > 0)
          for (int t = 0; t < c.d; ++t) ref[(size_t)j * c.d + t] = sum[(size_t)j * c.d + t] / std::sqrt(nrm);
      }
      // Faiss's split of empty clusters, written out again: a round-robin walk
      // picks m with probability (count_m - 1) / (n - k); the two move apart.
      std::mt19937_64 rng(9 + 1 + (uint64_t)it);
      std::uniform_real_distribution<float> u(0.f, 1.f);
      for (int64_t j = 0; j < c.k; ++j) {
        if (count[(size_t)j]) continue;
        int64_t m = 0;
        while (!(count[(size_t)m] > 1 && u(rng) < (float)(count[(size_t)m] - 1) / (float)std::max<int64_t>(c.n - c.k, 1)))
          m = (m + 1) % c.k;
        for (int t = 0; t < c.d; ++t) {
          const double v = ref[(size_t)m * c.d + t];
          ref[(size_t)j * c.d + t] = v * (t % 2 ? 1 - 1.0 / 1024 : 1 + 1.0 / 1024);
          ref[(size_t)m * c.d + t] = v * (t % 2 ? 1 + 1.0 / 1024 : 1 - 1.0 / 1024);
        }
        renorm(j), renorm(m);
        count[(size_t)j] = count[(size_t)m] / 2, count[(size_t)m] -= count[(size_t)j];
        ++splits;
      }
    }
    std::printf("lloyd n=%lld d=%d k=%lld iters=%d: %lld empty clusters split\n", (long long)c.n, c.d, (long long)c.k,
                c.iters, (long long)splits);
    double worst = 0;
    for (size_t i = 0; i < cent.size(); ++i) worst = std::max(worst, std::abs((double)cent[i] - ref[i]));
    CHECK(worst < 1e-4);
    for (int64_t j = 0; j < c.k; ++j) CHECK(dot(&cent[(size_t)j * c.d], &cent[(size_t)j * c.d], c.d) == Approx(1.0).epsilon(1e-5));
    // Labels: the nearest returned centroid (ties aside: none within 1e-6 here).
    std::vector<int32_t> again((size_t)c.n);
    kmeans_assign_reference(x.data(), c.n, cent.data(), c.k, c.d, again.data());
    CHECK(again == lab);
    for (int64_t i = 0; i < c.n; ++i) {
      const double mine = dot(&x[(size_t)i * c.d], &cent[(size_t)lab[(size_t)i] * c.d], c.d);
      for (int64_t j = 0; j < c.k; ++j) REQUIRE(dot(&x[(size_t)i * c.d], &cent[(size_t)j * c.d], c.d) <= mine + 1e-5);
    }
  }
}

TEST_CASE("Lloyd k-means: ties go to the lowest index, an empty cluster splits a large one, train and label sets apart") {
  const int d = 4;
  // Two copies of one row and one other: k = 3 starts on all three rows; the
  // duplicate's centroids tie, so both copies take the lower index and the
  // higher one is left empty: it splits cluster 0 (the only one of two rows),
  // a copy moved by 1/1024 in alternate dimensions, which normalises back to
  // the same unit row here, so the tie and the split repeat every round.
  const std::vector<float> x = {1, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 0};
  std::vector<float> cent(3 * d);
  std::vector<int32_t> lab(3);
  LloydKMeans().cluster(x.data(), 3, x.data(), 3, d, 3, 5, 1, cent.data(), lab.data());
  CHECK(lab == std::vector<int32_t>{0, 0, 2});
  CHECK(std::vector<float>(cent.begin() + d, cent.begin() + 2 * d) == std::vector<float>{1, 0, 0, 0});
  {  // kmeans_split_empty alone: two empties, one cluster of 5 rows and one of 1 (n = 6, k = 4).
    std::vector<float> c = {0.6f, 0.8f, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 0};
    std::vector<int32_t> count = {5, 1, 0, 0};
    CHECK(kmeans_split_empty(c.data(), count.data(), 4, d, 6, 3) == 2);
    CHECK(count[0] + count[1] + count[2] + count[3] == 6);
    CHECK(count[2] >= 1);
    CHECK(count[3] >= 1);
    for (int j = 0; j < 4; ++j) CHECK(dot(&c[(size_t)j * d], &c[(size_t)j * d], d) == Approx(1.0).epsilon(1e-6));
    // Each split copy sits within 2/1024 of cluster 0's row (the only one with rows to spare).
    for (int j : {2, 3}) CHECK(dot(&c[(size_t)j * d], std::vector<float>{0.6f, 0.8f, 0, 0}.data(), d) > 0.999);
  }
  // Trained on a sample, labelling other rows: each label is the nearest centroid.
  const auto train = unit_rows(200, 16, 3), all = unit_rows(501, 16, 4);
  std::vector<float> c2(10 * 16);
  std::vector<int32_t> l2(501), want(501);
  LloydKMeans().cluster(train.data(), 200, all.data(), 501, 16, 10, 6, 7, c2.data(), l2.data());
  kmeans_assign_reference(all.data(), 501, c2.data(), 10, 16, want.data());
  CHECK(l2 == want);
}
