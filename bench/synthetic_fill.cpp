#include "bench/synthetic_fill.h"

#include "bench/rng.h"
#include "src/common/error.h"
#include "src/common/progress.h"
#include "src/model/model.h"

namespace topkv {

SyntheticFill::SyntheticFill(const ModelConfig& cfg, int64_t n, uint64_t seed, bool progress)
    : cfg_(cfg), n_(n), seed_(seed), progress_(progress) {
  TOPKV_CHECK(n >= 1, "a synthetic context needs at least one token (got {})", n);
  TOPKV_CHECK(cfg_.n_head_kv >= 1 && cfg_.n_head % cfg_.n_head_kv == 0,
              "{} query heads cannot be grouped over {} KV heads", cfg_.n_head, cfg_.n_head_kv);
  layer_config(0).validate();  // the geometry the generator cannot make (odd head_dim, ...) fails here
}

SyntheticConfig SyntheticFill::layer_config(int layer) const {
  TOPKV_CHECK(layer >= 0 && layer < cfg_.n_layer, "layer {} is out of range (0..{})", layer, cfg_.n_layer - 1);
  SyntheticConfig c;
  c.n_keys = n_;
  c.head_dim = cfg_.head_dim;
  c.kv_heads = cfg_.n_head_kv;
  c.group = cfg_.n_head / cfg_.n_head_kv;
  c.n_queries = 1;  // not generated here; validate() wants a positive count
  c.n_sinks = (int)std::min<int64_t>(c.n_sinks, n_);
  c.rope_base = cfg_.layers[(size_t)layer].rope.base;
  uint64_t s = seed_ ^ (0x5851f42d4c957f2dull * (uint64_t)(layer + 1));
  c.seed = splitmix64(s);  // per layer; the generator derives per-head streams from it
  return c;
}

void SyntheticFill::read(int layer, int64_t t0, int64_t m, std::vector<float>& k, std::vector<float>& v) const {
  const SyntheticConfig c = layer_config(layer);
  const size_t per_head = (size_t)m * c.head_dim;
  k.resize(per_head * c.kv_heads);
  v.resize(k.size());
  for (int h = 0; h < c.kv_heads; ++h)  // [kv][m][hd]: one head's rows are token-major [m][hd]
    synthetic_key_values(c, h, t0, m, k.data() + h * per_head, v.data() + h * per_head);
}

KvReader SyntheticFill::reader() const {
  return [this](int layer, std::vector<float>& k, std::vector<float>& v) { read(layer, 0, n_, k, v); };
}

void SyntheticFill::fill_model(Model& model) const {
  TOPKV_CHECK(model.options().n_ctx >= n_, "a synthetic context of {} tokens does not fit the model's context size "
              "{}", n_, model.options().n_ctx);
  int64_t total = 0;
  for (int il = 0; il < cfg_.n_layer; ++il) total += std::min(n_, model.kv_capacity(il));
  Progress bar("synthetic fill", total * cfg_.n_head_kv, "keys", progress_ && total * cfg_.n_head_kv >= 100000);
  std::vector<float> k, v;
  for (int il = 0; il < cfg_.n_layer; ++il) {
    const int64_t m = std::min(n_, model.kv_capacity(il));  // a ring keeps the last positions; 0: no cache
    if (m == 0) continue;
    read(il, n_ - m, m, k, v);
    model.write_kv(il, k.data(), v.data(), n_ - m, m);
    bar.add(m * cfg_.n_head_kv);
  }
  bar.finish();
  model.set_n_past(n_);
}

}  // namespace topkv
