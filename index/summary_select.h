// Helpers shared by the summary-based backends (quest pages, centroid and
// multipole clusters): score a table of fp32 summary rows against the query
// heads, then take summaries best first until a token budget is covered
// (Quest's Algorithm 1; Squeezed/Multipole Attention's "retain clusters until
// we hit a target token budget").
#pragma once
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "src/common/vec_math.h"

namespace topkv {

// out[r * nq + g] = rows[r] . q[g] for `n` contiguous fp32 rows of `dim`,
// split over up to `threads` threads in blocks (the summaries of a
// million-token head are tens of thousands of rows).
// Page bounds [M | m] (rows of 2*dim; fine page j's at row_of(j)) of n
// pages reduced over spans of `ratio` pages: out [ceil(n / ratio)][2*dim],
// each the element-wise max of the Ms and min of the ms (a quest coarse
// level, SummaryTables::coarse_level); only coarse pages [c_begin, c_end)
// when given (c_end < 0: to the last), out still indexed from 0.
template <class RowOf>
void reduce_page_bounds(RowOf row_of, int64_t n, int dim, int64_t ratio, float* out, int threads,
                        int64_t c_begin = 0, int64_t c_end = -1) {
  const size_t w = 2 * (size_t)dim;
  const int64_t nc = c_end < 0 ? (n + ratio - 1) / ratio : c_end;
#pragma omp parallel for num_threads(std::max(1, threads)) schedule(static) if (threads > 1 && nc - c_begin > 64)
  for (int64_t c = c_begin; c < nc; ++c) {
    float* o = out + (size_t)c * w;
    const int64_t first = c * ratio, last = std::min(n, first + ratio);
    std::copy_n(row_of(first), w, o);
    for (int64_t j = first + 1; j < last; ++j) {
      const float* r = row_of(j);
      for (int i = 0; i < dim; ++i) o[i] = std::max(o[i], r[i]), o[dim + i] = std::min(o[dim + i], r[dim + i]);
    }
  }
}

inline void score_summary_rows(const float* rows, int64_t n, int dim, const float* q, int nq, float* out,
                               int threads) {
  const int64_t block = 2048, n_blocks = (n + block - 1) / block;
  threads = (int)std::max<int64_t>(1, std::min<int64_t>(threads, n_blocks));
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int64_t b = 0; b < n_blocks; ++b) {
    int64_t lo = b * block, hi = std::min(n, lo + block);
    dot_rows_multi(DType::F32, rows + (size_t)lo * dim, (size_t)(hi - lo), (size_t)dim, q, (size_t)nq,
                   out + (size_t)lo * nq);
  }
}

// The items of `candidates` (ids) by score descending (ties: smaller id first)
// until their sizes sum to at least `budget`; the last one taken may overshoot.
// Sorts only as much as it needs: the head of the order is found with
// nth_element in doubling rounds, so a budget of a few percent of a large
// table costs about one pass over it.
template <class ScoreOf, class SizeOf>
std::vector<int32_t> take_best_until(const std::vector<int32_t>& candidates, int64_t budget, ScoreOf score_of,
                                     SizeOf size_of) {
  std::vector<std::pair<float, int32_t>> v;
  v.reserve(candidates.size());
  int64_t total = 0;
  for (int32_t c : candidates) {
    v.emplace_back(score_of(c), c);
    total += size_of(c);
  }
  auto better = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  std::vector<int32_t> out;
  if (v.empty() || budget <= 0) return out;
  // First round: as many items as the budget needs at the average size, with slack.
  const double share = std::min(1.0, (double)budget / (double)std::max<int64_t>(total, 1));
  size_t want = std::min(v.size(), (size_t)(2.0 * share * (double)v.size()) + 8);
  size_t done = 0;
  int64_t covered = 0;
  while (covered < budget && done < v.size()) {
    size_t end = std::min(v.size(), done + want);
    if (end < v.size()) std::nth_element(v.begin() + (long)done, v.begin() + (long)end, v.end(), better);
    std::sort(v.begin() + (long)done, v.begin() + (long)end, better);
    for (size_t i = done; i < end && covered < budget; ++i) {
      out.push_back(v[i].second);
      covered += size_of(v[i].second);
    }
    done = end;
    want *= 2;
  }
  return out;
}

// log(sum_i exp(x_i)) over the values pushed, without overflow.
class LogSumExp {
 public:
  void add(float x) {
    if (x == -INFINITY) return;
    if (x > m_) {
      s_ = s_ * std::exp((double)m_ - x) + 1.0;
      m_ = x;
    } else {
      s_ += std::exp((double)x - m_);
    }
  }
  double value() const { return s_ > 0 ? m_ + std::log(s_) : -INFINITY; }

 private:
  float m_ = -INFINITY;
  double s_ = 0.0;
};

}  // namespace topkv
