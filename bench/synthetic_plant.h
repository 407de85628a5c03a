// Planting sink and retrieval hits into synthetic queries: the last term of
// the query model in bench/synthetic.h, sum_G delta_G c_G. Internal to the
// generator; separate because the calibration is its own concern.
#pragma once
#include <cstdint>
#include <vector>

#include "bench/rng.h"
#include "index/row_store.h"

namespace topkv {

// The newest keys are always scored exactly when calibrating (recency makes
// them peaky); far retrieval targets are drawn from before them.
inline constexpr int64_t kNewestExact = 256;

// Stratified sample of the keys a query's softmax normaliser is estimated
// from: the newest kNewestExact keys exactly, one random key per stratum of
// the older ones (4096 strata), each standing for its stratum. Sinks are left
// out (the planting adds them back when they are not targets).
struct NormaliserSample {
  std::vector<int64_t> pos;
  std::vector<float> log_weight;     // ln(stratum size); 0 for exact keys
  std::vector<float> rows;           // fp32 keys as stored
  std::vector<float> mean, inv_var;  // per-dimension key statistics, for whitening target directions
};
NormaliserSample make_normaliser_sample(const RowStore& keys, int64_t n_sinks, Rng& r);

// Keys that together should hold `share` of the query's attention.
struct PlantGroup {
  std::vector<int64_t> keys;
  double share = 0;
};

// Adds sum_G delta_G c_G to the post-RoPE query q. c_G is the mean whitened
// direction of group G's keys; delta is calibrated by damped Newton steps so
// that each group's log-sum-exp of scores reaches
// ln(share_G / (1 - total share)) + ln Z_rest. Z_rest is estimated over the
// sample, the sinks that are not targets, and exactly over +-`neighbourhood`
// keys around each far target (its passage shares its topic and gains with
// it; sampling would miss that). Shares must sum below 1.
void plant_targets(const NormaliserSample& S, const RowStore& keys, const std::vector<PlantGroup>& groups,
                   int64_t n_sinks, int64_t neighbourhood, float* q);

}  // namespace topkv
