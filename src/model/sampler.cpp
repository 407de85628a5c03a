#include "src/model/sampler.h"

#include <algorithm>
#include <cmath>

#include "src/common/error.h"

namespace topkv {

int32_t argmax(std::span<const float> logits) {
  TOPKV_CHECK(!logits.empty(), "cannot sample from an empty vocabulary");
  return (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(const SamplerParams& p) : p_(p), rng_(p.seed) {
  TOPKV_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.f,
              "temperature must be >= 0 (0 = greedy), got {}", p.temperature);
  TOPKV_CHECK(p.top_k >= 0, "top-k must be >= 0 (0 = off), got {}", p.top_k);
  TOPKV_CHECK(p.top_p > 0.f && p.top_p <= 1.f, "top-p must be in (0, 1] (1 = off), got {}", p.top_p);
}

std::vector<Sampler::Candidate> Sampler::distribution(std::span<const float> logits) const {
  std::vector<Candidate> c;
  if (p_.temperature <= 0.f) return c;
  const int64_t n = (int64_t)logits.size();
  TOPKV_CHECK(n > 0, "cannot sample from an empty vocabulary");
  const auto by_logit = [&](const Candidate& a, const Candidate& b) {
    return logits[a.id] != logits[b.id] ? logits[a.id] > logits[b.id] : a.id < b.id;
  };
  c.resize(n);
  for (int64_t i = 0; i < n; ++i) c[i] = {(int32_t)i, 0.f};
  // Sort only as far as needed: the top-k, or (nucleus) a growing prefix
  // until its mass reaches top_p; a 262k vocabulary rarely needs a full sort.
  const int64_t keep = p_.top_k > 0 ? std::min<int64_t>(p_.top_k, n) : n;
  const float mx = *std::max_element(logits.begin(), logits.end());
  const auto weight = [&](int32_t id) { return std::exp((double)(logits[id] - mx) / p_.temperature); };
  if (keep < n) std::partial_sort(c.begin(), c.begin() + keep, c.end(), by_logit);
  double total = 0;  // softmax denominator over the kept set, tempered
  for (int64_t i = 0; i < keep; ++i) total += weight(c[i].id);
  int64_t sorted = keep < n ? keep : 0, cut = 0;
  double mass = 0;
  if (p_.top_p >= 1.f) {  // nucleus off: every kept token, in any order
    c.resize(keep);
    for (auto& e : c) e.prob = (float)(weight(e.id) / total);
    if (keep == n) std::sort(c.begin(), c.end(), by_logit);
    return c;
  }
  while (true) {
    // Nucleus: the smallest prefix of the sorted kept set whose mass reaches p.
    for (; cut < sorted && mass < p_.top_p; ++cut) mass += weight(c[cut].id) / total;
    if (mass >= p_.top_p || cut == keep) break;
    const int64_t more = std::min(keep, std::max<int64_t>(64, sorted * 8));
    std::partial_sort(c.begin() + sorted, c.begin() + more, c.begin() + keep, by_logit);
    sorted = more;
  }
  c.resize(cut);
  for (auto& e : c) e.prob = (float)(weight(e.id) / (total * mass));
  return c;
}

int32_t Sampler::sample(std::span<const float> logits) {
  // NaN or Inf logits come from corrupt weights or a corrupt context: an error,
  // not an arbitrary token (argmax over NaN is the first one, and text ends).
  for (size_t i = 0; i < logits.size(); ++i)
    TOPKV_CHECK(std::isfinite(logits[i]), "the model's output for token {} is {}: its weights or its context hold "
                "values that are not finite (check the model file, or the pack with `topkv index info --verify`)",
                i, logits[i]);
  if (p_.temperature <= 0.f) return argmax(logits);
  // A uniform double from 53 random bits: the same on every platform, unlike
  // std::uniform_real_distribution.
  const double u = (double)(rng_() >> 11) * 0x1.0p-53;
  if (p_.top_k == 0 && p_.top_p >= 1.f) {  // plain temperature: no sort needed
    TOPKV_CHECK(!logits.empty(), "cannot sample from an empty vocabulary");
    const float mx = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (float l : logits) total += std::exp((double)(l - mx) / p_.temperature);
    double acc = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      acc += std::exp((double)(logits[i] - mx) / p_.temperature) / total;
      if (u < acc) return (int32_t)i;
    }
    return argmax(logits);  // u within rounding of 1
  }
  const auto d = distribution(logits);
  double acc = 0;
  for (const auto& e : d) {
    acc += e.prob;
    if (u < acc) return e.id;
  }
  return d.back().id;
}

}  // namespace topkv
