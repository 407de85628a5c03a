// Tokenizer: vocabulary validation, special-token splitting, the encode and
// decode drivers shared by both vocabulary kinds, and StreamDecoder. The
// merge rules themselves live in tokenizer_spm.cpp and tokenizer_bpe.cpp.
//
// Deliberate differences to llama.cpp (src/llama-vocab.cpp):
//  - Special tokens are found by one leftmost-longest scan over a trie
//    (Hugging Face's added-token matcher) instead of searching the text once
//    per special token, longest first: same result unless two special texts
//    overlap in the text, and linear in the text for vocabularies with
//    thousands of control tokens (Gemma 3 has 6249).
//  - decode() drops the add_space_prefix space after every special token, not
//    only at the start, so that it inverts encode() exactly.
#include "src/model/tokenizer.h"

#include <cstring>

#include "src/common/error.h"
#include "src/model/tokenizer_impl.h"
#include "src/model/unicode.h"

namespace topkv {

void SpecialTokenTrie::add(std::string_view text, int32_t id) {
  if (text.empty()) return;
  first_byte_[(uint8_t)text[0]] = true;
  int32_t node = 0;
  for (char ch : text) {
    auto [it, inserted] = edges_.try_emplace(edge_key(node, (uint8_t)ch), (int32_t)terminal_.size());
    if (inserted) terminal_.push_back(-1);
    node = it->second;
  }
  if (terminal_[node] < 0) terminal_[node] = id;  // the same text twice: the first id wins
}

uint64_t PieceTable::hash(std::string_view s) {
  // 8 bytes at a time, multiply-xorshift mixing (MurmurHash3's fmix64 at the end).
  uint64_t h = 0x9E3779B97F4A7C15ull ^ (s.size() * 0xC2B2AE3D27D4EB4Full);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t k;
    std::memcpy(&k, s.data() + i, 8);
    h = (h ^ k) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
  }
  uint64_t k = 0;
  std::memcpy(&k, s.data() + i, s.size() - i);
  h = (h ^ k) * 0xFF51AFD7ED558CCDull;
  h ^= h >> 33;
  h *= 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 33);
}

void PieceTable::build(const std::vector<std::string>* tokens) {
  tokens_ = tokens;
  size_t cap = 16;
  while (cap < 2 * tokens->size()) cap *= 2;
  slots_.assign(cap, 0);
  mask_ = cap - 1;
  for (size_t id = 0; id < tokens->size(); ++id) {
    const std::string& s = (*tokens)[id];
    if (s.empty() || find(s) >= 0) continue;
    const uint64_t h = hash(s);
    uint64_t i = h & mask_;
    while (slots_[i] != 0) i = (i + 1) & mask_;
    slots_[i] = (h >> 32) << 32 | (uint64_t)(id + 1);
  }
}

namespace {

bool is_special_type(TokenType t) {
  return t == TokenType::Control || t == TokenType::Unknown || t == TokenType::UserDefined;
}

void validate(const Vocab& v) {
  const size_t n = v.tokens.size();
  TOPKV_CHECK(n > 0, "the vocabulary is empty (tokenizer.ggml.tokens has no entries)");
  TOPKV_CHECK(n < (size_t)INT32_MAX, "the vocabulary has {} tokens, more than token ids can address", n);
  TOPKV_CHECK(v.types.empty() || v.types.size() == n,
              "{} token types for {} tokens (tokenizer.ggml.token_type must have one per token)", v.types.size(), n);
  for (size_t i = 0; i < v.types.size(); ++i)
    TOPKV_CHECK((uint8_t)v.types[i] <= (uint8_t)TokenType::Byte,
                "token {} has type {}, not one of 0..6 (tokenizer.ggml.token_type)", i, (int)v.types[i]);
  const std::pair<const char*, int32_t> ids[] = {
      {"bos", v.bos}, {"eos", v.eos}, {"eot", v.eot}, {"padding", v.pad}, {"unknown", v.unk}};
  for (auto [name, id] : ids)
    TOPKV_CHECK(id >= -1 && id < (int64_t)n, "the {} token id {} is outside the vocabulary of {} tokens", name, id, n);
}

}  // namespace

Tokenizer::Tokenizer(Vocab vocab) {
  validate(vocab);
  auto t = std::make_unique<TokenizerImpl>();
  t->vocab = std::move(vocab);
  const Vocab& v = t->vocab;
  const int32_t n = (int32_t)v.tokens.size();

  t->pieces.build(&t->vocab.tokens);

  if (v.kind == VocabKind::Spm)
    spm_prepare(*t);
  else
    bpe_prepare(*t);

  for (int32_t id = 0; id < n; ++id)
    if (is_special_type(t->type(id))) t->specials.add(v.tokens[id], id);

  // End of turn: from the metadata, else by the texts chat models use.
  if (t->vocab.eot < 0)
    for (const char* s : {"<end_of_turn>", "<|eot_id|>", "<|im_end|>"})
      if (int32_t id = t->lookup(s); id >= 0 && t->vocab.eot < 0) t->vocab.eot = id;
  // End of generation: eos, eot and the control tokens whose text is one of
  // the end markers in llama.cpp's list (llama_vocab::impl::load,
  // special_eog_ids). Qwen2.5 ends a reply with <|im_end|> (its eos) and a
  // raw completion with <|endoftext|>, as its generation_config.json lists.
  // llama.cpp's FIM markers (<|fim_pad|>, <|repo_name|>, <|file_sep|>) are
  // left out: topkv does no fill-in-the-middle.
  for (int32_t id : {v.eos, v.eot})
    if (id >= 0) t->eog_ids.push_back(id);
  for (const char* s : {"<|eom_id|>", "<|end_of_text|>", "<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|endoftext|>",
                        "<|end|>"})
    if (int32_t id = t->lookup(s); id >= 0 && t->type(id) == TokenType::Control) t->eog_ids.push_back(id);

  t->chat = detect_chat_format(*t);
  if (t->chat == ChatFormat::ChatML) t->chat_system = chatml_default_system(t->vocab.chat_template);
  impl_ = std::move(t);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

namespace {

// Splits `text` at the special tokens written in it and encodes the pieces
// between them. `prev_special` is true at the start and after each special
// token: an Spm add_space_prefix vocabulary puts a space before such text.
void encode_text(const TokenizerImpl& t, std::string_view text, bool parse_special, bool reference,
                 bool& prev_special, EncodeScratch& scratch, std::vector<int32_t>& out) {
  auto fragment = [&](std::string_view f) {
    if (t.vocab.kind == VocabKind::Spm)
      spm_encode_fragment(t, f, t.vocab.add_space_prefix && prev_special, reference, scratch, out);
    else
      bpe_encode_fragment(t, f, reference, scratch, out);
    prev_special = false;
  };
  auto allowed = [&](int32_t id) { return parse_special || t.type(id) == TokenType::UserDefined; };
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t id = -1;
    const size_t len = t.specials.empty() ? 0 : t.specials.match(text, i, id, allowed);
    if (len == 0) {
      ++i;
      continue;
    }
    if (i > start) fragment(text.substr(start, i - start));
    out.push_back(id);
    prev_special = true;
    i += len;
    start = i;
  }
  if (start < text.size()) fragment(text.substr(start));
}

}  // namespace

std::vector<int32_t> Tokenizer::encode_impl(std::string_view text, bool add_bos, bool parse_special,
                                            bool reference) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos) {
    TOPKV_CHECK(impl_->vocab.bos >= 0, "this vocabulary has no BOS token; encode without it (--no-bos)");
    out.push_back(impl_->vocab.bos);
  }
  bool prev_special = true;
  EncodeScratch scratch;
  encode_text(*impl_, text, parse_special, reference, prev_special, scratch, out);
  return out;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  return encode_impl(text, add_bos, parse_special, false);
}

std::vector<int32_t> Tokenizer::encode_reference(std::string_view text, bool add_bos, bool parse_special) const {
  return encode_impl(text, add_bos, parse_special, true);
}

void Tokenizer::decode_append(int32_t id, bool render_special, bool& at_text_start, std::string& out) const {
  const TokenizerImpl& t = *impl_;
  TOPKV_CHECK(id >= 0 && id < n_tokens(), "token id {} is outside the vocabulary of {} tokens", id, n_tokens());
  const TokenType ty = t.type(id);
  const std::string& p = piece(id, render_special);
  const bool text_token = ty == TokenType::Normal || ty == TokenType::Undefined;
  if (text_token && at_text_start && t.vocab.kind == VocabKind::Spm && t.vocab.add_space_prefix && !p.empty() &&
      p[0] == ' ')
    out.append(p, 1);
  else
    out += p;
  at_text_start = is_special_type(ty);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool render_special) const {
  std::string out;
  bool at_text_start = true;
  for (int32_t id : ids) decode_append(id, render_special, at_text_start, out);
  return out;
}

const std::string& Tokenizer::piece(int32_t id, bool render_special) const {
  static const std::string kEmpty;
  TOPKV_CHECK(id >= 0 && id < n_tokens(), "token id {} is outside the vocabulary of {} tokens", id, n_tokens());
  const TokenType ty = impl_->type(id);
  const bool hidden = ty == TokenType::Control || ty == TokenType::Unknown || ty == TokenType::Unused;
  return hidden && !render_special ? kEmpty : impl_->decoded[id];
}

const std::string& Tokenizer::token_text(int32_t id) const {
  TOPKV_CHECK(id >= 0 && id < n_tokens(), "token id {} is outside the vocabulary of {} tokens", id, n_tokens());
  return impl_->vocab.tokens[id];
}

TokenType Tokenizer::token_type(int32_t id) const {
  TOPKV_CHECK(id >= 0 && id < n_tokens(), "token id {} is outside the vocabulary of {} tokens", id, n_tokens());
  return impl_->type(id);
}

int32_t Tokenizer::find_token(std::string_view text) const { return impl_->lookup(text); }
int32_t Tokenizer::n_tokens() const { return (int32_t)impl_->vocab.tokens.size(); }
VocabKind Tokenizer::kind() const { return impl_->vocab.kind; }
int32_t Tokenizer::bos() const { return impl_->vocab.bos; }
int32_t Tokenizer::eos() const { return impl_->vocab.eos; }
int32_t Tokenizer::eot() const { return impl_->vocab.eot; }
int32_t Tokenizer::pad() const { return impl_->vocab.pad; }
int32_t Tokenizer::unk() const { return impl_->vocab.unk; }
bool Tokenizer::add_bos_default() const { return impl_->vocab.add_bos; }
const Vocab& Tokenizer::vocab() const { return impl_->vocab; }
ChatFormat Tokenizer::chat_format() const { return impl_->chat; }
const std::string& Tokenizer::chat_system_prompt() const { return impl_->chat_system; }

bool Tokenizer::is_eog(int32_t id) const {
  for (int32_t e : impl_->eog_ids)
    if (e == id) return true;
  return false;
}

std::string Tokenizer::apply_chat_template(std::string_view user_text) const {
  std::string s;
  for (const ChatSegment& seg : chat_segments(*impl_, user_text))
    s += seg.special >= 0 ? impl_->vocab.tokens[seg.special] : seg.text;
  return s;
}

namespace {

// A chat template's segments as ids: special tokens as themselves, the text
// between them encoded without parsing specials (a user cannot inject them).
std::vector<int32_t> encode_segments(const TokenizerImpl& impl, const std::vector<ChatSegment>& segments) {
  std::vector<int32_t> out;
  bool prev_special = true;
  EncodeScratch scratch;
  for (const ChatSegment& seg : segments) {
    if (seg.special >= 0) {
      out.push_back(seg.special);
      prev_special = true;
    } else {
      encode_text(impl, seg.text, /*parse_special=*/false, /*reference=*/false, prev_special, scratch, out);
    }
  }
  return out;
}

}  // namespace

std::vector<int32_t> Tokenizer::encode_chat(std::string_view user_text) const {
  return encode_segments(*impl_, chat_segments(*impl_, user_text));
}

std::vector<int32_t> Tokenizer::encode_chat_turns(std::span<const ChatTurn> turns) const {
  return encode_segments(*impl_, chat_turn_segments(*impl_, turns));
}

StreamDecoder::StreamDecoder(const Tokenizer& tok, bool render_special) : tok_(&tok), render_special_(render_special) {}

std::string StreamDecoder::push(int32_t id) {
  tok_->decode_append(id, render_special_, at_text_start_, pending_);
  const size_t ready = utf8_complete_prefix(pending_);
  std::string out = pending_.substr(0, ready);
  pending_.erase(0, ready);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace topkv
