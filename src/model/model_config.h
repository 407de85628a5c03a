// What a GGUF file says about the transformer in it: hyperparameters of the
// supported architectures (llama, gemma3, qwen2; docs/MODELS.md) and the weight
// tensors, found by name and checked against those hyperparameters. Both the
// fast forward pass (model.h) and the plain reference (reference.h) start here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "src/model/backend.h"
#include "src/model/gguf.h"

namespace topkv {

enum class Arch { Llama, Gemma3, Qwen2 };
const char* arch_name(Arch a);

struct LayerConfig {
  bool sliding = false;   // gemma3 local layer: attends to the last `window` tokens
  int64_t window = 0;     // 0 = the whole context
  RopeParams rope;        // freq_factors: the file's rope_freqs.weight (llama 3.1), in
                          // the mapping (valid while the GgufFile is open), or null
};

struct ModelConfig {
  Arch arch = Arch::Llama;
  int n_embd = 0, n_layer = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0;
  int64_t n_vocab = 0, n_ctx_train = 0;
  float rms_eps = 1e-5f;
  float attn_scale = 0.f;     // multiplies q.k
  float embed_scale = 1.f;    // gemma3: sqrt(n_embd)
  bool qk_norm = false;       // gemma3: RMSNorm over head_dim on q and k before RoPE
  bool post_norms = false;    // gemma3: post_attention_norm and post_ffw_norm
  bool qkv_bias = false;      // qwen2: the q, k and v projections add a bias
  GluKind glu = GluKind::SiLU;
  std::vector<LayerConfig> layers;

  std::string summary() const;  // one line for logs: "gemma3: 18 layers, 640 wide, ..."
};

// Reads and validates the hyperparameters; throws Error naming the missing or
// inconsistent key and the file.
ModelConfig read_model_config(const GgufFile& f);

// The weights of one layer (pointers into the file; null when the architecture
// does not have that tensor). Matrices are [out][in] rows (GGUF ne = {in, out}).
struct LayerTensors {
  const GgufTensor *attn_norm = nullptr, *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
  const GgufTensor *q_norm = nullptr, *k_norm = nullptr, *post_attn_norm = nullptr;
  const GgufTensor *ffn_norm = nullptr, *ffn_gate = nullptr, *ffn_up = nullptr, *ffn_down = nullptr;
  const GgufTensor* post_ffw_norm = nullptr;
  const GgufTensor *bq = nullptr, *bk = nullptr, *bv = nullptr;  // qwen2: attn_{q,k,v}.bias
};
// Fills every per-layer weight of `out` (any struct with the LayerTensors
// member names: the model's prepared weights, the reference's fp32 copies)
// as f(tensor of that name), so the list of names lives in one place.
template <class Out, class F>
void map_layer_tensors(const LayerTensors& s, Out& out, F&& f) {
  out.attn_norm = f(s.attn_norm), out.wq = f(s.wq), out.wk = f(s.wk), out.wv = f(s.wv), out.wo = f(s.wo);
  out.q_norm = f(s.q_norm), out.k_norm = f(s.k_norm), out.post_attn_norm = f(s.post_attn_norm);
  out.ffn_norm = f(s.ffn_norm), out.ffn_gate = f(s.ffn_gate), out.ffn_up = f(s.ffn_up);
  out.ffn_down = f(s.ffn_down), out.post_ffw_norm = f(s.post_ffw_norm);
  out.bq = f(s.bq), out.bk = f(s.bk), out.bv = f(s.bv);
}

struct ModelTensors {
  const GgufTensor* token_embd = nullptr;  // [vocab][n_embd]
  const GgufTensor* output_norm = nullptr;
  const GgufTensor* output = nullptr;      // [vocab][n_embd]; token_embd when tied
  std::vector<LayerTensors> layers;
};

// Finds every tensor the config needs and checks its shape and type (norms
// must be F32); throws Error naming the tensor, its shape and the expected one.
ModelTensors find_model_tensors(const GgufFile& f, const ModelConfig& c);

// A weight view of a tensor as backend.h expects it (rows = ne[1], cols = ne[0]).
Weight weight_view(const GgufTensor& t);

}  // namespace topkv
