// A seam in the forward pass: the attention of some layers can be served by
// something other than the model's own KV cache — the offloaded top-k
// runtime (offload/offload_runtime.h) takes the retrieval layers at decode.
// The model still runs prefill attention densely with its own cache; once the
// prompt is in, the override takes the layers' keys and values from it.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "src/common/error.h"

namespace topkv {

class Model;

// Any source of a context's keys and values: read(model_layer, t0, m, k, v)
// fills k and v with fp32 [n_head_kv][m][head_dim] (post-RoPE keys) of
// positions [t0, t0 + m) of that layer — Model::read_kv after a prefill, or
// synthetic data (bench/synthetic_fill.h). Overrides take their context
// through it (take_context) in pieces of positions, so a layer of a 1M
// context is never copied whole (8 GiB of fp32 at the Llama-3-8B geometry),
// and every fill path works for each of them. It may be called for several
// layers at once from different threads.
using KvReader = std::function<void(int layer, int64_t t0, int64_t m, std::vector<float>& k, std::vector<float>& v)>;
// The positions an override's take_context reads at a time (the last piece
// may be shorter): 512 MiB of fp32 K and V at the Llama-3-8B geometry. A
// multiple of the synthetic generator's super-block, whose pieces then
// continue each other bit for bit (bench/synthetic.h).
inline constexpr int64_t kContextPiece = 65536;
// read(layer, t0, m, k, v), checked to give `values_per_position` (KV heads x
// head_dim) values a position in each of k and v.
inline void read_positions(const KvReader& read, int layer, int64_t t0, int64_t m, size_t values_per_position,
                           std::vector<float>& k, std::vector<float>& v) {
  read(layer, t0, m, k, v);
  TOPKV_CHECK(k.size() == values_per_position * (size_t)m && v.size() == k.size(),
              "internal: positions {}..{} of layer {} came as {} key and {} value numbers, expected {} each", t0,
              t0 + m, layer, k.size(), v.size(), values_per_position * (size_t)m);
}

class AttentionOverride {
 public:
  virtual ~AttentionOverride() = default;
  // True when decode attention of `layer` is served here.
  virtual bool overrides(int layer) const = 0;
  // Called once after the prompt is prefilled: copy what is needed from the
  // model's caches (Model::read_kv) before they are reused.
  virtual void take_prefill(const Model& model) = 0;
  // Decode of one token at position `pos` on an overridden layer. q: [n_head][head_dim],
  // k, v: [n_head_kv][head_dim] (post-norm, post-RoPE); out: [n_head][head_dim].
  // Host memory.
  virtual void decode_attention(int layer, const float* q, const float* k, const float* v, int64_t pos,
                                float scale, float* out) = 0;
  // An override that runs on the model's backend (the CUDA offload runtime)
  // says so here; the model then calls decode_attention_device with q, k, v
  // and out in backend memory (device memory on a CUDA backend, same layouts)
  // instead of staging them through the host.
  virtual bool on_device() const { return false; }
  virtual void decode_attention_device(int layer, const float* q, const float* k, const float* v, int64_t pos,
                                       float scale, float* out) {
    (void)layer, (void)q, (void)k, (void)v, (void)pos, (void)scale, (void)out;
  }
};

}  // namespace topkv
