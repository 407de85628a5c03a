#include "gpu/summary_search_ref.h"

#include <algorithm>
#include <cmath>

namespace topkv {

namespace {
constexpr uint32_t kKeyMax = (1u << 24) - 1;
}

std::vector<float> summary_scores_reference(const SummaryTables& t, const float* q, int group) {
  const int64_t n = t.size();
  const int d = t.dim, len = t.row_len();
  std::vector<float> s((size_t)group * n);
  for (int g = 0; g < group; ++g)
    for (int64_t j = 0; j < n; ++j) {
      const float* row = t.rows.data() + (size_t)j * len;
      const float* qg = q + (size_t)g * d;
      double acc = 0;
      for (int i = 0; i < d; ++i)
        acc += t.kind == SummaryTables::Kind::PageBounds
                   ? (double)std::max(qg[i], 0.f) * row[i] + (double)std::min(qg[i], 0.f) * row[d + i]
                   : (double)qg[i] * row[i];
      s[(size_t)g * n + j] = (float)acc;
    }
  return s;
}

uint32_t ScoreCut::key(float x) const {
  const float t = (x - lo) * inv;
  return t >= (float)kKeyMax ? kKeyMax : (t > 0.f ? (uint32_t)t : 0u);
}

ScoreCut summary_cut_reference(const float* x, const std::vector<int32_t>& counts, int64_t k) {
  const size_t n = counts.size();
  ScoreCut c;
  float lo = INFINITY, hi = -INFINITY;
  for (size_t j = 0; j < n; ++j) lo = std::min(lo, x[j]), hi = std::max(hi, x[j]);
  c.lo = lo;
  c.inv = hi > lo ? (float)kKeyMax / (hi - lo) : 0.f;
  // Keys by weight, largest first; the cut is the key at which k is reached.
  std::vector<std::pair<uint32_t, int64_t>> keyed(n);
  for (size_t j = 0; j < n; ++j) keyed[j] = {c.key(x[j]), counts[j]};
  std::sort(keyed.begin(), keyed.end(), [](auto& a, auto& b) { return a.first > b.first; });
  int64_t acc = 0;
  c.cut = 0;
  for (auto& [key, w] : keyed) {
    acc += w;
    if (acc >= std::min<int64_t>(k, 0xffffffffll)) {
      c.cut = key;
      break;
    }
  }
  return c;
}

SummarySelection summary_select_reference(const SummaryTables& t, const std::vector<float>& scores, int group,
                                          int64_t k, int64_t cap, const std::vector<int32_t>* listed) {
  const int64_t n = listed ? (int64_t)listed->size() : t.size();
  const auto id = [&](int64_t j) { return listed ? (int64_t)(*listed)[(size_t)j] : j; };
  std::vector<int32_t> counts((size_t)n);
  for (int64_t j = 0; j < n; ++j) counts[(size_t)j] = t.counts[(size_t)id(j)];
  std::vector<ScoreCut> cuts((size_t)group);
  for (int g = 0; g < group; ++g) cuts[(size_t)g] = summary_cut_reference(scores.data() + (size_t)g * n, counts, k);
  SummarySelection sel;
  sel.cuts = cuts;
  sel.selected.assign((size_t)n, 0);
  int64_t used = 0;
  bool full = false;
  for (int64_t j = 0; j < n; ++j) {
    bool any = false;
    for (int g = 0; g < group; ++g) any |= cuts[(size_t)g].key(scores[(size_t)g * n + j]) >= cuts[(size_t)g].cut;
    if (!any) continue;
    const int64_t cnt = counts[(size_t)j], jj = id(j);
    full |= used + cnt > cap;  // the gather's prefix layout: once a group does not fit, no later one does
    sel.capped = full;
    if (full) continue;
    sel.selected[(size_t)j] = 1;
    for (int64_t r = 0; r < cnt; ++r) {
      sel.rows.push_back(t.kind == SummaryTables::Kind::PageBounds
                             ? jj * t.page + r
                             : (int64_t)t.members[(size_t)t.offsets[(size_t)jj] + r]);
      sel.row_group.push_back(jj);
    }
    used += cnt;
  }
  return sel;
}

std::vector<int32_t> summary_expand_reference(const SummaryTables& t, const float* q, int group, int64_t coarse_k,
                                              std::vector<float>* coarse_scores) {
  const SummaryTables c = t.coarse_level();
  const int64_t nc = c.size();
  const std::vector<float> cs = summary_scores_reference(c, q, group);
  std::vector<char> taken((size_t)nc, 0);
  for (int g = 0; g < group; ++g) {
    const ScoreCut cut = summary_cut_reference(cs.data() + (size_t)g * nc, c.counts, coarse_k);
    for (int64_t j = 0; j < nc; ++j) taken[(size_t)j] |= cut.key(cs[(size_t)g * nc + j]) >= cut.cut;
  }
  std::vector<int32_t> listed;
  for (int64_t j = 0; j < nc; ++j)
    for (int64_t f = j * t.coarse_ratio; taken[(size_t)j] && f < std::min(t.size(), (j + 1) * t.coarse_ratio); ++f)
      listed.push_back((int32_t)f);
  if (coarse_scores) *coarse_scores = cs;
  return listed;
}

SummarySelection summary_rerank_reference(const SummaryTables& t, const SummarySelection& cand,
                                          const std::vector<float>& scores, const std::vector<float>& row_scores,
                                          int group, int64_t k, int64_t cap) {
  const int64_t n = t.size(), nc = (int64_t)cand.rows.size();
  // included[g][r]: query head g's cut took candidate r's group.
  std::vector<char> included((size_t)group * nc);
  std::vector<ScoreCut> row_cuts((size_t)group);
  for (int g = 0; g < group; ++g) {
    const ScoreCut& gc = cand.cuts[(size_t)g];
    std::vector<float> x;
    for (int64_t r = 0; r < nc; ++r) {
      const bool in = gc.key(scores[(size_t)g * n + cand.row_group[(size_t)r]]) >= gc.cut;
      included[(size_t)g * nc + r] = in;
      if (in) x.push_back(row_scores[(size_t)g * nc + r]);
    }
    row_cuts[(size_t)g] = summary_cut_reference(x.data(), std::vector<int32_t>(x.size(), 1), k);
  }
  SummarySelection sel;
  sel.cuts = row_cuts;
  sel.selected.assign((size_t)n, 0);
  for (int64_t r = 0; r < nc && (int64_t)sel.rows.size() < cap; ++r) {
    bool keep = false;
    for (int g = 0; g < group && !keep; ++g)
      keep = included[(size_t)g * nc + r] &&
             row_cuts[(size_t)g].key(row_scores[(size_t)g * nc + r]) >= row_cuts[(size_t)g].cut;
    if (!keep) continue;
    sel.rows.push_back(cand.rows[(size_t)r]);
    sel.row_group.push_back(cand.row_group[(size_t)r]);
    sel.selected[(size_t)cand.row_group[(size_t)r]] = 1;
  }
  return sel;
}

std::vector<int64_t> summary_dropped_reference(const SummarySelection& cand, const SummarySelection& kept) {
  std::vector<int64_t> listed(kept.rows);
  std::sort(listed.begin(), listed.end());
  std::vector<int64_t> dropped;
  for (size_t r = 0; r < cand.rows.size(); ++r)
    if (kept.selected[(size_t)cand.row_group[r]] && !std::binary_search(listed.begin(), listed.end(), cand.rows[r]))
      dropped.push_back((int64_t)r);
  return dropped;
}

float summary_far_logit_reference(const SummaryTables& t, int64_t j, const float* q, float x, float scale) {
  double logit = (double)x * scale + std::log((double)t.counts[(size_t)j]);
  if (!t.key_var.empty())
    logit += far_spread_logit(q, t.key_var.data() + (size_t)j * t.dim, t.dim, t.spread, t.spread_clip, scale);
  return (float)logit;
}

}  // namespace topkv
