#include "index/kmeans.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "src/common/error.h"
#include "src/common/vec_math.h"

namespace topkv {

std::vector<int64_t> select_rows(int64_t n, int64_t m, uint64_t seed) {
  TOPKV_CHECK(m >= 1 && m <= n, "choosing {} of {} rows (k-means starting rows or a training sample): the count "
              "must be in [1, rows]", m, n);
  std::vector<int64_t> rows;
  rows.reserve((size_t)m);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int64_t i = 0; i < n && (int64_t)rows.size() < m; ++i)
    if ((double)(n - i) * u(rng) < (double)(m - (int64_t)rows.size())) rows.push_back(i);
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

int64_t kmeans_split_empty(float* centroids, int32_t* counts, int64_t k, int d, int64_t n, uint64_t seed) {
  constexpr float kEps = 1.f / 1024.f;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.f, 1.f);
  const float spare = (float)std::max<int64_t>(n - k, 1);
  auto renorm = [&](float* c) {
    const float nrm = std::sqrt(dot_f32(c, c, (size_t)d));
    if (nrm > 0.f)
      for (int t = 0; t < d; ++t) c[t] /= nrm;
  };
  int64_t split = 0;
  for (int64_t j = 0; j < k; ++j) {
    if (counts[j] != 0) continue;
    int64_t m = 0;
    for (;; m = (m + 1) % k)
      if (counts[m] > 1 && u(rng) < (float)(counts[m] - 1) / spare) break;
    float *cj = centroids + (size_t)j * d, *cm = centroids + (size_t)m * d;
    std::copy_n(cm, d, cj);
    for (int t = 0; t < d; ++t) {
      cj[t] *= t % 2 == 0 ? 1 + kEps : 1 - kEps;
      cm[t] *= t % 2 == 0 ? 1 - kEps : 1 + kEps;
    }
    renorm(cj), renorm(cm);
    counts[j] = counts[m] / 2, counts[m] -= counts[j];
    ++split;
  }
  return split;
}

void LloydKMeans::cluster(const float* train, int64_t n_train, const float* all, int64_t n_all, int d, int64_t k,
                          int iters, uint64_t seed, float* centroids, int32_t* labels) const {
  const std::vector<int64_t> init = select_rows(n_train, k, seed);
  for (int64_t j = 0; j < k; ++j) std::copy_n(train + (size_t)init[(size_t)j] * d, d, centroids + (size_t)j * d);
  std::vector<int32_t> lab((size_t)n_train);
  std::vector<float> sum((size_t)k * d);
  std::vector<int32_t> count((size_t)k);
  for (int it = 0; it < iters; ++it) {
    kmeans_assign_reference(train, n_train, centroids, k, d, lab.data());
    std::fill(sum.begin(), sum.end(), 0.f);
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < n_train; ++i) {
      float* s = sum.data() + (size_t)lab[(size_t)i] * d;
      const float* r = train + (size_t)i * d;
      for (int t = 0; t < d; ++t) s[t] += r[t];
      ++count[(size_t)lab[(size_t)i]];
    }
    for (int64_t j = 0; j < k; ++j) {
      const float* s = sum.data() + (size_t)j * d;
      const float nrm = std::sqrt(dot_f32(s, s, (size_t)d));
      if (!(nrm > 0.f)) continue;  // no rows (or rows that cancel): the centroid stays
      for (int t = 0; t < d; ++t) centroids[(size_t)j * d + t] = s[t] / nrm;
    }
    kmeans_split_empty(centroids, count.data(), k, d, n_train, seed + 1 + (uint64_t)it);
  }
  kmeans_assign_reference(all, n_all, centroids, k, d, labels);
}

}  // namespace topkv
