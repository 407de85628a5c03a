#include "bench/synthetic_fill.h"

#include <map>
#include <memory>
#include <mutex>

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

void SyntheticFill::read(int layer, int64_t t0, int64_t m, std::vector<float>& k, std::vector<float>& v,
                         std::vector<std::vector<float>>* topics) const {
  const SyntheticConfig c = layer_config(layer);
  const size_t per_head = (size_t)m * c.head_dim;
  k.resize(per_head * c.kv_heads);
  v.resize(k.size());
  if (topics) topics->resize((size_t)c.kv_heads);
  for (int h = 0; h < c.kv_heads; ++h)  // [kv][m][hd]: one head's rows are token-major [m][hd]
    synthetic_key_values(c, h, t0, m, k.data() + h * per_head, v.data() + h * per_head, 0,
                         topics ? &(*topics)[(size_t)h] : nullptr);
}

static_assert(kContextPiece % kSyntheticSuperBlock == 0,
              "take_context's pieces must start on the generator's super-blocks to continue each other bit for bit");

// Each layer's topic state is carried from one read to the next, so a layer
// read in pieces (take_context: 64K positions at a time, from 0, in order) is
// the same context, bit for bit, as one read of [0, n): the context the
// model's own caches get (fill_model), which the modes of a benchmark share.
KvReader SyntheticFill::reader() const {
  struct Topics {
    std::mutex mu;
    std::map<int, std::pair<int64_t, std::vector<std::vector<float>>>> next;  // layer -> (next t0, per head)
  };
  auto topics = std::make_shared<Topics>();
  return [this, topics](int layer, int64_t t0, int64_t m, std::vector<float>& k, std::vector<float>& v) {
    TOPKV_CHECK(t0 >= 0 && m >= 0 && t0 + m <= n_, "internal: positions {}..{} of a synthetic context of {}", t0,
                t0 + m, n_);
    std::vector<std::vector<float>> state;
    {
      std::lock_guard<std::mutex> lock(topics->mu);
      const auto it = topics->next.find(layer);
      const int64_t at = it == topics->next.end() ? 0 : it->second.first;
      TOPKV_CHECK(t0 == 0 || (t0 == at && t0 % kSyntheticSuperBlock == 0), "internal: a synthetic layer is read "
                  "from 0 in pieces that continue each other at multiples of {} (layer {} at {}, its last read "
                  "ended at {})", kSyntheticSuperBlock, layer, t0, at);
      if (t0 > 0) state = std::move(it->second.second);
      if (it != topics->next.end()) topics->next.erase(it);
    }
    read(layer, t0, m, k, v, &state);
    std::lock_guard<std::mutex> lock(topics->mu);
    topics->next[layer] = {t0 + m, std::move(state)};
  };
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
