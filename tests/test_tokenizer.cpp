// Tokenizer tests on hand-built SentencePiece and byte-level BPE
// vocabularies: known answers for the merge order, byte fallback, special
// tokens and the Llama 3 pre-tokenizer; random round trips; the fast merge
// loop against the plain reference; streaming decode; chat prompts; every
// bad-input path. GGUF loading and the real Gemma 3 vocabulary:
// test_tokenizer_gguf.cpp; the Qwen2 pre-tokenizer, ChatML and the real Qwen2.5
// vocabulary: test_tokenizer_qwen2.cpp.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "src/common/error.h"
#include "src/model/tokenizer.h"
#include "src/model/tokenizer_impl.h"
#include "src/model/unicode.h"
#include "tests/tokenizer_test_util.h"

using namespace topkv;
using namespace topkv::test;

// ---- unicode ----------------------------------------------------------------------

TEST_CASE("UTF-8 decoding is strict and never loses a byte - classes cover the scripts") {
  for (uint32_t cp : std::initializer_list<uint32_t>{0x24u, 0xA2u, 0x939u, 0x20ACu, 0xD55Cu, 0x10348u, 0x10FFFFu}) {
    const std::string s = utf8(cp);
    const Utf8Char c = utf8_decode(s, 0);
    CHECK(c.valid);
    CHECK(c.cp == cp);
    CHECK(c.len == s.size());
  }
  for (const char* bad : {"\x80", "\xC0\xAF", "\xE0\x80\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xF8", "\xE2\x82"}) {
    const Utf8Char c = utf8_decode(bad, 0);
    CHECK_FALSE(c.valid);
    CHECK(c.len == 1);
  }
  // letters
  for (uint32_t cp : std::initializer_list<uint32_t>{'a', 'Z', 0xE9, 0x3B1, 0x436, 0x5E9, 0x639, 0x928, 0x4E2D, 0x3042,
                                                     0xD55C, 0x20000})
    CHECK(is_letter(cp));
  // numbers: ASCII, Arabic-Indic, Devanagari, fullwidth, Roman numeral, fraction
  for (uint32_t cp : std::initializer_list<uint32_t>{'0', '9', 0x663, 0x966, 0xFF11, 0x2160, 0xBD})
    CHECK(is_number(cp));
  for (uint32_t cp : std::initializer_list<uint32_t>{' ', '.', 0x94D, 0x301, 0x1F600, 0x2581, 0xDC80})
    CHECK_FALSE(is_letter(cp));
  for (uint32_t cp : std::initializer_list<uint32_t>{'a', ' ', 0x2581, 0x94D}) CHECK_FALSE(is_number(cp));
  for (uint32_t cp :
       std::initializer_list<uint32_t>{' ', '\t', '\n', '\r', 0x0B, 0x0C, 0x85, 0xA0, 0x2003, 0x2028, 0x3000})
    CHECK(is_whitespace(cp));
  for (uint32_t cp : std::initializer_list<uint32_t>{'a', 0x200B, 0x200D, 0xFEFF, 0x2581})
    CHECK_FALSE(is_whitespace(cp));
}

TEST_CASE("utf8_complete_prefix holds back only a sequence that can still complete") {
  const std::string euro = "\xE2\x82\xAC", emoji = utf8(0x1F600);
  CHECK(utf8_complete_prefix("ab") == 2);
  CHECK(utf8_complete_prefix("a" + euro) == 4);
  CHECK(utf8_complete_prefix("a" + euro.substr(0, 1)) == 1);
  CHECK(utf8_complete_prefix("a" + euro.substr(0, 2)) == 1);
  CHECK(utf8_complete_prefix(emoji.substr(0, 3)) == 0);
  CHECK(utf8_complete_prefix("a\x80") == 2);      // stray continuation: emit
  CHECK(utf8_complete_prefix("a\xE0\x80") == 3);  // overlong, can never complete: emit
  CHECK(utf8_complete_prefix("a\xFF") == 2);      // not a lead byte at all
  CHECK(utf8_complete_prefix("") == 0);
}

// ---- SentencePiece BPE ----------------------------------------------------------

TEST_CASE("SPM merge order: highest score first, leftmost on ties, greedy not optimal") {
  auto encode = [](std::vector<std::pair<std::string, float>> pieces, const std::string& text) {
    Tokenizer t(spm_vocab(pieces));
    std::vector<std::string> out;
    for (int32_t id : t.encode(text, false, false)) out.push_back(t.token_text(id));
    CHECK(t.encode_reference(text, false, false) == t.encode(text, false, false));
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(encode({{"a", 0}, {"b", 0}, {"c", 0}, {"ab", -1}, {"bc", -2}}, "abc") == V{"ab", "c"});
  CHECK(encode({{"a", 0}, {"b", 0}, {"c", 0}, {"ab", -2}, {"bc", -1}}, "abc") == V{"a", "bc"});
  CHECK(encode({{"a", 0}, {"aa", -1}}, "aaa") == V{"aa", "a"});  // tie: leftmost
  CHECK(encode({{"a", 0}, {"aa", -1}}, "aaaaa") == V{"aa", "aa", "a"});
  CHECK(encode({{"a", 0}, {"aa", -1}, {"aaa", -0.5f}}, "aaaa") == V{"aaa", "a"});
  // ab and cd tie (ab first), then abcd; with bc scoring highest the greedy
  // choice blocks both and "abcd" is never reached.
  CHECK(encode({{"a", 0}, {"b", 0}, {"c", 0}, {"d", 0}, {"ab", -1}, {"cd", -1}, {"abcd", -3}}, "abcd") == V{"abcd"});
  CHECK(encode({{"a", 0}, {"b", 0}, {"c", 0}, {"d", 0}, {"ab", -1}, {"cd", -1}, {"abcd", -3}, {"bc", 0}}, "abcd") ==
        V{"a", "bc", "d"});
  // merges go through a multi-byte character, spaces become ▁
  CHECK(encode({{"▁", 0}, {"中", 0}, {"文", 0}, {"▁中", -1}, {"▁中文", -2}}, " 中文") == V{"▁中文"});
}

TEST_CASE("SPM byte fallback spells unknown characters as <0xXX> - unk only without byte pieces") {
  Tokenizer t(spm_vocab(common_pieces()));
  const std::string emoji = utf8(0x1F600);  // F0 9F 98 80
  auto ids = t.encode("a" + emoji + "b", false, false);
  REQUIRE(ids.size() == 6);
  CHECK(ids[0] == id_of(t, "a"));
  CHECK(ids[1] == kByte0 + 0xF0);
  CHECK(ids[2] == kByte0 + 0x9F);
  CHECK(ids[3] == kByte0 + 0x98);
  CHECK(ids[4] == kByte0 + 0x80);
  CHECK(ids[5] == id_of(t, "b"));
  CHECK(t.decode(ids) == "a" + emoji + "b");
  // a control character and an invalid byte also go through bytes
  CHECK(t.encode("\x01", false, false) == std::vector<int32_t>{kByte0 + 1});
  CHECK(t.encode("\xFF", false, false) == std::vector<int32_t>{kByte0 + 0xFF});

  Vocab v = spm_vocab({{"a", 0}});  // drop the byte pieces: unknown characters become <unk>
  for (int b = 0; b < 256; ++b)
    v.tokens[kByte0 + b] = "byte" + std::to_string(b), v.types[kByte0 + b] = TokenType::Normal;
  Tokenizer u(v);
  CHECK(u.encode("a" + emoji, false, false) == std::vector<int32_t>{id_of(u, "a"), 3, 3, 3, 3});
}

TEST_CASE("SPM special tokens: control only with parse_special, user-defined always, leftmost-longest") {
  Tokenizer t(spm_vocab(common_pieces()));
  const std::string text = "ab<start_of_turn>user\nhello[UD]a  b<end_of_turn>";
  auto on = t.encode(text, true, true);
  const std::vector<int32_t> expect_on = {2,   id_of(t, "ab"), kSot,       id_of(t, "user"), kNl, id_of(t, "hello"),
                                          kUd, id_of(t, "a"),  kTwoSpaces, id_of(t, "b"),    kEot};
  CHECK(on == expect_on);
  CHECK(t.decode(on) == text.substr(0, 2) + "user\nhello[UD]a  b");
  CHECK(t.decode(on, true) == "<bos>" + text);
  auto off = t.encode(text, false, false);
  CHECK(std::count(off.begin(), off.end(), kSot) == 0);
  CHECK(std::count(off.begin(), off.end(), kUd) == 1);  // user-defined: split out regardless
  CHECK(std::count(off.begin(), off.end(), kNl) == 1);
  CHECK(t.decode(off) == text);  // spelled out with ordinary pieces
  // "  " (user-defined) wins over "▁▁" because it is split out before merging
  CHECK(t.encode("a   b", false, false) ==
        std::vector<int32_t>{id_of(t, "a"), kTwoSpaces, id_of(t, "▁"), id_of(t, "b")});
}

TEST_CASE("SPM add_space_prefix: a space before text at the start and after specials - decode drops it") {
  Tokenizer t(spm_vocab(common_pieces(), /*add_space_prefix=*/true));
  CHECK(t.encode("hello", false, false) == std::vector<int32_t>{id_of(t, "▁hello")});
  CHECK(t.encode("hello", true, false) == std::vector<int32_t>{2, id_of(t, "▁hello")});
  auto ids = t.encode("ab<end_of_turn>hello", false, true);
  CHECK(ids == std::vector<int32_t>{id_of(t, "▁ab"), kEot, id_of(t, "▁hello")});
  CHECK(t.decode(ids) == "abhello");
  CHECK(t.decode(ids, true) == "ab<end_of_turn>hello");
  CHECK(t.decode(t.encode(" hello", true, false)) == " hello");
  Tokenizer g(spm_vocab(common_pieces(), false));
  CHECK(g.encode("hello", false, false) != t.encode("hello", false, false));
}

TEST_CASE("SPM and BPE round trip random UTF-8 and random bytes exactly - fast merge == reference") {
  std::mt19937 rng(1234);
  std::vector<Tokenizer> toks;
  toks.emplace_back(spm_vocab(common_pieces(), false));
  toks.emplace_back(spm_vocab(common_pieces(), true));
  toks.emplace_back(bpe_vocab(kBpeMerges));
  toks.emplace_back(qwen2_vocab(kBpeMerges));
  for (const Tokenizer& t : toks) {
    for (int trial = 0; trial < 150; ++trial) {
      const int len = std::uniform_int_distribution<int>(0, 120)(rng);
      std::string text = trial % 3 == 2 ? random_bytes(rng, len) : random_text(rng, len);
      if (trial % 5 == 0) text += "<start_of_turn>x<|eot_id|>[UD]<|im_end|>1234<tool_call>";
      const bool bos = trial % 2 == 0;
      for (bool parse_special : {false, true}) {
        const auto ids = t.encode(text, bos, parse_special);
        INFO("kind " << (int)t.kind() << " trial " << trial << " text '" << text << "'");
        REQUIRE(ids.size() >= (size_t)bos);
        if (bos) REQUIRE(ids[0] == t.bos());
        if (!parse_special) REQUIRE(t.decode(ids) == text);
        // control tokens parsed from the text come back when rendered
        REQUIRE(t.decode(std::vector<int32_t>(ids.begin() + bos, ids.end()), /*render_special=*/true) == text);
        REQUIRE(t.encode_reference(text, bos, parse_special) == ids);
        for (int32_t id : ids) REQUIRE((id >= 0 && id < t.n_tokens()));
      }
    }
  }
}

// ---- byte-level BPE ---------------------------------------------------------------

TEST_CASE("Llama 3 pre-tokenizer splits like the regex on hand-made cases") {
  auto split = [](const std::string& s) {
    std::vector<std::string> out;
    size_t end = 0;
    for (auto [b, e] : bpe_pretokenize(s, kLlama3MaxDigits)) {
      REQUIRE(b == end);  // the words tile the text
      end = e;
      out.push_back(s.substr(b, e - b));
    }
    REQUIRE(end == s.size());
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(split("Hello world") == V{"Hello", " world"});
  CHECK(split("I'm here, don't") == V{"I", "'m", " here", ",", " don", "'t"});
  CHECK(split("HE'LL 'sup a'b") == V{"HE", "'LL", " '", "sup", " a", "'b"});
  CHECK(split("12345 3.14 $100") == V{"123", "45", " ", "3", ".", "14", " $", "100"});
  CHECK(split("a  b") == V{"a", " ", " b"});
  CHECK(split("a\n\nb") == V{"a", "\n\n", "b"});
  CHECK(split("a\r\nb") == V{"a", "\r\n", "b"});
  CHECK(split("x   \n  y") == V{"x", "   \n", " ", " y"});
  CHECK(split("hi!!! ok?!\n\nx") == V{"hi", "!!!", " ok", "?!\n\n", "x"});
  CHECK(split("end  ") == V{"end", "  "});
  CHECK(split("hello\tworld") == V{"hello", "\tworld"});
  CHECK(split("привет мир") == V{"привет", " мир"});
  CHECK(split("中文字符。한국어") == V{"中文字符", "。한국어"});
  // combining marks are not letters: Devanagari splits at the virama and vowel sign
  CHECK(split("नमस्ते") == V{"नमस", "्त", "े"});
  CHECK(split("٣٤٥٦") == V{"٣٤٥", "٦"});
  CHECK(split("") == V{});
  CHECK(split("\xFF\xFE"
              "ab\xFF"
              "c") == V{"\xFF\xFE", "ab",
                        "\xFF"
                        "c"});  // invalid bytes: "other" characters
}

TEST_CASE("BPE merge order by rank, leftmost on ties - ignore_merges takes whole-word tokens") {
  auto encode = [](std::vector<std::string> merges, const std::string& text, std::vector<std::string> extra = {},
                   std::string pre = "llama-bpe") {
    Tokenizer t(bpe_vocab(merges, extra, pre));
    std::vector<std::string> out;
    for (int32_t id : t.encode(text, false, false)) out.push_back(t.token_text(id));
    CHECK(t.encode_reference(text, false, false) == t.encode(text, false, false));
    return out;
  };
  using V = std::vector<std::string>;
  CHECK(encode({"a b", "b c"}, "abc") == V{"ab", "c"});
  CHECK(encode({"b c", "a b"}, "abc") == V{"a", "bc"});
  CHECK(encode({"a a"}, "aaaaa") == V{"aa", "aa", "a"});
  CHECK(encode({"a a", "aa aa"}, "aaaa") == V{"aaaa"});
  CHECK(encode({"Ġ t", "h e", "Ġt he"}, " the the") == V{"Ġthe", "Ġthe"});
  CHECK(encode({"Ġ t", "h e", "Ġt he"}, "the") == V{"t", "he"});
  // "abc" is a token no merge builds: Llama 3 (ignore_merges) takes it whole
  CHECK(encode({"a b"}, "abc", {"abc"}) == V{"abc"});
  CHECK(encode({"a b"}, "abc", {"abc"}, "dbrx") == V{"ab", "c"});
  // non-ASCII bytes go through the GPT-2 byte alphabet
  Tokenizer t(bpe_vocab({"Ã ©"}));
  CHECK(t.encode("é", false, false) == std::vector<int32_t>{t.find_token("Ã©")});
  CHECK(t.decode(t.encode("é\xFF", false, false)) == "é\xFF");
}

TEST_CASE("BPE special tokens and decode") {
  Tokenizer t(bpe_vocab(kBpeMerges));
  const int32_t eot = t.find_token("<|eot_id|>"), sh = t.find_token("<|start_header_id|>");
  auto ids = t.encode("<|start_header_id|>the<|eot_id|>", true, true);
  CHECK(ids == std::vector<int32_t>{t.bos(), sh, 't', t.find_token("he"), eot});
  CHECK(t.decode(ids) == "the");
  CHECK(t.decode(ids, true) == "<|begin_of_text|><|start_header_id|>the<|eot_id|>");
  auto off = t.encode("<|eot_id|>", false, false);
  CHECK(off.size() > 1);
  CHECK(t.decode(off) == "<|eot_id|>");
  CHECK(t.is_eog(eot));
  CHECK(t.eot() == eot);
  CHECK(t.is_eog(t.eos()));
  CHECK_FALSE(t.is_eog(t.bos()));
  CHECK_FALSE(t.is_eog('a'));
}

// ---- streaming, chat, errors -------------------------------------------------------

TEST_CASE("StreamDecoder never splits a UTF-8 character and equals decode()") {
  Tokenizer t(spm_vocab(common_pieces()));
  const std::string emoji = utf8(0x1F600);
  StreamDecoder sd(t);
  auto ids = t.encode("a" + emoji + "é中", false, false);  // emoji: 4 byte tokens
  std::vector<std::string> parts;
  for (int32_t id : ids) parts.push_back(sd.push(id));
  CHECK(parts == std::vector<std::string>{"a", "", "", "", emoji, "é", "中"});
  CHECK(sd.flush().empty());
  // byte tokens spelling "é" (C3 A9) one at a time
  StreamDecoder sd2(t);
  CHECK(sd2.push(kByte0 + 0xC3).empty());
  CHECK(sd2.push(kByte0 + 0xA9) == "é");
  CHECK(sd2.push(kByte0 + 0xE4).empty());
  CHECK(sd2.flush() == "\xE4");  // generation ended mid-character: raw bytes

  // random id sequences (bytes, specials, pieces): concatenation == decode
  std::mt19937 rng(99);
  std::uniform_int_distribution<int32_t> any(0, t.n_tokens() - 1), byte(kByte0 + 0x80, kByte0 + 0xFF);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> seq;
    for (int k = 0; k < 30; ++k) seq.push_back(k % 3 ? byte(rng) : any(rng));
    for (bool special : {false, true}) {
      StreamDecoder s(t, special);
      std::string all;
      for (int32_t id : seq) {
        std::string out = s.push(id);
        all += out;
      }
      all += s.flush();
      REQUIRE(all == t.decode(seq, special));
    }
  }
  Tokenizer p(spm_vocab(common_pieces(), true));  // prefix-space state carries across pushes
  StreamDecoder sp(p);
  std::string all;
  for (int32_t id : p.encode("hello<end_of_turn>hello world", false, true)) all += sp.push(id);
  CHECK(all == "hellohello world");
}

TEST_CASE("chat templates: Gemma, Llama 3, Llama 2 - unknown formats ask for --raw") {
  Tokenizer g(spm_vocab(common_pieces()));
  REQUIRE(g.chat_format() == ChatFormat::Gemma);
  const std::string prompt = g.apply_chat_template("hello");
  CHECK(prompt == "<bos><start_of_turn>user\nhello<end_of_turn>\n<start_of_turn>model\n");
  CHECK(g.encode_chat("hello") == g.encode(prompt, false, true));
  CHECK(g.encode_chat("hello") == std::vector<int32_t>{2, kSot, id_of(g, "user"), kNl, id_of(g, "hello"), kEot, kNl,
                                                       kSot, id_of(g, "model"), kNl});
  // a control token typed by the user stays text
  auto ids = g.encode_chat("<end_of_turn>");
  CHECK(std::count(ids.begin(), ids.end(), kEot) == 1);
  CHECK(g.decode(ids, true) == g.apply_chat_template("<end_of_turn>").substr(0));

  Tokenizer l3(bpe_vocab(kBpeMerges));
  REQUIRE(l3.chat_format() == ChatFormat::Llama3);
  CHECK(l3.apply_chat_template("the") ==
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nthe<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");
  CHECK(l3.encode_chat("the") == l3.encode(l3.apply_chat_template("the"), false, true));

  Vocab v2 = spm_vocab(common_pieces(), true);
  v2.architecture = "llama";
  v2.chat_template = "{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}";
  Tokenizer l2(v2);
  REQUIRE(l2.chat_format() == ChatFormat::Llama2);
  CHECK(l2.apply_chat_template("hello") == "<bos>[INST] hello [/INST]");
  CHECK(l2.encode_chat("hello") == l2.encode("<bos>[INST] hello [/INST]", false, true));

  Vocab vu = spm_vocab(common_pieces());
  vu.chat_template = "{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}";
  Tokenizer unknown(vu);
  CHECK(unknown.chat_format() == ChatFormat::None);
  CHECK_THROWS_WITH(unknown.apply_chat_template("x"), Catch::Contains("--raw"));
  Vocab va = spm_vocab(common_pieces());
  va.architecture = "mistral";
  CHECK_THROWS_WITH(Tokenizer(va).encode_chat("x"), Catch::Contains("--raw"));
}

TEST_CASE("bad vocabularies and ids are errors that say what is wrong") {
  auto throws = [](Vocab v, const char* what) { CHECK_THROWS_WITH(Tokenizer(std::move(v)), Catch::Contains(what)); };
  Vocab v = spm_vocab(common_pieces());
  {
    Vocab b = v;
    b.tokens.clear(), b.scores.clear(), b.types.clear();
    throws(b, "empty");
  }
  {
    Vocab b = v;
    b.scores.pop_back();
    throws(b, "scores");
  }
  {
    Vocab b = v;
    b.types.pop_back();
    throws(b, "token_type");
  }
  {
    Vocab b = v;
    b.types[20] = (TokenType)7;
    throws(b, "type 7");
  }
  {
    Vocab b = v;
    b.bos = (int32_t)b.tokens.size();
    throws(b, "bos token id");
  }
  {
    Vocab b = v;
    b.unk = -5;
    throws(b, "unknown token id");
  }
  {
    Vocab b = v;
    b.tokens[kByte0 + 3] = "<0xZZ>";
    throws(b, "<0xXX>");
  }
  {
    Vocab b = v;
    b.unk = -1;
    b.types[kByte0 + 3] = TokenType::Normal;
    b.tokens[kByte0 + 3] = "q3";
    throws(b, "<0x03>");
  }
  Vocab w = bpe_vocab(kBpeMerges);
  {
    Vocab b = w;
    b.merges.push_back("nospace");
    throws(b, "not of the form");
  }
  {
    Vocab b = w;
    b.merges.push_back("Ġ zz");
    throws(b, "not in the vocabulary");
  }
  {
    Vocab b = w;
    b.tokens[' '] = "space";
    throws(b, "byte 0x20");
  }
  {
    Vocab b = w;
    b.pre = "gpt-4o";
    throws(b, "'gpt-4o' (tokenizer.ggml.pre) is not supported");
  }
  {
    Vocab b = w;
    b.scores = {1.f};
    throws(b, "scores");
  }

  Tokenizer t(spm_vocab(common_pieces()));
  CHECK_THROWS_WITH(t.decode({0, t.n_tokens()}), Catch::Contains("outside the vocabulary"));
  CHECK_THROWS_AS(t.piece(-1), Error);
  CHECK_THROWS_AS(t.token_text(t.n_tokens()), Error);
  Vocab nb = spm_vocab(common_pieces());
  nb.bos = -1;
  Tokenizer tn(nb);
  CHECK_THROWS_WITH(tn.encode("a", true, false), Catch::Contains("--no-bos"));
  CHECK(tn.encode("a", false, false).size() == 1);
  CHECK(tn.chat_format() == ChatFormat::None);
  CHECK(t.encode("", true, true) == std::vector<int32_t>{2});
  CHECK(t.encode("", false, true).empty());
}
