// Text <-> token ids for the models topkv runs (MODELS.md, "Tokenizer").
//
// Two vocabulary kinds, both read from GGUF metadata:
//   Spm  tokenizer.ggml.model = "llama": SentencePiece BPE with byte fallback
//        (Gemma 3, Llama 2). Spaces become U+2581; adjacent symbols merge by
//        the score of the piece they form; what is no piece becomes <0xXX>.
//   Bpe  tokenizer.ggml.model = "gpt2": byte-level BPE with ranked merges and
//        the Llama 3 pre-tokenizer regex (Llama 3, 3.1, 3.2) or the Qwen2 one
//        (Qwen2, 2.5, 2.5-Coder: the same with single-digit numbers).
// Reference implementation: llama.cpp src/llama-vocab.cpp. Deliberate
// differences are noted where they are made (tokenizer.cpp).
//
// Special tokens written in the text: user-defined pieces (type 4) are always
// split out first, exactly as SentencePiece and Hugging Face do; control and
// unknown pieces (types 3, 2) only when `parse_special` is set. Matching is
// leftmost-longest (Hugging Face's added-token matcher).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace topkv {

class GgufFile;

// tokenizer.ggml.token_type values (llama.cpp llama_token_type).
enum class TokenType : uint8_t {
  Undefined = 0,  // treated as Normal
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,  // SPM byte-fallback piece "<0xXX>"
};

enum class VocabKind : uint8_t { Spm, Bpe };

// One message of a conversation: role system, user or assistant.
struct ChatTurn {
  std::string role, content;
};

// Prompt formats apply_chat_template knows.
enum class ChatFormat : uint8_t { None, Gemma, Llama3, Llama2, ChatML };
const char* chat_format_name(ChatFormat f);

// Everything a tokenizer is built from; load_vocab fills it from GGUF, tests
// build it by hand. Special ids are -1 when the model has none.
struct Vocab {
  VocabKind kind = VocabKind::Spm;
  std::vector<std::string> tokens;  // piece text (Bpe: in the GPT-2 byte alphabet)
  std::vector<float> scores;        // Spm: one per token (higher merges first); Bpe: may be empty
  std::vector<TokenType> types;     // one per token; empty means all Normal
  std::vector<std::string> merges;  // Bpe: "left right", rank = position
  std::string pre = "llama-bpe";    // Bpe pre-tokenizer (tokenizer.ggml.pre)
  int32_t bos = -1, eos = -1, eot = -1, pad = -1, unk = -1;
  bool add_bos = true;              // tokenizer.ggml.add_bos_token
  bool add_space_prefix = true;     // Spm: a space before the text (Llama 2 yes, Gemma 3 no)
  std::string architecture;         // general.architecture, picks the chat format
  std::string chat_template;        // tokenizer.chat_template (may be empty)
};

// Reads the tokenizer.* keys of a GGUF file; every missing or inconsistent
// key is a topkv::Error naming it.
Vocab load_vocab(const GgufFile& file);

struct TokenizerImpl;

class Tokenizer {
 public:
  // Validates the vocabulary (array lengths, id ranges, byte pieces, merges)
  // and builds the lookup tables; throws topkv::Error on anything wrong.
  explicit Tokenizer(Vocab vocab);
  static Tokenizer from_gguf(const GgufFile& file);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Text to ids. `add_bos` prepends the BOS id (the model's own preference is
  // add_bos_default()); `parse_special` lets control tokens written in the
  // text ("<start_of_turn>") become their ids instead of being spelled out.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;
  // The same with the plain O(n^2) merge loop (greedy_merge.h), for tests.
  std::vector<int32_t> encode_reference(std::string_view text, bool add_bos, bool parse_special) const;

  // Ids to text. Control/unknown/unused tokens render as their text only with
  // `render_special`. With an Spm add_space_prefix vocabulary, the space that
  // encode() puts before text at the start and after a special token is
  // dropped again, so decode(encode(t)) == t for any text t.
  std::string decode(const std::vector<int32_t>& ids, bool render_special = false) const;
  // The bytes one token stands for (a byte token: one byte, possibly half a
  // UTF-8 character; see StreamDecoder). Empty for control/unknown/unused
  // tokens unless `render_special`.
  const std::string& piece(int32_t id, bool render_special = false) const;
  // Incremental decode: appends what `id` adds to decode() of the ids before
  // it; `at_text_start` carries the prefix-space state (start it as true).
  void decode_append(int32_t id, bool render_special, bool& at_text_start, std::string& out) const;

  const std::string& token_text(int32_t id) const;  // the raw vocabulary entry
  TokenType token_type(int32_t id) const;
  int32_t find_token(std::string_view text) const;  // id of an exact piece, or -1
  int32_t n_tokens() const;
  VocabKind kind() const;
  int32_t bos() const;
  int32_t eos() const;
  int32_t eot() const;  // end of turn (<end_of_turn>, <|eot_id|>, <|im_end|>), -1 if none
  int32_t pad() const;
  int32_t unk() const;
  bool add_bos_default() const;
  // End of generation: eos, eot, and the other end markers the vocabulary has
  // as control tokens (<|eom_id|>, <|end_of_text|>, <|im_end|>, <|endoftext|>).
  bool is_eog(int32_t id) const;
  const Vocab& vocab() const;

  // Chat prompt for one user turn, ending where the model's reply begins.
  // The format comes from tokenizer.chat_template when present (recognised by
  // its markers), else from the architecture and vocabulary; ChatFormat::None
  // when neither identifies a known format.
  ChatFormat chat_format() const;
  // The system message the chat prompt starts with (ChatML only; empty: none).
  const std::string& chat_system_prompt() const;
  // The prompt as text, special tokens spelled out (encode it with
  // parse_special and no extra BOS). Throws topkv::Error for an unknown format.
  // ChatML (Qwen) puts the template's default system message first when the
  // template has one (chat_system_prompt()).
  std::string apply_chat_template(std::string_view user_text) const;
  // The prompt as ids. Unlike encoding apply_chat_template's text, special
  // tokens written inside user_text stay plain text.
  std::vector<int32_t> encode_chat(std::string_view user_text) const;
  // A conversation (system, user and assistant turns, as the OpenAI chat API
  // sends them), ending where the model's next reply begins. One user turn
  // gives encode_chat's ids. Error on an unknown role or format.
  std::vector<int32_t> encode_chat_turns(std::span<const ChatTurn> turns) const;

 private:
  std::vector<int32_t> encode_impl(std::string_view text, bool add_bos, bool parse_special, bool reference) const;
  std::unique_ptr<const TokenizerImpl> impl_;
};

// Streaming detokenisation for generation: feed ids one at a time, get text
// that never ends in the middle of a UTF-8 character (byte tokens can split a
// character across several ids). The concatenation of every push() and the
// final flush() equals tok.decode(ids, render_special).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool render_special = false);
  std::string push(int32_t id);
  // What is still held back: an incomplete sequence at the end, as raw bytes.
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool render_special_;
  bool at_text_start_ = true;
  std::string pending_;
};

}  // namespace topkv
