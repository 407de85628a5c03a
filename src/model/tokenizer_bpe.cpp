// Byte-level BPE (tokenizer.ggml.model = "gpt2"): Llama 3 and Qwen2 (2.5,
// 2.5-Coder). Reference: llama.cpp src/llama-vocab.cpp
// (llm_tokenizer_bpe_session; the pre-tokenizer types LLAMA3 and QWEN2) and
// src/unicode.cpp (unicode_regex_split_custom_llama3); GPT-2 encoder.py.
//
// A fragment is cut into words by the pre-tokenizer regex; each word
// starts as one symbol per byte (the token of that byte's GPT-2 stand-in
// character) and the adjacent pair with the lowest merge rank is fused,
// leftmost on ties, until no merge rule applies. Vocabulary pieces are stored
// in the GPT-2 byte alphabet, so decoding maps each character back to a byte.
#include <string>

#include "src/common/error.h"
#include "src/model/tokenizer_impl.h"
#include "src/model/unicode.h"

namespace topkv {

namespace {

// GPT-2 bytes_to_unicode(): printable Latin-1 bytes stand for themselves, the
// other 68 bytes (controls, space, 0x7F-0xA0, 0xAD) become U+0100.. in order.
struct Gpt2ByteMap {
  uint32_t to_cp[256];
  int16_t from_cp[324];
  Gpt2ByteMap() {
    for (auto& x : from_cp) x = -1;
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      to_cp[b] = printable ? (uint32_t)b : extra++;
      from_cp[to_cp[b]] = (int16_t)b;
    }
  }
};
const Gpt2ByteMap& byte_map() {
  static const Gpt2ByteMap m;
  return m;
}

uint64_t rule_key(int32_t left, int32_t right) { return (uint64_t)(uint32_t)left << 32 | (uint32_t)right; }

bool is_nl(uint32_t cp) { return cp == '\r' || cp == '\n'; }

}  // namespace

uint32_t gpt2_byte_to_cp(uint8_t b) { return byte_map().to_cp[b]; }
int gpt2_cp_to_byte(uint32_t cp) { return cp < 324 ? byte_map().from_cp[cp] : -1; }

std::vector<std::pair<uint32_t, uint32_t>> bpe_pretokenize(std::string_view text, int max_digits) {
  enum : uint8_t { kL = 1, kN = 2, kS = 4 };
  struct Cp {
    uint32_t cp, off;
    uint8_t cls;
  };
  std::vector<Cp> c;
  c.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const Utf8Char ch = utf8_decode(text, i);
    const uint8_t cls = (is_letter(ch.cp) ? kL : 0) | (is_number(ch.cp) ? kN : 0) | (is_whitespace(ch.cp) ? kS : 0);
    c.push_back({ch.cp, (uint32_t)i, cls});
    i += ch.len;
  }
  const size_t n = c.size();
  auto L = [&](size_t k) { return k < n && (c[k].cls & kL); };
  auto N = [&](size_t k) { return k < n && (c[k].cls & kN); };
  auto S = [&](size_t k) { return k < n && (c[k].cls & kS); };
  auto other = [&](size_t k) { return k < n && c[k].cls == 0; };  // [^\s\p{L}\p{N}]
  // The contractions' (?i:...) as Hugging Face's regex engine applies it:
  // ASCII case, and U+017F LONG S, whose Unicode case folding is 's'
  // (llama.cpp's rewrite '[sS] misses that one).
  auto lower = [&](size_t k) -> uint32_t {
    if (k >= n) return 0;
    return c[k].cp < 0x80 ? c[k].cp | 0x20 : c[k].cp == 0x17F ? 's' : 0;
  };

  std::vector<std::pair<uint32_t, uint32_t>> words;
  auto byte_off = [&](size_t k) { return k < n ? c[k].off : (uint32_t)text.size(); };
  size_t i = 0;
  while (i < n) {
    size_t j = i;  // the word is c[i, j)
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (c[i].cp == '\'') {
      const uint32_t a = lower(i + 1), b = lower(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd')
        j = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
        j = i + 3;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (j == i && (L(i) || (!is_nl(c[i].cp) && !N(i) && L(i + 1)))) {
      j = i + 1;
      while (L(j)) ++j;
    }
    // \p{N}{1,3} (Llama 3), \p{N} (Qwen2)
    if (j == i && N(i)) {
      while (j < i + (size_t)max_digits && N(j)) ++j;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    if (j == i) {
      size_t k = (c[i].cp == ' ' && other(i + 1)) ? i + 1 : i;
      if (other(k)) {
        while (other(k)) ++k;
        while (k < n && is_nl(c[k].cp)) ++k;
        j = k;
      }
    }
    if (j == i && S(i)) {
      size_t e = i;
      while (S(e)) ++e;
      size_t last_nl = n;
      for (size_t k = i; k < e; ++k)
        if (is_nl(c[k].cp)) last_nl = k;
      if (last_nl < n)
        j = last_nl + 1;  // \s*[\r\n]+ : up to the last line break of the run
      else if (e == n)
        j = e;  // \s+(?!\S) at the end of the text
      else if (e - i >= 2)
        j = e - 1;  // \s+(?!\S) : leave the last space to the next word
      else
        j = e;  // \s+
    }
    if (j == i) j = i + 1;  // unreachable: every character is L, N, \s or other
    words.push_back({byte_off(i), byte_off(j)});
    i = j;
  }
  return words;
}

void bpe_prepare(TokenizerImpl& t) {
  const Vocab& v = t.vocab;
  const int32_t n = (int32_t)v.tokens.size();
  // As llama.cpp's llama_vocab::impl::load: only the Llama 3 type sets
  // ignore_merges; Qwen2's tokenizer.json has no "ignore_merges" and always
  // merges. (llama.cpp's "deepseek-r1-qwen" is the Qwen2 vocabulary as well.)
  if (v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3") {
    t.bpe_ignore_merges = true;  // Hugging Face tokenizer.json of Llama 3: "ignore_merges": true
  } else if (v.pre == "dbrx" || v.pre == "smaug-bpe") {
    t.bpe_ignore_merges = false;  // the same regex, merges always applied
  } else if (v.pre == "qwen2" || v.pre == "deepseek-r1-qwen") {
    t.bpe_ignore_merges = false;
    t.bpe_max_digits = kQwen2MaxDigits;
  } else {
    fail("byte-level BPE pre-tokenizer '{}' (tokenizer.ggml.pre) is not supported; topkv implements the Llama 3 "
         "one ('llama-bpe', also 'dbrx', 'smaug-bpe') and the Qwen2 one ('qwen2', 'deepseek-r1-qwen')",
         v.pre);
  }
  TOPKV_CHECK(v.scores.empty() || v.scores.size() == v.tokens.size(),
              "BPE vocabulary: {} scores for {} tokens (tokenizer.ggml.scores must be absent or one per token)",
              v.scores.size(), v.tokens.size());

  t.decoded.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    const TokenType ty = t.type(id);
    const std::string& text = v.tokens[id];
    if (ty == TokenType::Normal || ty == TokenType::Undefined) {
      std::string& d = t.decoded[id];
      for (size_t i = 0; i < text.size();) {
        const Utf8Char ch = utf8_decode(text, i);
        const int b = ch.valid ? gpt2_cp_to_byte(ch.cp) : -1;
        if (b >= 0)
          d += (char)b;
        else
          d.append(text, i, ch.len);  // outside the byte alphabet: keep the text
        i += ch.len;
      }
    } else if (ty == TokenType::Byte && parse_byte_piece(text) >= 0) {
      t.decoded[id] = std::string(1, (char)parse_byte_piece(text));
    } else {
      t.decoded[id] = text;
    }
  }

  for (int b = 0; b < 256; ++b) {
    std::string ch;
    utf8_append(ch, gpt2_byte_to_cp((uint8_t)b));
    t.byte_token[b] = t.lookup(ch);
    TOPKV_CHECK(t.byte_token[b] >= 0,
                "byte-level BPE vocabulary lacks the piece '{}' for byte 0x{:02X}; every byte needs one", ch, b);
  }

  t.bpe_rules.reserve(v.merges.size());
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& m = v.merges[r];
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    TOPKV_CHECK(sp != std::string::npos, "merge rule {} '{}' is not of the form 'left right'", r, m);
    const std::string_view left(m.data(), sp), right(m.data() + sp + 1, m.size() - sp - 1);
    const int32_t a = t.lookup(left), b = t.lookup(right), ab = t.lookup(std::string(left) + std::string(right));
    TOPKV_CHECK(a >= 0 && b >= 0 && ab >= 0,
                "merge rule {} '{}' refers to a piece that is not in the vocabulary ('{}' {}, '{}' {}, result {}); "
                "tokenizer.ggml.merges does not match tokenizer.ggml.tokens",
                r, m, left, a, right, b, ab);
    t.bpe_rules.emplace(rule_key(a, b), BpeRule{(int32_t)r, ab});  // a repeated rule keeps its first rank
  }
}

void bpe_encode_fragment(const TokenizerImpl& t, std::string_view fragment, bool reference, EncodeScratch& scratch,
                         std::vector<int32_t>& out) {
  auto pair = [&](const MergeSymbol& a, const MergeSymbol& b) -> MergeCandidate {
    auto it = t.bpe_rules.find(rule_key(a.id, b.id));
    if (it == t.bpe_rules.end()) return {0, -1};
    return {-(double)it->second.rank, it->second.result};
  };
  for (auto [wb, we] : bpe_pretokenize(fragment, t.bpe_max_digits)) {
    const std::string_view word = fragment.substr(wb, we - wb);
    if (t.bpe_ignore_merges) {
      std::string& mapped = scratch.text;
      mapped.clear();
      for (char ch : word) utf8_append(mapped, gpt2_byte_to_cp((uint8_t)ch));
      const int32_t id = t.lookup(mapped);
      if (id >= 0 && (t.type(id) == TokenType::Normal || t.type(id) == TokenType::Undefined)) {
        out.push_back(id);
        continue;
      }
    }
    auto& syms = scratch.syms;
    syms.clear();
    syms.reserve(word.size());
    for (uint32_t k = 0; k < word.size(); ++k) syms.push_back({k, 1, 0, 0, t.byte_token[(uint8_t)word[k]]});
    link_symbols(syms);
    if (reference)
      merge_reference(syms, pair);
    else
      scratch.merger.run(syms, pair);
    for (int32_t i = 0; i >= 0; i = syms[i].next) out.push_back(syms[i].id);
  }
}

}  // namespace topkv
