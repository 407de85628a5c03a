#include "src/model/model_config.h"

#include <cmath>
#include <fmt/format.h>

#include "src/common/error.h"

namespace topkv {

const char* arch_name(Arch a) { return a == Arch::Gemma3 ? "gemma3" : a == Arch::Qwen2 ? "qwen2" : "llama"; }

namespace {

// Rope scaling as llama.cpp reads it: "none" or "linear" (positions divided by
// the factor). YaRN and friends change the attention math and are refused.
float rope_freq_scale(const GgufFile& f, const std::string& a) {
  const std::string type = f.get_str_or(a + ".rope.scaling.type", "none");
  if (type == "none") return 1.f;
  if (type == "linear") {
    const float factor = f.get_f32(a + ".rope.scaling.factor");
    TOPKV_CHECK(std::isfinite(factor) && factor > 0.f, "{}: {}.rope.scaling.factor must be a finite number > 0, "
                "got {}", f.path(), a, factor);
    return 1.f / factor;
  }
  fail("{}: RoPE scaling '{}' is not supported (topkv supports none and linear)", f.path(), type);
}

void read_common(const GgufFile& f, const std::string& a, ModelConfig& c) {
  c.n_embd = (int)f.get_u32(a + ".embedding_length");
  c.n_layer = (int)f.get_u32(a + ".block_count");
  c.n_ff = (int)f.get_u32(a + ".feed_forward_length");
  c.n_head = (int)f.get_u32(a + ".attention.head_count");
  c.n_head_kv = (int)f.get_u32_or(a + ".attention.head_count_kv", (uint32_t)c.n_head);
  c.n_ctx_train = (int64_t)f.get_u32(a + ".context_length");
  c.rms_eps = f.get_f32(a + ".attention.layer_norm_rms_epsilon");
  TOPKV_CHECK(c.n_embd > 0 && c.n_layer > 0 && c.n_ff > 0 && c.n_head > 0 && c.n_ctx_train > 0,
              "{}: {}.embedding_length, .block_count, .feed_forward_length, .attention.head_count and "
              ".context_length must all be positive", f.path(), a);
  // Every block has at least its attention and FFN weights: a block count
  // past the file's tensors is a corrupt header, not a model to allocate for.
  TOPKV_CHECK((uint64_t)c.n_layer <= f.tensors().size(), "{}: {}.block_count = {} but the file holds only {} "
              "tensors: the header is corrupt (re-download or re-convert the model)", f.path(), a, c.n_layer,
              f.tensors().size());
  TOPKV_CHECK(c.n_head <= c.n_embd && c.n_head_kv <= c.n_head, "{}: {} query heads / {} KV heads do not fit a width "
              "of {}: the header is corrupt", f.path(), c.n_head, c.n_head_kv, c.n_embd);
  TOPKV_CHECK(c.n_head_kv > 0 && c.n_head % c.n_head_kv == 0,
              "{}: {} query heads cannot be grouped over {} KV heads ({}.attention.head_count_kv)", f.path(),
              c.n_head, c.n_head_kv, a);
  c.head_dim = (int)f.get_u32_or(a + ".attention.key_length", (uint32_t)(c.n_embd / c.n_head));
  const int v_dim = (int)f.get_u32_or(a + ".attention.value_length", (uint32_t)c.head_dim);
  TOPKV_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "{}: head dimension {} must be even and positive",
              f.path(), c.head_dim);
  TOPKV_CHECK(v_dim == c.head_dim, "{}: key_length {} != value_length {}; topkv needs them equal", f.path(),
              c.head_dim, v_dim);
  TOPKV_CHECK(c.head_dim <= 4096, "{}: head dimension {} is past the 4096 topkv supports (a corrupt header?)",
              f.path(), c.head_dim);
  TOPKV_CHECK(c.rms_eps > 0.f && c.rms_eps < 1.f, "{}: {}.attention.layer_norm_rms_epsilon = {} is not a "
              "plausible epsilon", f.path(), a, c.rms_eps);
}

void read_llama(const GgufFile& f, ModelConfig& c) {
  read_common(f, "llama", c);
  RopeParams rope;
  rope.style = RopeStyle::Interleaved;
  rope.n_rot = (int)f.get_u32_or("llama.rope.dimension_count", (uint32_t)c.head_dim);
  rope.base = f.get_f32_or("llama.rope.freq_base", 10000.f);
  rope.freq_scale = rope_freq_scale(f, "llama");
  TOPKV_CHECK(rope.n_rot > 0 && rope.n_rot % 2 == 0 && rope.n_rot <= c.head_dim,
              "{}: llama.rope.dimension_count = {} must be even and at most the head dimension {}", f.path(),
              rope.n_rot, c.head_dim);
  c.attn_scale = 1.f / std::sqrt((float)c.head_dim);
  c.glu = GluKind::SiLU;
  c.layers.assign(c.n_layer, LayerConfig{false, 0, rope});
  if (const GgufTensor* rf = f.find("rope_freqs.weight")) {
    TOPKV_CHECK(rf->type == GgmlType::F32 && rf->nelements() == rope.n_rot / 2,
                "{}: rope_freqs.weight must be F32 with {} values (n_rot/2), found {} {}", f.path(),
                rope.n_rot / 2, ggml_type_name((uint32_t)rf->type), rf->shape_string());
    for (auto& l : c.layers) l.rope.freq_factors = reinterpret_cast<const float*>(rf->data);
  }
}

// Qwen2 (llama.cpp LLM_ARCH_QWEN2): the llama block with a bias on the q, k
// and v projections, RoPE in NeoX pairing (llama.cpp LLAMA_ROPE_TYPE_NEOX:
// convert_hf_to_gguf does not permute qwen2's q/k), base from the file (1e6 for
// Qwen2.5), SiLU GLU, output tied to token_embd when output.weight is absent.
void read_qwen2(const GgufFile& f, ModelConfig& c) {
  read_common(f, "qwen2", c);
  RopeParams rope;
  rope.style = RopeStyle::NeoX;
  rope.n_rot = (int)f.get_u32_or("qwen2.rope.dimension_count", (uint32_t)c.head_dim);
  rope.base = f.get_f32_or("qwen2.rope.freq_base", 10000.f);
  rope.freq_scale = rope_freq_scale(f, "qwen2");
  TOPKV_CHECK(rope.n_rot > 0 && rope.n_rot % 2 == 0 && rope.n_rot <= c.head_dim,
              "{}: qwen2.rope.dimension_count = {} must be even and at most the head dimension {}", f.path(),
              rope.n_rot, c.head_dim);
  TOPKV_CHECK(std::isfinite(rope.base) && rope.base > 1.f, "{}: qwen2.rope.freq_base = {} is not a usable RoPE base",
              f.path(), rope.base);
  c.attn_scale = 1.f / std::sqrt((float)c.head_dim);
  c.glu = GluKind::SiLU;
  c.qkv_bias = true;
  c.layers.assign(c.n_layer, LayerConfig{false, 0, rope});
}

// Which layers are local. The real files carry no key (llama.cpp hard-codes
// every 6th layer global); newer llama.cpp architectures, and topkv's
// synthetic models, write `attention.sliding_window_pattern` either as one
// bool per layer (true = sliding) or as the period n (layer il global when
// (il + 1) % n == 0).
std::vector<bool> gemma3_sliding_layers(const GgufFile& f, int n_layer) {
  const std::string key = "gemma3.attention.sliding_window_pattern";
  std::vector<bool> sliding(n_layer);
  const GgufKV* kv = f.find_kv(key);
  if (kv && kv->type == GgufType::ARR) {
    TOPKV_CHECK(kv->arr_count == (uint64_t)n_layer && (kv->arr_type == GgufType::BOOL || kv->arr_type == GgufType::U8 ||
                                                       kv->arr_type == GgufType::I8),
                "{}: {} must hold one bool per layer ({}), found {} elements of {}", f.path(), key, n_layer,
                kv->arr_count, gguf_type_name(kv->arr_type));
    for (int il = 0; il < n_layer; ++il) sliding[il] = kv->arr_data[il] != 0;
    return sliding;
  }
  const uint32_t period = kv ? f.get_u32(key) : 6;
  TOPKV_CHECK(period > 0, "{}: {} must be positive", f.path(), key);
  for (int il = 0; il < n_layer; ++il) sliding[il] = (il + 1) % period != 0;
  return sliding;
}

void read_gemma3(const GgufFile& f, ModelConfig& c) {
  read_common(f, "gemma3", c);
  const int64_t window = (int64_t)f.get_u32("gemma3.attention.sliding_window");
  TOPKV_CHECK(window > 0, "{}: gemma3.attention.sliding_window must be positive", f.path());
  // Gemma 3: five local (sliding-window, RoPE base 1e4) layers, then one
  // global layer (base from the file, 1e6, and the file's RoPE scaling);
  // llama.cpp set_swa_pattern(6), rope_freq_base_train_swa = 10000, both
  // overridable by keys (gemma3_sliding_layers, rope.freq_base_swa).
  RopeParams global;
  global.style = RopeStyle::NeoX;
  global.n_rot = (int)f.get_u32_or("gemma3.rope.dimension_count", (uint32_t)c.head_dim);
  TOPKV_CHECK(global.n_rot == c.head_dim, "{}: gemma3 rotates the whole head ({}), rope.dimension_count is {}",
              f.path(), c.head_dim, global.n_rot);
  global.base = f.get_f32_or("gemma3.rope.freq_base", 1e6f);
  global.freq_scale = rope_freq_scale(f, "gemma3");
  RopeParams local = global;
  local.base = f.get_f32_or("gemma3.rope.freq_base_swa", 10000.f);
  local.freq_scale = 1.f;
  const std::vector<bool> sliding = gemma3_sliding_layers(f, c.n_layer);
  c.layers.resize(c.n_layer);
  for (int il = 0; il < c.n_layer; ++il)
    c.layers[il] = LayerConfig{sliding[il], sliding[il] ? window : 0, sliding[il] ? local : global};
  // Scores are scaled by query_pre_attn_scalar^-1/2: head_dim for every size
  // but 27B (62 layers), where it is n_embd / n_head (gemma_pytorch config.py,
  // as llama.cpp does).
  c.attn_scale = c.n_layer == 62 ? 1.f / std::sqrt((float)c.n_embd / (float)c.n_head)
                                 : 1.f / std::sqrt((float)c.head_dim);
  c.embed_scale = std::sqrt((float)c.n_embd);
  c.qk_norm = true;
  c.post_norms = true;
  c.glu = GluKind::GeluTanh;
}

}  // namespace

ModelConfig read_model_config(const GgufFile& f) {
  const std::string arch = f.get_str("general.architecture");
  ModelConfig c;
  if (arch == "llama") {
    c.arch = Arch::Llama;
    read_llama(f, c);
  } else if (arch == "gemma3") {
    c.arch = Arch::Gemma3;
    read_gemma3(f, c);
  } else if (arch == "qwen2") {
    c.arch = Arch::Qwen2;
    read_qwen2(f, c);
  } else {
    fail("{}: architecture '{}' is not supported; topkv runs llama, gemma3 and qwen2 models", f.path(), arch);
  }
  const GgufTensor& embd = f.tensor("token_embd.weight");
  TOPKV_CHECK(embd.n_dims == 2 && embd.ne[0] == c.n_embd,
              "{}: token_embd.weight has shape {}, expected {} x vocab", f.path(), embd.shape_string(), c.n_embd);
  c.n_vocab = embd.ne[1];
  // RoPE: a base that is NaN, 0, negative or 1 gives NaN or constant angles,
  // and the model silently produces nothing useful.
  for (int il = 0; il < c.n_layer; ++il) {
    const RopeParams& r = c.layers[(size_t)il].rope;
    TOPKV_CHECK(std::isfinite(r.base) && r.base > 1.f, "{}: layer {} has RoPE base (rope.freq_base) {}: it must be a "
                "finite number > 1 (a corrupt header?)", f.path(), il, r.base);
    TOPKV_CHECK(std::isfinite(r.freq_scale) && r.freq_scale > 0.f, "{}: layer {} has RoPE frequency scale {}: it "
                "must be a finite number > 0", f.path(), il, r.freq_scale);
  }
  return c;
}

std::string ModelConfig::summary() const {
  int n_sliding = 0;
  for (const auto& l : layers) n_sliding += l.sliding;
  std::string s = fmt::format("{}: {} layers, width {}, {} heads / {} KV heads of {}, FFN {}, vocab {}, "
                              "trained context {}", arch_name(arch), n_layer, n_embd, n_head, n_head_kv, head_dim,
                              n_ff, n_vocab, n_ctx_train);
  if (n_sliding) s += fmt::format(", {} sliding-window layers (window {})", n_sliding, layers[0].window);
  return s;
}

namespace {

const GgufTensor* find_checked(const GgufFile& f, const std::string& name, int64_t ne0, int64_t ne1,
                               bool optional = false) {
  const GgufTensor* t = f.find(name);
  if (!t) {
    if (optional) return nullptr;
    fail("{}: tensor '{}' is missing; the file is not a complete model of its architecture", f.path(), name);
  }
  const bool vec = ne1 == 0;
  const bool ok = vec ? (t->n_dims == 1 && t->ne[0] == ne0) : (t->n_dims == 2 && t->ne[0] == ne0 && t->ne[1] == ne1);
  TOPKV_CHECK(ok, "{}: tensor '{}' has shape {}, expected {} (from the file's hyperparameters)", f.path(), name,
              t->shape_string(), vec ? fmt::format("{}", ne0) : fmt::format("{} x {}", ne0, ne1));
  TOPKV_CHECK(!vec || t->type == GgmlType::F32, "{}: vector '{}' (a norm weight or bias) is {}, expected F32",
              f.path(), name, ggml_type_name((uint32_t)t->type));
  return t;
}

}  // namespace

ModelTensors find_model_tensors(const GgufFile& f, const ModelConfig& c) {
  ModelTensors m;
  const int64_t d = c.n_embd, qd = (int64_t)c.n_head * c.head_dim, kvd = (int64_t)c.n_head_kv * c.head_dim;
  m.token_embd = find_checked(f, "token_embd.weight", d, c.n_vocab);
  m.output_norm = find_checked(f, "output_norm.weight", d, 0);
  m.output = find_checked(f, "output.weight", d, c.n_vocab, /*optional=*/true);
  if (!m.output) m.output = m.token_embd;  // tied
  m.layers.resize(c.n_layer);
  for (int il = 0; il < c.n_layer; ++il) {
    const auto n = [&](const char* what) { return fmt::format("blk.{}.{}.weight", il, what); };
    LayerTensors& L = m.layers[il];
    L.attn_norm = find_checked(f, n("attn_norm"), d, 0);
    L.wq = find_checked(f, n("attn_q"), d, qd);
    L.wk = find_checked(f, n("attn_k"), d, kvd);
    L.wv = find_checked(f, n("attn_v"), d, kvd);
    L.wo = find_checked(f, n("attn_output"), qd, d);
    L.ffn_norm = find_checked(f, n("ffn_norm"), d, 0);
    L.ffn_gate = find_checked(f, n("ffn_gate"), d, c.n_ff);
    L.ffn_up = find_checked(f, n("ffn_up"), d, c.n_ff);
    L.ffn_down = find_checked(f, n("ffn_down"), c.n_ff, d);
    if (c.qk_norm) {
      L.q_norm = find_checked(f, n("attn_q_norm"), c.head_dim, 0);
      L.k_norm = find_checked(f, n("attn_k_norm"), c.head_dim, 0);
    }
    if (c.post_norms) {
      L.post_attn_norm = find_checked(f, n("post_attention_norm"), d, 0);
      L.post_ffw_norm = find_checked(f, n("post_ffw_norm"), d, 0);
    }
    if (c.qkv_bias) {
      const auto b = [&](const char* what) { return fmt::format("blk.{}.{}.bias", il, what); };
      L.bq = find_checked(f, b("attn_q"), qd, 0);
      L.bk = find_checked(f, b("attn_k"), kvd, 0);
      L.bv = find_checked(f, b("attn_v"), kvd, 0);
    }
  }
  return m;
}

Weight weight_view(const GgufTensor& t) {
  Weight w;
  w.name = t.name;
  w.type = t.type;
  w.cols = t.ne[0];
  w.rows = t.nrows();
  w.data = t.data;
  w.row_bytes = t.row_bytes;
  return w;
}

}  // namespace topkv
