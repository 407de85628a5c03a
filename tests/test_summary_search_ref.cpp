// SummaryTables (KvIndex::export_summaries) and the CPU twin of the device
// search (gpu/summary_search_ref.h): the tables describe the index exactly,
// and the twin's budget cut selects the rows the index's own budget-mode
// search returns (GQA union; level-1 lookups, random scores: no ties), with
// rerank (summary_rerank_reference) as without.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>
#include <random>
#include <map>
#include <set>

#include "offload/partial_attention.h"
#include "gpu/summary_search_ref.h"
#include "index/kv_index.h"
#include "offload/offloaded_layer.h"
#include "tests/clustered_keys.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

// An index of `spec` built on one thread over n of `data`'s keys, with as
// many of its keys again as values.
struct ClusteredIndex {
  std::shared_ptr<RowStore> keys, values;
  std::unique_ptr<KvIndex> index;
};
ClusteredIndex build_clustered(const std::string& spec, topkv::testing::Clustered& data, int64_t n) {
  ClusteredIndex b;
  b.keys = std::make_shared<RowStore>(data.d, DType::F32), b.values = std::make_shared<RowStore>(data.d, DType::F32);
  const auto kf = data.keys(n), vf = data.keys(n);
  b.keys->append_f32(kf.data(), n);
  b.values->append_f32(vf.data(), n);
  BuildOptions bo;
  bo.n_threads = 1;
  b.index = KvIndex::create(spec, bo);
  b.index->build(b.keys, b.values);
  return b;
}

// The twin's selection for the index's own search: the cut at k, or with
// rerank (the default of one-level centroid/multipole) the cut at R*k, the
// candidates' exact scores (the store's own dot product, as the index
// computes them) and the rerank cut at k.
// `candidates` gets the rerank's candidates (the cut at R*k) where given.
SummarySelection twin_select(const KvIndex& index, const SummaryTables& t, const RowStore& keys, const float* q,
                             int group, int64_t k, int64_t cap, SummarySelection* candidates = nullptr) {
  const auto scores = summary_scores_reference(t, q, group);
  if (t.coarse_ratio > 0) {  // two levels: the listed groups' scores, cut at k
    const std::vector<int32_t> listed = summary_expand_reference(t, q, group, t.coarse_budget(k));
    std::vector<float> ls((size_t)group * listed.size());
    for (int g = 0; g < group; ++g)
      for (size_t j = 0; j < listed.size(); ++j) ls[g * listed.size() + j] = scores[(size_t)g * t.size() + listed[j]];
    return summary_select_reference(t, ls, group, k, cap, &listed);
  }
  const double R = index.own_rerank();
  if (R <= 1.0) return summary_select_reference(t, scores, group, k, cap);
  const SummarySelection cand = summary_select_reference(t, scores, group, (int64_t)(R * (double)k), cap);
  const size_t nc = cand.rows.size();
  std::vector<float> row_scores((size_t)group * nc);
  for (int g = 0; g < group; ++g)
    for (size_t r = 0; r < nc; ++r) row_scores[(size_t)g * nc + r] = keys.dot(cand.rows[r], q + (size_t)g * t.dim);
  if (candidates) *candidates = cand;
  return summary_rerank_reference(t, cand, scores, row_scores, group, k, cap);
}

}  // namespace

TEST_CASE("summary tables partition the indexed rows, the twin's cut selects what the index's search returns") {
  struct Case { std::string spec; int d, group; int64_t n, k; };
  const std::vector<Case> cases = {
      {"multipole", 64, 4, 3001, 200},          {"centroid:ratio=7", 128, 1, 999, 64},
      {"quest:page=16", 128, 4, 2050, 300},     {"quest:page=5", 64, 2, 17, 4},
      {"multipole:ratio=16", 256, 8, 1500, 1},  {"centroid", 64, 3, 500, 100000},
      // the plain lookup (rerank=1), and other factors than the default 4
      {"multipole:rerank=1", 64, 4, 3001, 200}, {"centroid:ratio=7,rerank=1", 128, 1, 999, 64},
      {"multipole:rerank_far=0", 64, 4, 3001, 200},
      {"multipole:rerank=2.5", 128, 6, 2001, 33}, {"centroid:rerank=1", 64, 3, 500, 100000},
      // two levels: coarse pages of 2..16 pages (a partial last one), expand 1..8
      {"quest:page=16,coarse_ratio=4", 128, 4, 2050, 100}, {"quest:page=5,coarse_ratio=3,expand=1", 64, 2, 17, 4},
      {"quest:page=8,coarse_ratio=16,expand=2", 256, 7, 3001, 50}, {"quest:coarse_ratio=2", 64, 1, 1000, 100000},
  };
  for (const Case& c : cases) {
    CAPTURE(c.spec, c.d, c.group, c.n, c.k);
    topkv::testing::Clustered data(c.d, 12, 99);
    const ClusteredIndex built = build_clustered(c.spec, data, c.n);
    const auto& keys = built.keys;
    KvIndex* index = built.index.get();

    SummaryTables t;
    REQUIRE(index->export_summaries(t));
    REQUIRE(t.covered == c.n);
    REQUIRE(t.dim == c.d);
    REQUIRE(t.rows.size() == (size_t)t.size() * t.row_len());
    REQUIRE(t.value_means.empty() == (index->name() != "multipole"));
    // Every indexed row in exactly one group.
    std::vector<int> seen((size_t)c.n, 0);
    int64_t total = 0;
    for (int64_t j = 0; j < t.size(); ++j) {
      REQUIRE(t.counts[(size_t)j] >= 1);
      total += t.counts[(size_t)j];
      for (int32_t r = 0; r < t.counts[(size_t)j]; ++r) {
        const int64_t row = t.kind == SummaryTables::Kind::PageBounds ? j * t.page + r
                                                                      : t.members[(size_t)t.offsets[(size_t)j] + r];
        REQUIRE(row >= 0);
        REQUIRE(row < c.n);
        ++seen[(size_t)row];
      }
    }
    CHECK(total == c.n);
    CHECK(std::all_of(seen.begin(), seen.end(), [](int s) { return s == 1; }));

    for (int trial = 0; trial < 5; ++trial) {
      const auto q = data.queries(c.group);
      const auto scores = summary_scores_reference(t, q.data(), c.group);
      const auto sel = twin_select(*index, t, *keys, q.data(), c.group, c.k, c.n);
      // The cut: per query head, the groups at or above it hold >= k tokens
      // (or all), those strictly above hold fewer.
      for (int g = 0; g < c.group; ++g) {
        const float* x = scores.data() + (size_t)g * t.size();
        const ScoreCut cut = summary_cut_reference(x, t.counts, c.k);
        int64_t at_or_above = 0, above = 0;
        for (int64_t j = 0; j < t.size(); ++j) {
          const uint32_t key = cut.key(x[j]);
          if (key >= cut.cut) at_or_above += t.counts[(size_t)j];
          if (key > cut.cut) above += t.counts[(size_t)j];
        }
        CHECK((at_or_above >= c.k || at_or_above == c.n));
        CHECK((above < c.k || cut.cut == 0));
      }
      SearchParams p;
      p.k = c.k;
      const SearchResult r = index->search(q.data(), c.group, p);
      const std::set<int64_t> want(r.ids.begin(), r.ids.end()), got(sel.rows.begin(), sel.rows.end());
      CHECK(got.size() == sel.rows.size());  // no row twice
      CHECK(got == want);
      // Far rows: every group not selected; with far_dropped (rerank_far,
      // multipole's default) also one per selected group with dropped rows
      // (their own test below).
      const int64_t unselected = std::count(sel.selected.begin(), sel.selected.end(), 0);
      if (index->name() == "multipole" && !t.far_dropped) CHECK((int64_t)r.far_clusters.size() == unselected);
      if (index->name() == "multipole" && t.far_dropped) CHECK((int64_t)r.far_clusters.size() >= unselected);
      if (t.coarse_ratio > 0) {
        // The expansion's own contract: every group of a coarse group some
        // head's cut took, each coarse group's at or above the cut holding
        // >= expand*k tokens (or all); and it scores fewer groups than one level
        // where the budget is a small share of the keys.
        const SummaryTables ct = t.coarse_level();
        std::vector<float> cs;
        const auto listed = summary_expand_reference(t, q.data(), c.group, t.coarse_budget(c.k), &cs);
        CHECK(std::is_sorted(listed.begin(), listed.end()));
        CHECK(std::adjacent_find(listed.begin(), listed.end()) == listed.end());
        for (int g = 0; g < c.group; ++g) {
          const ScoreCut cut = summary_cut_reference(cs.data() + (size_t)g * ct.size(), ct.counts, t.coarse_budget(c.k));
          int64_t held = 0;
          for (int64_t j = 0; j < ct.size(); ++j)
            if (cut.key(cs[(size_t)g * ct.size() + j]) >= cut.cut) {
              held += ct.counts[(size_t)j];
              CHECK(std::binary_search(listed.begin(), listed.end(), (int32_t)(j * t.coarse_ratio)));
            }
          CHECK((held >= t.coarse_budget(c.k) || held == c.n));
        }
        if (t.coarse_budget(c.k) * c.group * 4 < c.n) CHECK((int64_t)listed.size() < t.size());
      }
    }
  }
}

TEST_CASE("the twin's dropped rows are the host search's rerank_far rows, with the same mass") {
  // multipole:rerank_far=1: the host search adds one far row per selected
  // cluster whose exact score x gives N_j exp(s x) = sum over its dropped
  // rows of exp(s q.k); the device search adds those rows one by one
  // (summary_dropped_reference). Both must name the same rows.
  struct Case { int d, group; int64_t n, k; };
  int64_t far_rows = 0;
  for (const Case& c : {Case{64, 4, 3001, 200}, Case{128, 6, 2001, 33}, Case{256, 2, 1500, 64}, Case{64, 7, 999, 1}}) {
    CAPTURE(c.d, c.group, c.n, c.k);
    topkv::testing::Clustered data(c.d, 12, 7);
    const ClusteredIndex built = build_clustered("multipole:rerank_far=1", data, c.n);
    const auto& keys = built.keys;
    KvIndex* index = built.index.get();
    SummaryTables t;
    REQUIRE(index->export_summaries(t));
    REQUIRE(t.far_dropped);
    const double s = 1.0 / std::sqrt((double)c.d);
    for (int trial = 0; trial < 4; ++trial) {
      const auto q = data.queries(c.group);
      SummarySelection cand;
      const SummarySelection sel = twin_select(*index, t, *keys, q.data(), c.group, c.k, c.n, &cand);
      const std::vector<int64_t> dropped = summary_dropped_reference(cand, sel);
      // Per selected group: the log of the twin's dropped rows' mass, per query head.
      std::map<int32_t, std::vector<double>> lse;
      for (int64_t r : dropped) {
        const int32_t j = (int32_t)cand.row_group[(size_t)r];
        REQUIRE(sel.selected[(size_t)j]);
        auto& v = lse.try_emplace(j, (size_t)c.group, -INFINITY).first->second;
        for (int g = 0; g < c.group; ++g) {
          const double z = s * keys->dot(cand.rows[(size_t)r], q.data() + (size_t)g * c.d);
          const double m = std::max(v[(size_t)g], z);
          v[(size_t)g] = m + std::log(std::exp(v[(size_t)g] - m) + std::exp(z - m));
        }
      }
      SearchParams p;
      p.k = c.k;
      const SearchResult r = index->search(q.data(), c.group, p);
      const size_t nf = r.far_clusters.size();
      REQUIRE(r.far_scores.size() == (size_t)c.group * nf);
      // The host's rows for selected clusters are its dropped-rows rows.
      std::set<int32_t> host;
      for (size_t f = 0; f < nf; ++f) {
        const int32_t j = r.far_clusters[f];
        if (!sel.selected[(size_t)j]) continue;
        host.insert(j);
        REQUIRE(lse.count(j));
        for (int g = 0; g < c.group; ++g) {
          const double got = s * r.far_scores[(size_t)g * nf + f] + std::log((double)t.counts[(size_t)j]);
          CHECK(got == Approx(lse[j][(size_t)g]).margin(1e-4));
        }
        ++far_rows;
      }
      CHECK(host.size() == lse.size());
      // Every candidate row of a selected group is listed or dropped.
      const std::set<int64_t> listed(sel.rows.begin(), sel.rows.end());
      for (size_t i = 0; i < cand.rows.size(); ++i)
        if (sel.selected[(size_t)cand.row_group[i]])
          CHECK((listed.count(cand.rows[i]) == 1) !=
                std::binary_search(dropped.begin(), dropped.end(), (int64_t)i));
    }
  }
  CHECK(far_rows > 50);
}

TEST_CASE("a quest coarse page bounds every page and key below it (SummaryTables::coarse_level)") {
  for (const auto& [d, n, page, ratio] : std::vector<std::tuple<int, int64_t, int, int>>{
           {64, 1, 16, 4}, {128, 999, 16, 16}, {256, 3001, 5, 3}, {64, 640, 16, 4}}) {
    CAPTURE(d, n, page, ratio);
    topkv::testing::Clustered data(d, 6, 17 + d);
    auto keys = std::make_shared<RowStore>(d, DType::F32);
    const auto kf = data.keys(n);
    keys->append_f32(kf.data(), n);
    auto index = KvIndex::create(fmt::format("quest:page={},coarse_ratio={}", page, ratio));
    index->build(keys);
    SummaryTables t;
    REQUIRE(index->export_summaries(t));
    REQUIRE(t.coarse_ratio == ratio);
    const SummaryTables c = t.coarse_level();
    REQUIRE(c.size() == (t.size() + ratio - 1) / ratio);
    CHECK(c.page == (int64_t)page * ratio);
    CHECK(std::accumulate(c.counts.begin(), c.counts.end(), int64_t{0}) == n);
    const auto q = data.queries(3);
    const auto fs = summary_scores_reference(t, q.data(), 3), cs = summary_scores_reference(c, q.data(), 3);
    for (int g = 0; g < 3; ++g)
      for (int64_t j = 0; j < t.size(); ++j) {
        const float coarse = cs[(size_t)g * c.size() + j / ratio];
        CHECK(coarse >= fs[(size_t)g * t.size() + j] - 1e-4f * (1 + std::fabs(coarse)));
        for (int64_t r = j * page; r < j * page + t.counts[(size_t)j]; ++r)
          CHECK(coarse >= keys->dot(r, q.data() + (size_t)g * d) - 1e-4f * (1 + std::fabs(coarse)));
      }
  }
}

TEST_CASE("device pages f times longer are the quest index of f times the page (SummaryTables::coarsened)") {
  // What the budget's longer pages hold (DeviceTableChoice::page_factor):
  // the exported tables of the same keys indexed with page * f, field for
  // field and in i8, partial last pages, one token and both levels included.
  for (const auto& [d, n, page, ratio] : std::vector<std::tuple<int, int64_t, int, int>>{
           {64, 1, 16, 0}, {128, 999, 16, 16}, {256, 3001, 5, 0}, {64, 640, 16, 8}, {128, 4099, 4, 4}}) {
    topkv::testing::Clustered data(d, 6, 29 + d);
    auto keys = std::make_shared<RowStore>(d, DType::F32);
    const auto kf = data.keys(n);
    keys->append_f32(kf.data(), n);
    const auto tables = [&](int pg, int r) {
      auto index = KvIndex::create(fmt::format("quest:page={},coarse_ratio={}", pg, r));
      index->build(keys);
      SummaryTables t;
      REQUIRE(index->export_summaries(t));
      return std::pair{std::move(t), index->summary_page_factor_max()};
    };
    const auto [t, f_max] = tables(page, ratio);
    CHECK(f_max == (ratio == 0 ? 4 : ratio >= 8 ? 4 : ratio == 4 ? 2 : 1));
    for (int f = 2; f <= f_max; f *= 2) {
      CAPTURE(d, n, page, ratio, f);
      const SummaryTables c = t.coarsened(f);
      const SummaryTables want = tables(page * f, ratio / f).first;
      CHECK(c.page == want.page);
      CHECK(c.covered == want.covered);
      CHECK(c.counts == want.counts);
      CHECK(c.rows == want.rows);
      CHECK(c.coarse_ratio == want.coarse_ratio);
      CHECK(c.expand == want.expand);
      CHECK(c.encoded_rows(DType::I8).decoded() == want.encoded_rows(DType::I8).decoded());
      if (ratio > 0) CHECK(c.coarse_level().rows == t.coarse_level().rows);  // the coarse pages stay
    }
    CHECK(t.coarsened(1).rows == t.rows);
  }
  // What does not coarsen is refused: clusters, a factor that does not tile
  // the coarse pages or leaves one page a coarse page.
  topkv::testing::Clustered data(64, 6, 3);
  auto keys = std::make_shared<RowStore>(64, DType::F32);
  const auto kf = data.keys(300);
  keys->append_f32(kf.data(), 300);
  for (const auto& [spec, f] : {std::pair{"centroid", 2}, std::pair{"quest:coarse_ratio=6", 4},
                                std::pair{"quest:coarse_ratio=4", 4}, std::pair{"quest", 0}}) {
    CAPTURE(spec, f);
    auto index = KvIndex::create(spec);
    index->build(keys);
    SummaryTables t;
    REQUIRE(index->export_summaries(t));
    CHECK_THROWS_WITH(t.coarsened(f), Catch::Contains("internal:"));
  }
  CHECK(KvIndex::create("centroid")->summary_page_factor_max() == 1);
  CHECK(KvIndex::create("quest:coarse_ratio=6")->summary_page_factor_max() == 2);
  CHECK(KvIndex::create("quest:coarse_ratio=3")->summary_page_factor_max() == 1);
}

TEST_CASE("page bounds in a narrower table type still bound every key (SummaryTables::encoded_rows)") {
  // The device holds the tables at --device-table-type; rounded to nearest,
  // an f8 bound could fall up to 1/16 below its keys. encoded_rows rounds M up
  // and m down, so a page's (and a coarse page's) score stays at least every
  // q.k below it, in every type; centroids round to nearest. One dimension of
  // the keys lies in [-300, -100] (inside f8's 448), as the few large
  // dimensions of Qwen2.5's first layers (max |k| 359).
  for (DType t : {DType::F8E4M3, DType::I8, DType::F16, DType::BF16, DType::F32})
    for (const auto& [d, n, page] : std::vector<std::tuple<int, int64_t, int>>{{64, 1, 16}, {128, 1001, 16}, {256, 333, 5}}) {
      CAPTURE(dtype_name(t), d, n, page);
      topkv::testing::Clustered data(d, 6, 5 + d);
      auto keys = std::make_shared<RowStore>(d, DType::F32);
      auto kf = data.keys(n);
      for (int64_t r = 0; r < n; ++r) kf[(size_t)(r * d + 3)] = -200.f + 100.f * std::sin((float)r);
      keys->append_f32(kf.data(), n);
      auto index = KvIndex::create(fmt::format("quest:page={},coarse_ratio=4", page));
      index->build(keys);
      SummaryTables tab;
      REQUIRE(index->export_summaries(tab));
      {  // The coarse level encoded is the coarse level of the encoded pages (one-way
         // rounding is monotone, and an i8 table's scales are the same on both
         // levels): the device's coarse table and its twin's agree.
        const TableCodes fine = tab.encoded_rows(t), coarse = tab.coarse_level().encoded_rows(t);
        CHECK(coarse.scale == fine.scale);
        SummaryTables decoded = tab;
        decoded.rows = fine.decoded();
        CHECK(decoded.coarse_level().rows == coarse.decoded());
      }
      for (const SummaryTables& level : {tab, tab.coarse_level()}) {
        SummaryTables narrow = level;
        const TableCodes codes = level.encoded_rows(t);
        REQUIRE(codes.codes.size() == dtype_bytes(t, level.rows.size()));
        REQUIRE(codes.scale.size() == (t == DType::I8 ? (size_t)d : 0));
        narrow.rows = codes.decoded();
        // Element by element: M at least, m at most, every key of the page.
        std::vector<float> k(d);
        for (int64_t j = 0; j < narrow.size(); ++j)
          for (int64_t r = j * narrow.page; r < j * narrow.page + narrow.counts[(size_t)j]; ++r) {
            keys->row_f32(r, k.data());
            const float* row = narrow.rows.data() + (size_t)j * 2 * d;
            for (int i = 0; i < d; ++i) REQUIRE((row[i] >= k[(size_t)i] && row[d + i] <= k[(size_t)i]));
          }
        const auto q = data.queries(3);
        const auto sc = summary_scores_reference(narrow, q.data(), 3);
        for (int g = 0; g < 3; ++g)
          for (int64_t j = 0; j < narrow.size(); ++j)
            for (int64_t r = j * narrow.page; r < j * narrow.page + narrow.counts[(size_t)j]; ++r) {
              const float x = keys->dot(r, q.data() + (size_t)g * d), b = sc[(size_t)g * narrow.size() + j];
              REQUIRE(b >= x - 1e-5f * (1 + std::fabs(x)));  // fp32 sums in another order
            }
      }
    }
  // Centroids: nearest, as from_f32.
  SummaryTables c;
  c.kind = SummaryTables::Kind::Centroid, c.dim = 64;
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.f, 3.f);
  for (int i = 0; i < 64 * 5; ++i) c.rows.push_back(nd(rng));
  c.counts.assign(5, 1);
  std::vector<uint8_t> want(c.rows.size());
  from_f32(DType::F8E4M3, c.rows.data(), want.data(), c.rows.size());
  CHECK(c.encoded_rows(DType::F8E4M3).codes == want);
  {  // i8: nearest within half a step of each dimension's scale
    const TableCodes i8 = c.encoded_rows(DType::I8);
    const std::vector<float> y = i8.decoded();
    for (size_t i = 0; i < y.size(); ++i) CHECK(std::fabs(y[i] - c.rows[i]) <= 0.5f * i8.scale[i % 64] * 1.00001f);
  }
  // Past f8's 448 a centroid is refused, not clipped; so is a page bound (no f8 value above it).
  c.rows[7] = 500.f;
  CHECK_THROWS_WITH(c.encoded_rows(DType::F8E4M3), Catch::Contains("a centroid element 500 is past f8's largest value 448"));
  CHECK(c.encoded_rows(DType::F16).codes.size() == c.rows.size() * 2);
  CHECK(c.encoded_rows(DType::I8).codes.size() == c.rows.size());  // i8 has no range to be past
  SummaryTables pb;
  pb.kind = SummaryTables::Kind::PageBounds, pb.dim = 2, pb.rows = {500.f, 1.f, -1.f, 0.5f}, pb.counts = {3};
  CHECK_THROWS_WITH(pb.encoded_rows(DType::F8E4M3), Catch::Contains("an upper bound 500 has no f8 value"));
}

TEST_CASE("two-level quest selects as its twin through folds and a save and load") {
  // The host keeps its coarse bounds beside the pages: built, then grown by
  // folds of a few rows (the last coarse page's last page grows; new ones
  // start), then reduced again on load. After each, the host search's rows
  // are the twin's on the exported tables.
  const int d = 64, G = 3;
  const int64_t k = 40;
  topkv::testing::Clustered data(d, 10, 31);
  auto keys = std::make_shared<RowStore>(d, DType::F32);
  const auto kf = data.keys(1300);
  keys->append_f32(kf.data(), 700);
  BuildOptions bo;
  bo.n_threads = 2;
  auto index = KvIndex::create("quest:page=8,coarse_ratio=4,expand=2", bo);
  index->build(keys);
  const auto check = [&](const KvIndex& idx) {
    SummaryTables t;
    REQUIRE(idx.export_summaries(t));
    for (int trial = 0; trial < 4; ++trial) {
      const auto q = data.queries(G);
      const auto sel = twin_select(idx, t, *keys, q.data(), G, k, t.covered);
      SearchParams p;
      p.k = k;
      const SearchResult r = idx.search(q.data(), G, p);
      CHECK(std::set<int64_t>(r.ids.begin(), r.ids.end()) == std::set<int64_t>(sel.rows.begin(), sel.rows.end()));
    }
  };
  check(*index);
  for (int64_t at = 700; at < 1300;) {  // folds of 1, 7, 29, ... rows
    const int64_t m = std::min<int64_t>(1300 - at, 1 + (at % 37));
    keys->append_f32(kf.data() + (size_t)at * d, m);
    at += m;
    CHECK(index->add_new_rows() == m);
    if (at % 5 == 0 || at == 1300) check(*index);
  }
  topkv::test::TempDir tmp;
  index->save(tmp.file("quest.idx"));
  const auto loaded = KvIndex::load(tmp.file("quest.idx"), keys);
  check(*loaded);
}

TEST_CASE("quest's two-level parameters are checked where the spec is read") {
  for (const char* bad : {"quest:coarse_ratio=1", "quest:coarse_ratio=-3", "quest:coarse_ratio=5000",
                          "quest:coarse_ratio=16,expand=0.5"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH(KvIndex::create(bad), Catch::Matchers::Contains("quest: "));
  }
  for (const char* bad : {"quest:coarse_ratio=16,expand=nan", "quest:coarse_ratio=16,expand=inf"}) {
    CAPTURE(bad);  // the spec parser's own check
    CHECK_THROWS_WITH(KvIndex::create(bad), Catch::Matchers::Contains("expand"));
  }
  CHECK_NOTHROW(KvIndex::create("quest:coarse_ratio=0"));  // one level, as without it
}

TEST_CASE("the twin's gather stops at its capacity, in group order") {
  topkv::testing::Clustered data(64, 5, 3);
  auto keys = std::make_shared<RowStore>(64, DType::F32);
  const auto kf = data.keys(400);
  keys->append_f32(kf.data(), 400);
  auto index = KvIndex::create("quest:page=10");
  index->build(keys);
  SummaryTables t;
  REQUIRE(index->export_summaries(t));
  const auto q = data.queries(2);
  const auto scores = summary_scores_reference(t, q.data(), 2);
  const auto all = summary_select_reference(t, scores, 2, 150, 400);
  const auto capped = summary_select_reference(t, scores, 2, 150, 95);
  CHECK(all.rows.size() >= 150);
  REQUIRE(capped.rows.size() <= 95);
  // The capped list is the uncapped one's prefix, whole groups only.
  CHECK(std::equal(capped.rows.begin(), capped.rows.end(), all.rows.begin()));
  CHECK(capped.rows.size() % 10 == 0);
  CHECK(capped.rows.size() + 10 > 95);
}

namespace {

// What the GPU runtime's device search attends for one KV head of `L`, on the
// CPU: sinks, window and the rows its tables do not cover yet, exactly; the
// twin's selected groups exactly; every other group as a far row; with
// far_dropped (rerank_far) each candidate row a selected group dropped as a
// far row of its own (logit s q.k, its group's mean value).
void device_search_attend(const OffloadedLayer& L, int h, const float* q, int G, int64_t k, float scale, float* out) {
  const int d = L.config().head_dim;
  SummaryTables t;
  REQUIRE(L.index(h)->export_summaries(t));
  const auto scores = summary_scores_reference(t, q, G);
  const RowStore &K = *L.key_store(h), &V = *L.value_store(h);
  SummarySelection cand;
  const auto sel = twin_select(*L.index(h), t, K, q, G, k, t.covered, t.far_dropped ? &cand : nullptr);
  const std::vector<int64_t> dropped = t.far_dropped ? summary_dropped_reference(cand, sel) : std::vector<int64_t>{};
  for (int g = 0; g < G; ++g) {
    const float* qg = q + (size_t)g * d;
    AttnPartial p(d);
    std::vector<float> s, v, row(d);
    auto add_row = [&](const float* kr, const float* vr) {
      s.push_back(dot_f32(kr, qg, (size_t)d) * scale);
      v.insert(v.end(), vr, vr + d);
    };
    for (int i = 0; i < L.n_sinks(); ++i) add_row(L.sink_keys(h) + (size_t)i * d, L.sink_values(h) + (size_t)i * d);
    const int W = L.config().window;
    for (int64_t pos = L.window_start(); pos < L.window_start() + L.window_len(); ++pos)
      add_row(L.window_keys(h) + (size_t)(pos % W) * d, L.window_values(h) + (size_t)(pos % W) * d);
    std::vector<int64_t> rows(sel.rows);
    for (int64_t r = t.covered; r < K.size(); ++r) rows.push_back(r);  // the tail
    std::vector<float> kr(d), vr(d);
    for (int64_t r : rows) {
      K.row_f32(r, kr.data()), V.row_f32(r, vr.data());
      add_row(kr.data(), vr.data());
    }
    partial_add(p, s.data(), nullptr, v.data(), (int64_t)s.size());
    if (!t.value_means.empty()) {
      std::vector<float> fs, logw;
      std::vector<int32_t> idx;
      for (int64_t j = 0; j < t.size(); ++j)
        if (!sel.selected[(size_t)j]) {
          fs.push_back(summary_far_logit_reference(t, j, qg, scores[(size_t)g * t.size() + j], scale));
          logw.push_back(0.f);  // ln N_j is in the logit
          idx.push_back((int32_t)j);
        }
      std::vector<float> kd(d);
      for (int64_t r : dropped) {
        K.row_f32(cand.rows[(size_t)r], kd.data());
        fs.push_back(dot_f32(kd.data(), qg, (size_t)d) * scale);
        logw.push_back(0.f);
        idx.push_back((int32_t)cand.row_group[(size_t)r]);
      }
      AttnPartial far(d);
      partial_add_gather(far, fs.data(), logw.data(), t.value_means.data(), idx.data(), (int64_t)idx.size());
      partial_merge(p, far);
    }
    partial_finish(p, out + (size_t)g * d);
  }
}

}  // namespace

TEST_CASE("the device search's attention, emulated on the CPU, equals the CPU layer's while the tail fits k") {
  struct Case { std::string index; int d, G, n, window, sinks, fold; int64_t k; };
  for (const Case& c : {Case{"multipole", 128, 4, 3000, 16, 4, 1024, 128}, Case{"quest:page=4", 64, 4, 700, 8, 0, 7, 40},
                        Case{"centroid", 64, 2, 1200, 32, 4, 40, 64}, Case{"multipole:rerank=1", 128, 4, 3000, 16, 4, 1024, 128},
                        Case{"multipole:rerank_far=0", 128, 4, 3000, 16, 4, 1024, 128},
                        Case{"centroid:rerank=1", 64, 2, 1200, 32, 4, 40, 64},
                        // the far rows' spread term, damped and with the clip binding
                        Case{"multipole:spread=0.5", 128, 4, 3000, 16, 4, 1024, 128},
                        Case{"multipole:spread=4,spread_clip=1.5,rerank=1", 64, 2, 1200, 32, 4, 40, 64}}) {
    CAPTURE(c.index, c.d, c.G, c.n, c.fold, c.k);
    OffloadedLayer::Config cfg;
    cfg.n_heads = c.G, cfg.kv_heads = 1, cfg.head_dim = c.d, cfg.sinks = c.sinks, cfg.window = c.window;
    cfg.k = c.k, cfg.index = c.index, cfg.fold_every = c.fold, cfg.build.n_threads = 1;
    OffloadedLayer L(cfg);
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    auto rnd = [&](size_t n, float sd, float mean) {
      std::vector<float> x(n);
      for (auto& e : x) e = mean + sd * nd(rng);
      std::vector<uint16_t> h(n);  // f16-exact, as the store keeps them
      from_f32(DType::F16, x.data(), h.data(), n);
      to_f32(DType::F16, h.data(), x.data(), n);
      return x;
    };
    const auto ck = rnd((size_t)c.n * c.d, 1.f, 0.3f), cv = rnd((size_t)c.n * c.d, 1.f, 0.f);
    L.prefill(ck.data(), cv.data(), c.n);
    const float scale = 1.f / std::sqrt((float)c.d);
    double worst = 0;
    for (int step = 0; step < 3 * c.window + 20; ++step) {
      const auto q = rnd((size_t)c.G * c.d, 1.5f, 0.f), k = rnd((size_t)c.d, 1.f, 0.3f), v = rnd((size_t)c.d, 1.f, 0.f);
      L.append(k.data(), v.data());
      if (L.key_store(0)->size() - L.index(0)->indexed_rows() >= c.k) break;  // the CPU then cuts the tail to k
      std::vector<float> want((size_t)c.G * c.d), got(want.size());
      L.attend(q.data(), scale, want.data());
      device_search_attend(L, 0, q.data(), c.G, c.k, scale, got.data());
      double num = 0, den = 0;
      for (size_t i = 0; i < got.size(); ++i) num += std::pow(got[i] - want[i], 2), den += std::pow(want[i], 2);
      worst = std::max(worst, std::sqrt(num / den));
    }
    CHECK(worst < 1e-5);
  }
}
