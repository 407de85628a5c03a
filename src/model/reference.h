// The plain reference beside the fast path (llm.c style): every op as the
// obvious loop with double accumulators, and a whole-model forward that runs
// one token at a time over fp32 copies of the weights, keeps every past K and
// V, and recomputes attention over all of them with no cache, ring or chunk.
// Tests compare the CPU backend ops and Model against these. Slow by design;
// use on small models only.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "src/model/backend.h"
#include "src/model/gguf.h"
#include "src/model/model_config.h"

namespace topkv::ref {

// Same contracts as the Backend ops of the same names (backend.h), with plain
// host arrays and fp32 weights ([rows][cols] row-major).
void rms_norm(const float* x, const float* w, int64_t rows, int dim, float eps, float* out);
void rope(float* x, int T, int n_heads, int head_dim, int64_t pos0, const RopeParams& p);
void matmul(const float* x, const float* w, int64_t rows, int64_t cols, int T, float* y);
void glu(GluKind kind, const float* gate, const float* up, int64_t n, float* out);
// Attention of one query token q[n_head][hd] over n keys/values k, v
// [n][n_kv][hd] (oldest first): out[n_head][hd].
void attention(const float* q, int n_head, int n_kv, int hd, const float* k, const float* v, int64_t n,
               float scale, float* out);

class ReferenceModel {
 public:
  explicit ReferenceModel(const GgufFile& f);  // dequantises every weight to fp32
  const ModelConfig& config() const { return cfg_; }
  // Appends `token` at the next position; returns its logits [n_vocab].
  std::vector<float> forward(int32_t token);

 private:
  struct Layer {
    std::vector<float> attn_norm, wq, wk, wv, wo, q_norm, k_norm, post_attn_norm;
    std::vector<float> ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffw_norm;
    std::vector<float> bq, bk, bv;    // qwen2 (empty otherwise)
    std::vector<float> keys, values;  // [pos][n_kv][hd], every position so far
  };
  ModelConfig cfg_;
  std::vector<float> token_embd_, output_norm_, output_;
  std::vector<Layer> layers_;
  int64_t pos_ = 0;
};

}  // namespace topkv::ref
