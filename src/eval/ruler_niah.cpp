// RULER's needle-in-a-haystack tasks (RULER, Sec. 3.1; scripts/data/synthetic/niah.py
// of its repository): needles "One of the special magic {numbers} for {key}
// is: {value}." at random depths of a haystack of noise sentences, varied
// sentences (RULER: essays) or other needles.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "src/common/error.h"
#include "src/eval/ruler_compose.h"
#include "src/eval/ruler_words.h"

namespace topkv::ruler {

namespace {

enum class Haystack { Noise, Essay, Needle };
enum class Kind { Word, Number, Uuid };

struct NiahConfig {
  Haystack haystack;
  Kind key, value;
  int num_k, num_v, num_q;  // keys with needles, values per key, keys asked
};

// RULER's synthetic.yaml.
NiahConfig config_of(RulerTask t) {
  using H = Haystack;
  using K = Kind;
  switch (t) {
    case RulerTask::NiahSingle1: return {H::Noise, K::Word, K::Number, 1, 1, 1};
    case RulerTask::NiahSingle2: return {H::Essay, K::Word, K::Number, 1, 1, 1};
    case RulerTask::NiahSingle3: return {H::Essay, K::Word, K::Uuid, 1, 1, 1};
    case RulerTask::NiahMultikey1: return {H::Essay, K::Word, K::Number, 4, 1, 1};
    case RulerTask::NiahMultikey2: return {H::Needle, K::Word, K::Number, 1, 1, 1};
    case RulerTask::NiahMultikey3: return {H::Needle, K::Uuid, K::Uuid, 1, 1, 1};
    case RulerTask::NiahMultivalue: return {H::Essay, K::Word, K::Number, 1, 4, 1};
    case RulerTask::NiahMultiquery: return {H::Essay, K::Word, K::Number, 4, 1, 4};
    default: fail("internal: {} is not a needle-in-a-haystack task", ruler_task_name(t));
  }
}

std::string random_of(Kind k, Rng& rng) {
  switch (k) {
    case Kind::Word: return random_key_word(rng);
    case Kind::Number: return random_number(rng, 7);
    case Kind::Uuid: return random_uuid(rng);
  }
  return {};
}

const char* plural_name(Kind k) { return k == Kind::Word ? "words" : k == Kind::Number ? "numbers" : "uuids"; }

std::string needle(const char* type, const std::string& key, const std::string& value) {
  return fmt::format("One of the special magic {} for {} is: {}.", type, key, value);
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

}  // namespace

Composer niah_composer(RulerTask task, uint64_t seed) {
  const NiahConfig c = config_of(task);
  Rng rng(seed);
  const char* type_plural = plural_name(c.value);
  // The needles: num_k keys with num_v values each, in random order.
  std::vector<std::string> keys, needles;
  std::vector<std::vector<std::string>> values;
  auto used = std::make_shared<std::set<std::string>>();
  for (int i = 0; i < c.num_k; ++i) {
    std::string key;
    do key = random_of(c.key, rng);
    while (!used->insert(key).second);
    keys.push_back(key);
    values.emplace_back();
    for (int j = 0; j < c.num_v; ++j) {
      values.back().push_back(random_of(c.value, rng));
      needles.push_back(needle(type_plural, key, values.back().back()));
    }
  }
  shuffle(needles, rng);
  // The keys asked and their values, the answers.
  std::vector<std::string> queries, answers;
  for (uint64_t i : sample_distinct(rng, (uint64_t)c.num_k, (uint64_t)c.num_q)) {
    queries.push_back(keys[i]);
    answers.insert(answers.end(), values[i].begin(), values[i].end());
  }
  std::string query = queries.back();
  if (queries.size() > 1) {
    query.clear();
    for (size_t i = 0; i + 1 < queries.size(); ++i) query += queries[i] + ", ";
    query += "and " + queries.back();
  }
  // Depths: an essay's come from RULER's 40 (0, 3, 5, ..., 100 percent), the
  // others' are uniform; the i-th smallest takes the i-th needle.
  std::vector<double> depths;
  if (c.haystack == Haystack::Essay)
    for (uint64_t i : sample_distinct(rng, 40, needles.size())) depths.push_back(std::round(i * 100.0 / 39.0) / 100.0);
  else
    for (size_t i = 0; i < needles.size(); ++i) depths.push_back(unit(rng));
  std::sort(depths.begin(), depths.end());
  // The template; one value asked makes it singular, as RULER rewrites it.
  std::string intro = "Some special magic {type} are hidden within the following text. Make sure to memorize it. I "
                      "will quiz you about the {type} afterwards.\n",
              question = "\nWhat are all the special magic {type} for {query} mentioned in the provided text?",
              prefix = " The special magic {type} for {query} mentioned in the provided text are";
  std::string type = type_plural;
  if (c.num_q * c.num_v == 1) {
    for (std::string* s : {&intro, &question, &prefix})
      *s = replace_all(replace_all(replace_all(replace_all(*s, "Some", "A"), "are all", "is"), "are", "is"),
                       "answers", "answer");
    type.pop_back();
  }
  for (std::string* s : {&intro, &question, &prefix})
    *s = replace_all(replace_all(*s, "{type}", type), "{query}", query);

  Composer out;
  out.min_units = 1;
  out.compose = [=](int64_t n) {
    Rng hay(mix_seed(seed, 1));  // the haystack's own stream: its first n units are the same for any n
    std::vector<std::string> units;
    units.reserve((size_t)n);
    for (int64_t i = 0; i < n; ++i) {
      if (c.haystack == Haystack::Noise) {
        units.emplace_back(kNoise);
      } else if (c.haystack == Haystack::Essay) {
        std::string s = filler_sentence(hay);
        s.pop_back();  // its trailing blank: units are joined with one
        units.push_back(std::move(s));
      } else {
        std::string key;
        do key = random_of(c.key, hay);
        while (used->count(key));  // never one of the keys the needles use
        units.push_back(needle(type_plural, key, random_of(c.value, hay)));
      }
    }
    const char* sep = c.haystack == Haystack::Essay ? " " : "\n";
    Composed r;
    std::string context;
    size_t next = 0;
    for (int64_t i = 0; i <= n; ++i) {
      for (; next < needles.size() && (int64_t)std::floor(depths[next] * (double)n) <= i; ++next) {
        context += (context.empty() ? "" : sep) + needles[next];
        r.depths.push_back((double)i / (double)n);
      }
      if (i < n) context += (context.empty() ? "" : sep) + units[(size_t)i];
    }
    r.text = intro + context + question;
    r.answer_prefix = prefix;
    r.answers = answers;
    return r;
  };
  return out;
}

}  // namespace topkv::ruler
