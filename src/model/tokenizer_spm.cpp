// SentencePiece BPE with byte fallback (tokenizer.ggml.model = "llama"):
// Gemma 3, Llama 2. Reference: llama.cpp src/llama-vocab.cpp,
// llm_tokenizer_spm_session; SentencePiece bpe_model.cc.
//
// One fragment (text between special tokens) is encoded as:
//   1. spaces -> U+2581 ("▁"), with one more in front if asked (add_space_prefix);
//   2. one symbol per UTF-8 character;
//   3. repeatedly fuse the adjacent pair whose concatenation is a piece with
//      the highest score, leftmost on ties (greedy_merge.h);
//   4. a symbol that is no piece (a character outside the vocabulary) is
//      spelled as its UTF-8 bytes with the <0xXX> byte tokens.
// Difference to llama.cpp: only normal and user-defined pieces may be formed
// by merging (as in SentencePiece, whose merges never produce control,
// unused or byte pieces); llama.cpp accepts any vocabulary entry.
#include <cstdio>

#include "src/common/error.h"
#include "src/model/tokenizer_impl.h"
#include "src/model/unicode.h"

namespace topkv {

namespace {
constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK
}

void spm_prepare(TokenizerImpl& t) {
  const Vocab& v = t.vocab;
  const int32_t n = (int32_t)v.tokens.size();
  TOPKV_CHECK(v.scores.size() == v.tokens.size(),
              "SentencePiece vocabulary: {} scores for {} tokens (tokenizer.ggml.scores must have one per token)",
              v.scores.size(), v.tokens.size());
  t.mergeable.assign(n, 0);
  t.decoded.resize(n);
  for (int32_t id = 0; id < n; ++id) {
    const TokenType ty = t.type(id);
    const std::string& text = v.tokens[id];
    if (ty == TokenType::Normal || ty == TokenType::Undefined) {
      t.mergeable[id] = 1;
      std::string& d = t.decoded[id];
      for (size_t i = 0; i < text.size();) {
        if (text.compare(i, kSpace.size(), kSpace) == 0) {
          d += ' ';
          i += kSpace.size();
        } else {
          d += text[i++];
        }
      }
    } else if (ty == TokenType::Byte) {
      const int b = parse_byte_piece(text);
      TOPKV_CHECK(b >= 0, "token {} has type byte but its text '{}' is not of the form <0xXX>; the GGUF is damaged",
                  id, text);
      t.decoded[id] = std::string(1, (char)b);
    } else {
      if (ty == TokenType::UserDefined) t.mergeable[id] = 1;
      t.decoded[id] = text;  // user-defined: literal text; control etc.: rendered only when asked
    }
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const int32_t id = t.lookup(name);
    t.byte_token[b] = id >= 0 ? id : v.unk;
    TOPKV_CHECK(t.byte_token[b] >= 0,
                "SentencePiece vocabulary has no byte piece {} and no unknown token, so text outside the vocabulary "
                "cannot be encoded; this GGUF is not a byte-fallback SentencePiece model",
                name);
  }
}

void spm_encode_fragment(const TokenizerImpl& t, std::string_view fragment, bool space_prefix, bool reference,
                         EncodeScratch& scratch, std::vector<int32_t>& out) {
  std::string& s = scratch.text;
  s.clear();
  if (space_prefix) s += kSpace;
  for (char c : fragment) {
    if (c == ' ')
      s += kSpace;
    else
      s += c;
  }
  if (s.empty()) return;

  auto& syms = scratch.syms;
  syms.clear();
  syms.reserve(s.size());  // at most one symbol per byte: one allocation, not a doubling per power of two
  for (size_t i = 0; i < s.size();) {
    const uint32_t len = utf8_decode(s, i).len;
    const int32_t id = t.lookup(std::string_view(s).substr(i, len));
    syms.push_back({(uint32_t)i, len, 0, 0, id >= 0 && t.mergeable[id] ? id : -1});
    i += len;
  }
  link_symbols(syms);
  auto pair = [&](const MergeSymbol& a, const MergeSymbol& b) -> MergeCandidate {
    const int32_t id = t.lookup(std::string_view(s.data() + a.begin, a.len + b.len));
    if (id < 0 || !t.mergeable[id]) return {0, -1};
    return {(double)t.vocab.scores[id], id};
  };
  if (reference)
    merge_reference(syms, pair);
  else
    scratch.merger.run(syms, pair);

  for (int32_t i = 0; i >= 0; i = syms[i].next) {
    const MergeSymbol& sym = syms[i];
    if (sym.id >= 0) {
      out.push_back(sym.id);
    } else {
      for (uint32_t k = 0; k < sym.len; ++k) out.push_back(t.byte_token[(uint8_t)s[sym.begin + k]]);
    }
  }
}

}  // namespace topkv
