#include "index/kv_index.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "index/summary_select.h"
#include "index/topk_collector.h"
#include "src/common/error.h"

namespace topkv {

namespace {
constexpr char kIndexMagic[] = "TKVINDEX";
// 1: arrays inline. 2: a flag after the header says whether the arrays are
// inline (0) or apart (1: in a context pack's tensors, index/index_arrays.h).
constexpr uint32_t kIndexVersion = 2;
}  // namespace

int KvIndex::n_threads() const {
  if (opt_.n_threads > 0) return opt_.n_threads;
  unsigned h = std::thread::hardware_concurrency();
  return h ? (int)h : 1;
}

std::unique_ptr<KvIndex> KvIndex::create(const std::string& spec, const BuildOptions& opt) {
  return create(parse_spec(spec), opt);
}

void KvIndex::build(std::shared_ptr<const RowStore> keys, std::shared_ptr<const RowStore> values) {
  TOPKV_CHECK(keys, "index build needs a key store");
  if (needs_values()) {
    TOPKV_CHECK(values, "backend '{}' summarises values and needs the value store at build", name_);
    TOPKV_CHECK(values->size() >= keys->size(), "value store has {} rows but the key store has {}",
                values->size(), keys->size());
  }
  std::unique_lock lk(mu_);
  keys_ = std::move(keys);
  values_ = std::move(values);
  int64_t n = keys_->size();
  build_impl(n);
  indexed_ = n;
}

std::string KvIndex::split_search_params(const std::string& spec, SearchParams& p) {
  const Spec s = parse_spec(spec);
  if (!create(s)->reranks() || !s.params.has("rerank")) return canonical_spec(spec);
  p.rerank = s.params.get_double("rerank", 1.0);
  Params rest;
  for (const auto& [key, value] : s.params.map())
    if (key != "rerank") rest.set(key, value);
  return canonical_spec(rest.str().empty() ? s.name : s.name + ":" + rest.str());
}

void KvIndex::begin_build(std::shared_ptr<const RowStore> keys, std::shared_ptr<const RowStore> values,
                          int64_t n_total) {
  TOPKV_CHECK(keys, "index build needs a key store");
  TOPKV_CHECK(!needs_values() || values, "backend '{}' summarises values and needs the value store at build", name_);
  TOPKV_CHECK(n_total >= 0 && build_total_ < 0, "internal: streaming build of {} rows (one already running: {})",
              n_total, build_total_ >= 0);
  std::unique_lock lk(mu_);
  keys_ = std::move(keys);
  values_ = std::move(values);
  indexed_ = 0;
  build_total_ = n_total;
  begin_build_impl(n_total);
}

void KvIndex::rows_ready(int64_t n) {
  TOPKV_CHECK(build_total_ >= 0, "internal: rows_ready without begin_build");
  rows_ready_impl(std::min(n, build_total_));
}

void KvIndex::end_build() {
  TOPKV_CHECK(build_total_ >= 0, "internal: end_build without begin_build");
  const int64_t n = build_total_;
  TOPKV_CHECK(keys_->size() >= n && (!needs_values() || values_->size() >= n),
              "internal: streaming build of {} rows ends with {} in the store", n, keys_->size());
  std::unique_lock lk(mu_);
  build_total_ = -1;
  end_build_impl(n);
  indexed_ = n;
}

int64_t KvIndex::add_new_rows(int64_t upto) {
  TOPKV_CHECK(keys_, "add_new_rows on an index that was never built");
  std::unique_lock lk(mu_);
  int64_t n = upto >= 0 ? std::min(keys_->size(), upto) : keys_->size();
  if (needs_values())
    TOPKV_CHECK(values_->size() >= n, "value store has {} rows but the key store has {}: append both",
                values_->size(), n);
  if (n <= indexed_) return 0;
  if (indexed_ == 0)
    build_impl(n);
  else
    add_impl(indexed_, n);
  int64_t added = n - indexed_;
  indexed_ = n;
  return added;
}

SearchResult KvIndex::search(const float* queries, int nq, const SearchParams& p) const {
  TOPKV_CHECK(keys_, "search on an index that was never built: build() or load() it first");
  std::shared_lock lk(mu_);
  const int64_t n = keys_->size();
  const int d = keys_->dim();
  TOPKV_CHECK(n > 0, "search on an empty index ('{}' has no keys): append keys before searching", name_);
  TOPKV_CHECK(nq >= 1, "search needs at least one query vector (got {})", nq);
  TOPKV_CHECK(p.k >= 1, "k must be at least 1 (got {})", p.k);
  for (int64_t i = 0; i < (int64_t)nq * d; ++i)
    TOPKV_CHECK(std::isfinite(queries[i]), "query {} has a non-finite value ({}) at dimension {}",
                i / d, queries[i], i % d);

  // GQA aggregate: one search with the mean query (scores stay exact per head).
  std::vector<float> mean;
  const float* sq = queries;
  int snq = nq;
  if (p.gqa == GqaMode::Mean && nq > 1) {
    mean.assign((size_t)d, 0.f);
    for (int g = 0; g < nq; ++g)
      for (int j = 0; j < d; ++j) mean[(size_t)j] += queries[(size_t)g * d + j] / (float)nq;
    sq = mean.data();
    snq = 1;
  }

  Candidates c;
  if (indexed_ > 0) search_impl(sq, snq, p, c);

  // Rows appended since the last add_new_rows(): exact scan, best k per query join.
  if (n > indexed_) {
    int64_t tail = n - indexed_;
    std::vector<float> s((size_t)tail * snq);
    keys_->for_each_span(indexed_, n, [&](int64_t first, int64_t cnt, const void* rows) {
      dot_rows_multi(keys_->dtype(), rows, (size_t)cnt, (size_t)d, sq, (size_t)snq,
                     s.data() + (size_t)(first - indexed_) * snq);
    });
    for (int g = 0; g < snq; ++g) {
      TopKCollector top(std::min(p.k, tail));
      for (int64_t i = 0; i < tail; ++i) top.push(s[(size_t)i * snq + g], indexed_ + i);
      for (auto& e : top.take_sorted()) c.ids.push_back(e.second);
    }
    c.stats.tail_scanned = tail * snq;
  }

  std::sort(c.ids.begin(), c.ids.end());
  c.ids.erase(std::unique(c.ids.begin(), c.ids.end()), c.ids.end());

  // Exact scores of every candidate for every query head.
  const size_t m = c.ids.size();
  std::vector<float> sc((size_t)nq * m);
  for (size_t j = 0; j < m; ++j)
    for (int g = 0; g < nq; ++g) sc[(size_t)g * m + j] = keys_->dot(c.ids[j], queries + (size_t)g * d);

  SearchResult r;
  r.nq = nq;
  r.stats = c.stats;
  r.far_clusters = std::move(c.far_clusters);
  r.far_scores = std::move(c.far_scores);
  r.summaries = c.summaries;
  if (snq != nq && !r.far_clusters.empty()) {
    // Mean mode searched once; far-cluster scores are per query head like key scores.
    const size_t nf = r.far_clusters.size();
    r.far_scores.assign((size_t)nq * nf, 0.f);
    for (size_t t = 0; t < nf; ++t) {
      const float* cen = r.summaries->key_centroids.data() + (size_t)r.far_clusters[t] * d;
      for (int g = 0; g < nq; ++g) r.far_scores[(size_t)g * nf + t] = dot_f32(cen, queries + (size_t)g * d, (size_t)d);
    }
  }

  if (is_topk() && (int64_t)m > p.k) {
    // Each query head keeps its k best; the result is the union of those.
    std::vector<char> keep(m, 0);
    std::vector<std::pair<float, int64_t>> v(m);
    for (int g = 0; g < nq; ++g) {
      for (size_t j = 0; j < m; ++j) v[j] = {sc[(size_t)g * m + j], (int64_t)j};
      std::nth_element(v.begin(), v.begin() + (p.k - 1), v.end(),
                       [](auto& a, auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
      for (int64_t t = 0; t < p.k; ++t) keep[(size_t)v[(size_t)t].second] = 1;
    }
    size_t kept = 0;
    for (size_t j = 0; j < m; ++j) kept += keep[j];
    r.ids.reserve(kept);
    r.scores.resize((size_t)nq * kept);
    size_t o = 0;
    for (size_t j = 0; j < m; ++j) {
      if (!keep[j]) continue;
      r.ids.push_back(c.ids[j]);
      for (int g = 0; g < nq; ++g) r.scores[(size_t)g * kept + o] = sc[(size_t)g * m + j];
      ++o;
    }
  } else {
    r.ids = std::move(c.ids);
    r.scores = std::move(sc);
  }
  return r;
}

MemoryReport KvIndex::memory() const {
  std::shared_lock lk(mu_);
  MemoryReport m = memory_impl();
  if (keys_) m.shared_store_bytes = (size_t)keys_->size() * keys_->row_bytes();
  return m;
}

bool KvIndex::export_summaries(SummaryTables& out) const {
  std::shared_lock lk(mu_);
  out = SummaryTables{};
  out.dim = dim();
  out.covered = indexed_;
  return keys_ && export_impl(out);
}

double far_spread_logit(const float* q, const float* var, int dim, double a, double clip, double s) {
  double acc = 0;
  for (int i = 0; i < dim; ++i) acc += (double)q[i] * q[i] * var[i];
  return std::min(a * 0.5 * s * s * acc, std::log(clip));
}

namespace {

// Runs of f page-bound groups merged into one: the rows' element-wise max /
// min, the counts' sums (SummaryTables::coarse_level, coarsened).
SummaryTables merged_pages(const SummaryTables& t, int64_t f) {
  SummaryTables c;
  c.kind = t.kind, c.dim = t.dim, c.covered = t.covered, c.page = t.page * f;
  const int64_t n = t.size(), nc = (n + f - 1) / f;
  c.rows.resize((size_t)nc * t.row_len());
  reduce_page_bounds([&](int64_t j) { return t.rows.data() + (size_t)j * t.row_len(); }, n, t.dim, f, c.rows.data(), 1);
  c.counts.assign((size_t)nc, 0);
  for (int64_t j = 0; j < n; ++j) c.counts[(size_t)(j / f)] += t.counts[(size_t)j];
  return c;
}

}  // namespace

SummaryTables SummaryTables::coarse_level() const {
  TOPKV_CHECK(kind == Kind::PageBounds && coarse_ratio >= 1, "internal: a coarse level needs page bounds and a ratio");
  return merged_pages(*this, coarse_ratio);
}

SummaryTables SummaryTables::coarsened(int64_t f) const {
  TOPKV_CHECK(kind == Kind::PageBounds && f >= 1 && value_means.empty() && key_var.empty(),
              "internal: only page bounds without a far field coarsen (factor {})", f);
  TOPKV_CHECK(longer_pages_tile(coarse_ratio, f),
              "internal: pages {} times longer do not tile coarse pages of {} pages", f, coarse_ratio);
  if (f == 1) return *this;
  SummaryTables c = merged_pages(*this, f);
  c.coarse_ratio = coarse_ratio / f, c.expand = expand;
  return c;
}

TableCodes SummaryTables::encoded_rows(DType t) const {
  if (kind == Kind::PageBounds)
    return encode_table(t, rows, dim, {TableRounding::Up, TableRounding::Down}, "a page bound");
  return encode_table(t, rows, dim, {TableRounding::Nearest}, "a centroid element");
}

int32_t SummaryTables::max_count() const {
  int32_t m = 0;
  for (int32_t c : counts) m = std::max(m, c);
  return m;
}

void KvIndex::save_to(BinaryWriter& w, IndexArrayWriter* arrays) const {
  TOPKV_CHECK(keys_, "cannot save an index that was never built");
  std::shared_lock lk(mu_);
  w.str(name_);
  w.str(params_.str());
  w.pod<int32_t>(keys_->dim());
  w.pod<uint8_t>((uint8_t)keys_->dtype());
  w.pod<int64_t>(indexed_);
  w.pod<uint64_t>(keys_->fingerprint(indexed_));
  w.pod<uint8_t>(arrays ? 1 : 0);
  std::unique_ptr<IndexArrayWriter> inline_arrays;
  if (!arrays) inline_arrays = IndexArrayWriter::inline_into(w), arrays = inline_arrays.get();
  save_impl(w, *arrays);
  w.commit();
}

void KvIndex::save(const std::string& path) const {
  TOPKV_CHECK(keys_, "cannot save an index that was never built");
  BinaryWriter w(path, kIndexMagic, kIndexVersion);
  save_to(w, nullptr);
}

std::vector<uint8_t> KvIndex::save_bytes(IndexArrayWriter* arrays) const {
  TOPKV_CHECK(keys_, "cannot save an index that was never built");
  std::vector<uint8_t> out;
  BinaryWriter w(out, kIndexMagic, kIndexVersion);
  save_to(w, arrays);
  return out;
}

std::unique_ptr<KvIndex> KvIndex::load(const std::string& path, std::shared_ptr<const RowStore> keys,
                                       std::shared_ptr<const RowStore> values, const BuildOptions& opt) {
  TOPKV_CHECK(keys, "loading an index needs the key store it was built on");
  BinaryReader r(path, kIndexMagic, kIndexVersion, "index");
  return load_from(r, std::move(keys), std::move(values), opt, nullptr);
}

std::unique_ptr<KvIndex> KvIndex::load_bytes(const std::string& name, const uint8_t* data, size_t n,
                                             std::shared_ptr<const RowStore> keys,
                                             std::shared_ptr<const RowStore> values, const BuildOptions& opt,
                                             IndexArrayReader* arrays) {
  TOPKV_CHECK(keys, "loading an index needs the key store it was built on");
  BinaryReader r(name, data, n, kIndexMagic, kIndexVersion, "index");
  return load_from(r, std::move(keys), std::move(values), opt, arrays);
}

std::unique_ptr<KvIndex> KvIndex::load_from(BinaryReader& r, std::shared_ptr<const RowStore> keys,
                                            std::shared_ptr<const RowStore> values, const BuildOptions& opt,
                                            IndexArrayReader* arrays) {
  const std::string& path = r.path();
  std::string name = r.str();
  std::string params = r.str();
  auto idx = create(Spec{name, Params(params)}, opt);
  int32_t dim = r.pod<int32_t>();
  auto dtype = (DType)r.pod<uint8_t>();
  int64_t n = r.pod<int64_t>();
  uint64_t fp = r.pod<uint64_t>();
  TOPKV_CHECK(dim == keys->dim(), "index '{}' was built on keys of dimension {}, the store has {}", path, dim,
              keys->dim());
  TOPKV_CHECK(dtype == keys->dtype(), "index '{}' was built on {} keys, the store holds {}", path,
              dtype_name(dtype), dtype_name(keys->dtype()));
  TOPKV_CHECK(n >= 0 && n <= keys->size(), "index '{}' covers {} rows but the store has only {}", path, n,
              keys->size());
  TOPKV_CHECK(fp == keys->fingerprint(n),
              "index '{}' was built on other keys than this store holds (fingerprint mismatch)", path);
  if (idx->needs_values()) TOPKV_CHECK(values && values->size() >= n, "index '{}' needs the value store", path);
  const bool apart = r.version() >= 2 && r.pod<uint8_t>() != 0;
  // Arrays kept apart are only found where they were saved (a context pack);
  // arrays inline are read from these bytes whatever reader is offered
  // (context packs of format 1 hold such blobs).
  TOPKV_CHECK(!apart || arrays, "index '{}' keeps its arrays apart from these bytes (in a context pack's tensors): "
              "load it from that pack", path);
  std::unique_ptr<IndexArrayReader> inline_arrays;
  if (!apart) inline_arrays = IndexArrayReader::inline_from(r), arrays = inline_arrays.get();
  std::unique_lock lk(idx->mu_);
  idx->keys_ = std::move(keys);
  idx->values_ = std::move(values);
  idx->indexed_ = n;
  idx->load_impl(r, *arrays);
  r.expect_end();
  return idx;
}

}  // namespace topkv
