// The RULER task generators and scorer (src/eval/ruler_tasks.h,
// ruler_score.h): every task's prompt meets its token target, holds its
// needles, and its answer can be worked out from the text alone (each
// derivation here is independent of the generator); a seed repeats a prompt;
// the scorer is RULER's string_match_all.
#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <map>
#include <regex>
#include <set>

#include "src/eval/ruler_score.h"
#include "src/eval/ruler_tasks.h"
#include "src/eval/ruler_words.h"
#include "src/model/gguf.h"
#include "src/model/synth.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

const Tokenizer& synth_tokenizer() {
  static test::TempDir dir("topkv_ruler_tok");
  static const Tokenizer tok = [] {
    SynthConfig sc = synth_defaults("gemma3");
    sc.layers = 1;
    const std::string path = dir.file("tok.gguf");
    synth_write(sc, path);
    return Tokenizer::from_gguf(*GgufFile::open(path));
  }();
  return tok;
}

std::set<std::string> as_set(const std::vector<std::string>& v) { return {v.begin(), v.end()}; }

// The answers a reader works out from a needle task's text: the values of
// the needles whose keys the question names.
std::set<std::string> derive_niah(const std::string& text) {
  std::smatch q;
  REQUIRE(std::regex_search(text, q, std::regex("\nWhat (?:is|are all) the special magic \\w+ for (.+) mentioned in "
                                                "the provided text\\?$")));
  std::vector<std::string> keys;
  const std::string list = q[1];
  const std::regex key_re("[a-z0-9-]+");
  for (auto it = std::sregex_iterator(list.begin(), list.end(), key_re); it != std::sregex_iterator(); ++it)
    if (it->str() != "and") keys.push_back(it->str());
  std::set<std::string> out;
  const std::regex needle("One of the special magic \\w+ for ([a-z0-9-]+) is: ([a-z0-9-]+)\\.");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), needle); it != std::sregex_iterator(); ++it)
    if (std::find(keys.begin(), keys.end(), (*it)[1].str()) != keys.end()) out.insert((*it)[2].str());
  return out;
}

// Variable tracking: follow the assignments from the value the question asks
// about (the text's last chain: the worked example comes first).
std::set<std::string> derive_vt(const std::string& text) {
  std::smatch q;
  REQUIRE(std::regex_search(text, q, std::regex("assigned the value (\\d+) in the text above\\.$")));
  const std::string main_part = text.substr(text.rfind("Memorize and track"));
  std::set<std::string> holds{q[1].str()}, vars;
  const std::regex stmt("VAR ([A-Z]+) = (VAR )?([A-Z0-9]+)");
  for (auto it = std::sregex_iterator(main_part.begin(), main_part.end(), stmt); it != std::sregex_iterator(); ++it)
    if (holds.count((*it)[3].str())) holds.insert((*it)[1].str()), vars.insert((*it)[1].str());
  return vars;
}

// Word counts of the text after the last `marker` and before "\nQuestion".
std::map<std::string, int> counts_after(const std::string& text, const std::string& marker, const std::regex& word) {
  const size_t from = text.rfind(marker) + marker.size(), to = text.rfind("\nQuestion");
  const std::string part = text.substr(from, to - from);
  std::map<std::string, int> c;
  for (auto it = std::sregex_iterator(part.begin(), part.end(), word); it != std::sregex_iterator(); ++it)
    ++c[(*it)[1].str()];
  return c;
}

// The n most frequent words, checking that the n-th is strictly ahead of the next.
std::set<std::string> top_n(const std::map<std::string, int>& counts, size_t n) {
  std::vector<std::pair<int, std::string>> v;
  for (auto& [w, c] : counts) v.push_back({c, w});
  std::sort(v.rbegin(), v.rend());
  REQUIRE(v.size() > n);
  CHECK(v[n - 1].first > v[n].first);
  std::set<std::string> out;
  for (size_t i = 0; i < n; ++i) out.insert(v[i].second);
  return out;
}

std::set<std::string> derive(const RulerSample& s) {
  switch (s.task) {
    case RulerTask::Vt: return derive_vt(s.text);
    case RulerTask::Cwe:
      return top_n(counts_after(s.text, "most often.\n", std::regex("\\d+\\. ([a-z-]+)")), 10);
    case RulerTask::Fwe: {
      auto c = counts_after(s.text, "coded words. ", std::regex("([a-z]+|\\.\\.\\.)"));
      c.erase("...");
      return top_n(c, 3);
    }
    default: return derive_niah(s.text);
  }
}

}  // namespace

TEST_CASE("ruler tasks: length on target, needles inside, the answer derivable from the text alone") {
  const Tokenizer& tok = synth_tokenizer();
  const RulerFormat plain{&tok, false};
  for (RulerTask task : all_ruler_tasks())
    for (int64_t target : {2500, 6001}) {
      INFO(ruler_task_name(task) << " target " << target);
      const RulerSample s = build_ruler_sample(task, plain, target, 7 + (uint64_t)target);
      REQUIRE(s.task == task);
      const int64_t n = (int64_t)s.tokens.size();
      CHECK(n <= target);
      CHECK(n >= target * 97 / 100);
      CHECK(s.tokens == tok.encode(s.text + s.answer_prefix, tok.add_bos_default(), false));
      REQUIRE(!s.answers.empty());
      const std::string decoded = tok.decode(s.tokens);
      for (const std::string& ans : s.answers) CHECK(decoded.find(ans) != std::string::npos);
      CHECK(derive(s) == as_set(s.answers));
      CHECK(s.answers.size() == as_set(s.answers).size());
      const size_t expect_answers = task == RulerTask::Vt ? 5 : task == RulerTask::Cwe ? 10 : task == RulerTask::Fwe ? 3
          : task == RulerTask::NiahMultivalue || task == RulerTask::NiahMultiquery ? 4 : 1;
      CHECK(s.answers.size() == expect_answers);
      for (double d : s.depths) CHECK((d >= 0.0 && d <= 1.0));
      if (task <= RulerTask::NiahMultiquery) {  // a needle per value asked; multikey_1 has 3 more
        CHECK(s.depths.size() == (task == RulerTask::NiahMultikey1 ? 4 : s.answers.size()));
        for (const std::string& ans : s.answers)
          CHECK(std::regex_search(s.text, std::regex("One of the special magic \\w+ for [a-z0-9-]+ is: " + ans + "\\.")));
      }
      if (task == RulerTask::Vt) CHECK(s.depths.size() == 5);
    }
}

TEST_CASE("ruler tasks: a seed repeats a prompt, another seed changes it, depths vary") {
  const Tokenizer& tok = synth_tokenizer();
  const RulerFormat plain{&tok, false};
  for (RulerTask task : all_ruler_tasks()) {
    INFO(ruler_task_name(task));
    const RulerSample a = build_ruler_sample(task, plain, 2500, 11), b = build_ruler_sample(task, plain, 2500, 11),
                      c = build_ruler_sample(task, plain, 2500, 12);
    CHECK(a.tokens == b.tokens);
    CHECK(a.answers == b.answers);
    CHECK(a.tokens != c.tokens);
  }
  std::set<double> depths;  // a single needle lands at different depths for different seeds
  for (uint64_t seed = 0; seed < 12; ++seed)
    depths.insert(build_ruler_sample(RulerTask::NiahSingle1, plain, 600, seed).depths.at(0));
  CHECK(depths.size() >= 6);
  CHECK(*depths.rbegin() - *depths.begin() > 0.4);
}

TEST_CASE("ruler tasks: the chat format wraps the text and starts the reply with the answer prefix") {
  const Tokenizer& tok = synth_tokenizer();
  REQUIRE(tok.chat_format() != ChatFormat::None);
  const RulerFormat chat{&tok, true};
  const RulerSample s = build_ruler_sample(RulerTask::NiahSingle2, chat, 1200, 3);
  CHECK((int64_t)s.tokens.size() <= 1200);
  CHECK((int64_t)s.tokens.size() >= 1200 * 97 / 100);
  std::vector<int32_t> want = tok.encode_chat(s.text);
  const std::vector<int32_t> prefix = tok.encode(s.answer_prefix.substr(1), false, false);
  want.insert(want.end(), prefix.begin(), prefix.end());
  CHECK(s.tokens == want);
  CHECK(tok.decode(s.tokens, true).find("model\nThe special magic number for") != std::string::npos);
}

TEST_CASE("ruler tasks: bad names and targets too small are errors that say why") {
  const Tokenizer& tok = synth_tokenizer();
  CHECK(parse_ruler_task("vt") == RulerTask::Vt);
  CHECK(std::string(ruler_task_name(parse_ruler_task("niah_multikey_3"))) == "niah_multikey_3");
  CHECK_THROWS_WITH(parse_ruler_task("niah"), Catch::Contains("niah_single_1, niah_single_2"));
  CHECK_THROWS_WITH(parse_ruler_task("qa_1"), Catch::Contains("SQuAD"));
  CHECK_THROWS_WITH(parse_ruler_task("qa_2"), Catch::Contains("HotpotQA"));
  CHECK_THROWS_WITH(build_ruler_sample(RulerTask::Cwe, {&tok, false}, 100, 1), Catch::Contains("cannot hold"));
  CHECK(ruler_answer_tokens(RulerTask::NiahSingle1) == 128);
  CHECK(ruler_answer_tokens(RulerTask::Vt) == 30);
}

TEST_CASE("ruler words: lists without repeats, keys and UUIDs of the right shape") {
  for (auto list : {ruler::nouns(), ruler::adjectives(), ruler::verbs()}) {
    std::set<std::string_view> seen(list.begin(), list.end());
    CHECK(seen.size() == list.size());
    CHECK(list.size() >= 100);
  }
  ruler::Rng rng(5);
  for (int i = 0; i < 50; ++i) {
    CHECK(std::regex_match(ruler::random_uuid(rng), std::regex("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-"
                                                               "[0-9a-f]{12}")));
    CHECK(std::regex_match(ruler::random_number(rng, 7), std::regex("[1-9][0-9]{6}")));
    CHECK(std::regex_match(ruler::random_key_word(rng), std::regex("[a-z]+-[a-z]+")));
  }
  const std::vector<std::string> w = ruler::distinct_words(rng, 3000);  // past the single words: compounds
  CHECK(std::set<std::string>(w.begin(), w.end()).size() == 3000);
}

TEST_CASE("ruler scoring: string_match_all as RULER computes it") {
  CHECK(string_match_all("The number is 1234567.", {"1234567"}) == 1.0);
  CHECK(string_match_all("the NUMBERS are 11 and 22", {"11", "22", "33", "numbers"}) == 0.75);
  CHECK(string_match_all("Quiet-Harbor", {"quiet-harbor"}) == 1.0);
  CHECK(string_match_all("nothing here", {"1234567"}) == 0.0);
  CHECK(string_match_all("anything", {}) == 0.0);
  CHECK(ruler_postprocess("\x01  answer\tone \x02\n") == "answer\none");
  CHECK(ruler_task_score({1.0, 0.5, 0.0, 0.25}) == Approx(43.75));
  CHECK(ruler_task_score({}) == 0.0);
}
