// The tasks' texts at a given haystack size (internal to ruler_tasks.cpp,
// ruler_niah.cpp, ruler_aggregate.cpp). A Composer draws everything that does
// not depend on the size when it is made; compose(units) is then a pure
// function of the size, so build_ruler_sample can search for the size that
// meets a token target.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "src/eval/ruler_tasks.h"

namespace topkv::ruler {

struct Composed {
  std::string text, answer_prefix;
  std::vector<std::string> answers;
  std::vector<double> depths;
};

struct Composer {
  std::function<Composed(int64_t units)> compose;
  int64_t min_units = 1;  // the smallest haystack the task is defined with
};

// RULER's noise sentence (niah noise haystack, vt).
inline constexpr const char* kNoise =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

Composer niah_composer(RulerTask task, uint64_t seed);
Composer vt_composer(uint64_t seed);
// `short_regime`: RULER's settings for sequences shorter than 4096 tokens
// (6 repeats of the common words and 1 of the others instead of 30 and 3).
Composer cwe_composer(uint64_t seed, bool short_regime);
Composer fwe_composer(uint64_t seed);

}  // namespace topkv::ruler
