// Partial attention and the exact log-sum-exp merge (CPU reference twins of
// the decode kernels). DESIGN.md, "Attention over a union of disjoint parts":
// each part over a disjoint set of tokens yields, for one query head,
//   m = max_i s_i,  l = sum_i exp(s_i - m),  o = sum_i exp(s_i - m) v_i
// with s_i the scaled score. Two parts merge exactly as
//   m = max(m1, m2), l = l1 e^(m1-m) + l2 e^(m2-m), o = o1 e^(m1-m) + o2 e^(m2-m)
// and the attention output is o / l. A far cluster of N_j keys with centroid
// score s_j and mean value V_j (Multipole Attention) enters as one weighted
// row: score s_j + ln N_j, value V_j.
#pragma once
#include <cstdint>
#include <limits>
#include <vector>

#include "index/row_store.h"

namespace topkv {

struct AttnPartial {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.f;
  std::vector<float> o;  // un-normalised output, value_dim

  explicit AttnPartial(int value_dim = 0) : o((size_t)value_dim, 0.f) {}
  bool empty() const { return l == 0.f; }
};

// Adds rows with scaled scores `s[i]` (plus optional log-weights `logw[i]`,
// may be null) and values given as fp32 rows `v` (n x value_dim).
void partial_add(AttnPartial& p, const float* s, const float* logw, const float* v, int64_t n);
// Same, values read from the store rows `ids[i]`.
void partial_add_rows(AttnPartial& p, const float* s, const RowStore& values, const int64_t* ids, int64_t n);
// Same, values gathered: row i is rows + idx[i] * value_dim (fp32), weight
// e^(s[i] + logw[i]) (Multipole's far clusters: V̄_j with score + ln N_j).
void partial_add_gather(AttnPartial& p, const float* s, const float* logw, const float* rows, const int32_t* idx,
                        int64_t n);
// a <- merge(a, b). Either may be empty.
void partial_merge(AttnPartial& a, const AttnPartial& b);
// out[value_dim] = o / l (zeros if the partial is empty).
void partial_finish(const AttnPartial& p, float* out);

// Exact softmax attention of one query over rows [0, n) of the stores:
// the reference every sparse path is measured against. partial_exact gives
// it as a partial (to merge with more parts: sinks, window).
// `scores`, when set, gets the n scaled scores it computed (the oracle top-k
// mass reads them instead of a second pass over the keys).
AttnPartial partial_exact(const float* q, float scale, const RowStore& keys, const RowStore& values, int64_t n,
                          float* scores = nullptr);
void attention_exact(const float* q, float scale, const RowStore& keys, const RowStore& values, int64_t n,
                     float* out);
// partial_exact for the G query heads of one KV head (GQA: queries q + g *
// dim, g < G): one pass over the rows, each key row scored for all G at once
// (dot_rows_multi) and each value row converted once for all G. out[g] and,
// when set, scores[g * n + i] are partial_exact's for query g (up to the
// order of float sums). The exact pass of an evaluation's error measurement
// reads every store row of every layer per step, so the G-fold read is its cost.
void partial_exact_group(const float* q, int G, float scale, const RowStore& keys, const RowStore& values, int64_t n,
                         std::vector<AttnPartial>& out, float* scores = nullptr);

}  // namespace topkv
