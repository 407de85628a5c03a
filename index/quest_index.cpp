// quest: query-aware page selection (Tang et al., "Quest", ICML 2024,
// "QUEST: Query-Aware Sparsity for Efficient Long-Context LLM Inference",
// Algorithm 1).
//
// Keys are grouped into pages of P consecutive rows. Each page keeps the
// element-wise max M and min m of its keys (fp32). For a query q the page's
// criticality is the upper bound of q·k over its keys,
//   U = Σ_i max(q_i·m_i, q_i·M_i) = q⁺·M + q⁻·m,   q⁺ = max(q, 0), q⁻ = min(q, 0),
// so a page is stored as one row [M | m] of 2·dim floats and scored as one dot
// product with [q⁺ | q⁻]. Pages are taken by bound, largest first, until the
// token budget k is covered, and every row of a taken page is returned (the
// base class then scores them exactly). With GQA in union mode each query
// head picks its own pages.
//
// coarse_ratio=C (two levels; 0, the default, is the paper's one level):
// every C consecutive pages are bounded again by a coarse page, the
// element-wise max / min of theirs, whose bound is at least each of its
// pages' (the upper bound of an upper bound). Each query head takes coarse
// pages by bound until expand·k tokens (expand=E, default 8); only the pages
// inside the coarse pages some head took are scored, and each head takes its
// k from those. It reads 1/C of the bounds plus the expanded pages, which is
// what the device search needs past ~256K (docs/AS_BUILT.md); the host keeps
// the coarse bounds beside the pages (built, folded and loaded with them)
// and searches the same way.
//
// Keys are read in place from the store; the index owns only the bounds
// (8·dim bytes per page, 1/P of an fp32 key copy), and none of those it
// loaded from a context pack (index/host_array.h).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <utility>

#include "index/backends.h"
#include "index/page_bounds.h"
#include "index/summary_select.h"
#include "src/common/error.h"
#include "src/common/task_group.h"

namespace topkv {

namespace {

class QuestIndex final : public KvIndex {
 public:
  std::optional<SummaryTables::Kind> summary_kind() const override { return SummaryTables::Kind::PageBounds; }
  QuestIndex(const Params& p, const BuildOptions& opt) : KvIndex("quest", p, opt) {
    page_ = p.get_int("page", 16);
    TOPKV_CHECK(page_ >= 1 && page_ <= 65536, "quest: page={} is out of range (1..65536 keys per page)", page_);
    coarse_ratio_ = p.get_int("coarse_ratio", 0);
    expand_ = p.get_double("expand", 8.0);
    TOPKV_CHECK(coarse_ratio_ == 0 || (coarse_ratio_ >= 2 && coarse_ratio_ <= 4096),
                "quest: coarse_ratio={} is out of range (0 for one level, or 2..4096 pages per coarse page)",
                coarse_ratio_);
    TOPKV_CHECK(std::isfinite(expand_) && expand_ >= 1.0 && expand_ <= 1e6,
                "quest: expand={} is out of range (1..1e6: coarse pages cover expand*k tokens a query head)", expand_);
  }
  ~QuestIndex() override {
    if (stream_) stream_->tasks.wait();  // its tasks write bounds this index frees
  }
  bool is_topk() const override { return false; }
  bool uses_page_bounds() const override { return true; }

 protected:
  int64_t n_pages() const { return (indexed_ + page_ - 1) / page_; }
  // Rows of page p among the first n indexed rows.
  int64_t page_rows(int64_t p, int64_t n) const { return std::min(page_, n - p * page_); }

  void build_impl(int64_t n_rows) override {
    base_ = {};
    grown_.clear();
    coarse_.clear();
    extend(0, n_rows, build_engine());
  }
  void add_impl(int64_t from, int64_t to) override { extend(from, to); }

  size_t row_len() const { return 2 * (size_t)keys_->dim(); }
  int64_t base_pages() const { return (int64_t)(base_.size() / row_len()); }
  // Page p's bound row: in base_ (loaded from a pack, used in place) or grown_.
  float* bounds(int64_t p) { return const_cast<float*>(std::as_const(*this).bounds(p)); }
  const float* bounds(int64_t p) const {
    const int64_t b = base_pages();
    return p < b ? base_.data() + (size_t)p * row_len() : grown_.data() + (size_t)(p - b) * row_len();
  }

  // Folds rows [from, to) into the bounds: the page a fold left partial
  // grows, then new pages start (Algorithm 1, "Criticality estimation" stage
  // 1), bounded by `engine` (a build: BuildOptions::bounds) or on the host
  // cores (a fold of a few rows, or no engine: the twin, index/page_bounds.h).
  void extend(int64_t from, int64_t to, const PageBoundsEngine* engine = nullptr) {
    const int64_t first_page = from / page_, end_page = (to + page_ - 1) / page_;
    const int64_t old_pages = held_pages();
    hold_pages(end_page);
    int64_t p = first_page;
    if (p < old_pages && p < end_page) {  // rows [from, ...) join page p, which holds rows before `from`
      std::vector<float> k((size_t)keys_->dim());
      page_bounds_fold(*keys_, from, std::min(to, (p + 1) * page_), bounds(p), k.data());
      ++p;
    }
    if (p < end_page) {
      if (engine) engine->bound_pages(*keys_, page_, p, end_page, to, bounds(p));
      else page_bounds_reference(*keys_, page_, p, end_page, to, bounds(p), n_threads());
    }
    update_coarse(first_page);
  }
  int64_t held_pages() const { return base_pages() + (int64_t)(grown_.size() / row_len()); }
  // Room for pages [0, end_page) (those past the loaded ones in grown_).
  void hold_pages(int64_t end_page) {
    // Appends come a few rows at a time: grow by 1/8 rather than doubling, so
    // a long context's bounds do not hold up to twice the memory they need.
    const size_t need = (size_t)std::max<int64_t>(0, end_page - base_pages()) * row_len();
    if (need > grown_.capacity()) grown_.reserve(grown_.empty() ? need : need + need / 8);
    if (need > grown_.size()) grown_.resize(need);
  }
  // The engine a build bounds its new pages with: the one handed in, unless
  // its pages are longer than it takes; none: the host cores.
  const PageBoundsEngine* build_engine() const {
    return opt_.bounds && page_ <= opt_.bounds->max_page() ? opt_.bounds.get() : nullptr;
  }

  // Streaming build (KvIndex::begin_build, the build overlapped with a
  // chunked prefill): each run of kStreamRows rows' pages is bounded on TBB's
  // threads as soon as its rows are final, by the build's engine or the host
  // twin; end_build bounds the rest and reduces the coarse level. The pages
  // are the ones build_impl makes, bit for bit (the same twin or engine, page
  // by page). Only with two runs or more and two cores, as ClusterIndex.
  static constexpr int64_t kStreamRows = 16384;
  struct Streaming {
    int64_t total = 0, next_run = 0;
    std::vector<std::string> errors;  // one per run
    TaskGroup tasks;
  };
  int64_t run_pages() const { return std::max<int64_t>(1, kStreamRows / page_); }
  void begin_build_impl(int64_t n_total) override {
    if (stream_) stream_->tasks.wait();
    stream_.reset();
    base_ = {};
    grown_.clear();
    coarse_.clear();
    const int64_t pages = (n_total + page_ - 1) / page_, runs = (pages + run_pages() - 1) / run_pages();
    if (runs < 2 || TaskGroup::concurrency() < 2) return;
    hold_pages(pages);  // the tasks write their pages in place: grown_ is not resized while they run
    stream_ = std::make_unique<Streaming>();
    stream_->total = n_total;
    stream_->errors.resize((size_t)runs);
  }
  void rows_ready_impl(int64_t n) override {
    if (!stream_) return;
    Streaming& st = *stream_;
    const int64_t pages = (st.total + page_ - 1) / page_, run = run_pages();
    const PageBoundsEngine* engine = build_engine() ? build_engine() : &host_bounds_;
    for (;;) {
      const int64_t a = st.next_run * run, b = std::min(pages, a + run);
      const int64_t rows_end = std::min(st.total, b * page_);
      if (a >= pages || rows_end > n) break;  // the run's last row is not final yet
      const int64_t r = st.next_run++;
      st.tasks.run([this, &st, engine, a, b, rows_end, r] {
        try {
          engine->bound_pages(*keys_, page_, a, b, rows_end, bounds(a));
        } catch (const std::exception& ex) {
          st.errors[(size_t)r] = ex.what();
        }
      });
    }
  }
  void end_build_impl(int64_t n_total) override {
    if (!stream_) return build_impl(n_total);
    rows_ready_impl(n_total);
    std::unique_ptr<Streaming> st = std::move(stream_);
    st->tasks.wait();
    for (const std::string& e : st->errors) TOPKV_CHECK(e.empty(), "{}", e);
    update_coarse(0);
  }

  // Two levels: the coarse pages from the one holding page `from_page` to
  // the last, reduced again from their pages (a fold touches the last few).
  void update_coarse(int64_t from_page) {
    if (coarse_ratio_ == 0) return;
    const int64_t pages = held_pages();  // (n_pages() follows indexed_, which a fold sets after it)
    const int64_t nc = (pages + coarse_ratio_ - 1) / coarse_ratio_;
    coarse_.resize((size_t)nc * row_len());  // a new last coarse page is written below
    reduce_page_bounds([&](int64_t i) { return std::as_const(*this).bounds(i); }, pages, keys_->dim(), coarse_ratio_,
                       coarse_.data(), n_threads(), from_page / coarse_ratio_, nc);
  }

  void search_impl(const float* q, int nq, const SearchParams& p, Candidates& out) const override {
    const int d = keys_->dim();
    const int64_t n = indexed_, pages = n_pages(), base = std::min(base_pages(), pages);
    // [q⁺ | q⁻] per head, so that [M | m] · [q⁺ | q⁻] is the page's upper bound.
    std::vector<float> qx((size_t)nq * 2 * d);
    for (int g = 0; g < nq; ++g)
      for (int j = 0; j < d; ++j) {
        float x = q[(size_t)g * d + j];
        qx[(size_t)g * 2 * d + j] = std::max(x, 0.f);
        qx[(size_t)g * 2 * d + d + j] = std::min(x, 0.f);
      }
    // The pages taken from, ascending (all, or those of the expanded coarse
    // pages), and bound[i][g]: the i-th one's bound for query head g.
    std::vector<int32_t> scored;
    std::vector<float> bound;
    if (coarse_ratio_ > 0) {
      scored = expanded_pages(qx.data(), nq, p, out.stats);
      std::vector<float> rows(scored.size() * row_len());
      for (size_t i = 0; i < scored.size(); ++i) std::copy_n(bounds(scored[i]), row_len(), &rows[i * row_len()]);
      bound.resize(scored.size() * nq);
      score_summary_rows(rows.data(), (int64_t)scored.size(), 2 * d, qx.data(), nq, bound.data(), p.n_threads);
      out.stats.summaries_scored += (int64_t)scored.size() * nq;
    } else {
      bound.resize((size_t)pages * nq);
      score_summary_rows(base_.data(), base, 2 * d, qx.data(), nq, bound.data(), p.n_threads);
      score_summary_rows(grown_.data(), pages - base, 2 * d, qx.data(), nq, bound.data() + (size_t)base * nq,
                         p.n_threads);
      out.stats.summaries_scored = pages * nq;
      scored.resize((size_t)pages);
      std::iota(scored.begin(), scored.end(), 0);
    }
    std::vector<int32_t> at(scored.size());  // positions in scored (ascending with the pages: the same ties)
    std::iota(at.begin(), at.end(), 0);
    std::vector<char> taken((size_t)pages, 0);
    for (int g = 0; g < nq; ++g) {
      auto chosen = take_best_until(
          at, p.k, [&](int32_t i) { return bound[(size_t)i * nq + g]; },
          [&](int32_t i) { return page_rows(scored[(size_t)i], n); });
      for (int32_t i : chosen) taken[(size_t)scored[(size_t)i]] = 1;
    }
    for (int64_t i = 0; i < pages; ++i) {
      if (!taken[(size_t)i]) continue;
      for (int64_t r = i * page_, e = r + page_rows(i, n); r < e; ++r) out.ids.push_back(r);
    }
  }

  double bytes_per_key_estimate(int dim) const override {
    return 2.0 * dim * sizeof(float) / (double)page_ * (coarse_ratio_ > 0 ? 1.0 + 1.0 / (double)coarse_ratio_ : 1.0);
  }
  double summary_groups_per_key() const override { return 1.0 / (double)page_; }
  // [max | min] and a count per page (page_ * page_factor keys) and per
  // coarse page (page_ * coarse_ratio_ keys, whatever the factor).
  double summary_bytes_per_key(int dim, size_t elem, int page_factor) const override {
    const double per_group = 2.0 * dim * (double)elem + 4.0;
    const double coarse = coarse_ratio_ > 0 ? per_group / (double)(page_ * coarse_ratio_) : 0.0;
    return per_group / (double)(page_ * page_factor) + coarse;
  }
  // Pages up to 4 times longer on the device, as long as two levels keep at
  // least 2 pages a coarse page: each taken page then brings page_ * f tokens
  // of a query head's k, so selection coarsens with f ("Quest: Query-Aware
  // Sparsity for Efficient Long-Context LLM Inference" §3.4: the bounds are
  // 1/S of the keys' bytes for pages of S; §4.3.1 names larger pages to save
  // that memory). Past 4 (page 64 at the default, 4 pages a head at k = 256)
  // the budget's remaining choice is to refuse.
  int summary_page_factor_max() const override {
    int f = 1;
    for (int g = 2; g <= 4; g *= 2)
      if (SummaryTables::longer_pages_tile(coarse_ratio_, g)) f = g;
    return f;
  }
  MemoryReport memory_impl() const override {
    MemoryReport m{base_.owned_bytes() + (grown_.capacity() + coarse_.capacity()) * sizeof(float), 0, 0,
                   "per page of keys: element-wise min and max (fp32), and per coarse page with two levels; keys "
                   "read in place from the store"};
    m.mapped_bytes = base_.mapped_bytes();
    return m;
  }

  // Two levels: each query head's coarse pages until expand·k tokens, and
  // the pages of those any head took, ascending.
  std::vector<int32_t> expanded_pages(const float* qx, int nq, const SearchParams& p, SearchStats& stats) const {
    const int d = keys_->dim();
    const int64_t n = indexed_, pages = n_pages(), nc = (pages + coarse_ratio_ - 1) / coarse_ratio_;
    TOPKV_CHECK(coarse_.size() >= (size_t)nc * row_len(), "internal: quest holds {} coarse pages of {}",
                coarse_.size() / row_len(), nc);
    std::vector<float> cb((size_t)nc * nq);
    score_summary_rows(coarse_.data(), nc, 2 * d, qx, nq, cb.data(), p.n_threads);
    stats.summaries_scored = nc * nq;
    std::vector<int32_t> all((size_t)nc);
    std::iota(all.begin(), all.end(), 0);
    const int64_t budget = expanded_budget(expand_, p.k);
    std::vector<char> expanded((size_t)nc, 0);
    for (int g = 0; g < nq; ++g)
      for (int32_t c : take_best_until(
               all, budget, [&](int32_t c) { return cb[(size_t)c * nq + g]; },
               [&](int32_t c) { return std::min(n, (c + 1) * coarse_ratio_ * page_) - c * coarse_ratio_ * page_; }))
        expanded[(size_t)c] = 1;
    std::vector<int32_t> out;
    for (int64_t c = 0; c < nc; ++c)
      for (int64_t i = c * coarse_ratio_; expanded[(size_t)c] && i < std::min(pages, (c + 1) * coarse_ratio_); ++i)
        out.push_back((int32_t)i);
    return out;
  }

  bool export_impl(SummaryTables& out) const override {
    out.kind = SummaryTables::Kind::PageBounds;
    out.page = page_;
    out.coarse_ratio = coarse_ratio_;
    out.expand = coarse_ratio_ > 0 ? expand_ : 0.0;
    const int64_t pages = n_pages(), base = std::min(base_pages(), pages);
    const size_t w = row_len();
    out.rows.assign(base_.begin(), base_.begin() + (size_t)base * w);
    out.rows.insert(out.rows.end(), grown_.begin(), grown_.begin() + (size_t)(pages - base) * w);
    out.counts.resize((size_t)pages);
    for (int64_t i = 0; i < pages; ++i) out.counts[(size_t)i] = (int32_t)page_rows(i, indexed_);
    return true;
  }

  void save_impl(BinaryWriter& w, IndexArrayWriter& arrays) const override {
    w.pod<int64_t>(page_);
    const int64_t pages = n_pages(), base = std::min(base_pages(), pages);
    const size_t row_bytes = row_len() * sizeof(float);
    arrays.put<float>("bounds", {pages, (int64_t)row_len()},
                      {ByteSpan{base_.data(), (size_t)base * row_bytes},
                       ByteSpan{grown_.data(), (size_t)(pages - base) * row_bytes}});
  }

  void load_impl(BinaryReader& r, IndexArrayReader& arrays) override {
    int64_t page = r.pod<int64_t>();
    TOPKV_CHECK(page == page_, "quest index '{}' is malformed: page size {} in the data, {} in its parameters",
                r.path(), page, page_);
    base_ = arrays.get<float>("bounds", {n_pages(), (int64_t)row_len()});
    grown_.clear();
    coarse_.clear();
    update_coarse(0);  // not saved: reduced from the pages
  }

 private:
  int64_t page_ = 16, coarse_ratio_ = 0;
  double expand_ = 8.0;
  // [page][max(dim) | min(dim)]: the pages a pack held when loaded (base_,
  // in place; its last page may still grow, copy-on-write), then those
  // started since (grown_). A built index keeps all of them in grown_.
  HostArray<float> base_;
  std::vector<float> grown_;
  std::vector<float> coarse_;  // two levels: [coarse page][max | min] of its pages
  std::unique_ptr<Streaming> stream_;  // a streaming build in progress
  HostPageBounds host_bounds_;         // the streaming build's engine when none is handed in
};

}  // namespace

std::unique_ptr<KvIndex> make_quest_index(const Params& params, const BuildOptions& opt) {
  return std::make_unique<QuestIndex>(params, opt);
}

}  // namespace topkv
