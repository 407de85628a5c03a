// Tokenizer from GGUF: load_vocab on synthetic files (and every
// inconsistent-key error), and the real Gemma 3 vocabulary when the model file
// is present (TOPKV_MODEL, else .models/ in the source tree): special ids, chat
// prompt ids, round trips, fast == reference, golden ids from Hugging Face
// (tests/data/gemma3_golden_tokens.json, when present).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "src/common/error.h"
#include "src/model/gguf.h"
#include "src/model/gguf_writer.h"
#include "src/model/tokenizer.h"
#include "tests/tokenizer_test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

void write_vocab_gguf(const Vocab& v, const std::string& path, const std::string& model = "",
                      std::function<void(GgufWriter&)> tweak = {}) {
  GgufWriter w;
  w.set_str("general.architecture", v.architecture);
  w.set_str("tokenizer.ggml.model", !model.empty() ? model : v.kind == VocabKind::Spm ? "llama" : "gpt2");
  w.set_arr_str("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w.set_arr_f32("tokenizer.ggml.scores", v.scores);
  std::vector<int32_t> types;
  for (TokenType t : v.types) types.push_back((int32_t)t);
  w.set_arr_i32("tokenizer.ggml.token_type", types);
  if (!v.merges.empty()) w.set_arr_str("tokenizer.ggml.merges", v.merges);
  if (v.kind == VocabKind::Bpe) w.set_str("tokenizer.ggml.pre", v.pre);
  w.set_u32("tokenizer.ggml.bos_token_id", (uint32_t)v.bos);
  w.set_u32("tokenizer.ggml.eos_token_id", (uint32_t)v.eos);
  if (v.unk >= 0) w.set_u32("tokenizer.ggml.unknown_token_id", (uint32_t)v.unk);
  if (v.pad >= 0) w.set_u32("tokenizer.ggml.padding_token_id", (uint32_t)v.pad);
  w.set_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  w.set_bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
  if (tweak) tweak(w);
  w.write(path);
}

}  // namespace

TEST_CASE("load_vocab reads a GGUF vocabulary and rejects inconsistent ones by key") {
  const auto dir = std::filesystem::temp_directory_path() / "topkv_test_tokenizer";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "vocab.gguf").string();
  std::mt19937 rng(7);
  for (const Vocab& v : {spm_vocab(common_pieces(), true), bpe_vocab(kBpeMerges), qwen2_vocab(kBpeMerges)}) {
    write_vocab_gguf(v, path);
    auto f = GgufFile::open(path);
    const Tokenizer from_file = Tokenizer::from_gguf(*f);
    const Tokenizer direct(v);
    CHECK(from_file.kind() == v.kind);
    CHECK(from_file.bos() == v.bos);
    CHECK(from_file.eos() == v.eos);
    CHECK(from_file.unk() == v.unk);
    CHECK(from_file.pad() == v.pad);
    CHECK(from_file.add_bos_default() == v.add_bos);
    CHECK(from_file.vocab().pre == v.pre);
    CHECK(from_file.chat_format() == direct.chat_format());
    for (int trial = 0; trial < 20; ++trial) {
      const std::string text = random_text(rng, 60);
      REQUIRE(from_file.encode(text, true, true) == direct.encode(text, true, true));
    }
  }
  auto bad = [&](const Vocab& v, const char* what, const std::string& model = "",
                 std::function<void(GgufWriter&)> tweak = {}) {
    write_vocab_gguf(v, path, model, std::move(tweak));
    auto f = GgufFile::open(path);
    CHECK_THROWS_WITH(Tokenizer::from_gguf(*f), Catch::Contains(what));
  };
  const Vocab s = spm_vocab(common_pieces());
  bad(s, "'bert' (tokenizer.ggml.model) is not supported", "bert");
  {
    Vocab b = s;
    b.scores.pop_back();
    bad(b, "tokenizer.ggml.scores has");
  }
  {
    Vocab b = s;
    b.scores.clear();
    bad(b, "tokenizer.ggml.scores is missing");
  }
  bad(s, "tokenizer.ggml.token_type has", "", [](GgufWriter& w) {
    w.set_arr_i32("tokenizer.ggml.token_type", {1, 1});
  });
  bad(s, "token_type[1] = 9", "", [&](GgufWriter& w) {
    std::vector<int32_t> t(s.tokens.size(), 1);
    t[1] = 9;
    w.set_arr_i32("tokenizer.ggml.token_type", t);
  });
  bad(s, "tokenizer.ggml.eos_token_id = 99999", "",
      [](GgufWriter& w) { w.set_u32("tokenizer.ggml.eos_token_id", 99999); });
  bad(s, "tokenizer.ggml.tokens", "", [](GgufWriter& w) { w.set_u32("tokenizer.ggml.tokens", 3); });
  {
    Vocab b = bpe_vocab(kBpeMerges);
    b.merges.clear();
    bad(b, "tokenizer.ggml.merges is missing");
  }
  {
    GgufWriter w;
    w.set_str("general.architecture", "gemma3");
    w.write(path);
    auto f = GgufFile::open(path);
    CHECK_THROWS_WITH(Tokenizer::from_gguf(*f), Catch::Contains("has no tokenizer"));
  }
  std::filesystem::remove_all(dir);
}

// ---- the real Gemma 3 vocabulary ------------------------------------------------------

namespace {

std::string model_path() {
  if (const char* p = std::getenv("TOPKV_MODEL")) return p;
  return TOPKV_SOURCE_DIR "/.models/gemma-3-270m-q4_k_m.gguf";
}

}  // namespace

TEST_CASE("Gemma 3 vocabulary: special ids, chat ids, round trips, fast == reference, golden ids") {
  const std::string path = model_path();
  if (!std::filesystem::exists(path)) {
    WARN("no model at " << path
                        << " (set TOPKV_MODEL or run scripts/fetch-model.sh); skipping the real-vocabulary test");
    return;
  }
  auto f = GgufFile::open(path);
  const Tokenizer t = Tokenizer::from_gguf(*f);
  REQUIRE(t.kind() == VocabKind::Spm);
  REQUIRE(t.n_tokens() == 262144);
  CHECK(t.pad() == 0);
  CHECK(t.eos() == 1);
  CHECK(t.bos() == 2);
  CHECK(t.unk() == 3);
  CHECK(t.find_token("<start_of_turn>") == 105);
  CHECK(t.eot() == 106);
  CHECK(t.is_eog(1));
  CHECK(t.is_eog(106));
  CHECK_FALSE(t.is_eog(2));
  CHECK(t.add_bos_default());
  CHECK_FALSE(t.vocab().add_space_prefix);
  REQUIRE(t.chat_format() == ChatFormat::Gemma);

  // Chat prompts whose ids were published by other Gemma runtimes checked
  // against Hugging Face (found in public code): an independent reference.
  CHECK(t.encode_chat("Hello") == std::vector<int32_t>{2, 105, 2364, 107, 9259, 106, 107, 105, 4368, 107});
  CHECK(t.encode_chat("say hi") == std::vector<int32_t>{2, 105, 2364, 107, 30468, 5631, 106, 107, 105, 4368, 107});
  CHECK(t.encode_chat("Write a haiku about Apple Silicon.") == std::vector<int32_t>{2, 105, 2364, 107, 6974, 496, 678,
                                                                                    20517, 1003, 9947, 56125, 236761,
                                                                                    106, 107, 105, 4368, 107});
  CHECK(t.encode_chat("What is 2+2?") == std::vector<int32_t>{2, 105, 2364, 107, 3689, 563, 236743, 236778, 236862,
                                                              236778, 236881, 106, 107, 105, 4368, 107});
  CHECK(t.encode(t.apply_chat_template("Hello"), false, true) == t.encode_chat("Hello"));

  std::mt19937 rng(2024);
  std::vector<std::string> texts = {
      "The quick brown fox jumps over the lazy dog.\n\nLe cœur a ses raisons que la raison ne connaît point.",
      "Γειά σου Κόσμε — Привет, мир! שלום עולם مرحبا بالعالم नमस्ते दुनिया 你好，世界 こんにちは世界 안녕하세요",
      "def f(x):\n    return x ** 2  # comment\t\ttabs\r\n}",
      "emoji 😀👩‍👩‍👧 flags 🇫🇷 math ∑∫√ zero\u200bwidth nbsp\u00a0here <start_of_turn> "
      "<unused5> "
      "<0x41>"};
  for (int i = 0; i < 40; ++i) texts.push_back(random_text(rng, 200));
  for (const std::string& text : texts) {
    for (bool special : {false, true}) {
      const auto ids = t.encode(text, true, special);
      INFO("text '" << text << "'");
      REQUIRE(t.decode(std::vector<int32_t>(ids.begin() + 1, ids.end()), special) == text);
      REQUIRE(t.encode_reference(text, true, special) == ids);
    }
  }

  const std::string golden = TOPKV_SOURCE_DIR "/tests/data/gemma3_golden_tokens.json";
  if (!std::filesystem::exists(golden)) {
    WARN("no " << golden << " (golden ids from Hugging Face); skipping the golden comparison");
    return;
  }
  std::ifstream in(golden);
  const nlohmann::json j = nlohmann::json::parse(in);
  REQUIRE(j.at("prompts").size() > 0);
  for (const auto& p : j.at("prompts")) {
    const std::string text = p.at("text").get<std::string>();
    const std::vector<int32_t> want = p.at("ids").get<std::vector<int32_t>>();
    INFO("golden prompt '" << text << "'");
    CHECK(t.encode(text, true, true) == want);
    CHECK(t.decode(want, true) == "<bos>" + text);
  }
}
