#include "offload/head_pattern.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>
#include <sstream>

#include "src/common/error.h"
#include "src/common/file_io.h"

namespace topkv {

int HeadPattern::n_streaming() const { return (int)std::count(streaming.begin(), streaming.end(), 1); }

HeadPattern parse_head_pattern(const std::string& text, const std::string& origin, int layers, int kv_heads,
                               double threshold, double sparsity) {
  TOPKV_CHECK(layers > 0 && kv_heads > 0, "internal: head pattern for {} layers x {} heads", layers, kv_heads);
  TOPKV_CHECK(sparsity <= 1.0, "head-pattern sparsity {} is above 1: give a fraction of heads in [0, 1]", sparsity);
  TOPKV_CHECK(std::isfinite(threshold), "head-pattern threshold must be a finite number");
  HeadPattern p;
  p.layers = layers;
  p.kv_heads = kv_heads;
  std::istringstream in(text);
  std::string line;
  int lineno = 0, row = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;
    TOPKV_CHECK(row < layers, "{}: line {}: more rows than the model's {} layers (one row per layer expected)", origin,
                lineno, layers);
    std::istringstream cols(line);
    std::string tok;
    int col = 0;
    while (cols >> tok) {
      ++col;
      TOPKV_CHECK(col <= kv_heads, "{}: line {}: more than the model's {} KV heads per row", origin, lineno, kv_heads);
      char* end = nullptr;
      double v = std::strtod(tok.c_str(), &end);
      TOPKV_CHECK(end != tok.c_str() && *end == '\0', "{}: line {}, column {}: '{}' is not a number", origin, lineno,
                  col, tok);
      TOPKV_CHECK(std::isfinite(v) && v >= 0.0 && v <= 1.0,
                  "{}: line {}, column {}: gate value {} is outside [0, 1]", origin, lineno, col, tok);
      p.gates.push_back((float)v);
    }
    TOPKV_CHECK(col == kv_heads, "{}: line {}: {} values, but the model has {} KV heads per layer", origin, lineno,
                col, kv_heads);
    ++row;
  }
  TOPKV_CHECK(row == layers, "{}: {} rows, but the model has {} layers (one row per layer expected)", origin, row,
              layers);

  p.streaming.assign(p.gates.size(), 0);
  if (sparsity >= 0.0) {
    size_t n_stream = (size_t)std::llround(sparsity * (double)p.gates.size());
    std::vector<size_t> order(p.gates.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p.gates[a] < p.gates[b]; });
    for (size_t i = 0; i < n_stream; ++i) p.streaming[order[i]] = 1;
  } else {
    for (size_t i = 0; i < p.gates.size(); ++i) p.streaming[i] = p.gates[i] < threshold;
  }
  return p;
}

HeadPattern load_head_pattern(const std::string& path, int layers, int kv_heads, double threshold, double sparsity) {
  return parse_head_pattern(read_text_input(path, "head pattern file", 1ull << 24), path, layers, kv_heads, threshold, sparsity);
}

}  // namespace topkv
