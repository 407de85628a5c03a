#include "index/kmeans.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "src/common/error.h"
#include "src/common/vec_math.h"

namespace topkv {

std::vector<int64_t> kmeans_init_rows(int64_t n, int64_t k, uint64_t seed) {
  TOPKV_CHECK(k >= 1 && k <= n, "k-means of {} rows into {} clusters: k must be in [1, rows]", n, k);
  std::vector<int64_t> rows;
  rows.reserve((size_t)k);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < n && (int64_t)rows.size() < k; ++i)
    if ((double)(n - i) * u(rng) < (double)(k - (int64_t)rows.size())) rows.push_back(i);
  return rows;
}

void kmeans_assign_reference(const float* x, int64_t n, const float* centroids, int64_t k, int d, int32_t* labels) {
  for (int64_t i = 0; i < n; ++i) {
    const float* r = x + (size_t)i * d;
    float best = -INFINITY;
    int32_t arg = 0;
    for (int64_t j = 0; j < k; ++j) {
      const float s = dot_f32(r, centroids + (size_t)j * d, (size_t)d);
      if (s > best) best = s, arg = (int32_t)j;
    }
    labels[i] = arg;
  }
}

void LloydKMeans::cluster(const float* train, int64_t n_train, const float* all, int64_t n_all, int d, int64_t k,
                          int iters, uint64_t seed, float* centroids, int32_t* labels) const {
  const std::vector<int64_t> init = kmeans_init_rows(n_train, k, seed);
  for (int64_t j = 0; j < k; ++j) std::copy_n(train + (size_t)init[(size_t)j] * d, d, centroids + (size_t)j * d);
  std::vector<int32_t> lab((size_t)n_train);
  std::vector<float> sum((size_t)k * d);
  for (int it = 0; it < iters; ++it) {
    kmeans_assign_reference(train, n_train, centroids, k, d, lab.data());
    std::fill(sum.begin(), sum.end(), 0.f);
    for (int64_t i = 0; i < n_train; ++i) {
      float* s = sum.data() + (size_t)lab[(size_t)i] * d;
      const float* r = train + (size_t)i * d;
      for (int t = 0; t < d; ++t) s[t] += r[t];
    }
    for (int64_t j = 0; j < k; ++j) {
      const float* s = sum.data() + (size_t)j * d;
      const float nrm = std::sqrt(dot_f32(s, s, (size_t)d));
      if (!(nrm > 0.f)) continue;  // no rows (or rows that cancel): the centroid stays
      for (int t = 0; t < d; ++t) centroids[(size_t)j * d + t] = s[t] / nrm;
    }
  }
  kmeans_assign_reference(all, n_all, centroids, k, d, labels);
}

}  // namespace topkv
