// Model helpers shared by the tests that build Model objects directly.
#pragma once
#include <cstdint>

#include "src/model/model.h"

namespace topkv::test {

// Model options of a test: context size, prefill chunk, cache type, weight
// mode (the rest at their defaults, without naming every field).
inline ModelOptions model_options(int64_t n_ctx, int max_chunk, DType kv = DType::F32,
                                  WeightMode weights = WeightMode::Quant) {
  ModelOptions o;
  o.n_ctx = n_ctx, o.max_chunk = max_chunk, o.kv_dtype = kv, o.weights = weights;
  return o;
}

}  // namespace topkv::test
