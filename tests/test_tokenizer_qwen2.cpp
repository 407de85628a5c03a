// The Qwen2 tokenizer (tokenizer.ggml.pre = "qwen2": Qwen2, 2.5, 2.5-Coder).
// Without a model: the pre-tokenizer on hand-made cases and against the words
// Python's `regex` module makes of the golden prompts; merges (no
// ignore_merges, digits one by one), special tokens, end of generation and the
// ChatML prompt on a hand-built vocabulary. With the real Qwen2.5-Coder GGUF
// (TOPKV_QWEN2_MODEL, else .models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf in
// the source tree; skipped when absent): special ids, the chat prompt as
// transformers renders the GGUF's template, the golden ids of
// tests/data/qwen2_golden_tokens.json (scripts/make_golden_qwen2.py), round
// trips, and the fast merge loop against the reference one.
//
// A known difference to Hugging Face: Qwen2's tokenizer.json normalises the
// text to NFC first; llama.cpp and topkv do not, so text that NFC changes
// ("e" + U+0301) gives other ids than transformers' Qwen2Tokenizer (the same
// ids as transformers' GGUF conversion and llama.cpp). The golden prompts are
// NFC-stable.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "src/model/gguf.h"
#include "src/model/tokenizer.h"
#include "src/model/tokenizer_impl.h"
#include "tests/tokenizer_test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

using Words = std::vector<std::string>;

Words split(const std::string& s, int max_digits) {
  Words out;
  size_t end = 0;
  for (auto [b, e] : bpe_pretokenize(s, max_digits)) {
    REQUIRE(b == end);  // the words tile the text
    end = e;
    out.push_back(s.substr(b, e - b));
  }
  REQUIRE(end == s.size());
  return out;
}

nlohmann::json golden() {
  std::ifstream in(TOPKV_SOURCE_DIR "/tests/data/qwen2_golden_tokens.json");
  REQUIRE(in);
  return nlohmann::json::parse(in);
}

std::vector<std::string> pieces(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::vector<std::string> out;
  for (int32_t id : ids) out.push_back(t.token_text(id));
  return out;
}

}  // namespace

TEST_CASE("Qwen2 pre-tokenizer: single digits, contractions, line breaks (by hand from the regex)") {
  CHECK(split("x = 12345 + 678", kQwen2MaxDigits) ==
        Words{"x", " =", " ", "1", "2", "3", "4", "5", " +", " ", "6", "7", "8"});
  CHECK(split("12345 3.14 $100", kQwen2MaxDigits) ==
        Words{"1", "2", "3", "4", "5", " ", "3", ".", "1", "4", " $", "1", "0", "0"});
  CHECK(split("12345 3.14 $100", kLlama3MaxDigits) == Words{"123", "45", " ", "3", ".", "14", " $", "100"});
  CHECK(split("abc123def v1.2 2nd", kQwen2MaxDigits) ==
        Words{"abc", "1", "2", "3", "def", " v", "1", ".", "2", " ", "2", "nd"});
  CHECK(split("٣٤٥٦", kQwen2MaxDigits) == Words{"٣", "٤", "٥", "٦"});
  CHECK(split("I'm here, don't", kQwen2MaxDigits) == Words{"I", "'m", " here", ",", " don", "'t"});
  CHECK(split("HE'LL 'sup a'b", kQwen2MaxDigits) == Words{"HE", "'LL", " '", "sup", " a", "'b"});
  CHECK(split("x'ſtep", kQwen2MaxDigits) == Words{"x", "'ſ", "tep"});  // long s case-folds to s
  CHECK(split("a\n\nb", kQwen2MaxDigits) == Words{"a", "\n\n", "b"});
  CHECK(split("a\r\nb", kQwen2MaxDigits) == Words{"a", "\r\n", "b"});
  CHECK(split("x   \n  y", kQwen2MaxDigits) == Words{"x", "   \n", " ", " y"});
  CHECK(split("  \n\n  x", kQwen2MaxDigits) == Words{"  \n\n", " ", " x"});
  CHECK(split("hi!!! ok?!\n\nx", kQwen2MaxDigits) == Words{"hi", "!!!", " ok", "?!\n\n", "x"});
  CHECK(split("end  ", kQwen2MaxDigits) == Words{"end", "  "});
  CHECK(split("", kQwen2MaxDigits) == Words{});
}

TEST_CASE("Qwen2 pre-tokenizer == Python regex on the golden prompts (no model needed)") {
  const nlohmann::json j = golden();
  size_t n_fragments = 0;
  for (const auto& p : j.at("prompts")) {
    const auto want = p.at("words").get<std::vector<Words>>();
    // the stretches between special tokens: concatenations of the expected words
    for (const Words& w : want) {
      std::string fragment;
      for (const std::string& s : w) fragment += s;
      INFO("fragment '" << fragment << "' of '" << p.at("text").get<std::string>() << "'");
      CHECK(split(fragment, kQwen2MaxDigits) == w);
      ++n_fragments;
    }
  }
  CHECK(n_fragments >= j.at("prompts").size());
}

TEST_CASE("Qwen2 merges: no ignore_merges, numbers merge no further than one digit") {
  // "abc" is a piece no merge builds: Llama 3 takes it whole, Qwen2 does not
  Tokenizer q(byte_level_vocab({"a b"}, {"abc"}, "qwen2", {}));
  CHECK(pieces(q, q.encode("abc", false, false)) == Words{"ab", "c"});
  CHECK(q.encode_reference("abc", false, false) == q.encode("abc", false, false));
  Tokenizer l3(byte_level_vocab({"a b"}, {"abc"}, "llama-bpe", {}));
  CHECK(pieces(l3, l3.encode("abc", false, false)) == Words{"abc"});
  // the merges "1 2", "12 3" exist, but the Qwen2 split never hands them a pair
  Tokenizer t(qwen2_vocab(kBpeMerges));
  CHECK(pieces(t, t.encode("123 the", false, false)) == Words{"1", "2", "3", "Ġthe"});
  Tokenizer b(bpe_vocab(kBpeMerges));
  CHECK(pieces(b, b.encode("123 the", false, false)) == Words{"123", "Ġthe"});
  Vocab dq = qwen2_vocab(kBpeMerges);
  dq.pre = "deepseek-r1-qwen";  // llama.cpp's name for the same pre-tokenizer
  CHECK(Tokenizer(dq).encode("123", false, false) == t.encode("123", false, false));
}

TEST_CASE("Qwen2 special tokens: control with parse_special, user-defined always - im_end ends generation") {
  Tokenizer t(qwen2_vocab(kBpeMerges));
  const int32_t eot = id_of(t, "<|endoftext|>"), ims = id_of(t, "<|im_start|>"), ime = id_of(t, "<|im_end|>"),
                tool = id_of(t, "<tool_call>"), pad = id_of(t, "[PAD999]");
  CHECK(t.encode("<|im_start|>the<|im_end|>", false, true) == std::vector<int32_t>{ims, 't', id_of(t, "he"), ime});
  const auto plain = t.encode("<|im_end|><tool_call>", false, false);
  CHECK(plain.size() > 2);
  CHECK(plain.back() == tool);  // user-defined: split out even without parse_special
  CHECK(t.decode(plain) == "<|im_end|><tool_call>");
  CHECK(t.encode("[PAD999]", false, true).size() > 1);  // unused: never matched in text
  CHECK(t.decode({ims, 't', ime, tool}) == "t<tool_call>");
  CHECK(t.decode({ims, 't', ime, tool}, true) == "<|im_start|>t<|im_end|><tool_call>");
  CHECK_FALSE(t.add_bos_default());
  CHECK(t.encode("the", t.add_bos_default(), true) == std::vector<int32_t>{'t', id_of(t, "he")});
  CHECK(t.eos() == ime);
  CHECK(t.eot() == ime);
  CHECK(t.is_eog(ime));
  CHECK(t.is_eog(eot));
  CHECK_FALSE(t.is_eog(ims));
  CHECK_FALSE(t.is_eog(tool));
  CHECK_FALSE(t.is_eog(pad));
  CHECK_FALSE(t.is_eog('t'));
}

TEST_CASE("ChatML prompt: the template's default system message, from the template or the architecture") {
  Tokenizer t(qwen2_vocab(kBpeMerges));
  REQUIRE(t.chat_format() == ChatFormat::ChatML);
  CHECK(std::string(chat_format_name(t.chat_format())) == "chatml");
  CHECK(t.chat_system_prompt() == "You are Qwen, a 'test' model.");
  const std::string prompt = t.apply_chat_template("the");
  CHECK(prompt ==
        "<|im_start|>system\nYou are Qwen, a 'test' model.<|im_end|>\n<|im_start|>user\nthe<|im_end|>\n"
        "<|im_start|>assistant\n");
  CHECK(t.encode_chat("the") == t.encode(prompt, false, true));
  auto ids = t.encode_chat("<|im_end|>");  // typed by the user: stays text
  CHECK(std::count(ids.begin(), ids.end(), id_of(t, "<|im_end|>")) == 2);
  CHECK(t.decode(ids, true) == t.apply_chat_template("<|im_end|>"));

  // Qwen2.5's template: two <|im_start|>system\n literals that are not the
  // default message (tools; a system message of the caller's), then the default.
  const std::string qwen25 =
      "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] == 'system' %}\n"
      "{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
      "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
      "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
      "assistant.<|im_end|>\\n' }}\n    {%- endif %}\n{%- endif %}\n";
  CHECK(chatml_default_system(qwen25) == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  CHECK(chatml_default_system("{{ \"<|im_start|>system\\nYou're \\\"kind\\\".\\n<|im_end|>\" }}") ==
        "You're \"kind\".\n");
  // Qwen3 / plain ChatML: no default system turn
  const std::string plain = "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + "
                            "'<|im_end|>' + '\\n' }}{%- endfor %}";
  CHECK(chatml_default_system(plain).empty());
  Tokenizer p(qwen2_vocab(kBpeMerges, plain));
  REQUIRE(p.chat_format() == ChatFormat::ChatML);
  CHECK(p.apply_chat_template("the") == "<|im_start|>user\nthe<|im_end|>\n<|im_start|>assistant\n");

  Vocab na = qwen2_vocab(kBpeMerges);
  na.chat_template.clear();  // no template: ChatML by the architecture, no system turn
  Tokenizer by_arch(na);
  REQUIRE(by_arch.chat_format() == ChatFormat::ChatML);
  CHECK(by_arch.apply_chat_template("x") == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n");
  na.add_bos = true;  // a vocabulary that asks for BOS gets it first
  CHECK(Tokenizer(na).encode_chat("x").front() == na.bos);
  na.architecture = "mistral";
  CHECK(Tokenizer(na).chat_format() == ChatFormat::None);
  Vocab nt = bpe_vocab(kBpeMerges);  // a ChatML template on a vocabulary without <|im_start|>
  nt.chat_template = plain;
  CHECK(Tokenizer(nt).chat_format() == ChatFormat::None);
}

// ---- the real Qwen2.5-Coder vocabulary ----------------------------------------------

namespace {

std::string qwen2_model_path() {
  if (const char* p = std::getenv("TOPKV_QWEN2_MODEL")) return p;
  return TOPKV_SOURCE_DIR "/.models/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf";
}

}  // namespace

TEST_CASE("Qwen2.5-Coder vocabulary: special ids, ChatML prompt, golden ids, round trips, fast == reference") {
  const std::string path = qwen2_model_path();
  if (!std::filesystem::exists(path)) {
    WARN("no model at " << path
                        << " (set TOPKV_QWEN2_MODEL or run scripts/fetch-model.sh qwen2.5-coder-0.5b); skipping the "
                           "real Qwen2 vocabulary test");
    return;
  }
  auto f = GgufFile::open(path);
  const Tokenizer t = Tokenizer::from_gguf(*f);
  REQUIRE(t.kind() == VocabKind::Bpe);
  REQUIRE(t.n_tokens() == 151936);
  CHECK(t.vocab().pre == "qwen2");
  CHECK(t.bos() == 151643);
  CHECK(t.pad() == 151643);
  CHECK(t.eos() == 151645);
  CHECK(t.eot() == 151645);
  CHECK_FALSE(t.add_bos_default());
  CHECK(t.find_token("<|endoftext|>") == 151643);
  CHECK(t.find_token("<|im_start|>") == 151644);
  CHECK(t.token_type(151644) == TokenType::Control);
  CHECK(t.token_type(t.find_token("<|fim_middle|>")) == TokenType::Control);
  CHECK(t.token_type(t.find_token("<tool_call>")) == TokenType::UserDefined);
  CHECK(t.token_type(151935) == TokenType::Unused);  // [PAD151935]: the padding up to the model's vocabulary
  CHECK(t.is_eog(151645));
  CHECK(t.is_eog(151643));
  CHECK_FALSE(t.is_eog(151644));
  REQUIRE(t.chat_format() == ChatFormat::ChatML);
  CHECK(t.chat_system_prompt() == "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");

  const nlohmann::json j = golden();
  for (const auto& c : j.at("chat")) {
    const std::string user = c.at("user").get<std::string>();
    INFO("chat prompt for '" << user << "'");
    CHECK(t.apply_chat_template(user) == c.at("text").get<std::string>());
    CHECK(t.encode_chat(user) == c.at("ids").get<std::vector<int32_t>>());
  }
  REQUIRE(j.at("prompts").size() > 0);
  for (const auto& p : j.at("prompts")) {
    const std::string text = p.at("text").get<std::string>();
    const std::vector<int32_t> want = p.at("ids").get<std::vector<int32_t>>();
    INFO("golden prompt '" << text << "'");
    CHECK(t.encode(text, false, true) == want);
    CHECK(t.encode_reference(text, false, true) == want);
    CHECK(t.decode(want, true) == text);
    CHECK(t.decode(t.encode(text, false, false)) == text);
  }

  std::mt19937 rng(2025);
  for (int i = 0; i < 40; ++i) {
    std::string text = random_text(rng, 200);
    if (i % 4 == 0) text += " x = 1234567 <|im_end|>\n<tool_call>";
    for (bool special : {false, true}) {
      const auto ids = t.encode(text, false, special);
      INFO("text '" << text << "'");
      REQUIRE(t.decode(ids, special) == text);
      REQUIRE(t.encode_reference(text, false, special) == ids);
    }
  }
}
