// ClusterIndex: k-means clusters of keys with a centroid lookup, the one
// clustering implementation behind `centroid` (Squeezed Attention, Hooper et
// al. 2024, "Squeezed Attention: Accelerating Long Context Length LLM
// Inference") and `multipole`
// ("Multipole Attention for Efficient Long Context Reasoning"), which
// adds per-cluster value means and the far-field clusters on top.
//
// Build (Squeezed §3.1): spherical k-means (Faiss) over L2-normalised keys —
// a sample of at most max_train of them — then every key is assigned to the
// centroid of largest cosine. The keys are clustered in blocks of `block`
// consecutive rows (Multipole §3.3's blockwise k-means, W = 8K tokens; the
// last block holds 0.5 to 1.5 blocks), each into len/ratio clusters, so the
// build is linear in n; block=0 runs one k-means over all keys (Squeezed).
// Cluster j keeps its member row ids, its count
// N_j and its centroid C_j = mean of its RAW keys (the ClusterSummaries rows).
// levels=2 (Squeezed §3.3) clusters the fine centroids again (normalised,
// weighted by N_j) into coarse clusters; coarse cluster c keeps its fine
// children, M_c = Σ N_j and D_c = mean of the raw keys below it.
//
// Search, per query head q (GQA union: each head selects for itself):
//   score x_j = q·C_j. Budget mode (threshold 0): clusters by x_j descending
//   until k tokens are covered. Threshold mode: the estimated softmax share
//   S_j = exp(s·x_j) / Σ_i N_i·exp(s·x_i) (s = SearchParams::scale, 0 ->
//   1/sqrt(dim)) of every kept cluster is >= threshold (one global threshold).
//   levels=2: coarse scores first; budget mode expands the best coarse
//   clusters until they hold expand·k keys, threshold mode every coarse
//   cluster whose share is >= threshold/expand; only the fine centroids of
//   expanded coarse clusters are scored. The share denominator sums the
//   scored fine clusters and the unexpanded coarse ones, so it estimates the
//   softmax over all keys (the paper's level-2 denominator counts only the
//   remaining centroids, which inflates shares).
//
// rerank=R (budget mode, one level): clusters are selected until R·k tokens
// per head, then each head keeps the k of their rows with the largest exact
// q·k (the union over heads is returned). A centroid scores a cluster's keys
// together, and where look-alike keys share clusters (RULER's multi-key
// needles) the budget fills with the wrong ones; ranking the candidates'
// rows exactly picks the needle as flat top-k does, at R·k dot products.
// Rows of the selected clusters that are not kept are dropped (multipole:
// clusters with no row kept are far as usual).
//
// Appends (Multipole §3.3's fast update, without re-clustering): each new key
// joins the cluster whose centroid has the largest cosine with it; N_j and
// the running mean C_j (and its coarse parent's) are updated.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "index/kv_index.h"

namespace topkv {

class Progress;

class ClusterIndex : public KvIndex {
 public:
  // With rerank the device search ranks the candidates' rows too
  // (gpu/kernels_summary_rerank.cu), so the tables serve it either way.
  std::optional<SummaryTables::Kind> summary_kind() const override { return SummaryTables::Kind::Centroid; }
  bool is_topk() const override { return false; }
  bool reranks() const override { return levels_ == 1; }
  bool uses_kmeans() const override { return true; }
  double own_rerank() const override { return rerank_; }

 protected:
  // default_ratio: keys per fine centroid when the spec does not say
  // (Squeezed uses 5% centroids = 20, Multipole one per 16 tokens).
  ClusterIndex(std::string name, const Params& p, const BuildOptions& opt, int64_t default_ratio);

  // What one search's centroid lookup decided, over all query heads.
  struct Lookup {
    int nq = 0;
    std::vector<float> fine_score;      // [fine][nq] q_g·C_j; NaN where head g did not score j
    std::vector<float> coarse_score;    // [coarse][nq] q_g·D_c (levels=2)
    std::vector<char> fine_selected;    // [fine] kept by some head: its members are returned
    std::vector<char> coarse_expanded;  // [coarse] expanded by some head (levels=2)
    double scale = 0;                   // the attention's logit scale (SearchParams::scale, or 1/sqrt(dim))
  };

  ~ClusterIndex() override;
  void build_impl(int64_t n_rows) override;
  void begin_build_impl(int64_t n_total) override;
  void rows_ready_impl(int64_t n) override;
  void end_build_impl(int64_t n_total) override;
  void add_impl(int64_t from, int64_t to) override;
  void search_impl(const float* queries, int nq, const SearchParams& p, Candidates& out) const override;
  // A member id (int32) per key + per fine centroid an fp32 centroid, a count
  // and (multipole) an fp32 mean value, assumed of the key's dimension.
  double bytes_per_key_estimate(int dim) const override {
    double per_centroid = dim * 4.0 + 8.0 + (needs_values() ? dim * 4.0 : 0.0);
    return 4.0 + per_centroid / (double)ratio_ * (levels_ == 2 ? 1.0 + 1.0 / (double)coarse_ratio_ : 1.0);
  }
  // The fine level as exported: a member id per key; per cluster its centroid,
  // count and offset, and the mean value with a far field (multipole).
  double summary_groups_per_key() const override { return summary_kind() ? 1.0 / (double)ratio_ : 0.0; }
  double summary_bytes_per_key(int dim, size_t elem, int page_factor) const override {
    (void)page_factor;  // clusters do not merge (summary_page_factor_max 1)
    if (!summary_kind()) return 0.0;
    return 4.0 + (dim * (double)elem + 8.0 + (needs_values() ? dim * (double)elem : 0.0)) / (double)ratio_;
  }
  MemoryReport memory_impl() const override;
  bool export_impl(SummaryTables& out) const override;
  void save_impl(BinaryWriter& w, IndexArrayWriter& arrays) const override;
  void load_impl(BinaryReader& r, IndexArrayReader& arrays) override;

  // Extension points (multipole). after_build: the clusters are set;
  // after_add: row `row` has just joined fine cluster `fine` (counts and key
  // centroids already updated); after_lookup: the selection is done.
  virtual void after_build() {}
  virtual void after_add(int64_t row, int32_t fine) {}
  virtual void after_lookup(const float* queries, const Lookup& lk, Candidates& out) const {}
  virtual void save_extra(BinaryWriter&, IndexArrayWriter&) const {}
  virtual void load_extra(BinaryReader&, IndexArrayReader&) {}

  // Means of `store`'s rows (squares: of their element-wise squares) per
  // cluster, laid out like sum_.key_centroids: fine rows from their members,
  // coarse rows count-weighted from their fine.
  std::vector<float> cluster_means(const RowStore& store, bool squares = false) const;
  // Running-mean update of `means` for row `row` of `store` that joined fine
  // cluster `fine` (and so its coarse parent); counts must already include it.
  void add_to_means(float* means, const RowStore& store, int64_t row, int32_t fine, bool squares = false) const;
  // Appends the coarse rows to fine-only `means` (rows of dv floats).
  void append_coarse_means(std::vector<float>& means, int dv) const;

  int64_t n_fine() const { return sum_.n_fine; }
  int64_t n_coarse() const { return sum_.size() - sum_.n_fine; }
  const float* centroid(int64_t row) const { return sum_.key_centroids.data() + (size_t)row * sum_.dim; }

  // Calls f(rows, n) for the row ids of fine cluster j: those it had when
  // built or loaded, then any folded in since.
  template <typename F>
  void for_each_member_run(int64_t j, F&& f) const {
    const int64_t b = member_begin_[(size_t)j];
    f(member_rows_.data() + b, (size_t)(member_begin_[(size_t)j + 1] - b));
    if (!member_added_.empty() && !member_added_[(size_t)j].empty())
      f(member_added_[(size_t)j].data(), member_added_[(size_t)j].size());
  }

  ClusterSummaries sum_;                        // fine rows, then coarse rows
  // Members as built or loaded, cluster after cluster (CSR): fine j's rows
  // are member_rows_[member_begin_[j] .. member_begin_[j+1]). In place when
  // loaded from a context pack; member_begin_ is derived from the counts.
  HostArray<int32_t> member_rows_;
  std::vector<int64_t> member_begin_;           // [n_fine + 1]
  std::vector<std::vector<int32_t>> member_added_;  // fine j -> rows folded in since (empty until a fold)
  HostArray<int32_t> parent_;                   // fine j -> coarse c (levels=2)
  std::vector<std::vector<int32_t>> children_;  // coarse c -> its fine clusters (levels=2)

  std::vector<float> inv_norm_;                 // fine j -> 1/|C_j| for appends (add_impl), lazily built
  int64_t ratio_, iters_, max_train_, block_, levels_, coarse_ratio_;
  double expand_;
  double rerank_;  // 1: off; R > 1: clusters until R·k tokens, then each head's k best of their rows
  // The one-level lookup reranks by default: on the real Qwen2.5-Coder models
  // (every layer retrieving, RULER's 11 tasks, k = 2% of the prompt) R = 4
  // scored 1.00 / 0.98 / 0.98 of dense at 4K / 8K / 16K (1.5B, GPU) and
  // 1.03 / 1.02 at 2K / 4K (0.5B, CPU), against 0.95 / 0.98 / 1.00 and
  // 0.89 / 0.97 without, with half the next-token KL; it costs ~18% of
  // decode speed on the device search at <= 32K, ~6% on the host (docs/AS_BUILT.md,
  // "Evaluation"). rerank=1 gives the plain lookup.
  static constexpr double kDefaultRerank = 4.0;

 private:
  // Blocks of `block` rows (the last holds 0.5 to 1.5 blocks), each into
  // len/ratio clusters: k_first[b] clusters come before block b.
  struct BlockPlan {
    int64_t n = 0, block = 1, n_blocks = 1;
    std::vector<int64_t> k_first;
    std::pair<int64_t, int64_t> range(int64_t b) const {
      const int64_t lo = b * block;
      return {lo, b + 1 == n_blocks ? n : lo + block};
    }
  };
  struct Streaming;
  BlockPlan plan_blocks(int64_t n) const;
  void cluster_block(const BlockPlan& p, int64_t b, int32_t* assign, int assign_threads, Progress& bar) const;
  void finish_build(const BlockPlan& p, const std::vector<int32_t>& assign);
  std::unique_ptr<Streaming> stream_;  // a streaming build in progress
  void build_coarse();
  void rerank_rows(const float* q, int k, const std::vector<std::vector<int32_t>>& kept, Lookup& lk,
                   Candidates& out) const;
  void select_for_head(const float* q, int g, const SearchParams& p, double scale, Lookup& lk,
                       std::vector<int32_t>& kept, std::vector<int32_t>& expanded, int64_t& scored) const;
};

}  // namespace topkv
