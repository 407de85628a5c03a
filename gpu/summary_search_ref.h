// CPU twin of the device search (cuda::summary_search, gpu/cuda_kernels.h)
// for one KV head: the same scores, the same 24-bit score keys and cut, the
// same group-order gather with its capacity. Tests compare the kernels with
// it; it is also the definition of what the device search selects.
#pragma once
#include <cstdint>
#include <vector>

#include "index/kv_index.h"

namespace topkv {

// scores [group][n]: each query head's score of every group of `t`.
std::vector<float> summary_scores_reference(const SummaryTables& t, const float* queries, int group);

// The cut of one query head: groups whose key is >= the returned key are
// taken (budget k tokens, weights t.counts; see cuda_kernels.h). lo and inv
// define the keys.
struct ScoreCut {
  float lo = 0.f, inv = 0.f;
  uint32_t cut = 0;
  uint32_t key(float x) const;
};
ScoreCut summary_cut_reference(const float* scores, const std::vector<int32_t>& counts, int64_t k);

// selected[j] for the union of the group's cuts, after the gather's capacity
// (`cap` rows, groups in order), the selected groups' rows in order with the
// group of each, and each query head's cut.
struct SummarySelection {
  std::vector<char> selected;
  std::vector<int64_t> rows;
  std::vector<int64_t> row_group;
  std::vector<ScoreCut> cuts;
  bool capped = false;  // a group some head took did not fit `cap` (it and every later one left out)
};
// With `listed` (two levels) only the listed groups take part: scores is
// [group][listed.size()], selected is indexed by position in the list (as
// the kernels' is), row_group holds t's group ids.
SummarySelection summary_select_reference(const SummaryTables& t, const std::vector<float>& scores, int group,
                                          int64_t k, int64_t cap, const std::vector<int32_t>* listed = nullptr);

// Two levels (t.coarse_ratio > 0; step 1b): each query head's cut of the
// coarse level (t.coarse_level()) at coarse_k tokens, and the fine groups
// of the coarse groups any head took, in order. `coarse_scores` gets the
// coarse scores [group][coarse groups] when given.
std::vector<int32_t> summary_expand_reference(const SummaryTables& t, const float* queries, int group,
                                              int64_t coarse_k, std::vector<float>* coarse_scores = nullptr);

// Rerank (cuda_kernels.h, step 3b): `candidates` is the selection at the
// candidates' budget, `row_scores` [group][candidates.rows.size()] the exact
// q.k of each candidate row per query head (those whose cut did not take the
// row's group are ignored). Each query head keeps the rows at or above its
// cut of k (weight 1 each); the kept rows, in candidate order, at most `cap`,
// and selected[j] for the groups with a kept row.
SummarySelection summary_rerank_reference(const SummaryTables& t, const SummarySelection& candidates,
                                          const std::vector<float>& scores, const std::vector<float>& row_scores,
                                          int group, int64_t k, int64_t cap);

// far_dropped (step 4): the candidates (positions in `candidates.rows`)
// that the rerank `kept` did not list but whose group it selected; each is a
// far row of its own, logit scale.q.k, value V̄ of its group.
std::vector<int64_t> summary_dropped_reference(const SummarySelection& candidates, const SummarySelection& kept);

// The far logit of group j for one query head q (step 4): scale * x + ln N_j,
// x the group's score, plus the spread term where the tables carry one
// (SummaryTables::key_var, far_spread_logit).
float summary_far_logit_reference(const SummaryTables& t, int64_t j, const float* q, float x, float scale);

}  // namespace topkv
