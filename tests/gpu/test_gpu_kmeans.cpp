// The GPU k-means (gpu/gpu_kmeans.h, `--build-on gpu`) against its CPU twin
// LloydKMeans (index/kmeans.h): the same labels where the order of the dot
// products cannot decide (one round: every row whose best two centroids are
// further apart than rounding), and after ten rounds the same objective and
// the same index quality; awkward sizes, head_dim 64/128/256, a sample apart
// from the rows labelled, and calls from several threads at once.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <thread>

#include "gpu/gpu_kmeans.h"
#include "index/kv_index.h"
#include "tests/clustered_keys.h"
#include "tests/gpu/cuda_test_util.h"

using namespace topkv;

namespace {

std::vector<float> unit_keys(int64_t n, int d, uint32_t seed, int centres) {
  topkv::testing::Clustered gen(d, centres, seed);
  auto x = gen.keys(n);
  for (int64_t i = 0; i < n; ++i) {
    double s = 0;
    for (int j = 0; j < d; ++j) s += (double)x[(size_t)i * d + j] * x[(size_t)i * d + j];
    for (int j = 0; j < d; ++j) x[(size_t)i * d + j] /= (float)std::sqrt(s);
  }
  return x;
}

double dotd(const float* a, const float* b, int d) {
  double s = 0;
  for (int j = 0; j < d; ++j) s += (double)a[j] * b[j];
  return s;
}

// The gap between a row's best and second-best centroid (in double).
double margin(const float* r, const std::vector<float>& cent, int64_t k, int d) {
  double b1 = -1e300, b2 = -1e300;
  for (int64_t j = 0; j < k; ++j) {
    const double s = dotd(r, &cent[(size_t)j * d], d);
    if (s > b1) b2 = b1, b1 = s;
    else if (s > b2) b2 = s;
  }
  return k > 1 ? b1 - b2 : 1e300;
}

double objective(const std::vector<float>& x, int64_t n, const std::vector<float>& cent, const std::vector<int32_t>& lab,
                 int d) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += dotd(&x[(size_t)i * d], &cent[(size_t)lab[(size_t)i] * d], d);
  return s / (double)n;
}

}  // namespace

TEST_CASE("GPU k-means: one round labels every row as the twin does where rounding cannot decide") {
  const auto engine = make_gpu_kmeans(test::cuda_be());
  const LloydKMeans twin;
  struct Case { int64_t n; int d; int64_t k; int iters; int64_t n_all; };
  for (Case c : {Case{1, 64, 1, 1, 1}, Case{7, 128, 7, 1, 7}, Case{8192, 128, 512, 0, 8192}, Case{8192, 128, 512, 1, 8192},
                 Case{3001, 64, 187, 1, 3001}, Case{12289, 256, 768, 1, 12289}, Case{1000, 128, 63, 1, 4099}}) {
    CAPTURE(c.n, c.d, c.k, c.iters, c.n_all);
    const auto train = unit_keys(c.n, c.d, (uint32_t)(c.n + c.d), 32);
    const auto all = c.n_all == c.n ? train : unit_keys(c.n_all, c.d, 77, 32);
    std::vector<float> cg((size_t)c.k * c.d), ct(cg.size());
    std::vector<int32_t> lg((size_t)c.n_all, -1), lt((size_t)c.n_all, -2);
    engine->cluster(train.data(), c.n, all.data(), c.n_all, c.d, c.k, c.iters, 5, cg.data(), lg.data());
    twin.cluster(train.data(), c.n, all.data(), c.n_all, c.d, c.k, c.iters, 5, ct.data(), lt.data());
    // After at most one round both hold the same centroids up to the sums' rounding...
    CHECK(test::rel_err(cg, ct) < 1e-5);
    // ...and label alike every row whose best two centroids are apart.
    int64_t near_ties = 0, differ = 0;
    for (int64_t i = 0; i < c.n_all; ++i) {
      const bool tie = margin(&all[(size_t)i * c.d], ct, c.k, c.d) < 1e-4;
      near_ties += tie;
      if (!tie) differ += lg[(size_t)i] != lt[(size_t)i];
      else CHECK((lg[(size_t)i] >= 0 && lg[(size_t)i] < c.k));
    }
    CHECK(differ == 0);
    std::printf("SUMMARY gpu_kmeans one round n=%lld d=%d k=%lld: %lld near ties, %lld labels differ elsewhere\n",
                (long long)c.n, c.d, (long long)c.k, (long long)near_ties, (long long)differ);
  }
}

TEST_CASE("GPU k-means: ten rounds reach the twin's objective, and calls from several threads at once") {
  const auto engine = make_gpu_kmeans(test::cuda_be());
  const LloydKMeans twin;
  for (int d : {64, 128, 256}) {
    CAPTURE(d);
    const int64_t n = 8192, k = 512;
    const auto x = unit_keys(n, d, 11u + (uint32_t)d, 64);
    std::vector<float> cg((size_t)k * d), ct(cg.size());
    std::vector<int32_t> lg((size_t)n), lt((size_t)n);
    engine->cluster(x.data(), n, x.data(), n, d, k, 10, 3, cg.data(), lg.data());
    twin.cluster(x.data(), n, x.data(), n, d, k, 10, 3, ct.data(), lt.data());
    const double og = objective(x, n, cg, lg, d), ot = objective(x, n, ct, lt, d);
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) same += lg[(size_t)i] == lt[(size_t)i];
    std::printf("SUMMARY gpu_kmeans ten rounds d=%d: objective %.6f (twin %.6f), %.4f of labels equal\n", d, og, ot,
                (double)same / (double)n);
    CHECK(og == Approx(ot).epsilon(2e-3));
    // Every label is the nearest of the engine's own centroids (up to rounding).
    for (int64_t i = 0; i < n; i += 7) {
      const double mine = dotd(&x[(size_t)i * d], &cg[(size_t)lg[(size_t)i] * d], d);
      for (int64_t j = 0; j < k; ++j) REQUIRE(dotd(&x[(size_t)i * d], &cg[(size_t)j * d], d) <= mine + 1e-5);
    }
    // Four threads, each its own block: every result as the call alone gives it.
    std::vector<std::vector<int32_t>> got(4, std::vector<int32_t>((size_t)n));
    std::vector<std::vector<float>> cent(4, std::vector<float>((size_t)k * d));
    std::vector<std::thread> pool;
    for (int t = 0; t < 4; ++t)
      pool.emplace_back([&, t] { engine->cluster(x.data(), n, x.data(), n, d, k, 10, 3, cent[t].data(), got[t].data()); });
    for (auto& th : pool) th.join();
    for (int t = 0; t < 4; ++t) CHECK(test::rel_err(cent[t], cg) < 1e-4);
  }
}

TEST_CASE("GPU k-means builds multipole and centroid indexes of the twin's recall and attention mass") {
  const int d = 128;
  const int64_t n = 20000;
  topkv::testing::Clustered gen(d, 48, 9);
  const auto kf = gen.keys(n), vf = gen.keys(n), q = gen.queries(24);
  auto keys = std::make_shared<RowStore>(d, DType::F16), values = std::make_shared<RowStore>(d, DType::F16);
  keys->append_f32(kf.data(), n);
  values->append_f32(vf.data(), n);
  // Exact attention per query (scale 1/sqrt(d)) and its 32 best keys.
  const int K = 32;
  std::vector<std::vector<double>> p(q.size() / d);
  std::vector<std::vector<int64_t>> top(p.size());
  for (size_t g = 0; g < p.size(); ++g) {
    std::vector<double> s((size_t)n);
    for (int64_t i = 0; i < n; ++i) s[(size_t)i] = keys->dot(i, q.data() + g * d) / std::sqrt((double)d);
    const double m = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (double& v : s) z += std::exp(v - m);
    p[g].resize((size_t)n);
    for (int64_t i = 0; i < n; ++i) p[g][(size_t)i] = std::exp(s[(size_t)i] - m) / z;
    top[g].resize((size_t)n);
    std::iota(top[g].begin(), top[g].end(), 0);
    std::partial_sort(top[g].begin(), top[g].begin() + K, top[g].end(),
                      [&](int64_t a, int64_t b) { return s[(size_t)a] > s[(size_t)b]; });
    top[g].resize(K);
  }
  for (const char* spec : {"multipole", "centroid:block=4096", "multipole:levels=2"}) {
    CAPTURE(spec);
    double recall[2] = {0, 0}, mass[2] = {0, 0};
    for (int e = 0; e < 2; ++e) {
      BuildOptions o;
      o.n_threads = 4, o.seed = 7;
      if (e == 0) o.kmeans = make_gpu_kmeans(test::cuda_be());
      else o.kmeans = std::make_shared<LloydKMeans>();
      auto idx = KvIndex::create(spec, o);
      idx->build(keys, values);
      SearchParams sp;
      sp.k = 600;
      for (size_t g = 0; g < p.size(); ++g) {
        const auto r = idx->search(q.data() + g * d, 1, sp);
        int64_t hit = 0;
        for (int64_t id : top[g]) hit += std::binary_search(r.ids.begin(), r.ids.end(), id);
        for (int64_t id : r.ids) mass[e] += p[g][(size_t)id] / (double)p.size();
        recall[e] += (double)hit / K / (double)p.size();
      }
    }
    std::printf("SUMMARY gpu_kmeans %s: recall@32 %.3f (twin %.3f), mass %.3f (twin %.3f)\n", spec, recall[0],
                recall[1], mass[0], mass[1]);
    CHECK(std::abs(recall[0] - recall[1]) <= 0.03);
    CHECK(std::abs(mass[0] - mass[1]) <= 0.03);
  }
}
