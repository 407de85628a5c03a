// Synthetic llama / gemma3 / qwen2 GGUF files (see synth.h).
#include "src/model/synth.h"

#include <cmath>
#include <vector>

#include "src/common/error.h"
#include "src/model/gguf_writer.h"

namespace topkv {

SynthConfig synth_defaults(std::string_view arch) {
  SynthConfig c;
  if (arch == "llama") return c;
  if (arch == "qwen2") {
    c.arch = "qwen2";
    c.rope_base = 1e6f;
    c.norm_eps = 1e-6f;
    return c;
  }
  TOPKV_CHECK(arch == "gemma3", "unknown architecture '{}'; synthetic models are 'llama', 'gemma3' or 'qwen2'",
              arch);
  c.arch = "gemma3";
  c.kv_heads = 1;
  c.rope_base = 1e6f;
  c.rope_base_local = 1e4f;
  c.norm_eps = 1e-6f;
  c.tied_output = true;
  return c;
}

std::vector<std::string> synth_preset_names() {
  return {"llama3-8b", "gemma3-270m", "qwen2.5-0.5b", "qwen2.5-1.5b", "tiny-llama", "tiny-gemma3", "tiny-qwen2"};
}

SynthConfig synth_preset(std::string_view name) {
  SynthConfig c;
  if (name == "llama3-8b") {
    c = synth_defaults("llama");
    c.layers = 32, c.width = 4096, c.heads = 32, c.kv_heads = 8, c.head_dim = 128, c.ffn = 14336;
    c.vocab = 128256, c.context = 8192, c.rope_base = 500000.f, c.type = GgmlType::Q4_K;
  } else if (name == "gemma3-270m") {
    c = synth_defaults("gemma3");
    c.layers = 18, c.width = 640, c.heads = 4, c.kv_heads = 1, c.head_dim = 256, c.ffn = 2048;
    c.vocab = 262144, c.context = 32768, c.sliding_window = 512, c.type = GgmlType::Q8_0;
  } else if (name == "qwen2.5-0.5b") {
    c = synth_defaults("qwen2");
    c.layers = 24, c.width = 896, c.heads = 14, c.kv_heads = 2, c.head_dim = 64, c.ffn = 4864;
    c.vocab = 151936, c.context = 32768, c.type = GgmlType::Q4_K;
  } else if (name == "qwen2.5-1.5b") {
    c = synth_defaults("qwen2");
    c.layers = 28, c.width = 1536, c.heads = 12, c.kv_heads = 2, c.head_dim = 128, c.ffn = 8960;
    c.vocab = 151936, c.context = 32768, c.type = GgmlType::Q4_K;
  } else if (name == "tiny-qwen2") {
    c = synth_defaults("qwen2");
    c.layers = 2, c.width = 128, c.heads = 7, c.kv_heads = 1, c.head_dim = 32, c.ffn = 256, c.vocab = 1024;
  } else if (name == "tiny-llama") {
    c = synth_defaults("llama");
    c.layers = 2, c.width = 128, c.heads = 4, c.kv_heads = 2, c.head_dim = 32, c.ffn = 256, c.vocab = 1024;
  } else if (name == "tiny-gemma3") {
    c = synth_defaults("gemma3");
    c.layers = 6, c.width = 128, c.heads = 2, c.kv_heads = 1, c.head_dim = 64, c.ffn = 256, c.vocab = 1024;
    c.sliding_window = 16, c.global_every = 3;
  } else {
    std::string names;
    for (auto& n : synth_preset_names()) names += (names.empty() ? "" : ", ") + n;
    fail("unknown preset '{}' (presets: {})", name, names);
  }
  return c;
}

GgmlType synth_matrix_type(GgmlType type, int64_t ne0) {
  if (ne0 % 256 == 0) return type;
  switch (type) {
    case GgmlType::Q4_K: return GgmlType::Q5_0;
    case GgmlType::Q5_K: return GgmlType::Q5_1;
    case GgmlType::Q6_K: return GgmlType::Q8_0;
    default: return type;
  }
}

void synth_validate(const SynthConfig& c) {
  TOPKV_CHECK(c.arch == "llama" || c.arch == "gemma3" || c.arch == "qwen2",
              "--arch '{}' is not supported (llama, gemma3 or qwen2)", c.arch);
  auto positive = [](int v, const char* flag, int hi) {
    TOPKV_CHECK(v >= 1 && v <= hi, "{} {} is out of range (1 to {})", flag, v, hi);
  };
  positive(c.layers, "--layers", 1024);
  positive(c.width, "--width", 1 << 16);
  positive(c.heads, "--heads", 1024);
  positive(c.kv_heads, "--kv-heads", 1024);
  positive(c.head_dim, "--head-dim", 4096);
  positive(c.ffn, "--ffn", 1 << 18);
  positive(c.context, "--context", 1 << 30);
  positive(c.vocab, "--vocab", 1 << 24);
  TOPKV_CHECK(c.heads % c.kv_heads == 0, "--heads {} is not a multiple of --kv-heads {} (GQA groups query heads "
              "evenly over KV heads)", c.heads, c.kv_heads);
  TOPKV_CHECK(c.head_dim % 2 == 0, "--head-dim {} must be even (RoPE rotates pairs)", c.head_dim);
  TOPKV_CHECK(c.vocab >= synth_min_vocab(c.arch), "--vocab {} is too small: a synthetic {} vocabulary needs at "
              "least {} tokens (special tokens, 256 byte tokens, characters)", c.vocab, c.arch,
              synth_min_vocab(c.arch));
  TOPKV_CHECK(c.rope_base > 0 && std::isfinite(c.rope_base), "--rope-base must be positive");
  TOPKV_CHECK(c.rope_base_local > 0 && std::isfinite(c.rope_base_local), "--rope-base-local must be positive");
  TOPKV_CHECK(c.norm_eps > 0, "the norm epsilon must be positive");
  if (c.arch == "gemma3") {
    positive(c.sliding_window, "--sliding-window", 1 << 30);
    positive(c.global_every, "--global-every", 1024);
  }
  // every matrix row (ne[0]) must hold whole blocks of its type
  struct { int64_t ne0; const char* flag; } rows[] = {
      {c.width, "--width"}, {(int64_t)c.heads * c.head_dim, "--heads x --head-dim"}, {c.ffn, "--ffn"}};
  for (auto& r : rows) {
    GgmlType t = synth_matrix_type(c.type, r.ne0);
    GgmlTypeInfo ti = ggml_type_info(t);
    TOPKV_CHECK(r.ne0 % ti.block_elems == 0, "{} = {} is not a multiple of {}, the block size of {}; choose a "
                "multiple or another --type (f32, f16 and bf16 take any size)", r.flag, r.ne0, ti.block_elems,
                ti.name);
  }
}

namespace {

enum class Init { Matrix, Norm, Bias };
struct TensorSpec {
  std::string name;
  int64_t ne0, ne1;  // ne1 = 0 for a vector
  Init init;
};

std::vector<TensorSpec> tensor_specs(const SynthConfig& c) {
  const int64_t w = c.width, q = (int64_t)c.heads * c.head_dim, kv = (int64_t)c.kv_heads * c.head_dim;
  std::vector<TensorSpec> s;
  s.push_back({"token_embd.weight", w, c.vocab, Init::Matrix});
  s.push_back({"output_norm.weight", w, 0, Init::Norm});
  const bool gemma = c.arch == "gemma3";
  if (!gemma && !c.tied_output) s.push_back({"output.weight", w, c.vocab, Init::Matrix});
  for (int l = 0; l < c.layers; ++l) {
    auto n = [l](const char* what) { return fmt::format("blk.{}.{}.weight", l, what); };
    s.push_back({n("attn_norm"), w, 0, Init::Norm});
    s.push_back({n("attn_q"), w, q, Init::Matrix});
    s.push_back({n("attn_k"), w, kv, Init::Matrix});
    s.push_back({n("attn_v"), w, kv, Init::Matrix});
    if (c.arch == "qwen2") {
      auto b = [l](const char* what) { return fmt::format("blk.{}.{}.bias", l, what); };
      s.push_back({b("attn_q"), q, 0, Init::Bias});
      s.push_back({b("attn_k"), kv, 0, Init::Bias});
      s.push_back({b("attn_v"), kv, 0, Init::Bias});
    }
    if (gemma) {
      s.push_back({n("attn_q_norm"), c.head_dim, 0, Init::Norm});
      s.push_back({n("attn_k_norm"), c.head_dim, 0, Init::Norm});
    }
    s.push_back({n("attn_output"), q, w, Init::Matrix});
    if (gemma) s.push_back({n("post_attention_norm"), w, 0, Init::Norm});
    s.push_back({n("ffn_norm"), w, 0, Init::Norm});
    s.push_back({n("ffn_gate"), w, c.ffn, Init::Matrix});
    s.push_back({n("ffn_up"), w, c.ffn, Init::Matrix});
    s.push_back({n("ffn_down"), c.ffn, w, Init::Matrix});
    if (gemma) s.push_back({n("post_ffw_norm"), w, 0, Init::Norm});
  }
  return s;
}

GgmlType spec_type(const SynthConfig& c, const TensorSpec& t) {
  return t.init == Init::Matrix ? synth_matrix_type(c.type, t.ne0) : GgmlType::F32;
}

// Counter-based generator (SplitMix64 finaliser): one independent stream per
// (seed, tensor, row), so rows can be generated in any order or in parallel.
uint64_t mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// n approximately standard normal values: the sum of four 16-bit uniforms
// (Irwin-Hall, mean 2, variance 1/3) centred and scaled to unit variance.
// Tails end at +-3.46 sigma, which is all random weights need.
void normal_row(uint64_t stream, float* out, int64_t n) {
  const float k = std::sqrt(3.f) / 65536.f;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t r = mix(stream + (uint64_t)i);
    float s = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) + (float)(r >> 48);
    out[i] = (s - 2.f * 65535.5f) * k;
  }
}

// llama.cpp's general.file_type (llama_ftype) for the main weight type.
uint32_t file_type(GgmlType t) {
  switch (t) {
    case GgmlType::F32: return 0;
    case GgmlType::F16: return 1;
    case GgmlType::Q4_0: return 2;
    case GgmlType::Q4_1: return 3;
    case GgmlType::Q8_0: return 7;
    case GgmlType::Q5_0: return 8;
    case GgmlType::Q5_1: return 9;
    case GgmlType::Q4_K: return 15;  // Q4_K_M
    case GgmlType::Q5_K: return 17;  // Q5_K_M
    case GgmlType::Q6_K: return 18;
    case GgmlType::BF16: return 32;
  }
  return 0;
}

void write_metadata(GgufWriter& w, const SynthConfig& c, const SynthVocab& v) {
  const std::string a = c.arch;
  auto k = [&](const char* key) { return a + "." + key; };
  w.set_str("general.architecture", a);
  w.set_str("general.name", fmt::format("topkv synthetic {} {}x{}", a, c.layers, c.width));
  w.set_str("general.description", fmt::format("random weights written by topkv model synth (seed {})", c.seed));
  w.set_u32("general.file_type", file_type(c.type));
  w.set_u32("general.quantization_version", 2);
  w.set_u32(k("context_length"), (uint32_t)c.context);
  w.set_u32(k("embedding_length"), (uint32_t)c.width);
  w.set_u32(k("block_count"), (uint32_t)c.layers);
  w.set_u32(k("feed_forward_length"), (uint32_t)c.ffn);
  w.set_u32(k("attention.head_count"), (uint32_t)c.heads);
  w.set_u32(k("attention.head_count_kv"), (uint32_t)c.kv_heads);
  w.set_u32(k("attention.key_length"), (uint32_t)c.head_dim);
  w.set_u32(k("attention.value_length"), (uint32_t)c.head_dim);
  w.set_f32(k("attention.layer_norm_rms_epsilon"), c.norm_eps);
  w.set_f32(k("rope.freq_base"), c.rope_base);
  if (a == "llama" || a == "qwen2") {
    w.set_u32(k("rope.dimension_count"), (uint32_t)c.head_dim);
    if (a == "llama") w.set_u32(k("vocab_size"), (uint32_t)c.vocab);
  } else {
    w.set_u32(k("attention.sliding_window"), (uint32_t)c.sliding_window);
    // Not in the real Gemma 3 file (llama.cpp hard-codes 10000 and "every 6th
    // layer global" for gemma3); written here under the keys newer llama.cpp
    // architectures use, so non-default values survive: a reader should
    // default to 10000 and to the pattern of 6 when they are absent.
    w.set_f32(k("rope.freq_base_swa"), c.rope_base_local);
    std::vector<uint8_t> sliding(c.layers);
    for (int l = 0; l < c.layers; ++l) sliding[l] = (l + 1) % c.global_every != 0;  // true = local layer
    w.set_arr(k("attention.sliding_window_pattern"), GgufType::BOOL, sliding.data(), sliding.size());
  }
  w.set_str("tokenizer.ggml.model", "llama");
  w.set_str("tokenizer.ggml.pre", "default");
  w.set_arr_str("tokenizer.ggml.tokens", v.tokens);
  w.set_arr_f32("tokenizer.ggml.scores", v.scores);
  w.set_arr_i32("tokenizer.ggml.token_type", v.types);
  w.set_u32("tokenizer.ggml.bos_token_id", (uint32_t)v.bos);
  w.set_u32("tokenizer.ggml.eos_token_id", (uint32_t)v.eos);
  w.set_u32("tokenizer.ggml.unknown_token_id", (uint32_t)v.unk);
  if (v.pad >= 0) w.set_u32("tokenizer.ggml.padding_token_id", (uint32_t)v.pad);
  w.set_bool("tokenizer.ggml.add_bos_token", true);
  w.set_bool("tokenizer.ggml.add_eos_token", false);
  w.set_bool("tokenizer.ggml.add_space_prefix", a == "llama");  // as the real files do
}

}  // namespace

uint64_t synth_file_bytes(const SynthConfig& c) {
  uint64_t bytes = 0;
  for (auto& t : tensor_specs(c)) bytes += ggml_row_bytes(spec_type(c, t), t.ne0) * (uint64_t)std::max<int64_t>(t.ne1, 1);
  return bytes + (uint64_t)c.vocab * 24;  // tokens, scores, types
}

void synth_write(const SynthConfig& c, const std::string& path, bool progress) {
  synth_validate(c);
  GgufWriter w;
  write_metadata(w, c, synth_vocab(c.arch, c.vocab));
  auto specs = tensor_specs(c);
  for (size_t ti = 0; ti < specs.size(); ++ti) {
    const TensorSpec& t = specs[ti];
    const GgmlType type = spec_type(c, t);
    const size_t row_bytes = ggml_row_bytes(type, t.ne0);
    const uint64_t tensor_stream = mix(c.seed * 0x2545f4914f6cdd1dull + ti) << 24;
    const float scale = t.init == Init::Norm ? 0.05f : t.init == Init::Bias ? 0.5f : 1.f / std::sqrt((float)t.ne0);
    const float offset = t.init == Init::Norm ? 1.f : 0.f;
    const int64_t ne0 = t.ne0;
    auto fill = [=](int64_t r0, int64_t nr, uint8_t* dst) {
#pragma omp parallel
      {
        std::vector<float> row(ne0);
#pragma omp for schedule(static)
        for (int64_t r = 0; r < nr; ++r) {
          normal_row(mix(tensor_stream + (uint64_t)(r0 + r)) , row.data(), ne0);
          for (auto& x : row) x = offset + scale * x;
          quantize_row(type, row.data(), dst + r * row_bytes, ne0);
        }
      }
    };
    std::vector<int64_t> ne = {t.ne0};
    if (t.ne1) ne.push_back(t.ne1);
    w.add_tensor(t.name, type, ne, fill);
  }
  w.write(path, progress);
}

}  // namespace topkv
