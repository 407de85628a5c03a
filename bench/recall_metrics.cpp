#include "bench/recall_metrics.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include "offload/partial_attention.h"
#include "index/topk_collector.h"
#include "src/common/error.h"
#include "src/common/progress.h"
#include "src/common/vec_math.h"

namespace topkv {

namespace {

constexpr int64_t kBlock = 4096;  // keys per fp32 partial sum of the exact output

double l2_norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += (double)x * x;
  return std::sqrt(s);
}

double mass_of(const std::vector<float>& topk_scores, float scale, double log_z) {
  double m = 0;
  for (float s : topk_scores) m += std::exp((double)scale * s - log_z);
  return m;
}

}  // namespace

QueryTruth exact_truth_reference(const float* q, const RowStore& keys, const RowStore& values, float scale, int k) {
  TOPKV_CHECK(k >= 1, "k must be at least 1 (got {})", k);
  const int64_t n = keys.size();
  TOPKV_CHECK(n >= 1 && values.size() >= n, "exact attention needs keys and as many values ({} / {})", n,
              values.size());
  std::vector<std::pair<float, int64_t>> all((size_t)n);
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    all[(size_t)i] = {keys.dot(i, q), i};
    mx = std::max(mx, (double)scale * all[(size_t)i].first);
  }
  double z = 0;
  for (auto& [s, i] : all) z += std::exp((double)scale * s - mx);
  std::sort(all.begin(), all.end(), [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
  QueryTruth t;
  for (int64_t i = 0; i < std::min<int64_t>(k, n); ++i) {
    t.topk_scores.push_back(all[(size_t)i].first);
    t.topk_ids.push_back(all[(size_t)i].second);
  }
  t.log_z = mx + std::log(z);
  t.output.resize((size_t)values.dim());
  attention_exact(q, scale, keys, values, n, t.output.data());
  t.topk_mass = mass_of(t.topk_scores, scale, t.log_z);
  return t;
}

std::vector<QueryTruth> exact_truth(const AttentionHead& head, float scale, int k, int n_threads, bool progress) {
  TOPKV_CHECK(k >= 1, "k must be at least 1 (got {})", k);
  const RowStore& keys = *head.keys;
  const RowStore& values = *head.values;
  const int64_t n = keys.size();
  const int d = keys.dim(), dv = values.dim(), G = head.group;
  TOPKV_CHECK(n >= 1 && values.size() >= n, "exact attention needs keys and as many values ({} / {})", n,
              values.size());
  const int threads = n_threads > 0 ? n_threads : std::max(1u, std::thread::hardware_concurrency());
  std::vector<QueryTruth> out((size_t)head.n_queries * G);
  Progress bar("ground truth", head.n_queries, "steps", progress);
#pragma omp parallel num_threads(std::min(threads, std::max(1, head.n_queries)))
  {
    std::vector<float> s((size_t)n * G);  // scores of every key for the step's G heads, [key][g]
    std::vector<double> o((size_t)dv);
    std::vector<float> ob((size_t)dv);
#pragma omp for schedule(dynamic, 1)
    for (int j = 0; j < head.n_queries; ++j) {
      const float* qs = head.step_queries(j);
      keys.for_each_span(0, n, [&](int64_t first, int64_t cnt, const void* rows) {
        dot_rows_multi(keys.dtype(), rows, (size_t)cnt, (size_t)d, qs, (size_t)G, &s[(size_t)first * G]);
      });
      for (int g = 0; g < G; ++g) {
        QueryTruth& t = out[(size_t)j * G + g];
        TopKCollector top(std::min<int64_t>(k, n));
        float mx = -INFINITY;
        for (int64_t i = 0; i < n; ++i) {
          float x = s[(size_t)i * G + g];
          top.push(x, i);
          mx = std::max(mx, x);
        }
        for (auto& [score, id] : top.take_sorted()) {
          t.topk_scores.push_back(score);
          t.topk_ids.push_back(id);
        }
        // Softmax normaliser and output in one pass over the values: fp32
        // SIMD within blocks of keys, blocks summed in double (a million terms).
        const double m = (double)scale * mx;
        double z = 0;
        std::fill(o.begin(), o.end(), 0.0);
        for (int64_t b0 = 0; b0 < n; b0 += kBlock) {
          const int64_t b1 = std::min(n, b0 + kBlock);
          std::fill(ob.begin(), ob.end(), 0.f);
          double zb = 0;
          for (int64_t i = b0; i < b1; ++i) {
            const float w = (float)std::exp((double)scale * s[(size_t)i * G + g] - m);
            zb += w;
            if (w > 0.f) axpy_row(values.dtype(), w, values.row(i), ob.data(), (size_t)dv);
          }
          z += zb;
          for (int c = 0; c < dv; ++c) o[(size_t)c] += ob[(size_t)c];
        }
        t.log_z = m + std::log(z);
        t.output.resize((size_t)dv);
        for (int c = 0; c < dv; ++c) t.output[(size_t)c] = (float)(o[(size_t)c] / z);
        t.topk_mass = mass_of(t.topk_scores, scale, t.log_z);
      }
      bar.add(1);
    }
  }
  bar.finish();
  return out;
}

QueryMetrics evaluate_query(const SearchResult& r, int g, const float* q, const QueryTruth& truth,
                            const RowStore& keys, const RowStore& values, float scale, int k) {
  TOPKV_CHECK(g >= 0 && g < r.nq, "query head {} of a search over {} query heads", g, r.nq);
  TOPKV_CHECK(!truth.topk_scores.empty(), "no ground truth for this query");
  const int64_t n = keys.size();
  const size_t m = r.ids.size();
  std::vector<float> s(m), scaled(m);
  for (size_t i = 0; i < m; ++i) {
    TOPKV_CHECK(r.ids[i] >= 0 && r.ids[i] < n, "search returned id {} outside the {} keys", r.ids[i], n);
    s[i] = keys.dot(r.ids[i], q);
    scaled[i] = scale * s[i];
  }
  QueryMetrics out;

  // recall@k with ties: keys scoring above the k-th best must be there; the
  // remaining slots may be filled by any key tying it.
  const size_t kk = std::min<size_t>((size_t)k, truth.topk_scores.size());
  const double kth = truth.topk_scores[kk - 1];
  const double tol = kTieTolerance * std::max(1.0, std::fabs((double)truth.topk_scores[0]));
  size_t above_exact = 0, above = 0, tied = 0;
  for (size_t i = 0; i < kk; ++i) above_exact += (double)truth.topk_scores[i] > kth + tol;
  for (size_t i = 0; i < m; ++i) {
    above += (double)s[i] > kth + tol;
    tied += std::fabs((double)s[i] - kth) <= tol;
  }
  const size_t hits = std::min(kk, std::min(above, above_exact) + std::min(tied, kk - above_exact));
  out.recall = (double)hits / (double)kk;

  for (size_t i = 0; i < m; ++i) out.mass_recall += std::exp((double)scaled[i] - truth.log_z);

  // Attention over the returned keys (+ far clusters), merged exactly.
  AttnPartial p(values.dim());
  partial_add_rows(p, scaled.data(), values, r.ids.data(), (int64_t)m);
  if (!r.far_clusters.empty()) {
    const ClusterSummaries* cs = r.summaries;
    TOPKV_CHECK(cs && cs->value_dim == values.dim() && !cs->value_means.empty(),
                "search returned far clusters without their summaries (counts and mean values)");
    const size_t nf = r.far_clusters.size();
    TOPKV_CHECK(r.far_scores.size() == nf * (size_t)r.nq, "far_scores holds {} values for {} clusters x {} heads",
                r.far_scores.size(), nf, r.nq);
    std::vector<float> fs(nf), logw(nf), vbar(nf * (size_t)values.dim());
    for (size_t f = 0; f < nf; ++f) {
      const int32_t c = r.far_clusters[f];
      TOPKV_CHECK(c >= 0 && c < cs->size(), "far cluster {} outside the {} clusters", c, cs->size());
      fs[f] = scale * r.far_scores[(size_t)g * nf + f];
      logw[f] = std::log((float)cs->counts[(size_t)c]);
      std::copy_n(&cs->value_means[(size_t)c * cs->value_dim], cs->value_dim, &vbar[f * cs->value_dim]);
    }
    partial_add(p, fs.data(), logw.data(), vbar.data(), (int64_t)nf);
  }
  std::vector<float> o((size_t)values.dim());
  partial_finish(p, o.data());
  double err = 0;
  for (size_t c = 0; c < o.size(); ++c) err += std::pow((double)o[c] - truth.output[c], 2);
  const double ref = l2_norm(truth.output);
  out.output_error = std::sqrt(err) / (ref > 0 ? ref : 1.0);
  return out;
}

double fraction_scored(const SearchResult& r, int64_t n_keys) {
  if (n_keys <= 0 || r.nq <= 0) return 0.0;
  return (double)(r.stats.keys_scored + r.stats.tail_scanned) / ((double)n_keys * r.nq);
}

}  // namespace topkv
