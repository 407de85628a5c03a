// load_vocab: the tokenizer.* metadata of a GGUF file (keys as written by
// llama.cpp's convert_hf_to_gguf.py; MODELS.md "Tokenizer"). Every key that
// is missing, of the wrong type or inconsistent is an Error naming the key
// and the file.
#include "src/common/error.h"
#include "src/model/gguf.h"
#include "src/model/tokenizer.h"

namespace topkv {

namespace {

// A special token id: -1 when the key is absent (or holds -1).
int32_t token_id(const GgufFile& f, const char* key, size_t n_tokens) {
  if (!f.has(key)) return -1;
  const int32_t id = f.get_i32(key);
  TOPKV_CHECK(id >= -1 && (size_t)(id + 1) <= n_tokens,
              "model '{}': {} = {} is outside the vocabulary of {} tokens (tokenizer.ggml.tokens); the GGUF is "
              "inconsistent",
              f.path(), key, id, n_tokens);
  return id;
}

}  // namespace

Vocab load_vocab(const GgufFile& f) {
  Vocab v;
  TOPKV_CHECK(f.has("tokenizer.ggml.model"),
              "model '{}' has no tokenizer (tokenizer.ggml.model is missing); topkv needs a GGUF with its vocabulary",
              f.path());
  const std::string model = f.get_str("tokenizer.ggml.model");
  if (model == "llama")
    v.kind = VocabKind::Spm;
  else if (model == "gpt2")
    v.kind = VocabKind::Bpe;
  else
    fail("model '{}': tokenizer '{}' (tokenizer.ggml.model) is not supported; topkv reads 'llama' (SentencePiece, "
         "Gemma/Llama 2) and 'gpt2' (byte-level BPE, Llama 3, Qwen2)",
         f.path(), model);

  v.tokens = f.get_arr_str("tokenizer.ggml.tokens");
  const size_t n = v.tokens.size();
  TOPKV_CHECK(n > 0, "model '{}': tokenizer.ggml.tokens is empty", f.path());

  if (f.has("tokenizer.ggml.scores")) {
    v.scores = f.get_arr_f32("tokenizer.ggml.scores");
    TOPKV_CHECK(v.scores.size() == n, "model '{}': tokenizer.ggml.scores has {} entries for {} tokens", f.path(),
                v.scores.size(), n);
  } else {
    TOPKV_CHECK(v.kind != VocabKind::Spm,
                "model '{}': tokenizer.ggml.scores is missing; a SentencePiece vocabulary needs the piece scores",
                f.path());
  }
  if (f.has("tokenizer.ggml.token_type")) {
    const std::vector<int32_t> types = f.get_arr_i32("tokenizer.ggml.token_type");
    TOPKV_CHECK(types.size() == n, "model '{}': tokenizer.ggml.token_type has {} entries for {} tokens", f.path(),
                types.size(), n);
    v.types.resize(n);
    for (size_t i = 0; i < n; ++i) {
      TOPKV_CHECK(types[i] >= 0 && types[i] <= (int32_t)TokenType::Byte,
                  "model '{}': tokenizer.ggml.token_type[{}] = {} is not a token type (0..6)", f.path(), i, types[i]);
      v.types[i] = (TokenType)types[i];
    }
  }
  if (v.kind == VocabKind::Bpe) {
    TOPKV_CHECK(f.has("tokenizer.ggml.merges"),
                "model '{}': tokenizer.ggml.merges is missing; a byte-level BPE vocabulary needs its merge rules",
                f.path());
    v.merges = f.get_arr_str("tokenizer.ggml.merges");
    v.pre = f.get_str_or("tokenizer.ggml.pre", "(missing: re-convert the model with a current llama.cpp)");
  }

  v.bos = token_id(f, "tokenizer.ggml.bos_token_id", n);
  v.eos = token_id(f, "tokenizer.ggml.eos_token_id", n);
  v.eot = token_id(f, "tokenizer.ggml.eot_token_id", n);
  v.pad = token_id(f, "tokenizer.ggml.padding_token_id", n);
  v.unk = token_id(f, "tokenizer.ggml.unknown_token_id", n);
  // Defaults as in llama.cpp: SentencePiece adds BOS and a space prefix
  // unless told otherwise; byte-level BPE adds BOS only when told.
  v.add_bos = f.get_bool_or("tokenizer.ggml.add_bos_token", v.kind == VocabKind::Spm);
  v.add_space_prefix = f.get_bool_or("tokenizer.ggml.add_space_prefix", v.kind == VocabKind::Spm);
  TOPKV_CHECK(!v.add_bos || v.bos >= 0,
              "model '{}': tokenizer.ggml.add_bos_token is true but tokenizer.ggml.bos_token_id is not set", f.path());
  v.architecture = f.get_str_or("general.architecture", "");
  v.chat_template = f.get_str_or("tokenizer.chat_template", "");
  return v;
}

Tokenizer Tokenizer::from_gguf(const GgufFile& file) { return Tokenizer(load_vocab(file)); }

}  // namespace topkv
