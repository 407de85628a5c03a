// Hand-built vocabularies and random text shared by the tokenizer tests
// (test_tokenizer.cpp, test_tokenizer_gguf.cpp).
#pragma once
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "src/model/tokenizer.h"
#include "src/model/tokenizer_impl.h"
#include "src/model/unicode.h"

namespace topkv::test {

inline std::string utf8(uint32_t cp) {
  std::string s;
  utf8_append(s, cp);
  return s;
}

// ---- hand-built vocabularies ---------------------------------------------------

// Gemma-like: control 0..5, user-defined 6..8, 256 byte pieces 9..264, then
// `pieces` (Normal, with their scores).
constexpr int32_t kSot = 4, kEot = 5, kNl = 6, kUd = 7, kTwoSpaces = 8, kByte0 = 9;
inline Vocab spm_vocab(const std::vector<std::pair<std::string, float>>& pieces, bool add_space_prefix = false) {
  Vocab v;
  v.kind = VocabKind::Spm;
  auto add = [&](std::string text, float score, TokenType type) {
    v.tokens.push_back(std::move(text));
    v.scores.push_back(score);
    v.types.push_back(type);
  };
  for (const char* s : {"<pad>", "<eos>", "<bos>"}) add(s, 0, TokenType::Control);
  add("<unk>", 0, TokenType::Unknown);
  add("<start_of_turn>", 0, TokenType::Control);
  add("<end_of_turn>", 0, TokenType::Control);
  add("\n", 0, TokenType::UserDefined);
  add("[UD]", 0, TokenType::UserDefined);
  add("  ", 0, TokenType::UserDefined);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    add(name, 0, TokenType::Byte);
  }
  for (auto& [text, score] : pieces) add(text, score, TokenType::Normal);
  v.pad = 0, v.eos = 1, v.bos = 2, v.unk = 3;
  v.add_space_prefix = add_space_prefix;
  v.architecture = "gemma3";
  return v;
}

// Pieces for the round-trip vocabulary: every ASCII printable character, "▁",
// a few words and some non-Latin characters (the rest falls back to bytes).
inline std::vector<std::pair<std::string, float>> common_pieces() {
  std::vector<std::pair<std::string, float>> p;
  const std::string sp = utf8(0x2581);
  for (const char* s : {"▁t", "he",  "▁the",   "in",    "▁a", "ll",  "▁he", "llo",  "▁hello", "er",   "▁w",
                        "or", "ld",  "▁world", "hello", "ab", "▁ab", "abc", "中文", "us",     "user", "mo",
                        "de", "del", "model",  "▁▁",    "é",  "ж",   "中",  "文",   "한"})
    p.push_back({s, -(float)p.size()});
  for (int c = 33; c < 127; ++c) p.push_back({std::string(1, (char)c), -1000.f - (float)c});
  p.push_back({sp, -2000.f});
  return p;
}

inline int32_t id_of(const Tokenizer& t, const std::string& s) {
  const int32_t id = t.find_token(s);
  REQUIRE(id >= 0);
  return id;
}

// Byte-level BPE: the 256 byte pieces (in byte order: id = byte), the results
// of `merges` (given in the byte alphabet), `extra` pieces, then `controls`
// (control tokens) and `user_defined` tokens. No BOS/EOS set.
inline Vocab byte_level_vocab(const std::vector<std::string>& merges, const std::vector<std::string>& extra,
                              std::string pre, const std::vector<std::string>& controls,
                              const std::vector<std::string>& user_defined = {}) {
  Vocab v;
  v.kind = VocabKind::Bpe;
  v.pre = std::move(pre);
  for (int b = 0; b < 256; ++b) v.tokens.push_back(utf8(gpt2_byte_to_cp((uint8_t)b)));
  for (const std::string& m : merges) {
    const size_t sp = m.find(' ', 1);
    const std::string r = m.substr(0, sp) + m.substr(sp + 1);
    if (std::find(v.tokens.begin(), v.tokens.end(), r) == v.tokens.end()) v.tokens.push_back(r);
  }
  for (auto& e : extra) v.tokens.push_back(e);
  v.types.assign(v.tokens.size(), TokenType::Normal);
  for (auto* list : {&controls, &user_defined})
    for (const std::string& s : *list) {
      v.tokens.push_back(s);
      v.types.push_back(list == &controls ? TokenType::Control : TokenType::UserDefined);
    }
  v.merges = merges;
  return v;
}

// Llama-3-like: byte_level_vocab with the Llama 3 control tokens (BOS, EOS, ...).
inline Vocab bpe_vocab(const std::vector<std::string>& merges, std::vector<std::string> extra = {},
                       std::string pre = "llama-bpe") {
  Vocab v = byte_level_vocab(merges, extra, std::move(pre),
                             {"<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                              "<|eot_id|>"});
  const int32_t n = (int32_t)v.tokens.size();
  v.bos = n - 5, v.eos = n - 4;
  v.architecture = "llama";
  return v;
}

// Qwen2-like, as the Qwen2.5 GGUFs have it: the Qwen2 pre-tokenizer, control
// <|endoftext|> (BOS and padding, never added), <|im_start|>, <|im_end|> (EOS)
// and <|fim_pad|>, a user-defined <tool_call>, an unused [PAD] entry, and the
// Qwen2.5 chat template's default-system line when `chat_template` is empty.
inline Vocab qwen2_vocab(const std::vector<std::string>& merges, std::string chat_template = "") {
  Vocab v = byte_level_vocab(merges, {}, "qwen2", {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>"},
                             {"<tool_call>"});
  v.tokens.push_back("[PAD999]");
  v.types.push_back(TokenType::Unused);
  const int32_t n = (int32_t)v.tokens.size();
  v.bos = v.pad = n - 6, v.eos = n - 4;
  v.add_bos = false;
  v.add_space_prefix = false;
  v.architecture = "qwen2";
  v.chat_template = !chat_template.empty() ? chat_template
                                           : "{%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, a "
                                             "\\'test\\' model.<|im_end|>\\n' }}";
  return v;
}

inline const std::vector<std::string> kBpeMerges = {"Ġ t", "h e",  "Ġt he", "i n",   "Ġ a",    "e r",
                                                    "o r", "l l",  "Ġ w",   "Ġw or", "Ġwor l", "Ġworl d",
                                                    "a b", "ab c", "Ċ Ċ",   "1 2",   "12 3"};

// Random text over a pool that mixes scripts, emoji, controls, odd spaces and
// "invalid-looking" (but valid) code points. U+2581 itself is left out: a
// SentencePiece vocabulary cannot tell it from an escaped space.
inline std::string random_text(std::mt19937& rng, int n_chars) {
  static const std::vector<uint32_t> pool = {
      ' ',     ' ',    ' ',   '\n',   '\t',   '\r',  0x00,  0x01,    0x1B,   0x7F,   '.',      ',',
      '\'',    '!',    '<',   '>',    '[',    ']',   0xE9,  0xF1,    0xFC,   0xDF,   0x3B1,    0x3A9,
      0x436,   0x42F,  0x5E9, 0x639,  0x928,  0x94D, 0x947, 0x4E2D,  0x6587, 0x3042, 0xD55C,   0x1F600,
      0x1F93D, 0x200D, 0xA0,  0x2028, 0x3000, 0x301, 0x663, 0x20000, 0xFFFD, 0xFEFF, 0x10FFFF, 0xE000};
  std::uniform_int_distribution<int> pick(0, 99), pool_i(0, (int)pool.size() - 1), ascii(33, 126);
  std::string s;
  for (int i = 0; i < n_chars; ++i) {
    const int r = pick(rng);
    if (r < 45)
      s += (char)ascii(rng);
    else if (r < 50)
      s += "hello world the ";
    else
      utf8_append(s, pool[pool_i(rng)]);
  }
  return s;
}

inline std::string random_bytes(std::mt19937& rng, int n) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::string s;
  for (int i = 0; i < n; ++i) s += (char)byte(rng);
  for (size_t p; (p = s.find("\xE2\x96\x81")) != std::string::npos;) s[p] = 'x';  // no literal U+2581
  return s;
}

}  // namespace topkv::test
