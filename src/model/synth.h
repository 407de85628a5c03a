// Synthetic GGUF models: random weights in the exact tensor names, shapes and
// metadata keys of a real `llama`, `gemma3` or `qwen2` file (docs/MODELS.md), plus a
// small SentencePiece-style vocabulary, so the tokenizer, the forward pass and
// the long-context machinery can be tested at any geometry without
// downloading a model.
//
// Weights: N(0, 1/fan_in) approximations (fan_in = ne[0], the input width of
// the matrix), so every projection roughly preserves the activation scale and
// activations stay finite over many layers; norm weights are 1 + N(0, 0.05)
// (Gemma 3 GGUF norms already include Gemma's "+1", so the file stores values
// near 1 for both architectures). Random values come from a counter-based
// generator keyed by (seed, tensor, row): the file is the same whatever the
// thread count.
//
// llama q/k weights: real llama GGUFs store attn_q/attn_k permuted for the
// interleaved RoPE pairing llama.cpp uses. For random weights the permutation
// is meaningless, so none is applied; a forward pass must still use the
// interleaved pairing for `llama` and NeoX pairing for `gemma3` and `qwen2`.
//
// qwen2: the llama tensors plus blk.N.attn_{q,k,v}.bias (N(0, 0.5^2): large
// enough that a forward pass which drops them fails its test). The vocabulary
// stays the SentencePiece-style one below (a real qwen2 file carries a
// byte-level BPE vocabulary; the synthetic file exercises the model, not the
// tokenizer).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "src/model/ggml_types.h"

namespace topkv {

struct SynthConfig {
  std::string arch = "llama";  // "llama" | "gemma3" | "qwen2"
  int layers = 2;
  int width = 256;             // embedding_length
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 64;
  int ffn = 512;               // feed_forward_length
  int vocab = 1024;
  int context = 4096;          // context_length
  int sliding_window = 512;    // gemma3: local layers' window
  int global_every = 6;        // gemma3: layer i is global when (i + 1) % global_every == 0
  float rope_base = 10000.f;   // llama: the RoPE base; gemma3: the global layers' base
  float rope_base_local = 10000.f;  // gemma3: the local (sliding-window) layers' base
  float norm_eps = 1e-5f;
  bool tied_output = false;    // llama, qwen2: no output.weight (gemma3 is always tied)
  GgmlType type = GgmlType::F32;  // weight type of the matrices and token_embd
  uint64_t seed = 1;
};

// Defaults for an architecture ("llama": eps 1e-5, rope 1e4; "gemma3": eps
// 1e-6, rope 1e6 global / 1e4 local, window 512, tied output; "qwen2": eps
// 1e-6, rope 1e6). Throws Error for another name.
SynthConfig synth_defaults(std::string_view arch);
// Named geometries: "llama3-8b" (Llama-3-8B shape, 32 x 4096, 32/8 heads of
// 128, FFN 14336, vocab 128256, rope 5e5, Q4_K), "gemma3-270m" (the real
// model's shape, Q8_0 since its width 640 is not a multiple of 256),
// "qwen2.5-0.5b" and "qwen2.5-1.5b" (the Qwen2.5(-Coder) shapes, Q4_K with
// llama.cpp's fallbacks), "tiny-llama", "tiny-gemma3", "tiny-qwen2" (a few MB,
// for tests; tiny-qwen2 groups 7 query heads per KV head as Qwen2.5-0.5B
// does). Throws Error naming the presets.
SynthConfig synth_preset(std::string_view name);
std::vector<std::string> synth_preset_names();

// Checks the geometry (positive sizes, heads divisible by kv_heads, vocab
// large enough for the special and byte tokens, rows a multiple of the block
// size of the chosen type); throws Error saying which flag is wrong.
void synth_validate(const SynthConfig& c);
// The type a matrix with rows of ne0 elements gets: `type`, or for a K-quant
// and ne0 not a multiple of 256, the fallback llama.cpp uses (Q4_K -> Q5_0,
// Q5_K -> Q5_1, Q6_K -> Q8_0).
GgmlType synth_matrix_type(GgmlType type, int64_t ne0);

struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
  int32_t bos = 0, eos = 0, unk = 0, pad = -1;
};
// SentencePiece-style vocabulary of exactly `size` tokens for `arch`:
// special tokens (llama: <unk> <s> </s>; gemma3: <pad> <eos> <bos> <unk>
// <mask> [multimodal] <unused..> and <start_of_turn>=105, <end_of_turn>=106
// as in the real file), the 256 byte tokens <0x00>..<0xFF>, single characters,
// then "▁word" pieces of common English words with every prefix present (so
// score-ordered pair merging builds whole words), then letter n-grams to fill.
// Scores rank pieces by the order added (earlier = more frequent = higher).
SynthVocab synth_vocab(std::string_view arch, int size);
int synth_min_vocab(std::string_view arch);

// Estimated file size in bytes.
uint64_t synth_file_bytes(const SynthConfig& c);
// Writes the model (atomically: path.tmp then rename). `progress` draws a bar.
void synth_write(const SynthConfig& c, const std::string& path, bool progress = false);

}  // namespace topkv
