#include "src/eval/ruler_score.h"

#include <algorithm>
#include <cctype>

namespace topkv {

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = (char)std::tolower((unsigned char)c);
  return s;
}

}  // namespace

std::string ruler_postprocess(const std::string& prediction) {
  std::string s = prediction;
  for (char& c : s)
    if ((unsigned char)c < 0x20) c = '\n';
  // Python's str.strip(): whitespace at both ends.
  const auto blank = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; };
  size_t b = 0, e = s.size();
  while (b < e && blank(s[b])) ++b;
  while (e > b && blank(s[e - 1])) --e;
  return s.substr(b, e - b);
}

double string_match_all(const std::string& prediction, const std::vector<std::string>& references) {
  if (references.empty()) return 0.0;
  const std::string p = lower(ruler_postprocess(prediction));
  int found = 0;
  for (const std::string& r : references) found += p.find(lower(r)) != std::string::npos;
  return (double)found / (double)references.size();
}

double ruler_task_score(const std::vector<double>& sample_scores) {
  if (sample_scores.empty()) return 0.0;
  double s = 0;
  for (double x : sample_scores) s += x;
  return 100.0 * s / (double)sample_scores.size();
}

}  // namespace topkv
