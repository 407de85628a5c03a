// RULER's multi-hop tracing and aggregation tasks (RULER, Sec. 3.2-3.3;
// scripts/data/synthetic/variable_tracking.py, common_words_extraction.py,
// freq_words_extraction.py of its repository).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <set>

#include "src/common/error.h"
#include "src/eval/ruler_compose.h"
#include "src/eval/ruler_words.h"

namespace topkv::ruler {

namespace {

// ---- variable tracking ----------------------------------------------------------

constexpr int kHops = 4;  // RULER's vt: one chain of 4 hops (5 variables)

struct Chain {
  std::vector<std::string> vars;
  std::string value;
  std::vector<std::string> statements;  // "VAR A = 12345", "VAR B = VAR A ", ...
};

Chain make_chain(Rng& rng, int name_len) {
  Chain c;
  std::set<std::string> seen;
  while ((int)c.vars.size() < kHops + 1) {
    std::string v;
    for (int i = 0; i < name_len; ++i) v += (char)('A' + below(rng, 26));
    if (seen.insert(v).second) c.vars.push_back(v);
  }
  c.value = std::to_string(10000 + below(rng, 89999));  // numpy randint(10000, 99999)
  c.statements.push_back(fmt::format("VAR {} = {}", c.vars[0], c.value));
  for (int j = 0; j < kHops; ++j) c.statements.push_back(fmt::format("VAR {} = VAR {} ", c.vars[j + 1], c.vars[j]));
  return c;
}

// The chain's statements among n noise lines at the sorted fractions `at`,
// joined as RULER joins them.
std::string vt_context(const Chain& c, const std::vector<double>& at, int64_t n, std::vector<double>* depths) {
  std::vector<std::string> lines;
  size_t next = 0;
  for (int64_t i = 0; i <= n; ++i) {
    for (; next < at.size() && (int64_t)std::floor(at[next] * (double)n) <= i; ++next) {
      lines.push_back(c.statements[next]);
      if (depths) depths->push_back((double)i / (double)n);
    }
    if (i < n) lines.push_back(std::string(kNoise) + "\n");
  }
  std::string s;
  for (size_t i = 0; i < lines.size(); ++i) s += (i ? " " : "") + lines[i];
  for (size_t at_ = s.find(". \n"); at_ != std::string::npos; at_ = s.find(". \n", at_)) s.replace(at_, 3, ".\n");
  return s;
}

std::string vt_text(const std::string& context) {
  return "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n" + context +
         "\nQuestion: Find all variables that are assigned the value {value} in the text above.";
}

std::string vt_prefix() {
  return fmt::format(" Answer: According to the chain(s) of variable assignment in the text above, {} variables "
                     "are assigned the value {{value}}, they are: ", kHops + 1);
}

std::string with_value(std::string s, const std::string& value) {
  for (size_t at = s.find("{value}"); at != std::string::npos; at = s.find("{value}", at + value.size()))
    s.replace(at, 7, value);
  return s;
}

std::vector<double> sorted_units(Rng& rng, size_t n) {
  std::vector<double> v;
  for (size_t i = 0; i < n; ++i) v.push_back(unit(rng));
  std::sort(v.begin(), v.end());
  return v;
}

// ---- common words -----------------------------------------------------------

constexpr int kCommonWords = 10;

std::string numbered(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) s += fmt::format("{}{}. {}", i ? " " : "", i + 1, words[i]);
  return s;
}

// RULER's get_example: `n` distinct words, the first 10 repeated `common`
// times, the others `rare` times, shuffled. Returns (list, the 10 words).
std::pair<std::string, std::vector<std::string>> cwe_list(Rng& rng, int64_t n, int common, int rare) {
  std::vector<std::string> words = distinct_words(rng, (size_t)n), list;
  for (int64_t i = 0; i < n; ++i)
    for (int r = 0; r < (i < kCommonWords ? common : rare); ++r) list.push_back(words[(size_t)i]);
  shuffle(list, rng);
  return {numbered(list), std::vector<std::string>(words.begin(), words.begin() + kCommonWords)};
}

std::string cwe_text(const std::string& list) {
  return fmt::format("Below is a numbered list of words. In these words, some appear more often than others. "
                     "Memorize the ones that appear most often.\n{}\nQuestion: What are the {} most common words in "
                     "the above list?", list, kCommonWords);
}

const std::string kCwePrefix =
    fmt::format(" Answer: The top {} words that appear most often in the list are:", kCommonWords);

}  // namespace

Composer vt_composer(uint64_t seed) {
  Rng rng(seed);
  // One worked example first, as RULER adds (about 500 tokens, 3-letter names).
  const Chain ex = make_chain(rng, 3);
  const std::vector<double> ex_at = sorted_units(rng, ex.statements.size());
  std::string example = with_value(vt_text(vt_context(ex, ex_at, 16, nullptr)) + vt_prefix(), ex.value);
  for (size_t i = 0; i < ex.vars.size(); ++i) example += (i ? " " : "") + ex.vars[i];
  example += "\n\n";
  const Chain chain = make_chain(rng, 5);
  const std::vector<double> at = sorted_units(rng, chain.statements.size());
  Composer out;
  out.min_units = (int64_t)chain.statements.size();
  out.compose = [=](int64_t n) {
    Composed r;
    r.text = example + with_value(vt_text(vt_context(chain, at, n, &r.depths)), chain.value);
    r.answer_prefix = with_value(vt_prefix(), chain.value);
    r.answers = chain.vars;
    return r;
  };
  return out;
}

Composer cwe_composer(uint64_t seed, bool short_regime) {
  Rng rng(seed);
  // RULER: below 4096 tokens an example of 20 words (3 and 1 repeats) and
  // repeats 6 and 1; else 40 words (10 and 3) and repeats 30 and 3.
  const auto [ex_list, ex_words] = short_regime ? cwe_list(rng, 20, 3, 1) : cwe_list(rng, 40, 10, 3);
  const std::string example = cwe_text(ex_list) + kCwePrefix + " " + numbered(ex_words) + "\n";
  const int common = short_regime ? 6 : 30, rare = short_regime ? 1 : 3;
  Composer out;
  out.min_units = kCommonWords + 1;
  out.compose = [=](int64_t n) {
    Rng list_rng(mix_seed(seed, (uint64_t)n));  // RULER draws the words afresh for each size it tries
    auto [list, words] = cwe_list(list_rng, n, common, rare);
    Composed r;
    r.text = example + cwe_text(list);
    r.answer_prefix = kCwePrefix;
    r.answers = words;
    return r;
  };
  return out;
}

Composer fwe_composer(uint64_t seed) {
  Rng rng(seed);
  // 2000 distinct coded words of 6 lower-case letters in random order; the
  // first is "..." (noise, the most frequent), the next three the answers.
  constexpr int kVocab = 2000, kLen = 6;
  constexpr double kAlpha = 2.0;
  std::vector<std::string> vocab;
  std::set<std::string> seen;
  while ((int)vocab.size() < kVocab) {
    std::string w;
    for (int i = 0; i < kLen; ++i) w += (char)('a' + below(rng, 26));
    if (seen.insert(w).second) vocab.push_back(w);
  }
  vocab[0] = "...";
  const double zeta = std::numbers::pi * std::numbers::pi / 6;  // zeta(2)
  Composer out;
  out.min_units = 100;  // fewer and ranks 4 and 5 tie
  out.compose = [=](int64_t n) {
    std::vector<std::string> words;
    for (int k = 1; k <= kVocab; ++k) {
      const auto count = (int64_t)((double)n * std::pow((double)k, -kAlpha) / zeta);
      for (int64_t i = 0; i < count; ++i) words.push_back(vocab[(size_t)k - 1]);
    }
    Rng order(mix_seed(seed, (uint64_t)n));
    shuffle(words, order);
    std::string context;
    for (size_t i = 0; i < words.size(); ++i) context += (i ? " " : "") + words[i];
    Composed r;
    r.text = "Read the following coded text and track the frequency of each coded word. Find the three most "
             "frequently appeared coded words. " + context + "\nQuestion: Do not provide any explanation. Please "
             "ignore the dots '....'. What are the three most frequently appeared words in the above coded text?";
    r.answer_prefix = " Answer: According to the coded text above, the three most frequently appeared words are:";
    r.answers = {vocab[1], vocab[2], vocab[3]};
    return r;
  };
  return out;
}

}  // namespace topkv::ruler
