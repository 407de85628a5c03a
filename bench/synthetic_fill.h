// A model's context without a prefill: keys and values from the synthetic
// generator (bench/synthetic.h: RoPE'd keys with a shared offset, uneven
// dimensions, sinks, a drifting topic; per layer and KV head seeds), so that
// decode can be benchmarked at contexts a real prefill would take hours for
// (Llama-3-8B geometry at 512K). Everything that reports such a run must say
// the context was synthetic.
//
// The same data feeds every holder of a context: the model's own caches
// (fill_model: full-context layers get all n positions, sliding-window layers
// their ring's last positions) and the overrides (reader(): a KvReader for
// take_context), so the modes of a benchmark decode from identical contexts.
//
// The generator rotates keys with NeoX pairing at the layer's RoPE base; a
// llama model pairs dimensions differently, which changes no cost measured
// here (the model's queries are not the generator's anyway).
#pragma once
#include <cstdint>
#include <vector>

#include "bench/synthetic.h"
#include "src/model/attention_override.h"
#include "src/model/model_config.h"

namespace topkv {

class Model;

class SyntheticFill {
 public:
  // A context of n tokens for a model of this geometry.
  SyntheticFill(const ModelConfig& cfg, int64_t n, uint64_t seed = 1, bool progress = true);

  int64_t n() const { return n_; }
  // The generator's parameters for `layer`: its own seed, its RoPE base, the
  // model's KV heads, head_dim and GQA group; everything else the defaults.
  SyntheticConfig layer_config(int layer) const;
  // fp32 [n_head_kv][m][head_dim] keys and values of positions [t0, t0 + m);
  // topics: per KV head the topic state entering t0 (empty: the generator's
  // stationary start) and, after, the one leaving (synthetic_key_values).
  void read(int layer, int64_t t0, int64_t m, std::vector<float>& k, std::vector<float>& v,
            std::vector<std::vector<float>>* topics = nullptr) const;
  // A layer's positions [0, n) in pieces that continue each other, for an
  // override's take_context: the pieces are one read of [0, n), bit for bit.
  KvReader reader() const;
  // Writes every layer the model keeps a cache for (layers it gave to an
  // override via ModelOptions::override_layers have none) and sets its
  // n_past to n. Throws Error when the model's context size is below n.
  void fill_model(Model& model) const;

 private:
  ModelConfig cfg_;
  int64_t n_;
  uint64_t seed_;
  bool progress_;
};

}  // namespace topkv
