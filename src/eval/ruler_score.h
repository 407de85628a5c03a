// RULER's scoring (scripts/eval/synthetic/constants.py of its repository):
// every synthetic task is scored by string_match_all, the fraction of the
// reference strings that occur in the prediction, case-insensitively; a
// task's score is the mean over its samples x 100. The prediction is cleaned
// first as RULER's postprocess_pred does.
#pragma once
#include <string>
#include <vector>

namespace topkv {

// RULER's postprocess_pred: control characters (below 0x20) become newlines,
// then blanks are stripped at both ends.
std::string ruler_postprocess(const std::string& prediction);

// Per sample, in [0, 1]: the fraction of `references` found in the
// postprocessed prediction, ASCII case folded. No references: 0.
double string_match_all(const std::string& prediction, const std::vector<std::string>& references);

// A task's score: the mean of the samples' string_match_all x 100 (0 for none).
double ruler_task_score(const std::vector<double>& sample_scores);

}  // namespace topkv
