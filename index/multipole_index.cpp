// multipole: "Multipole Attention for Efficient Long Context Reasoning" (
// §3.2 and §3.4): the centroid lookup of ClusterIndex, plus a mean value V̄_j
// per cluster, so that the clusters NOT selected are still attended to,
// approximately. Their keys are not returned; instead search() returns them
// in far_clusters with q_g·C_j for every query head g, and the decode step
// adds each as one weighted row of the log-sum-exp merge: scaled score
// s·q·C_j + ln N_j, value V̄_j (offload/partial_attention.h). With rerank=1
// nothing is dropped: every token is in exactly one part, a cluster selected
// by any query head is returned exactly (for all heads), every other cluster
// is far. (With rerank, the default, a selected cluster's rows that no head
// keeps are dropped: cluster_index.h.) With
// levels=2 a coarse cluster that no head expanded is one far row summarising
// all its keys (the hierarchical multipole approximation, §3.4); the fine
// clusters of an expanded coarse cluster that were not kept are far one by
// one. Far rows index ClusterSummaries (fine rows first, coarse after).
//
// The value store may have another dimension than the keys. Appends update
// the value means with the same running mean as the key centroids.
//
// spread=a (0: off) corrects a far row's mass for the spread of its keys.
// N_j exp(s q.C_j) is exp of the mean score, which under-counts the mean of
// exp (Jensen): on the real Qwen 0.5B the far clusters' mass by 1.5-20x
// (bench/results/far_field_session11/). For keys Gaussian about C_j with
// per-dimension variance var_j the mean is exp(s q.C_j + s^2/2 q^2.var_j);
// the far score gets min(a * s^2/2 q^2.var_j, ln spread_clip) / s added. Real
// keys are heavier-tailed than Gaussian, so a = 0.5 with the factor clipped
// at 4 is what lowered the attention error there (0.091 -> 0.078; a = 1
// unclipped raised it to 0.24). The variance comes from a second mean per
// cluster, of the keys' squares, kept like the centroids (+ d floats a
// cluster). The device search adds the same term in its far kernel from the
// exported variance table (SummaryTables::key_var, far_spread_logit).
//
// far_mass=oracle (for evaluation only; host search, the device search
// refuses it) gives each far row its exact mass: the far score becomes
// (ln sum_i exp(s q.k_i) - ln N_j) / s over the row's member keys, so
// N_j exp(s x) is what dense attention gives those keys, and only the value
// stays the mean. It reads every far key for every query head (a dense pass),
// and answers whether the estimated mass, rather than the mean value or the
// selection, is what a task loses (eval ruler's fwe, docs/AS_BUILT.md).
//
// rerank_far=1: with rerank, the rows of a selected cluster that no head
// keeps are neither attended nor far, so their attention is lost, and they
// are the best-scored clusters' rows. Here each such cluster adds one more
// far row for them: the exact mass of its dropped rows with the cluster's
// mean value. In the host search their dot products are taken again (the
// rerank scores each head's own candidates only, and a union-selected
// cluster may not be among them), about the rerank's own cost again. The
// device search (SummaryTables::far_dropped) has every candidate's dot
// product for every query head already and adds the dropped rows one by one
// (the same sum: exp of the row-wise log-sum-exp). On by default since the
// device search's far kernel splits its candidates as it splits groups: on
// the real Qwen2.5-Coder-1.5B it cuts the attention error by a third and the
// worst next-token KL fivefold at the same RULER score, for no measurable
// decode time (docs/AS_BUILT.md, "rerank_far").
#include <algorithm>
#include <cmath>

#include "index/backends.h"
#include "index/cluster_index.h"
#include "src/common/error.h"

namespace topkv {

namespace {

class MultipoleIndex final : public ClusterIndex {
 public:
  // One centroid per 16 tokens, the paper's setting (§4, Figure 5).
  MultipoleIndex(const Params& p, const BuildOptions& opt)
      : ClusterIndex("multipole", p, opt, 16),
        spread_(p.get_double("spread", 0.0)),
        spread_clip_(p.get_double("spread_clip", 4.0)),
        oracle_mass_(parse_far_mass(p.get_str("far_mass", "estimate"))),
        rerank_far_(p.get_bool("rerank_far", true)) {
    TOPKV_CHECK(std::isfinite(spread_) && spread_ >= 0.0 && spread_ <= 4.0,
                "multipole: spread={} must be in [0, 4] (0 = off; 0.5 = half the Gaussian spread term)", spread_);
    TOPKV_CHECK(std::isfinite(spread_clip_) && spread_clip_ >= 1.0 && spread_clip_ <= 1e6,
                "multipole: spread_clip={} must be in [1, 1e6] (the largest factor a far row's mass is raised by)",
                spread_clip_);
  }
  bool needs_values() const override { return true; }
  // The oracle's exact far mass exists only in the host search.
  std::optional<SummaryTables::Kind> summary_kind() const override {
    return oracle_mass_ ? std::nullopt : ClusterIndex::summary_kind();
  }
  // With spread, an fp32 mean of squares per summary row besides the centroid.
  double bytes_per_key_estimate(int dim) const override {
    const double rows_per_key = (levels_ == 2 ? 1.0 + 1.0 / (double)coarse_ratio_ : 1.0) / (double)ratio_;
    return ClusterIndex::bytes_per_key_estimate(dim) + (spread_ > 0.0 ? dim * 4.0 * rows_per_key : 0.0);
  }
  // With spread, the device tables hold a variance row per group as well.
  double summary_bytes_per_key(int dim, size_t elem, int page_factor) const override {
    const double base = ClusterIndex::summary_bytes_per_key(dim, elem, page_factor);
    return base + (base > 0.0 && spread_ > 0.0 ? dim * (double)elem / (double)ratio_ : 0.0);
  }

 protected:
  void after_build() override {
    sum_.value_dim = values_->dim();
    sum_.value_means = cluster_means(*values_);
    if (spread_ > 0.0) key_squares_ = cluster_means(*keys_, /*squares=*/true);
  }

  MemoryReport memory_impl() const override {
    MemoryReport m = ClusterIndex::memory_impl();
    m.structure_bytes += key_squares_.owned_bytes();
    m.mapped_bytes += key_squares_.mapped_bytes();
    if (spread_ > 0.0) m.note += "; key squares (fp32) for the spread term";
    return m;
  }

  void after_add(int64_t row, int32_t fine) override {
    add_to_means(sum_.value_means.data(), *values_, row, fine);
    if (spread_ > 0.0) add_to_means(key_squares_.data(), *keys_, row, fine, /*squares=*/true);
  }

  // The per-dimension variance of summary row r's keys: mean of squares
  // less the squared mean (never below 0, whatever the rounding).
  void key_var(int64_t r, float* var) const {
    const int d = sum_.dim;
    const float* c = centroid(r);
    const float* sq = key_squares_.data() + (size_t)r * d;
    for (int i = 0; i < d; ++i) var[i] = (float)std::max(0.0, (double)sq[i] - (double)c[i] * c[i]);
  }

  bool export_impl(SummaryTables& out) const override {
    if (!ClusterIndex::export_impl(out)) return false;
    if (spread_ > 0.0) {
      const int64_t nf = n_fine();
      out.key_var.resize((size_t)nf * sum_.dim);
      for (int64_t j = 0; j < nf; ++j) key_var(j, out.key_var.data() + (size_t)j * sum_.dim);
      out.spread = spread_, out.spread_clip = spread_clip_;
    }
    out.far_dropped = rerank_far_;
    return true;
  }

  void after_lookup(const float* q, const Lookup& lk, Candidates& out) const override {
    const int nq = lk.nq, d = sum_.dim;
    const int64_t nf = n_fine(), nc = n_coarse();
    auto& far = out.far_clusters;
    if (nc == 0) {
      for (int64_t j = 0; j < nf; ++j)
        if (!lk.fine_selected[(size_t)j]) far.push_back((int32_t)j);
    } else {
      for (int64_t c = 0; c < nc; ++c) {
        if (!lk.coarse_expanded[(size_t)c]) {
          far.push_back((int32_t)(nf + c));
          continue;
        }
        for (int32_t j : children_[(size_t)c])
          if (!lk.fine_selected[(size_t)j]) far.push_back(j);
      }
    }
    // rerank_far: after those, a far row per selected cluster for its rows
    // that no head kept (dropped[t - n_estimated]).
    const size_t n_estimated = far.size();
    std::vector<std::vector<int32_t>> dropped;
    if (rerank_far_ && nc == 0) add_dropped(lk, out.ids, far, dropped);
    // [nq][n_far] q_g·C_j, or the exact score. A fine cluster that only
    // another head expanded was not scored for this head yet: score it now.
    const size_t n_far = far.size();
    out.far_scores.resize((size_t)nq * n_far);
    int64_t extra = 0;
    std::vector<float> var(spread_ > 0.0 ? (size_t)d : 0);
    std::vector<int32_t> members;
    for (size_t t = 0; t < n_far; ++t) {
      const int64_t r = far[t];
      // The rows whose exact mass the far row carries, if it does.
      const std::vector<int32_t>* exact = nullptr;
      if (t >= n_estimated)
        exact = &dropped[t - n_estimated];
      else if (oracle_mass_)
        exact = &(members = rows_below(r));
      if (spread_ > 0.0 && !exact) key_var(r, var.data());
      for (int g = 0; g < nq; ++g) {
        const float* qg = q + (size_t)g * d;
        float& x = out.far_scores[(size_t)g * n_far + t];
        if (exact) {
          x = exact_far_score(*exact, r, qg, lk.scale);
          continue;
        }
        x = r < nf ? lk.fine_score[(size_t)r * nq + g] : lk.coarse_score[(size_t)(r - nf) * nq + g];
        if (std::isnan(x)) {
          x = dot_f32(centroid(r), qg, (size_t)d);
          ++extra;
        }
        // The term is a logit; the far score is multiplied by s later.
        if (spread_ > 0.0) x += (float)(far_spread_logit(qg, var.data(), d, spread_, spread_clip_, lk.scale) / lk.scale);
      }
      if (exact) out.stats.keys_scored += (int64_t)exact->size() * nq;
    }
    out.stats.summaries_scored += extra;
  }

  // Array value_means [nf + nc][value_dim] (after ClusterIndex's); with
  // spread, key_squares [nf + nc][dim].
  void save_extra(BinaryWriter& w, IndexArrayWriter& arrays) const override {
    w.pod<int32_t>(sum_.value_dim);
    arrays.put<float>("value_means", {sum_.size(), n_fine() ? sum_.value_dim : 0}, sum_.value_means);
    if (spread_ > 0.0) arrays.put<float>("key_squares", {sum_.size(), n_fine() ? sum_.dim : 0}, key_squares_);
  }

  void load_extra(BinaryReader& r, IndexArrayReader& arrays) override {
    int32_t dv = r.pod<int32_t>();
    TOPKV_CHECK(dv == values_->dim() || n_fine() == 0,
                "multipole index '{}' summarises values of dimension {}, the value store has {}", r.path(), dv,
                values_->dim());
    sum_.value_dim = values_->dim();
    sum_.value_means = arrays.get<float>("value_means", {sum_.size(), n_fine() ? dv : 0});
    if (spread_ > 0.0) key_squares_ = arrays.get<float>("key_squares", {sum_.size(), n_fine() ? sum_.dim : 0});
  }

 private:
  static bool parse_far_mass(const std::string& v) {
    TOPKV_CHECK(v == "estimate" || v == "oracle",
                "multipole: far_mass={} is not known: 'estimate' (the default: N_j exp(s q.C_j)) or 'oracle' "
                "(evaluation only: each far row's exact mass over its keys, a dense pass on the host)", v);
    return v == "oracle";
  }
  // rerank_far: each selected fine cluster with rows outside `ids` (the rows
  // attended exactly, in any order, repeats allowed) joins `far`, and its
  // dropped rows `dropped`.
  void add_dropped(const Lookup& lk, const std::vector<int64_t>& ids, std::vector<int32_t>& far,
                   std::vector<std::vector<int32_t>>& dropped) const {
    std::vector<int64_t> kept(ids);
    std::sort(kept.begin(), kept.end());
    for (int64_t j = 0; j < n_fine(); ++j) {
      if (!lk.fine_selected[(size_t)j]) continue;
      std::vector<int32_t> rows;
      for_each_member_run(j, [&](const int32_t* r, size_t m) {
        for (size_t i = 0; i < m; ++i)
          if (!std::binary_search(kept.begin(), kept.end(), (int64_t)r[i])) rows.push_back(r[i]);
      });
      if (rows.empty()) continue;
      far.push_back((int32_t)j);
      dropped.push_back(std::move(rows));
    }
  }
  // The keys below summary row r: a fine row's members, a coarse row's children's.
  std::vector<int32_t> rows_below(int64_t r) const {
    std::vector<int32_t> rows;
    const auto add_run = [&](const int32_t* run, size_t n) { rows.insert(rows.end(), run, run + n); };
    if (r < n_fine())
      for_each_member_run(r, add_run);
    else
      for (int32_t j : children_[(size_t)(r - n_fine())]) for_each_member_run(j, add_run);
    return rows;
  }
  // The far score x of summary row r for query qg such that N_r exp(s x) is
  // the exact sum of exp(s q.k) over `rows`, by a running log-sum-exp.
  float exact_far_score(const std::vector<int32_t>& rows, int64_t r, const float* qg, double s) const {
    const double n = (double)sum_.counts[(size_t)r];
    if (rows.empty() || n <= 0.0) return -INFINITY;
    double m = -INFINITY, sum = 0.0;
    for (int32_t i : rows) {
      const double z = s * (double)keys_->dot(i, qg);
      if (z > m) sum = sum * std::exp(m - z) + 1.0, m = z;
      else sum += std::exp(z - m);
    }
    return (float)((m + std::log(sum) - std::log(n)) / s);
  }

  const double spread_, spread_clip_;
  const bool oracle_mass_;  // far_mass=oracle
  const bool rerank_far_;   // rerank_far=1 (the default)
  HostArray<float> key_squares_;  // [nf + nc][dim] mean of the keys' squares (spread only)
};

}  // namespace

std::unique_ptr<KvIndex> make_multipole_index(const Params& params, const BuildOptions& opt) {
  return std::make_unique<MultipoleIndex>(params, opt);
}

}  // namespace topkv
