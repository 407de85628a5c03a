// Quest's page bounds built three ways give the same bits (index/page_bounds.h):
// build() on the host cores; build() with an engine handed in
// (BuildOptions::bounds, what the GPU's does on the device); and the
// streaming build (begin_build / rows_ready / end_build, the build overlapped
// with a chunked prefill), whose runs of pages are bounded on TBB's threads as
// their rows arrive. Every store type, head_dim 64/128/256, pages of 1 to 64
// rows, one and two levels, contexts of one row to past a store chunk; signed
// zeros placed where the order of the comparisons decides. The GPU engine's
// own test is tests/gpu/test_gpu_page_bounds.cpp.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <random>

#include <fmt/format.h>

#include "index/kv_index.h"
#include "index/page_bounds.h"
#include "src/common/task_group.h"

using namespace topkv;

namespace {

// Random keys with outlier dimensions, and -0 / +0 in the same dimension of
// consecutive rows (which of them a page keeps depends on the order).
std::vector<float> keys_for_bounds(int64_t n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x((size_t)n * d);
  for (auto& v : x) v = g(rng);
  for (int64_t i = 0; i < n; ++i) {
    x[(size_t)i * d + (size_t)(i % d)] *= 20.f;                       // an outlier dimension a row
    x[(size_t)i * d + (size_t)((i * 7 + 3) % d)] = (i % 2) ? -0.f : 0.f;  // signed zeros
  }
  return x;
}

// An engine that counts the pages it bounded (the host twin underneath).
class CountingBounds final : public PageBoundsEngine {
 public:
  explicit CountingBounds(int64_t max_page = INT64_MAX) : max_page_(max_page) {}
  const char* name() const override { return "counting"; }
  int64_t max_page() const override { return max_page_; }
  mutable std::atomic<int64_t> pages{0}, calls{0};

 protected:
  void bound_impl(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page, int64_t n_rows,
                  float* out) const override {
    pages += end_page - first_page;
    ++calls;
    HostPageBounds().bound_pages(keys, page, first_page, end_page, n_rows, out);
  }

 private:
  int64_t max_page_;
};

SummaryTables tables_of(const KvIndex& index) {
  SummaryTables t;
  REQUIRE(index.export_summaries(t));
  return t;
}

void require_same_bits(const SummaryTables& a, const SummaryTables& b) {
  REQUIRE(a.rows.size() == b.rows.size());
  REQUIRE(a.counts == b.counts);
  CHECK(std::memcmp(a.rows.data(), b.rows.data(), a.rows.size() * sizeof(float)) == 0);
  const SummaryTables ca = a.coarse_ratio ? a.coarse_level() : a, cb = b.coarse_ratio ? b.coarse_level() : b;
  REQUIRE(ca.rows.size() == cb.rows.size());
  CHECK(std::memcmp(ca.rows.data(), cb.rows.data(), ca.rows.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("page bounds: an engine and the streaming build give the host build's bits") {
  struct Case {
    DType dtype;
    int d;
    int64_t n, page, coarse;
  };
  const Case cases[] = {
      {DType::F16, 128, 40000, 16, 16},  {DType::Q8_0, 128, 70001, 16, 0},  // past a store chunk (65,536 rows)
      {DType::F8E4M3, 64, 33333, 3, 4},      {DType::BF16, 256, 1, 16, 0},     // one row
      {DType::F32, 64, 16384 * 2 + 1, 1, 0}, {DType::Q8_0, 256, 20000, 64, 2},
      {DType::F16, 64, 17, 16, 0},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(dtype_name(c.dtype) << " d=" << c.d << " n=" << c.n << " page=" << c.page << " coarse=" << c.coarse) {
      const auto x = keys_for_bounds(c.n, c.d, (uint32_t)(c.n + c.d));
      auto keys = std::make_shared<RowStore>(c.d, c.dtype);
      keys->append_f32(x.data(), c.n);
      const std::string spec = fmt::format("quest:page={}{}", c.page, c.coarse ? fmt::format(",coarse_ratio={}", c.coarse) : "");
      const int64_t pages = (c.n + c.page - 1) / c.page;

      auto host = KvIndex::create(spec);
      host->build(keys);
      const SummaryTables want = tables_of(*host);
      REQUIRE(want.size() == pages);

      // build() with an engine: every page is the engine's.
      auto engine = std::make_shared<CountingBounds>();
      BuildOptions with;
      with.bounds = engine;
      auto built = KvIndex::create(spec, with);
      built->build(keys);
      require_same_bits(tables_of(*built), want);
      CHECK(engine->pages == pages);

      // The streaming build, the rows arriving in odd pieces as a chunked
      // prefill gives them, with the engine and without one.
      for (bool use_engine : {true, false}) {
        auto counting = std::make_shared<CountingBounds>();
        BuildOptions o;
        if (use_engine) o.bounds = counting;
        auto streamed = KvIndex::create(spec, o);
        auto growing = std::make_shared<RowStore>(c.d, c.dtype);
        streamed->begin_build(growing, nullptr, c.n);
        for (int64_t at = 0; at < c.n;) {
          const int64_t m = std::min<int64_t>(c.n - at, 4099);
          growing->append_f32(x.data() + (size_t)at * c.d, m);
          at += m;
          streamed->rows_ready(growing->size());
        }
        streamed->end_build();
        require_same_bits(tables_of(*streamed), want);
        if (use_engine) {
          CHECK(counting->pages == pages);
          // Two runs of 16,384 rows or more stream on two cores: more than one call.
          if (c.n > 2 * 16384 && TaskGroup::concurrency() >= 2) CHECK(counting->calls > 1);
        }
        // Rows folded in after the build: as a build over all of them.
        const auto more = keys_for_bounds(37, c.d, 99);
        growing->append_f32(more.data(), 37);
        streamed->add_new_rows();
        auto all = std::make_shared<RowStore>(c.d, c.dtype);
        all->append_f32(x.data(), c.n);
        all->append_f32(more.data(), 37);
        auto again = KvIndex::create(spec);
        again->build(all);
        require_same_bits(tables_of(*streamed), tables_of(*again));
      }
    }
  }
}

TEST_CASE("page bounds: pages longer than an engine takes are bounded on the host") {
  const int d = 64;
  const int64_t n = 5000;
  const auto x = keys_for_bounds(n, d, 5);
  auto keys = std::make_shared<RowStore>(d, DType::F16);
  keys->append_f32(x.data(), n);
  auto engine = std::make_shared<CountingBounds>(/*max_page=*/8);
  BuildOptions o;
  o.bounds = engine;
  auto index = KvIndex::create("quest:page=16", o);
  index->build(keys);
  CHECK(engine->calls == 0);
  auto host = KvIndex::create("quest:page=16");
  host->build(keys);
  require_same_bits(tables_of(*index), tables_of(*host));
  auto shorter = KvIndex::create("quest:page=8", o);  // pages it takes
  shorter->build(keys);
  CHECK(engine->pages == (n + 7) / 8);
}

TEST_CASE("page bounds: the twin refuses a range it cannot bound") {
  auto keys = std::make_shared<RowStore>(64, DType::F32);
  const auto x = keys_for_bounds(10, 64, 1);
  keys->append_f32(x.data(), 10);
  std::vector<float> out(5 * 2 * 64);  // 5 pages of [M | m] at dim 64
  CHECK_THROWS_WITH(page_bounds_reference(*keys, 4, 0, 4, 10, out.data(), 1),  // page 3 would start at row 12
                    Catch::Contains("internal: bounds of pages 0..4"));
  CHECK_THROWS_WITH(page_bounds_reference(*keys, 4, 0, 3, 11, out.data(), 1), Catch::Contains("of the store's 10 rows"));
  CHECK_NOTHROW(page_bounds_reference(*keys, 4, 0, 3, 10, out.data(), 1));
  // An engine checks its arguments before its own work: its page limit, and the same range rules.
  CountingBounds engine(/*max_page=*/2);
  CHECK_THROWS_WITH(engine.bound_pages(*keys, 4, 0, 3, 10, out.data()), Catch::Contains("(at most 2)"));
  CHECK_THROWS_WITH(engine.bound_pages(*keys, 2, 0, 6, 10, out.data()), Catch::Contains("internal: bounds of pages 0..6"));
  CHECK_NOTHROW(engine.bound_pages(*keys, 2, 0, 0, 0, out.data()));  // no pages: nothing to do
  CHECK(engine.calls == 0);
  CHECK_NOTHROW(engine.bound_pages(*keys, 2, 0, 5, 10, out.data()));
  CHECK(engine.calls == 1);
}
