// The GPU page bounds (gpu/gpu_page_bounds.h, `--build-on gpu|auto` with
// quest) against its twin page_bounds_reference (index/page_bounds.h): the
// same bits for every store type, head_dim 64/128/256, pages of 1 row to the
// engine's longest (16,384), ranges that start past page 0 and end in a short
// page, stores in heap and in pinned chunks (the CUDA runtime's) and past a
// chunk; quest indexes built with it, whole and streamed, equal the host's;
// calls from four threads at once give the single call's bits.
#include <catch2/catch.hpp>

#include <cstring>
#include <random>
#include <thread>

#include <fmt/format.h>

#include "gpu/gpu_offload_runtime_impl.h"  // gpu_offload::pinned_chunk_allocator
#include "gpu/gpu_page_bounds.h"
#include "index/kv_index.h"
#include "tests/gpu/cuda_test_util.h"

using namespace topkv;

namespace {

// Random keys with an outlier dimension a row and signed zeros in
// consecutive rows of one dimension (the order of the comparisons decides).
std::vector<float> bound_keys(int64_t n, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x = test::randn((size_t)n * d, rng);
  for (int64_t i = 0; i < n; ++i) {
    x[(size_t)i * d + (size_t)(i % d)] *= 20.f;
    x[(size_t)i * d + (size_t)((i * 7 + 3) % d)] = (i % 2) ? -0.f : 0.f;
  }
  return x;
}

std::shared_ptr<RowStore> store_of(const std::vector<float>& x, int d, DType t, bool pinned) {
  auto s = std::make_shared<RowStore>(d, t, pinned ? gpu_offload::pinned_chunk_allocator() : RowStore::ChunkAllocator{});
  s->append_f32(x.data(), (int64_t)(x.size() / d));
  return s;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("GPU page bounds equal the twin's bits") {
  const auto engine = make_gpu_page_bounds(test::cuda_be());
  CHECK(engine->max_page() == 16384);
  struct Case {
    DType t;
    int d;
    int64_t n, page, first_page;
    bool pinned;
  };
  const Case cases[] = {
      {DType::Q8_0, 128, 70001, 16, 0, true},  {DType::Q8_0, 128, 70001, 16, 77, false},
      {DType::F16, 64, 33333, 3, 5, true},     {DType::F8E4M3, 256, 20000, 64, 0, true},
      {DType::BF16, 128, 16387, 1, 0, false},  {DType::F32, 64, 40000, 16384, 0, true},
      {DType::F32, 256, 1, 16, 0, false},      {DType::F16, 128, 17, 16, 0, true},
      {DType::Q8_0, 256, 16384 * 2 + 5, 7, 100, true},
  };
  for (const Case& c : cases) {
    DYNAMIC_SECTION(dtype_name(c.t) << " d=" << c.d << " n=" << c.n << " page=" << c.page << " from page "
                                    << c.first_page << (c.pinned ? " pinned" : " heap")) {
      const auto x = bound_keys(c.n, c.d, (uint32_t)(c.n * 3 + c.d));
      const auto keys = store_of(x, c.d, c.t, c.pinned);
      const int64_t end_page = (c.n + c.page - 1) / c.page, w = 2 * c.d;
      std::vector<float> want((size_t)(end_page - c.first_page) * w), got(want.size(), std::nanf(""));
      page_bounds_reference(*keys, c.page, c.first_page, end_page, c.n, want.data(), 4);
      engine->bound_pages(*keys, c.page, c.first_page, end_page, c.n, got.data());
      CHECK(same_bits(got, want));
      // A range that ends on a whole page before the store does.
      if (end_page - c.first_page > 2) {
        std::vector<float> part((size_t)(end_page - 1 - c.first_page) * w);
        engine->bound_pages(*keys, c.page, c.first_page, end_page - 1, (end_page - 1) * c.page, part.data());
        CHECK(std::memcmp(part.data(), want.data(), part.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("GPU page bounds: quest built with the engine, whole and streamed, is the host's") {
  const auto engine = make_gpu_page_bounds(test::cuda_be());
  for (const char* spec : {"quest:page=16,coarse_ratio=16", "quest:page=5"}) {
    DYNAMIC_SECTION(spec) {
      const int d = 128;
      const int64_t n = 70001;
      const auto x = bound_keys(n, d, 11);
      const auto keys = store_of(x, d, DType::Q8_0, true);
      auto host = KvIndex::create(spec);
      host->build(keys);
      SummaryTables want, whole, streamed;
      REQUIRE(host->export_summaries(want));

      BuildOptions o;
      o.bounds = engine;
      auto built = KvIndex::create(spec, o);
      built->build(keys);
      REQUIRE(built->export_summaries(whole));
      CHECK(same_bits(whole.rows, want.rows));

      auto growing = std::make_shared<RowStore>(d, DType::Q8_0, gpu_offload::pinned_chunk_allocator());
      auto index = KvIndex::create(spec, o);
      index->begin_build(growing, nullptr, n);
      for (int64_t at = 0; at < n; at += 8192) {  // a chunked prefill's pieces
        growing->append_f32(x.data() + (size_t)at * d, std::min<int64_t>(8192, n - at));
        index->rows_ready(growing->size());
      }
      index->end_build();
      REQUIRE(index->export_summaries(streamed));
      CHECK(same_bits(streamed.rows, want.rows));
      CHECK(same_bits(streamed.coarse_ratio ? streamed.coarse_level().rows : streamed.rows,
                      want.coarse_ratio ? want.coarse_level().rows : want.rows));
    }
  }
}

TEST_CASE("GPU page bounds: calls from four threads at once give the single call's bits") {
  const auto engine = make_gpu_page_bounds(test::cuda_be());
  const int d = 128;
  const int64_t n = 50000, page = 16, pages = (n + page - 1) / page;
  std::vector<std::shared_ptr<RowStore>> stores;
  std::vector<std::vector<float>> want(4), got(4);
  for (int t = 0; t < 4; ++t) {
    stores.push_back(store_of(bound_keys(n, d, 40 + t), d, t % 2 ? DType::F16 : DType::Q8_0, true));
    want[(size_t)t].resize((size_t)pages * 2 * d);
    got[(size_t)t].resize(want[(size_t)t].size());
    engine->bound_pages(*stores[(size_t)t], page, 0, pages, n, want[(size_t)t].data());
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep) engine->bound_pages(*stores[(size_t)t], page, 0, pages, n, got[(size_t)t].data());
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) CHECK(same_bits(got[(size_t)t], want[(size_t)t]));
}
