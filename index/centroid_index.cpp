// centroid: Squeezed Attention's centroid lookup, and ClusterIndex, the
// clustering shared with `multipole` (see index/cluster_index.h for the
// algorithm and the papers it follows).
#include <faiss/Clustering.h>
#include <faiss/IndexFlat.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <optional>

#include "index/ann_util.h"
#include "index/backends.h"
#include "index/cluster_index.h"
#include "index/kmeans.h"
#include "index/summary_select.h"
#include "src/common/error.h"
#include "src/common/progress.h"
#include "src/common/parallel_errors.h"
#include "src/common/task_group.h"

namespace topkv {

static_assert(RowStore::kMaxChunks * RowStore::kChunkRows <= INT32_MAX, "member lists hold row ids as int32");

namespace {

// Faiss runs its k-means and flat search with OpenMP at the calling thread's
// default team size, and its matrix products in BLAS, which (OpenBLAS, as
// scripts/setup.sh installs it) has its own thread pool. OpenMP workers
// spinning between Faiss's parallel loops then fight the BLAS threads for the
// cores: a 1200-key build took seconds on two cores. So Faiss runs with one
// OpenMP thread (ScopedOmpThreads(1): its loops are O(n·k), the products
// O(n·k·dim) stay parallel in BLAS) and our own loops take n_threads explicitly.

void normalise_rows(float* x, int64_t n, int d) {
  for (int64_t i = 0; i < n; ++i) {
    float* r = x + (size_t)i * d;
    float nrm = std::sqrt(dot_f32(r, r, (size_t)d));
    if (nrm > 0.f)
      for (int j = 0; j < d; ++j) r[j] /= nrm;
  }
}

// Spherical k-means (unit centroids, inner-product assignment) of n unit rows
// into k clusters; on return `index` holds the k centroids.
void spherical_kmeans(const float* x, int64_t n, int d, int64_t k, int iters, uint64_t seed, const float* weights,
                      faiss::IndexFlatIP& index) {
  faiss::ClusteringParameters cp;
  cp.niter = iters;
  cp.spherical = true;
  cp.verbose = false;
  cp.min_points_per_centroid = 1;         // a centroid per ~20 keys is the point, not a mistake to warn about
  cp.max_points_per_centroid = INT_MAX;   // the sample cap is ours (max_train)
  cp.seed = (int)(seed % 2147483647u);
  faiss::Clustering km(d, (int)k, cp);
  ScopedOmpThreads one(1);
  km.train((faiss::Index::idx_t)n, x, index, weights);
}

// Label of the nearest (largest inner product) entry of `index` for each of
// the rows [from, to) of `keys`, normalised first.
void assign_rows(const RowStore& keys, int64_t from, int64_t to, const faiss::IndexFlatIP& index,
                 int32_t* out, int threads, Progress& progress) {
  const int d = keys.dim();
  const int64_t block = 8192;
  std::vector<float> x((size_t)std::min(block, to - from) * d), dist;
  std::vector<faiss::Index::idx_t> label;
  for (int64_t lo = from; lo < to; lo += block) {
    int64_t m = std::min(block, to - lo);
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t i = 0; i < m; ++i) keys.row_f32(lo + i, x.data() + (size_t)i * d);
    normalise_rows(x.data(), m, d);
    dist.resize((size_t)m);
    label.resize((size_t)m);
    {
      ScopedOmpThreads one(1);
      index.search(m, x.data(), 1, dist.data(), label.data());
    }
    for (int64_t i = 0; i < m; ++i) out[lo - from + i] = (int32_t)std::max<faiss::Index::idx_t>(label[(size_t)i], 0);
    progress.add(m);
  }
}

}  // namespace

ClusterIndex::ClusterIndex(std::string name, const Params& p, const BuildOptions& opt, int64_t default_ratio)
    : KvIndex(std::move(name), p, opt) {
  ratio_ = p.get_int("ratio", default_ratio);
  iters_ = p.get_int("iters", 10);
  max_train_ = p.get_int("max_train", 65536);
  block_ = p.get_int("block", 8192);
  levels_ = p.get_int("levels", 1);
  coarse_ratio_ = p.get_int("coarse_ratio", 5);
  expand_ = p.get_double("expand", 4.0);
  rerank_ = p.get_double("rerank", levels_ == 1 ? kDefaultRerank : 1.0);
  TOPKV_CHECK(ratio_ >= 1, "{}: ratio={} must be at least 1 (keys per centroid)", name_, ratio_);
  TOPKV_CHECK(iters_ >= 1 && iters_ <= 1000, "{}: iters={} is out of range (1..1000 k-means iterations)", name_,
              iters_);
  TOPKV_CHECK(block_ >= 0, "{}: block={} must be >= 0 (keys per k-means block; 0 = one k-means over all)",
              name_, block_);
  TOPKV_CHECK(max_train_ >= 1, "{}: max_train={} must be at least 1 (keys sampled for k-means)", name_, max_train_);
  TOPKV_CHECK(levels_ == 1 || levels_ == 2, "{}: levels={} must be 1 (flat lookup) or 2 (hierarchical)", name_,
              levels_);
  TOPKV_CHECK(coarse_ratio_ >= 2, "{}: coarse_ratio={} must be at least 2 (fine centroids per coarse one)", name_,
              coarse_ratio_);
  TOPKV_CHECK(expand_ >= 1.0, "{}: expand={} must be at least 1 (coarse clusters hold expand*k keys)", name_,
              expand_);
  TOPKV_CHECK(std::isfinite(rerank_) && rerank_ >= 1.0 && rerank_ <= 1024.0, "{}: rerank={} must be in [1, 1024] "
              "(1 = off; R: clusters until R*k tokens, then the k best rows exactly)", name_, rerank_);
  TOPKV_CHECK(rerank_ == 1.0 || levels_ == 1, "{}: rerank applies to the one-level lookup (levels=1)", name_);
  if (levels_ == 1)
    TOPKV_CHECK(!p.has("coarse_ratio") && !p.has("expand"),
                "{}: coarse_ratio and expand apply only to the hierarchical lookup: add levels=2", name_);
}

// ---- build ------------------------------------------------------------------

ClusterIndex::BlockPlan ClusterIndex::plan_blocks(int64_t n) const {
  BlockPlan p;
  p.n = n;
  p.block = block_ > 0 ? block_ : std::max<int64_t>(n, 1);
  p.n_blocks = std::max<int64_t>(1, std::llround((double)n / (double)p.block));  // last: 0.5..1.5 blocks
  p.k_first.assign((size_t)p.n_blocks + 1, 0);  // clusters before block b
  for (int64_t b = 0; b < p.n_blocks; ++b) {
    auto [lo, hi] = p.range(b);
    p.k_first[(size_t)b + 1] =
        p.k_first[(size_t)b] + std::clamp<int64_t>(std::llround((double)(hi - lo) / (double)ratio_), 1, hi - lo);
  }
  return p;
}

// Spherical k-means on (a sample of) the normalised keys of block b, and
// every key of the block to the centroid of largest cosine (global cluster
// ids into assign[lo..hi)). Seeded by the block's number: the result does not
// depend on which thread runs it, or when.
void ClusterIndex::cluster_block(const BlockPlan& p, int64_t b, int32_t* assign, int assign_threads,
                                 Progress& bar) const {
  const int d = keys_->dim();
  auto [lo, hi] = p.range(b);
  const int64_t len = hi - lo, kb = p.k_first[(size_t)b + 1] - p.k_first[(size_t)b];
  auto rows = select_rows(len, std::min(len, std::max(max_train_, kb)), opt_.seed + (uint64_t)b);  // training sample
  std::vector<float> x(rows.size() * d);
  for (int64_t i = 0; i < (int64_t)rows.size(); ++i) keys_->row_f32(lo + rows[(size_t)i], x.data() + (size_t)i * d);
  normalise_rows(x.data(), (int64_t)rows.size(), d);
  if (opt_.kmeans) {  // an engine handed in (BuildOptions::kmeans: the GPU's with --build-on gpu)
    std::vector<float> all, centroids((size_t)kb * d);
    if ((int64_t)rows.size() < len) {
      all.resize((size_t)len * d);
      for (int64_t i = 0; i < len; ++i) keys_->row_f32(lo + i, all.data() + (size_t)i * d);
      normalise_rows(all.data(), len, d);
    }
    opt_.kmeans->cluster(x.data(), (int64_t)rows.size(), all.empty() ? x.data() : all.data(), len, d, kb,
                         (int)iters_, opt_.seed + (uint64_t)b, centroids.data(), assign + lo);
    bar.add(len);
  } else {
    faiss::IndexFlatIP km_index(d);
    spherical_kmeans(x.data(), (int64_t)rows.size(), d, kb, (int)iters_, opt_.seed + (uint64_t)b, nullptr, km_index);
    assign_rows(*keys_, lo, hi, km_index, assign + lo, assign_threads, bar);
  }
  for (int64_t i = lo; i < hi; ++i) assign[i] += (int32_t)p.k_first[(size_t)b];
}

void ClusterIndex::build_impl(int64_t n) {
  // 1. Blockwise k-means (Multipole §3.3's blockwise clustering) keeps the
  //    build linear in n: one k-means of a million keys into 50k centroids
  //    is ~10^14 flops.
  const BlockPlan plan = plan_blocks(n);
  std::vector<int32_t> assign((size_t)n);
  if (n > 0) {
    Progress bar(name_ + ": cluster keys", n, "keys", opt_.progress);
    // One block's k-means is too small to spread over many cores (Faiss and
    // BLAS threads cost more than they give at 8K x 512), so with several
    // blocks each of this build's threads takes whole blocks, single-threaded
    // (also with a share of one thread: the heads beside it have the other
    // cores); one block keeps BLAS's threads.
    const bool several = plan.n_blocks > 1;
    const int block_threads = (int)std::min<int64_t>(n_threads(), plan.n_blocks);
    std::vector<std::string> errors((size_t)plan.n_blocks);
    {
      // Only for the blocks: the coarse k-means below is one large problem
      // that wants BLAS's threads (the H100 run lost 40 s per layer when it had one).
      std::optional<SingleThreadedBlas> blas;
      if (several) blas.emplace();
#pragma omp parallel for schedule(dynamic, 1) num_threads(block_threads)
      for (int64_t b = 0; b < plan.n_blocks; ++b) {
        try {
          cluster_block(plan, b, assign.data(), several ? 1 : n_threads(), bar);
        } catch (const std::exception& e) {
          errors[(size_t)b] = e.what();
        }
      }
    }
    for (auto& e : errors) TOPKV_CHECK(e.empty(), "{}", e);
    bar.finish();
  }
  finish_build(plan, assign);
}

// Streaming build: each block is clustered on TBB's threads as soon as its
// rows are final, while the caller goes on (a GPU prefill); end_build
// clusters what is left and finishes exactly as build_impl does. Only with
// several blocks and cores (TBB's, not this index's share of a run's threads:
// the blocks are TBB tasks): otherwise build_impl at the end (one block keeps
// BLAS's threads there, and the result must not depend on the path taken).
struct ClusterIndex::Streaming {
  BlockPlan plan;
  std::vector<int32_t> assign;
  int64_t next_block = 0;  // blocks [0, next_block) are queued
  std::vector<std::string> errors;
  Progress bar{"", 0, "", false};
  SingleThreadedBlas blas;
  TaskGroup tasks;  // TBB's (src/common/task_group.h)
};

ClusterIndex::~ClusterIndex() {
  if (stream_) stream_->tasks.wait();
}

void ClusterIndex::begin_build_impl(int64_t n_total) {
  if (stream_) stream_->tasks.wait();
  stream_.reset();
  BlockPlan plan = plan_blocks(n_total);
  if (n_total == 0 || plan.n_blocks < 2 || TaskGroup::concurrency() < 2) return;
  stream_ = std::make_unique<Streaming>();
  stream_->plan = std::move(plan);
  stream_->assign.resize((size_t)n_total);
  stream_->errors.resize((size_t)stream_->plan.n_blocks);
}

void ClusterIndex::rows_ready_impl(int64_t n) {
  if (!stream_) return;
  Streaming& st = *stream_;
  while (st.next_block < st.plan.n_blocks && st.plan.range(st.next_block).second <= n) {
    const int64_t b = st.next_block++;
    st.tasks.run([this, &st, b] {
      try {
        cluster_block(st.plan, b, st.assign.data(), 1, st.bar);
      } catch (const std::exception& e) {
        st.errors[(size_t)b] = e.what();
      }
    });
  }
}

void ClusterIndex::end_build_impl(int64_t n_total) {
  if (!stream_) return build_impl(n_total);
  rows_ready_impl(n_total);
  std::unique_ptr<Streaming> st = std::move(stream_);
  st->tasks.wait();
  for (auto& e : st->errors) TOPKV_CHECK(e.empty(), "{}", e);
  finish_build(st->plan, st->assign);
}

// 2. Member lists (dropping clusters that got no key), centroids, the coarse
// level, and the subclass's summaries.
void ClusterIndex::finish_build(const BlockPlan& plan, const std::vector<int32_t>& assign) {
  const int64_t n = plan.n;
  sum_ = ClusterSummaries{};
  inv_norm_.clear();
  member_rows_ = {};
  member_begin_.assign(1, 0);
  member_added_.clear();
  parent_ = {};
  children_.clear();
  sum_.dim = keys_->dim();
  if (n == 0) return;
  const int64_t k = plan.k_first.back();
  std::vector<int64_t> size((size_t)k, 0);
  for (int32_t a : assign) ++size[(size_t)a];
  std::vector<int32_t> remap((size_t)k, -1);
  int32_t nf = 0;
  for (int64_t j = 0; j < k; ++j)
    if (size[(size_t)j] > 0) remap[(size_t)j] = nf++;
  // Counting sort into CSR: each cluster's rows in ascending order.
  sum_.n_fine = nf;
  std::vector<int64_t> counts((size_t)nf);
  for (int64_t j = 0; j < k; ++j)
    if (remap[(size_t)j] >= 0) counts[(size_t)remap[(size_t)j]] = size[(size_t)j];
  member_begin_.assign((size_t)nf + 1, 0);
  for (int32_t j = 0; j < nf; ++j) member_begin_[(size_t)j + 1] = member_begin_[(size_t)j] + counts[(size_t)j];
  std::vector<int32_t> rows((size_t)n);
  std::vector<int64_t> at(member_begin_.begin(), member_begin_.end() - 1);
  for (int64_t i = 0; i < n; ++i) rows[(size_t)at[(size_t)remap[(size_t)assign[(size_t)i]]]++] = (int32_t)i;
  member_rows_ = std::move(rows);
  sum_.counts = std::move(counts);
  sum_.key_centroids = cluster_means(*keys_);

  if (levels_ == 2) build_coarse();
  after_build();
}

// Squeezed §3.3: k-means over the fine centroids (normalised, weighted by
// their counts) gives the coarse level.
void ClusterIndex::build_coarse() {
  const int d = sum_.dim;
  const int64_t nf = n_fine();
  const int64_t k = std::clamp<int64_t>(std::llround((double)nf / (double)coarse_ratio_), 1, nf);
  std::vector<float> y(sum_.key_centroids.begin(), sum_.key_centroids.begin() + nf * d), w((size_t)nf);
  normalise_rows(y.data(), nf, d);
  for (int64_t j = 0; j < nf; ++j) w[(size_t)j] = (float)sum_.counts[(size_t)j];
  faiss::IndexFlatIP km_index(d);
  spherical_kmeans(y.data(), nf, d, k, (int)iters_, opt_.seed + 1, w.data(), km_index);
  std::vector<float> dist((size_t)nf);
  std::vector<faiss::Index::idx_t> label((size_t)nf);
  {
    ScopedOmpThreads one(1);
    km_index.search(nf, y.data(), 1, dist.data(), label.data());
  }

  std::vector<int32_t> remap((size_t)k, -1);
  int32_t nc = 0;
  for (int64_t j = 0; j < nf; ++j) {
    auto& r = remap[(size_t)std::max<faiss::Index::idx_t>(label[(size_t)j], 0)];
    if (r < 0) r = nc++;
  }
  std::vector<int32_t> parent((size_t)nf);
  children_.assign((size_t)nc, {});
  std::vector<int64_t>& counts = sum_.counts.vec();
  counts.reserve((size_t)(nf + nc));
  counts.resize((size_t)(nf + nc), 0);
  for (int64_t j = 0; j < nf; ++j) {
    int32_t c = remap[(size_t)std::max<faiss::Index::idx_t>(label[(size_t)j], 0)];
    parent[(size_t)j] = c;
    children_[(size_t)c].push_back((int32_t)j);
    counts[(size_t)(nf + c)] += counts[(size_t)j];
  }
  parent_ = std::move(parent);
  append_coarse_means(sum_.key_centroids.vec(), d);
}

std::vector<float> ClusterIndex::cluster_means(const RowStore& store, bool squares) const {
  const int dv = store.dim();
  const int64_t nf = n_fine();
  std::vector<float> means((size_t)nf * dv, 0.f);
#pragma omp parallel for schedule(dynamic, 64) num_threads(n_threads())
  for (int64_t j = 0; j < nf; ++j) {
    float* mu = means.data() + (size_t)j * dv;
    std::vector<float> x(squares ? (size_t)dv : 0);
    for_each_member_run(j, [&](const int32_t* rows, size_t m) {
      for (size_t t = 0; t < m; ++t) {
        if (!squares) {
          axpy_row(store.dtype(), 1.f, store.row(rows[t]), mu, (size_t)dv);
          continue;
        }
        store.row_f32(rows[t], x.data());
        for (int i = 0; i < dv; ++i) mu[i] += x[(size_t)i] * x[(size_t)i];
      }
    });
    float inv = 1.f / (float)sum_.counts[(size_t)j];
    for (int t = 0; t < dv; ++t) mu[t] *= inv;
  }
  append_coarse_means(means, dv);
  return means;
}

void ClusterIndex::append_coarse_means(std::vector<float>& means, int dv) const {
  const int64_t nf = n_fine(), nc = (int64_t)children_.size();
  means.reserve((size_t)(nf + nc) * dv);
  means.resize((size_t)(nf + nc) * dv, 0.f);
  for (int64_t c = 0; c < nc; ++c) {
    float* mu = means.data() + (size_t)(nf + c) * dv;
    for (int32_t j : children_[(size_t)c])
      axpy_f32((float)sum_.counts[(size_t)j], means.data() + (size_t)j * dv, mu, (size_t)dv);
    float inv = 1.f / (float)sum_.counts[(size_t)(nf + c)];
    for (int t = 0; t < dv; ++t) mu[t] *= inv;
  }
}

// ---- appends ----------------------------------------------------------------

void ClusterIndex::add_impl(int64_t from, int64_t to) {
  const int d = keys_->dim();
  const int64_t nf = n_fine();
  // The build's cosine assignment against the current centroids: for a fixed
  // key, argmax_j cos(k, C_j) = argmax_j k·C_j / |C_j|, so the centroid table
  // is scored in place (each row read once per batch of new keys) and needs
  // only its norms; the batch's centroids stay fixed while it is scored
  // (the batched sequential k-means update of Multipole §3.3).
  auto inv_norm_of = [&](int64_t j) {
    float nrm = std::sqrt(dot_f32(centroid(j), centroid(j), (size_t)d));
    return nrm > 0.f ? 1.f / nrm : 0.f;
  };
  // 1/|C_j| persists between calls (decode folds a few keys at a time) and is
  // kept up to date for the clusters that change; rebuilt when the table did.
  std::vector<float>& inv_norm = inv_norm_;
  if ((int64_t)inv_norm.size() != nf) {
    inv_norm.resize((size_t)nf);
#pragma omp parallel for schedule(static) num_threads(n_threads())
    for (int64_t j = 0; j < nf; ++j) inv_norm[(size_t)j] = inv_norm_of(j);
  }
  const int64_t batch = 64;
  std::vector<float> x((size_t)batch * d), s((size_t)nf * batch);
  std::vector<int32_t> assign((size_t)batch);
  for (int64_t lo = from; lo < to; lo += batch) {
    const int m = (int)std::min(batch, to - lo);
    for (int i = 0; i < m; ++i) keys_->row_f32(lo + i, x.data() + (size_t)i * d);
    score_summary_rows(centroid(0), nf, d, x.data(), m, s.data(), n_threads());
    for (int i = 0; i < m; ++i) {
      int32_t best = 0;
      float best_cos = -INFINITY;
      for (int64_t j = 0; j < nf; ++j) {
        float c = s[(size_t)j * m + i] * inv_norm[(size_t)j];
        if (c > best_cos) best_cos = c, best = (int32_t)j;
      }
      assign[(size_t)i] = best;
    }
    for (int i = 0; i < m; ++i) {
      const int64_t row = lo + i;
      const int32_t j = assign[(size_t)i];
      if (member_added_.empty()) member_added_.resize((size_t)nf);
      member_added_[(size_t)j].push_back((int32_t)row);
      ++sum_.counts[(size_t)j];
      if (levels_ == 2) ++sum_.counts[(size_t)(nf + parent_[(size_t)j])];
      add_to_means(sum_.key_centroids.data(), *keys_, row, j);
      after_add(row, j);
      inv_norm[(size_t)j] = inv_norm_of(j);
    }
  }
}

void ClusterIndex::add_to_means(float* means, const RowStore& store, int64_t row, int32_t fine, bool squares) const {
  const int dv = store.dim();
  std::vector<float> x((size_t)dv);
  store.row_f32(row, x.data());
  if (squares)
    for (float& e : x) e *= e;
  auto update = [&](int64_t r) {  // mu += (x - mu) / N
    float* mu = means + (size_t)r * dv;
    float inv = 1.f / (float)sum_.counts[(size_t)r];
    for (int t = 0; t < dv; ++t) mu[t] += (x[(size_t)t] - mu[t]) * inv;
  };
  update(fine);
  if (levels_ == 2) update(n_fine() + parent_[(size_t)fine]);
}

// ---- search -----------------------------------------------------------------

void ClusterIndex::select_for_head(const float* q, int g, const SearchParams& p, double s, Lookup& lk,
                                   std::vector<int32_t>& kept, std::vector<int32_t>& expanded,
                                   int64_t& scored) const {
  const int nq = lk.nq, d = sum_.dim;
  const int64_t nf = n_fine(), nc = n_coarse();
  const bool budget = p.threshold == 0.0;
  auto fine_x = [&](int32_t j) { return lk.fine_score[(size_t)j * nq + g]; };
  auto coarse_x = [&](int32_t c) { return lk.coarse_score[(size_t)c * nq + g]; };
  auto count = [&](int64_t r) { return sum_.counts[(size_t)r]; };

  std::vector<int32_t> candidates;
  LogSumExp rest;  // ln Σ M_c·exp(s·y_c) over the coarse clusters not expanded
  if (levels_ == 1) {
    candidates.resize((size_t)nf);
    for (int64_t j = 0; j < nf; ++j) candidates[(size_t)j] = (int32_t)j;
  } else {
    std::vector<int32_t> all((size_t)nc);
    for (int64_t c = 0; c < nc; ++c) all[(size_t)c] = (int32_t)c;
    if (budget) {
      int64_t want = (int64_t)std::min(expand_ * (double)p.k, 9.0e18);
      expanded = take_best_until(all, want, coarse_x, [&](int32_t c) { return count(nf + c); });
    } else {
      LogSumExp z;
      for (int64_t c = 0; c < nc; ++c) z.add((float)(std::log((double)count(nf + c)) + s * coarse_x((int32_t)c)));
      double cut = std::log(p.threshold / expand_) + z.value();
      for (int64_t c = 0; c < nc; ++c)
        if (s * coarse_x((int32_t)c) >= cut) expanded.push_back((int32_t)c);
    }
    std::vector<char> is_expanded((size_t)nc, 0);
    for (int32_t c : expanded) {
      is_expanded[(size_t)c] = 1;
      for (int32_t j : children_[(size_t)c]) {
        lk.fine_score[(size_t)j * nq + g] = dot_f32(centroid(j), q, (size_t)d);
        candidates.push_back(j);
      }
    }
    scored += (int64_t)candidates.size();
    if (!budget)
      for (int64_t c = 0; c < nc; ++c)
        if (!is_expanded[(size_t)c]) rest.add((float)(std::log((double)count(nf + c)) + s * coarse_x((int32_t)c)));
  }

  if (budget) {
    kept = take_best_until(candidates, p.k, fine_x, count);
  } else {
    // S_j >= T  <=>  s·x_j - ln Z >= ln T, Z = Σ N_i·exp(s·x_i) (+ unexpanded coarse mass).
    LogSumExp z = rest;
    for (int32_t j : candidates) z.add((float)(std::log((double)count(j)) + s * fine_x(j)));
    double cut = std::log(p.threshold) + z.value();
    for (int32_t j : candidates)
      if (s * fine_x(j) >= cut) kept.push_back(j);
  }
}

void ClusterIndex::search_impl(const float* q, int nq, const SearchParams& p, Candidates& out) const {
  TOPKV_CHECK(std::isfinite(p.threshold) && p.threshold >= 0.0 && p.threshold <= 1.0,
              "{}: threshold={} must be a share in [0, 1] (0 = budget mode: keep clusters until k tokens)",
              name_, p.threshold);
  TOPKV_CHECK(std::isfinite(p.scale) && p.scale >= 0.0, "{}: scale={} must be >= 0 (0 = 1/sqrt(dim))", name_,
              p.scale);
  const int d = sum_.dim;
  const int64_t nf = n_fine(), nc = n_coarse();
  const double s = p.scale > 0.0 ? p.scale : 1.0 / std::sqrt((double)d);
  Lookup lk;
  lk.nq = nq;
  lk.scale = s;
  lk.fine_score.assign((size_t)nf * nq, NAN);
  if (levels_ == 1) {
    score_summary_rows(centroid(0), nf, d, q, nq, lk.fine_score.data(), p.n_threads);
    out.stats.summaries_scored = nf * nq;
  } else {
    lk.coarse_score.resize((size_t)nc * nq);
    score_summary_rows(centroid(nf), nc, d, q, nq, lk.coarse_score.data(), p.n_threads);
    out.stats.summaries_scored = nc * nq;
  }

  std::vector<std::vector<int32_t>> kept((size_t)nq), expanded((size_t)nq);
  std::vector<int64_t> scored((size_t)nq, 0);
  const double R = p.rerank > 0.0 ? p.rerank : rerank_;
  const bool rerank = R > 1.0 && p.threshold == 0.0;
  TOPKV_CHECK(!rerank || levels_ == 1, "{}: rerank applies to the one-level lookup (levels=1), not levels={}", name_,
              levels_);
  SearchParams ps = p;
  if (rerank) ps.k = (int)std::min(R * (double)p.k, 2.0e9);
  const int threads = std::max(1, std::min(p.n_threads, nq));
  ParallelErrors errors;  // src/common/parallel_errors.h
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int g = 0; g < nq; ++g) errors.run([&] {
    select_for_head(q + (size_t)g * d, g, ps, s, lk, kept[(size_t)g], expanded[(size_t)g], scored[(size_t)g]);
  });
  errors.rethrow();
  if (rerank) {
    for (int g = 0; g < nq; ++g) out.stats.summaries_scored += scored[(size_t)g];
    rerank_rows(q, p.k, kept, lk, out);
    return;
  }

  lk.fine_selected.assign((size_t)nf, 0);
  lk.coarse_expanded.assign((size_t)nc, 0);
  for (int g = 0; g < nq; ++g) {
    out.stats.summaries_scored += scored[(size_t)g];
    for (int32_t j : kept[(size_t)g]) lk.fine_selected[(size_t)j] = 1;
    for (int32_t c : expanded[(size_t)g]) lk.coarse_expanded[(size_t)c] = 1;
  }
  for (int64_t j = 0; j < nf; ++j)
    if (lk.fine_selected[(size_t)j])
      for_each_member_run(j, [&](const int32_t* rows, size_t m) { out.ids.insert(out.ids.end(), rows, rows + m); });
  out.summaries = &sum_;
  after_lookup(q, lk, out);
}

// rerank: each head's k best rows among the members of the clusters it
// selected (`kept`, at R·k tokens), scored exactly; the union goes out. A
// cluster with a row kept counts as selected; after_lookup takes the others.
void ClusterIndex::rerank_rows(const float* q, int k, const std::vector<std::vector<int32_t>>& kept, Lookup& lk,
                               Candidates& out) const {
  const int d = sum_.dim, nq = lk.nq;
  struct Scored {
    float score;
    int32_t row, cluster;
  };
  std::vector<Scored> scored;
  const auto better = [](const Scored& a, const Scored& b) {
    return a.score > b.score || (a.score == b.score && a.row < b.row);
  };
  // Work in the candidates only (R·k rows a head), never over every key: this
  // runs on the decode path. Rows kept by several heads repeat in out.ids;
  // KvIndex::search makes them distinct.
  lk.fine_selected.assign((size_t)n_fine(), 0);
  lk.coarse_expanded.clear();
  for (int g = 0; g < nq; ++g) {
    scored.clear();
    const float* qg = q + (size_t)g * d;
    for (int32_t j : kept[(size_t)g])
      for_each_member_run(j, [&](const int32_t* rows, size_t m) {
        for (size_t i = 0; i < m; ++i) scored.push_back({keys_->dot(rows[i], qg), rows[i], j});
      });
    out.stats.keys_scored += (int64_t)scored.size();
    const size_t take = std::min(scored.size(), (size_t)std::max(k, 0));
    std::partial_sort(scored.begin(), scored.begin() + (ptrdiff_t)take, scored.end(), better);
    for (size_t i = 0; i < take; ++i) {
      out.ids.push_back(scored[i].row);
      lk.fine_selected[(size_t)scored[i].cluster] = 1;
    }
  }
  out.summaries = &sum_;
  after_lookup(q, lk, out);
}

// ---- memory, save, load -----------------------------------------------------

MemoryReport ClusterIndex::memory_impl() const {
  size_t lists = member_rows_.owned_bytes() + member_begin_.capacity() * sizeof(int64_t) +
                 member_added_.capacity() * sizeof(std::vector<int32_t>);
  for (auto& m : member_added_) lists += m.capacity() * sizeof(int32_t);
  for (auto& c : children_) lists += c.capacity() * sizeof(int32_t) + sizeof(c);
  MemoryReport m;
  m.structure_bytes = sum_.counts.owned_bytes() + sum_.key_centroids.owned_bytes() +
                      sum_.value_means.owned_bytes() + parent_.owned_bytes() + inv_norm_.capacity() * sizeof(float) +
                      lists;
  m.mapped_bytes = sum_.counts.mapped_bytes() + sum_.key_centroids.mapped_bytes() +
                   sum_.value_means.mapped_bytes() + parent_.mapped_bytes() + member_rows_.mapped_bytes();
  m.note = "centroids (fp32), counts and member lists; keys read in place from the store";
  return m;
}

bool ClusterIndex::export_impl(SummaryTables& out) const {
  const int64_t nf = n_fine();
  const int d = sum_.dim;
  out.kind = SummaryTables::Kind::Centroid;
  out.rows.assign(sum_.key_centroids.begin(), sum_.key_centroids.begin() + nf * d);
  out.counts.resize((size_t)nf);
  out.offsets.resize((size_t)nf + 1);
  out.members.clear();
  out.members.reserve((size_t)indexed_);
  out.offsets[0] = 0;
  for (int64_t j = 0; j < nf; ++j) {
    for_each_member_run(j, [&](const int32_t* rows, size_t m) { out.members.insert(out.members.end(), rows, rows + m); });
    out.offsets[(size_t)j + 1] = (int32_t)out.members.size();
    out.counts[(size_t)j] = out.offsets[(size_t)j + 1] - out.offsets[(size_t)j];
  }
  if (needs_values()) {
    const int dv = sum_.value_dim;
    TOPKV_CHECK(dv == d, "{}: the device search needs values of the key dimension ({}), not {}", name_, d, dv);
    out.value_means.assign(sum_.value_means.begin(), sum_.value_means.begin() + nf * dv);
  }
  return true;
}

// Arrays (index/index_arrays.h), in this order: counts [nf + nc],
// key_centroids [nf + nc][dim], members [indexed] (cluster after cluster, as
// many as each count says), parent [nf, or 0 with one level]; then the
// subclass's (save_extra).
void ClusterIndex::save_impl(BinaryWriter& w, IndexArrayWriter& arrays) const {
  const int64_t nf = n_fine(), nc = n_coarse(), d = sum_.dim;
  w.pod<int64_t>(nf);
  w.pod<int64_t>(nc);
  arrays.put<int64_t>("counts", {nf + nc}, sum_.counts);
  arrays.put<float>("key_centroids", {nf + nc, d}, sum_.key_centroids);
  if (member_added_.empty()) {
    arrays.put<int32_t>("members", {indexed_}, member_rows_);
  } else {  // rows folded in since the build: the lists in cluster order
    std::vector<int32_t> flat;
    flat.reserve((size_t)indexed_);
    for (int64_t j = 0; j < nf; ++j)
      for_each_member_run(j, [&](const int32_t* rows, size_t m) { flat.insert(flat.end(), rows, rows + m); });
    arrays.put_owned<int32_t>("members", {indexed_}, flat);
  }
  arrays.put<int32_t>("parent", {(int64_t)parent_.size()}, parent_);
  save_extra(w, arrays);
}

void ClusterIndex::load_impl(BinaryReader& r, IndexArrayReader& arrays) {
  const std::string& path = r.path();
  auto bad = [&](const std::string& why) { fail("{} index '{}' is malformed: {}", name_, path, why); };
  const int d = keys_->dim();
  inv_norm_.clear();
  member_added_.clear();
  const int64_t nf = r.pod<int64_t>(), nc = r.pod<int64_t>();
  if (nf < 0 || nc < 0 || nf > indexed_ || nc > nf) bad(fmt::format("{} fine / {} coarse clusters", nf, nc));
  if (nf > 0 && (levels_ == 2) != (nc > 0)) bad(fmt::format("{} coarse clusters with levels={}", nc, levels_));
  sum_ = ClusterSummaries{};
  sum_.dim = d;
  sum_.n_fine = nf;
  sum_.counts = arrays.get<int64_t>("counts", {nf + nc});
  sum_.key_centroids = arrays.get<float>("key_centroids", {nf + nc, d});
  member_rows_ = arrays.get<int32_t>("members", {indexed_});
  // Every indexed row in exactly one cluster, as many as its count says. The
  // check reads the lists where they are (in place from a pack).
  std::vector<char> seen((size_t)indexed_, 0);
  member_begin_.assign((size_t)nf + 1, 0);
  for (int64_t j = 0; j < nf; ++j) {
    const int64_t cnt = sum_.counts[(size_t)j], at = member_begin_[(size_t)j];
    if (cnt < 1 || cnt > indexed_ - at) bad(fmt::format("cluster {} claims {} rows", j, cnt));
    member_begin_[(size_t)j + 1] = at + cnt;
  }
  if (member_begin_[(size_t)nf] != indexed_)
    bad(fmt::format("{} listed rows for {} indexed", member_begin_[(size_t)nf], indexed_));
  for (int32_t row : member_rows_) {
    if (row < 0 || row >= indexed_ || seen[(size_t)row]) bad(fmt::format("row {} listed twice or out of range", row));
    seen[(size_t)row] = 1;
  }
  parent_ = arrays.get<int32_t>("parent", {nc > 0 ? nf : 0});
  children_.assign((size_t)nc, {});
  std::vector<int64_t> below((size_t)nc, 0);
  for (int64_t j = 0; j < (int64_t)parent_.size(); ++j) {
    int32_t c = parent_[(size_t)j];
    if (c < 0 || c >= nc) bad(fmt::format("fine cluster {} has coarse parent {}", j, c));
    children_[(size_t)c].push_back((int32_t)j);
    below[(size_t)c] += sum_.counts[(size_t)j];
  }
  for (int64_t c = 0; c < nc; ++c)
    if (below[(size_t)c] != sum_.counts[(size_t)(nf + c)] || children_[(size_t)c].empty())
      bad(fmt::format("coarse cluster {} count disagrees with its fine clusters", c));
  load_extra(r, arrays);
}

// ---- the `centroid` backend -------------------------------------------------

namespace {
class CentroidIndex final : public ClusterIndex {
 public:
  CentroidIndex(const Params& p, const BuildOptions& opt) : ClusterIndex("centroid", p, opt, 20) {}
};
}  // namespace

std::unique_ptr<KvIndex> make_centroid_index(const Params& params, const BuildOptions& opt) {
  return std::make_unique<CentroidIndex>(params, opt);
}

}  // namespace topkv
