#include <catch2/catch.hpp>
#include <algorithm>
#include <random>

#include "index/kv_index.h"

using namespace topkv;

TEST_CASE("flat index returns the exact top-k, also for rows appended after build") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int d = 64, n = 1000;
  auto K = std::make_shared<RowStore>(d, DType::F32);
  std::vector<float> rows((size_t)n * d);
  for (auto& x : rows) x = nd(rng);
  K->append_f32(rows.data(), n);
  auto idx = KvIndex::create("flat");
  idx->build(K);
  std::vector<float> q(2 * d);
  for (auto& x : q) x = nd(rng);
  SearchParams p;
  p.k = 10;
  p.n_threads = 2;
  auto r = idx->search(q.data(), 2, p);
  for (int g = 0; g < 2; ++g) {
    std::vector<std::pair<float, int64_t>> all;
    for (int i = 0; i < n; ++i) all.push_back({K->dot(i, q.data() + g * d), i});
    std::sort(all.rbegin(), all.rend());
    for (int t = 0; t < 10; ++t) REQUIRE(std::binary_search(r.ids.begin(), r.ids.end(), all[t].second));
  }
  REQUIRE(r.scores.size() == 2 * r.ids.size());
  // append a key that must win, search before and after folding it in
  std::vector<float> big(d);
  for (int j = 0; j < d; ++j) big[j] = q[j] * 100.f;
  K->append_f32(big.data(), 1);
  auto r2 = idx->search(q.data(), 1, p);
  REQUIRE(std::binary_search(r2.ids.begin(), r2.ids.end(), (int64_t)n));
  CHECK(r2.stats.tail_scanned == 1);
  CHECK(idx->add_new_rows() == 1);
  auto r3 = idx->search(q.data(), 1, p);
  REQUIRE(std::binary_search(r3.ids.begin(), r3.ids.end(), (int64_t)n));
  CHECK(r3.stats.tail_scanned == 0);
}
