// Next-token sampling from host logits: greedy, or temperature then top-k then
// top-p (nucleus) over the tempered distribution, the order of Hugging Face's
// logits warpers. A seed fixes the draws: the same seed and the same logits
// give the same tokens (std::mt19937_64, no platform-dependent distributions).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace topkv {

struct SamplerParams {
  float temperature = 0.f;  // <= 0: greedy (argmax, lowest id on ties)
  int top_k = 0;            // keep the k most likely tokens; 0 = all
  float top_p = 1.f;        // keep the smallest set whose mass reaches p; 1 = all
  uint64_t seed = 0;
};

class Sampler {
 public:
  explicit Sampler(const SamplerParams& p);  // throws Error on out-of-range values
  int32_t sample(std::span<const float> logits);
  const SamplerParams& params() const { return p_; }

  struct Candidate {
    int32_t id;
    float prob;
  };
  // The distribution sample() draws from, most likely first, probabilities
  // summing to 1 (for tests and for --verbose output). Empty when greedy.
  std::vector<Candidate> distribution(std::span<const float> logits) const;

 private:
  SamplerParams p_;
  std::mt19937_64 rng_;
};

int32_t argmax(std::span<const float> logits);

}  // namespace topkv
