// DuoAttention head patterns (Xiao et al., DuoAttention, Sec. 2.2-2.3): one
// trained gate value per (layer, KV head); heads whose gate is below a
// threshold τ — or the lowest `sparsity` fraction — become *streaming heads*
// that keep only attention sinks + recent tokens and have no index.
//
// File format (as the DuoAttention authors publish `full_attention_heads.tsv`):
// one row per layer, one tab- (or space-) separated column per KV head, each a
// gate value in [0, 1]. Empty lines and lines starting with '#' are ignored.
#pragma once
#include <string>
#include <vector>

namespace topkv {

struct HeadPattern {
  int layers = 0, kv_heads = 0;
  std::vector<float> gates;          // [layers][kv_heads]
  std::vector<char> streaming;       // [layers][kv_heads], 1 = streaming head
  bool is_streaming(int layer, int head) const { return streaming[(size_t)layer * kv_heads + head] != 0; }
  int n_streaming() const;
};

// Parses `path`, checks it has exactly `layers` rows of `kv_heads` values, and
// binarises: with sparsity in [0, 1] the lowest-gate `sparsity` fraction of
// heads stream (ties broken by position); otherwise heads with gate < threshold
// stream. Throws Error naming the line and column of any problem.
HeadPattern load_head_pattern(const std::string& path, int layers, int kv_heads, double threshold = 0.5,
                              double sparsity = -1.0);
// Same, from text (for tests and config files that embed the pattern).
HeadPattern parse_head_pattern(const std::string& text, const std::string& origin, int layers, int kv_heads,
                               double threshold = 0.5, double sparsity = -1.0);

}  // namespace topkv
