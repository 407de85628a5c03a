#include <catch2/catch.hpp>
#include <filesystem>

#include "src/eval/passkey_prompt.h"
#include "src/model/gguf.h"
#include "src/model/synth.h"

using namespace topkv;

TEST_CASE("retrieval prompts: length close to the target, needle at the asked depth, answer inside") {
  SynthConfig sc = synth_defaults("gemma3");
  sc.layers = 1;
  auto path = (std::filesystem::temp_directory_path() / "topkv_test_passkey.gguf").string();
  synth_write(sc, path);
  auto file = GgufFile::open(path);
  Tokenizer tok = Tokenizer::from_gguf(*file);
  std::mt19937_64 rng(5);
  for (auto task : {RetrievalTask::Passkey, RetrievalTask::Needle})
    for (int64_t target : {700, 1001, 4096})
      for (double depth : {0.0, 0.3, 1.0}) {
        auto p = build_retrieval_prompt(tok, task, target, depth, rng);
        INFO("target " << target << " depth " << depth);
        REQUIRE((int64_t)p.tokens.size() <= target);
        CHECK((int64_t)p.tokens.size() >= target * 8 / 10);
        const double at = (double)p.needle_token / p.tokens.size();
        CHECK(std::abs(at - depth) < 0.15);
        CHECK(tok.decode(p.tokens).find(p.answer) != std::string::npos);
        CHECK(answer_found(" is " + p.answer + ".", p.answer));
      }
  CHECK_THROWS_WITH(build_retrieval_prompt(tok, RetrievalTask::Passkey, 10, 0.5, rng), Catch::Contains("cannot hold"));
  CHECK_THROWS_WITH(build_retrieval_prompt(tok, RetrievalTask::Passkey, 500, 1.5, rng), Catch::Contains("depth"));
  CHECK_FALSE(answer_found("1234567", "23456"));
  CHECK_FALSE(answer_found("no digits", "23456"));
  CHECK(answer_found("23456", "23456"));
  CHECK_THROWS_WITH(parse_retrieval_task("haystack"), Catch::Contains("passkey or needle"));
}
