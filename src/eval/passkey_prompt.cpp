#include "src/eval/passkey_prompt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "src/common/error.h"

namespace topkv {

namespace {

struct Parts {
  std::string intro, needle, question;
  std::vector<std::string> filler;  // sentences cycled through
};

Parts passkey_parts(std::mt19937_64& rng, std::string& answer) {
  answer = std::to_string(std::uniform_int_distribution<int>(10000, 99999)(rng));
  return {"There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz "
          "you about the important information there.\n",
          fmt::format("The pass key is {0}. Remember it. {0} is the pass key.\n", answer),
          "What is the pass key? The pass key is",
          {"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.\n"}};
}

Parts needle_parts(std::mt19937_64& rng, std::string& answer) {
  static const char* cities[] = {"Lisbon", "Nairobi", "Osaka", "Quito", "Tallinn", "Hanoi", "Perth", "Bergen",
                                 "Tucson", "Cusco", "Dakar", "Riga", "Malmo", "Porto", "Accra", "Hobart"};
  const std::string city = cities[std::uniform_int_distribution<int>(0, 15)(rng)];
  answer = std::to_string(std::uniform_int_distribution<int>(1000000, 9999999)(rng));
  return {"Below is a long collection of notes. One of them contains a special magic number. Read everything and "
          "answer the question at the end.\n",
          fmt::format("One of the special magic numbers for {} is: {}.\n", city, answer),
          fmt::format("What is the special magic number for {} mentioned in the notes? The special magic number "
                      "for {} is", city, city),
          {"The river bends twice before it reaches the old mill, where the water slows and turns green. ",
           "Most of the shops on the square open late in winter and close early in summer. ",
           "A ledger from the harbour office lists barrels of salt, rope and lamp oil for every month of the year. ",
           "The choir practises on Thursdays, and the organist tunes the pipes by ear. ",
           "Farmers in the valley rotate barley, beans and clover to keep the soil from tiring. ",
           "The night train stops for four minutes at the junction and then climbs into the hills.\n"}};
}

}  // namespace

RetrievalTask parse_retrieval_task(const std::string& s) {
  if (s == "passkey") return RetrievalTask::Passkey;
  if (s == "needle") return RetrievalTask::Needle;
  fail("unknown task '{}': use passkey or needle", s);
}

RetrievalPrompt build_retrieval_prompt(const Tokenizer& tok, RetrievalTask task, int64_t target, double depth,
                                       std::mt19937_64& rng) {
  TOPKV_CHECK(depth >= 0.0 && depth <= 1.0, "needle depth {} must be in [0, 1]", depth);
  RetrievalPrompt out;
  const Parts p = task == RetrievalTask::Passkey ? passkey_parts(rng, out.answer) : needle_parts(rng, out.answer);
  const bool bos = tok.add_bos_default();
  auto count = [&](const std::string& s) { return (int64_t)tok.encode(s, false, false).size(); };
  std::string cycle;
  for (auto& f : p.filler) cycle += f;
  const int64_t fixed = count(p.intro + p.needle + p.question) + (bos ? 1 : 0);
  const int64_t per_cycle = std::max<int64_t>(1, count(cycle));
  TOPKV_CHECK(target > fixed + per_cycle, "a {}-token prompt cannot hold the instructions, the needle and the "
              "question ({} tokens) plus filler: ask for more tokens", target, fixed);
  // Filler as whole sentences; shrink until the tokenised prompt fits.
  int64_t sentences = (target - fixed) / per_cycle * (int64_t)p.filler.size() + (int64_t)p.filler.size();
  for (;;) {
    const int64_t before = std::llround(depth * (double)sentences);
    std::string text = p.intro, head;
    for (int64_t i = 0; i < sentences; ++i) {
      if (i == before) {
        head = text;
        text += p.needle;
      }
      text += p.filler[(size_t)(i % (int64_t)p.filler.size())];
    }
    if (before >= sentences) {
      head = text;
      text += p.needle;
    }
    text += p.question;
    out.tokens = tok.encode(text, bos, false);
    if ((int64_t)out.tokens.size() <= target || sentences == 0) {
      out.needle_token = (int64_t)tok.encode(head, bos, false).size();
      return out;
    }
    sentences -= std::max<int64_t>(1, ((int64_t)out.tokens.size() - target) * (int64_t)p.filler.size() / per_cycle);
    sentences = std::max<int64_t>(sentences, 0);
  }
}

bool answer_found(const std::string& s, const std::string& answer) {
  for (size_t pos = s.find(answer); pos != std::string::npos; pos = s.find(answer, pos + 1)) {
    bool left = pos == 0 || !std::isdigit((unsigned char)s[pos - 1]);
    size_t end = pos + answer.size();
    bool right = end >= s.size() || !std::isdigit((unsigned char)s[end]);
    if (left && right) return true;
  }
  return false;
}

}  // namespace topkv
