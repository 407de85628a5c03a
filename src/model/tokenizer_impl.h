// Internals shared by tokenizer.cpp (construction, special tokens, decode),
// tokenizer_spm.cpp and tokenizer_bpe.cpp. Not part of the public API.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "src/model/greedy_merge.h"
#include "src/model/tokenizer.h"

namespace topkv {

// Byte trie over the texts of special (control, unknown, user-defined)
// tokens, for the leftmost-longest scan that splits them out of the text.
class SpecialTokenTrie {
 public:
  void add(std::string_view text, int32_t id);
  // Longest special token starting at `pos` that `allowed(id)` accepts:
  // returns its byte length and sets `id`, or returns 0.
  template <class Allowed>
  size_t match(std::string_view s, size_t pos, int32_t& id, Allowed&& allowed) const {
    if (!first_byte_[(uint8_t)s[pos]]) return 0;
    size_t best = 0;
    int32_t node = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      auto it = edges_.find(edge_key(node, (uint8_t)s[i]));
      if (it == edges_.end()) break;
      node = it->second;
      const int32_t t = terminal_[node];
      if (t >= 0 && allowed(t)) best = i + 1 - pos, id = t;
    }
    return best;
  }
  bool empty() const { return terminal_.size() <= 1; }

 private:
  static uint64_t edge_key(int32_t node, uint8_t b) { return (uint64_t)node << 8 | b; }
  std::unordered_map<uint64_t, int32_t> edges_;
  std::vector<int32_t> terminal_{-1};  // per node: token id ending here, or -1; node 0 = root
  std::array<bool, 256> first_byte_{};
};

// Piece text -> id. Open addressing with linear probing over 8-byte slots
// (32-bit hash tag, id) at load factor <= 1/2: a lookup, hit or miss, mostly
// touches one cache line, and compares text only on a tag match. Encoding is
// dominated by these lookups (one per candidate pair): with a node-based
// std::unordered_map, half of the encode time went to walking its chains.
class PieceTable {
 public:
  // Indexes `tokens` (kept by pointer; it must outlive the table). Empty
  // texts are skipped; a repeated text keeps its first id.
  void build(const std::vector<std::string>* tokens);
  int32_t find(std::string_view s) const {
    const uint64_t h = hash(s);
    const uint32_t tag = (uint32_t)(h >> 32);
    for (uint64_t i = h & mask_;; i = (i + 1) & mask_) {
      const uint64_t slot = slots_[i];
      if (slot == 0) return -1;
      if ((uint32_t)(slot >> 32) == tag) {
        const int32_t id = (int32_t)(uint32_t)slot - 1;
        if ((*tokens_)[id] == s) return id;
      }
    }
  }

 private:
  static uint64_t hash(std::string_view s);
  std::vector<uint64_t> slots_;  // 0 = empty, else tag << 32 | (id + 1)
  uint64_t mask_ = 0;
  const std::vector<std::string>* tokens_ = nullptr;
};

// Digits per number word of the byte-level BPE pre-tokenizers (bpe_pretokenize).
constexpr int kLlama3MaxDigits = 3, kQwen2MaxDigits = 1;

// A byte-level BPE merge rule: fusing (left id, right id) gives `result`.
struct BpeRule {
  int32_t rank;
  int32_t result;
};

struct TokenizerImpl {
  Vocab vocab;
  PieceTable pieces;  // over vocab.tokens
  std::vector<std::string> decoded;       // the bytes each token stands for
  std::vector<uint8_t> mergeable;         // Spm: may a merge produce this token?
  std::array<int32_t, 256> byte_token{};  // Spm: <0xXX> (or unk); Bpe: the byte's own token
  SpecialTokenTrie specials;
  std::vector<int32_t> eog_ids;
  ChatFormat chat = ChatFormat::None;
  std::string chat_system;  // ChatML: the template's default system message (may be empty)

  // Bpe only.
  std::unordered_map<uint64_t, BpeRule> bpe_rules;  // key: left id << 32 | right id
  bool bpe_ignore_merges = false;  // a word that is a whole token is taken as is (Llama 3)
  int bpe_max_digits = kLlama3MaxDigits;  // the pre-tokenizer's longest number word

  TokenType type(int32_t id) const { return vocab.types.empty() ? TokenType::Normal : vocab.types[id]; }
  int32_t lookup(std::string_view s) const { return pieces.find(s); }
};

// "<0xXX>" (two hex digits, either case) -> the byte value, else -1.
inline int parse_byte_piece(std::string_view s) {
  auto hex = [](char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  if (s.size() != 6 || s.substr(0, 3) != "<0x" || s[5] != '>') return -1;
  const int hi = hex(s[3]), lo = hex(s[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// Scratch buffers one encode() call reuses across its fragments.
struct EncodeScratch {
  std::string text;
  std::vector<MergeSymbol> syms;
  GreedyMerger merger;
};

// tokenizer_spm.cpp
void spm_prepare(TokenizerImpl& t);
void spm_encode_fragment(const TokenizerImpl& t, std::string_view fragment, bool space_prefix, bool reference,
                         EncodeScratch& scratch, std::vector<int32_t>& out);

// tokenizer_bpe.cpp
void bpe_prepare(TokenizerImpl& t);
void bpe_encode_fragment(const TokenizerImpl& t, std::string_view fragment, bool reference, EncodeScratch& scratch,
                         std::vector<int32_t>& out);
// The byte-level BPE pre-tokenizer regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,K}|
//    ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// by hand over code points, where `max_digits` K is 3 for Llama 3 and 1 for
// Qwen2 (which splits numbers into single digits); returns the [begin, end)
// byte offsets of the words in order (they tile the text exactly).
std::vector<std::pair<uint32_t, uint32_t>> bpe_pretokenize(std::string_view text, int max_digits);
// GPT-2's reversible byte <-> printable code point map (bytes_to_unicode).
uint32_t gpt2_byte_to_cp(uint8_t b);
int gpt2_cp_to_byte(uint32_t cp);  // -1 for a code point outside the map


// chat_template.cpp: a chat prompt as a row of special tokens and texts.
struct ChatSegment {
  int32_t special;   // >= 0: this token; -1: `text`
  std::string text;
};
ChatFormat detect_chat_format(const TokenizerImpl& t);
// The system message a ChatML template writes when the conversation has none:
// the string literal '<|im_start|>system\n...<|im_end|>' in the Jinja source,
// its escapes undone; empty when the template has no such literal.
std::string chatml_default_system(std::string_view chat_template);
std::vector<ChatSegment> chat_segments(const TokenizerImpl& t, std::string_view user_text);
// A conversation (Tokenizer::encode_chat_turns).
std::vector<ChatSegment> chat_turn_segments(const TokenizerImpl& t, std::span<const ChatTurn> turns);

}  // namespace topkv
