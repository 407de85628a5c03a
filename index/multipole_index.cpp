// multipole: "Multipole Attention for Efficient Long Context Reasoning" (
// §3.2 and §3.4): the centroid lookup of ClusterIndex, plus a mean value V̄_j
// per cluster, so that the clusters NOT selected are still attended to,
// approximately. Their keys are not returned; instead search() returns them
// in far_clusters with q_g·C_j for every query head g, and the decode step
// adds each as one weighted row of the log-sum-exp merge: scaled score
// s·q·C_j + ln N_j, value V̄_j (offload/partial_attention.h). Nothing is dropped.
//
// Every token is in exactly one part: a cluster selected by any query head
// is returned exactly (for all heads), every other cluster is far. With
// levels=2 a coarse cluster that no head expanded is one far row summarising
// all its keys (the hierarchical multipole approximation, §3.4); the fine
// clusters of an expanded coarse cluster that were not kept are far one by
// one. Far rows index ClusterSummaries (fine rows first, coarse after).
//
// The value store may have another dimension than the keys. Appends update
// the value means with the same running mean as the key centroids.
#include <cmath>

#include "index/backends.h"
#include "index/cluster_index.h"
#include "src/common/error.h"

namespace topkv {

namespace {

class MultipoleIndex final : public ClusterIndex {
 public:
  // One centroid per 16 tokens, the paper's setting (§4, Figure 5).
  MultipoleIndex(const Params& p, const BuildOptions& opt) : ClusterIndex("multipole", p, opt, 16) {}
  bool needs_values() const override { return true; }

 protected:
  void after_build() override {
    sum_.value_dim = values_->dim();
    sum_.value_means = cluster_means(*values_);
  }

  void after_add(int64_t row, int32_t fine) override { add_to_means(sum_.value_means.data(), *values_, row, fine); }

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
    // [nq][n_far] q_g·C_j. A fine cluster that only another head expanded was
    // not scored for this head yet: score it now.
    const size_t n_far = far.size();
    out.far_scores.resize((size_t)nq * n_far);
    int64_t extra = 0;
    for (size_t t = 0; t < n_far; ++t) {
      int64_t r = far[t];
      for (int g = 0; g < nq; ++g) {
        float x = r < nf ? lk.fine_score[(size_t)r * nq + g] : lk.coarse_score[(size_t)(r - nf) * nq + g];
        if (std::isnan(x)) {
          x = dot_f32(centroid(r), q + (size_t)g * d, (size_t)d);
          ++extra;
        }
        out.far_scores[(size_t)g * n_far + t] = x;
      }
    }
    out.stats.summaries_scored += extra;
  }

  // Array value_means [nf + nc][value_dim] (after ClusterIndex's).
  void save_extra(BinaryWriter& w, IndexArrayWriter& arrays) const override {
    w.pod<int32_t>(sum_.value_dim);
    arrays.put<float>("value_means", {sum_.size(), n_fine() ? sum_.value_dim : 0}, sum_.value_means);
  }

  void load_extra(BinaryReader& r, IndexArrayReader& arrays) override {
    int32_t dv = r.pod<int32_t>();
    TOPKV_CHECK(dv == values_->dim() || n_fine() == 0,
                "multipole index '{}' summarises values of dimension {}, the value store has {}", r.path(), dv,
                values_->dim());
    sum_.value_dim = values_->dim();
    sum_.value_means = arrays.get<float>("value_means", {sum_.size(), n_fine() ? dv : 0});
  }
};

}  // namespace

std::unique_ptr<KvIndex> make_multipole_index(const Params& params, const BuildOptions& opt) {
  return std::make_unique<MultipoleIndex>(params, opt);
}

}  // namespace topkv
