// Next-token sampling from logits in CUDA backend memory, the twin of Sampler
// (src/model/sampler.h), which stays the reference:
//   greedy (temperature 0): an argmax kernel; 4 bytes come back instead of
//     the whole logit row;
//   plain temperature (top_k 0, top_p 1): a softmax-and-draw kernel given the
//     uniform draw Sampler would make (same seed, same sequence of u);
//   top-k / top-p: the logits are copied to the host and Sampler draws.
// Same seed and logits give Sampler's tokens, barring a u within ~1e-16 of a
// boundary between two tokens' cumulative probabilities (the device sums in
// another order). Compiles without CUDA; there the constructor throws.
#pragma once
#include <cstdint>
#include <random>
#include <vector>

#include "src/model/backend.h"
#include "src/model/sampler.h"

namespace topkv {

class CudaSampler {
 public:
  // Throws Error on bad parameters (as Sampler) or when `cuda` is not a CUDA backend.
  CudaSampler(Backend& cuda, const SamplerParams& p);
  // logits: n floats in the backend's memory (after the ops that wrote them).
  int32_t sample(const float* logits, int64_t n);
  const SamplerParams& params() const { return host_.params(); }

 private:
  Backend& be_;
  Sampler host_;          // draws for top-k / top-p
  std::mt19937_64 rng_;   // draws for plain temperature, seeded as Sampler's
  std::vector<float> host_logits_;
};

// Index of the largest of n device logits (lowest on ties): topkv::argmax's twin.
int32_t cuda_argmax(Backend& cuda, const float* logits, int64_t n);

}  // namespace topkv
