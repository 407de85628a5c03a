// Synthetic keys and queries with the structure real attention data has: a
// few Gaussian clusters of keys around a shared non-zero mean, and queries near
// a cluster centre but without that mean (not distributed like the keys).
// Shared by the ANN tests.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace topkv::testing {

struct Clustered {
  int d = 0;
  std::vector<float> centres, mean;
  std::mt19937 rng;
  Clustered(int d, int n_clusters, uint32_t seed) : d(d), rng(seed) {
    std::normal_distribution<float> nd(0.f, 1.f);
    mean.resize((size_t)d);
    for (auto& x : mean) x = 0.7f + 0.5f * nd(rng);
    centres.resize((size_t)n_clusters * d);
    for (auto& x : centres) x = 1.5f * nd(rng);
  }
  std::vector<float> keys(int64_t n) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_int_distribution<int> pick(0, (int)(centres.size() / d) - 1);
    std::vector<float> v((size_t)n * d);
    for (int64_t i = 0; i < n; ++i) {
      int c = pick(rng);
      for (int j = 0; j < d; ++j) v[(size_t)i * d + j] = mean[j] + centres[(size_t)c * d + j] + 0.8f * nd(rng);
    }
    return v;
  }
  std::vector<float> queries(int nq) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_int_distribution<int> pick(0, (int)(centres.size() / d) - 1);
    std::vector<float> v((size_t)nq * d);
    for (int g = 0; g < nq; ++g) {
      int c = pick(rng);
      for (int j = 0; j < d; ++j) v[(size_t)g * d + j] = centres[(size_t)c * d + j] + nd(rng);
    }
    return v;
  }
};

}  // namespace topkv::testing
