// Sampler: greedy is argmax; temperature/top-k/top-p give the distribution
// they promise (checked against a direct softmax and by drawing); a seed
// repeats a run; bad parameters are errors.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "src/common/error.h"
#include "src/model/sampler.h"

using namespace topkv;

namespace {
std::vector<float> random_logits(size_t n, uint32_t seed, float sd = 3.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}
std::vector<int32_t> ids_by_logit(const std::vector<float>& l) {
  std::vector<int32_t> ids(l.size());
  for (size_t i = 0; i < l.size(); ++i) ids[i] = (int32_t)i;
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  return ids;
}
}  // namespace

TEST_CASE("greedy returns the argmax, lowest id on ties") {
  for (size_t n : {1, 2, 1000, 262144}) {
    auto l = random_logits(n, (uint32_t)n);
    Sampler s({});
    const int32_t want = (int32_t)(std::max_element(l.begin(), l.end()) - l.begin());
    REQUIRE(s.sample(l) == want);
    REQUIRE(argmax(l) == want);
    REQUIRE(s.distribution(l).empty());
  }
  std::vector<float> tie{1.f, 5.f, 2.f, 5.f};
  REQUIRE(Sampler({}).sample(tie) == 1);
  // top-k 1 at any temperature is greedy too.
  auto l = random_logits(5000, 3);
  Sampler s({.temperature = 2.f, .top_k = 1, .top_p = 1.f, .seed = 9});
  for (int i = 0; i < 20; ++i) REQUIRE(s.sample(l) == argmax(l));
}

TEST_CASE("the distribution is the tempered softmax restricted by top-k and top-p") {
  for (size_t n : {7, 300, 70000})
    for (float temp : {0.3f, 1.f, 1.7f})
      for (int k : {0, 1, 5, 64})
        for (float p : {1.f, 0.9f, 0.5f, 0.01f}) {
          CAPTURE(n, temp, k, p);
          const auto l = random_logits(n, (uint32_t)(n + k));
          const auto order = ids_by_logit(l);
          const size_t keep = k > 0 ? std::min<size_t>(k, n) : n;
          // Direct: softmax of l/temp over the top `keep`, then the smallest
          // prefix reaching p, renormalised.
          double z = 0;
          for (size_t i = 0; i < keep; ++i) z += std::exp((l[order[i]] - l[order[0]]) / temp);
          size_t cut = 0;
          double mass = 0;
          while (cut < keep && (mass < p || p >= 1.f)) mass += std::exp((l[order[cut]] - l[order[0]]) / temp) / z, ++cut;
          Sampler s({.temperature = temp, .top_k = k, .top_p = p, .seed = 1});
          const auto d = s.distribution(l);
          REQUIRE(d.size() == cut);
          double total = 0;
          for (size_t i = 0; i < cut; ++i) {
            REQUIRE(d[i].id == order[i]);
            const double want = std::exp((l[order[i]] - l[order[0]]) / temp) / z / mass;
            REQUIRE(d[i].prob == Approx(want).epsilon(1e-4));
            total += d[i].prob;
          }
          REQUIRE(total == Approx(1.0).epsilon(1e-5));
        }
}

TEST_CASE("draws stay in the support and follow the probabilities") {
  const auto l = random_logits(2000, 42, 2.f);
  for (auto [k, p] : {std::pair{10, 1.f}, std::pair{0, 0.6f}, std::pair{50, 0.8f}, std::pair{0, 1.f}}) {
    Sampler s({.temperature = 1.f, .top_k = k, .top_p = p, .seed = 123});
    const auto d = s.distribution(l);
    std::set<int32_t> support;
    for (auto& c : d) support.insert(c.id);
    std::map<int32_t, int> hits;
    const int draws = 8000;
    for (int i = 0; i < draws; ++i) {
      const int32_t id = s.sample(l);
      REQUIRE(support.count(id) == 1);
      ++hits[id];
    }
    // Tokens expected 20+ times: within 5 standard deviations of the count.
    // The rest together: their total, the same way.
    double rare_p = 0;
    int rare_hits = 0;
    for (auto& c : d) {
      const double want = c.prob * draws;
      if (want >= 20) {
        REQUIRE(std::abs(hits[c.id] - want) <= 5 * std::sqrt(want));
      } else {
        rare_p += c.prob, rare_hits += hits[c.id];
      }
    }
    REQUIRE(std::abs(rare_hits - rare_p * draws) <= 5 * std::sqrt(rare_p * draws) + 1);
  }
}

TEST_CASE("a seed repeats a run, different seeds differ") {
  const auto l = random_logits(5000, 8, 1.f);
  const auto run = [&](uint64_t seed) {
    Sampler s({.temperature = 1.f, .top_k = 0, .top_p = 0.95f, .seed = seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 64; ++i) out.push_back(s.sample(l));
    return out;
  };
  REQUIRE(run(7) == run(7));
  REQUIRE(run(7) != run(8));
}

TEST_CASE("bad sampler parameters are errors") {
  REQUIRE_THROWS_AS(Sampler({.temperature = -1.f}), Error);
  REQUIRE_THROWS_AS(Sampler({.temperature = NAN}), Error);
  REQUIRE_THROWS_AS(Sampler({.temperature = 1.f, .top_k = -2}), Error);
  REQUIRE_THROWS_AS(Sampler({.temperature = 1.f, .top_k = 0, .top_p = 0.f}), Error);
  REQUIRE_THROWS_AS(Sampler({.temperature = 1.f, .top_k = 0, .top_p = 1.5f}), Error);
  Sampler s({});
  REQUIRE_THROWS_AS(s.sample(std::span<const float>()), Error);
}
