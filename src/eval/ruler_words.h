// Words and random pieces for the RULER-style prompts (src/eval/ruler_tasks.h).
//
// RULER (Hsieh et al., "RULER: What's the Real Context Size of Your
// Long-Context Language Models?", 2024, Sec. 3 and its synthetic task
// configs) draws keys and list words from the `wonderwords` package's nouns,
// adjectives and verbs, and its essay haystack from Paul Graham's essays.
// topkv downloads nothing at run time: ruler_words.cpp embeds its own lists
// of common English nouns, adjectives and verbs (written for topkv, plain
// dictionary words), and the essay haystack is replaced by varied sentences
// composed from them (filler_sentence).
//
// Randomness: every draw goes through `below`, not the standard library's
// distributions (whose results differ between implementations), so a seed
// gives the same prompt with any compiler.
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace topkv::ruler {

using Rng = std::mt19937_64;

std::span<const std::string_view> nouns();
std::span<const std::string_view> adjectives();
std::span<const std::string_view> verbs();  // base form: "carry", "paint"

// A number in [0, n), n >= 1 (multiply-shift; the bias is below 2^-40 for the sizes used here).
uint64_t below(Rng& rng, uint64_t n);
// A uniform double in [0, 1).
double unit(Rng& rng);
// Fisher-Yates with `below`.
template <typename T>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[(size_t)below(rng, i)]);
}
// `count` distinct numbers of [0, n), in random order.
std::vector<uint64_t> sample_distinct(Rng& rng, uint64_t n, uint64_t count);

// A seed for a named sub-stream of `seed` (SplitMix64 of both): the parts of
// a prompt that depend on its size get their own stream, so that changing
// the size leaves the rest of the prompt as it was.
uint64_t mix_seed(uint64_t seed, uint64_t salt);

// RULER's needle keys: "adjective-noun", e.g. "quiet-harbor".
std::string random_key_word(Rng& rng);
// A number of `digits` digits without a leading zero (RULER: 7-digit values).
std::string random_number(Rng& rng, int digits);
// A UUID-like string, version 4 layout: 8-4-4-4-12 lower-case hex digits.
std::string random_uuid(Rng& rng);
// One varied English sentence ending in ". " (the essay-like haystack).
std::string filler_sentence(Rng& rng);
// `n` distinct words for the common-words list: the single words of the
// three lists (de-duplicated) while they last, then "adjective-noun"
// compounds; in random order.
std::vector<std::string> distinct_words(Rng& rng, size_t n);

}  // namespace topkv::ruler
