// The library-backed ANN backends (hnswlib, faiss-hnsw, faiss-ivf) against
// exact search on clustered keys: recall, per-call ef/nprobe, concurrency,
// appends under concurrent search, save/load, memory, dtypes and head sizes.
// The Faiss fast paths are also checked against stock Faiss search (same
// answers), and a `[.perf]` case times them (run it explicitly:
// ./build/tests/test_index_ann "[.perf]").
#include <catch2/catch.hpp>
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVFFlat.h>
#include <faiss/impl/AuxIndexStructures.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "index/faiss_search.h"
#include "index/hnswlib_index.h"
#include "index/kv_index.h"
#include "src/common/timer.h"

using namespace topkv;

namespace {

// Keys: a few Gaussian clusters around a shared non-zero mean (as real keys
// have); queries: near a cluster centre but without the shared mean, so they
// are not distributed like the keys.
struct Clustered {
  int d = 0;
  std::vector<float> centres, mean;
  std::mt19937 rng;
  Clustered(int d, int n_clusters, uint32_t seed) : d(d), rng(seed) {
    std::normal_distribution<float> nd(0.f, 1.f);
    mean.resize((size_t)d);
    for (auto& x : mean) x = 0.7f + 0.5f * nd(rng);
    centres.resize((size_t)n_clusters * d);
    for (auto& x : centres) x = 1.5f * nd(rng);
  }
  std::vector<float> keys(int64_t n) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_int_distribution<int> pick(0, (int)(centres.size() / d) - 1);
    std::vector<float> v((size_t)n * d);
    for (int64_t i = 0; i < n; ++i) {
      int c = pick(rng);
      for (int j = 0; j < d; ++j) v[(size_t)i * d + j] = mean[j] + centres[(size_t)c * d + j] + 0.8f * nd(rng);
    }
    return v;
  }
  std::vector<float> queries(int nq) {
    std::normal_distribution<float> nd(0.f, 1.f);
    std::uniform_int_distribution<int> pick(0, (int)(centres.size() / d) - 1);
    std::vector<float> v((size_t)nq * d);
    for (int g = 0; g < nq; ++g) {
      int c = pick(rng);
      for (int j = 0; j < d; ++j) v[(size_t)g * d + j] = centres[(size_t)c * d + j] + nd(rng);
    }
    return v;
  }
};

std::shared_ptr<RowStore> make_store(const std::vector<float>& rows, int d, DType t = DType::F32) {
  auto s = std::make_shared<RowStore>(d, t);
  s->append_f32(rows.data(), (int64_t)(rows.size() / d));
  return s;
}

// Exact top-k ids of one query over the store (ties: smaller id first).
std::vector<int64_t> exact_topk(const RowStore& s, const float* q, int64_t k) {
  std::vector<std::pair<float, int64_t>> all((size_t)s.size());
  for (int64_t i = 0; i < s.size(); ++i) all[(size_t)i] = {-s.dot(i, q), i};
  k = std::min<int64_t>(k, s.size());
  std::partial_sort(all.begin(), all.begin() + k, all.end());
  std::vector<int64_t> ids;
  for (int64_t t = 0; t < k; ++t) ids.push_back(all[(size_t)t].second);
  std::sort(ids.begin(), ids.end());
  return ids;
}

double overlap(const std::vector<int64_t>& sorted_a, const std::vector<int64_t>& sorted_b) {
  std::vector<int64_t> both;
  std::set_intersection(sorted_a.begin(), sorted_a.end(), sorted_b.begin(), sorted_b.end(), std::back_inserter(both));
  return sorted_b.empty() ? 1.0 : (double)both.size() / (double)sorted_b.size();
}

struct RecallRun {
  double recall = 0;
  int64_t keys_scored = 0;
  std::vector<std::vector<int64_t>> ids;
};

// Mean recall@k of single-query searches against exact search.
RecallRun measure(const KvIndex& idx, const std::vector<float>& queries, const SearchParams& p) {
  const int d = idx.dim();
  const int nq = (int)(queries.size() / d);
  RecallRun run;
  for (int g = 0; g < nq; ++g) {
    auto r = idx.search(queries.data() + (size_t)g * d, 1, p);
    REQUIRE((int64_t)r.ids.size() <= p.k);
    REQUIRE(std::is_sorted(r.ids.begin(), r.ids.end()));
    run.recall += overlap(r.ids, exact_topk(idx.keys(), queries.data() + (size_t)g * d, p.k));
    run.keys_scored += r.stats.keys_scored;
    run.ids.push_back(r.ids);
  }
  run.recall /= nq;
  return run;
}

SearchParams params_k(int64_t k, int ef = 0, int nprobe = 0) {
  SearchParams p;
  p.k = k;
  p.ef = ef;
  p.nprobe = nprobe;
  return p;
}

// The backends under test, at the moderate settings the recall thresholds
// below were measured with.
const std::vector<std::string> kSpecs = {"hnswlib:M=16,efc=100", "faiss-hnsw:M=16,efc=100", "faiss-ivf:nlist=64",
                                         "faiss-ivf:nlist=64,codec=fp16"};
bool is_ivf(const std::string& spec) { return spec.rfind("faiss-ivf", 0) == 0; }

// The per-call knob of each backend: ef for the graphs, nprobe for IVF.
SearchParams knob(const std::string& spec, int64_t k, int value) {
  return is_ivf(spec) ? params_k(k, 0, value) : params_k(k, value, 0);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("topkv_test_ann_" + name)).string();
}

// Parallel builds (TBB for hnswlib, OpenMP for Faiss) are exercised by the
// concurrency tests; the rest build serially, which is reproducible (the
// recall floors are measured on it) and fast on a loaded CI machine, where
// Faiss's many short OpenMP regions wait on descheduled threads.
BuildOptions two_threads() {
  BuildOptions o;
  o.n_threads = 2;
  return o;
}
BuildOptions one_thread() {
  BuildOptions o;
  o.n_threads = 1;
  return o;
}

}  // namespace

TEST_CASE("ANN backends reach their measured recall@10 on clustered keys") {
  Clustered gen(64, 8, 11);
  auto keys = make_store(gen.keys(4000), 64);
  auto queries = gen.queries(100);
  // {ef or nprobe, floor}: floors are the measured recall (in the WARN line) minus a margin.
  const std::vector<std::pair<int, double>> setting_and_floor = {{32, 0.80}, {32, 0.80}, {8, 0.93}, {8, 0.93}};
  for (size_t b = 0; b < kSpecs.size(); ++b) {
    INFO(kSpecs[b]);
    auto idx = KvIndex::create(kSpecs[b], one_thread());
    idx->build(keys);
    auto run = measure(*idx, queries, knob(kSpecs[b], 10, setting_and_floor[b].first));
    WARN(kSpecs[b] << " recall@10 = " << run.recall << ", keys scored/query = " << run.keys_scored / 100);
    CHECK(run.recall >= setting_and_floor[b].second);
    CHECK(run.keys_scored > 0);
    CHECK(run.keys_scored < 100 * 4000);  // it is not a scan
  }
}

TEST_CASE("a larger ef / nprobe reaches the library: more keys scored, recall never lower") {
  Clustered gen(64, 8, 12);
  auto keys = make_store(gen.keys(3000), 64);
  auto queries = gen.queries(60);
  for (const auto& spec : kSpecs) {
    INFO(spec);
    auto idx = KvIndex::create(spec, one_thread());
    idx->build(keys);
    const std::vector<int> values = is_ivf(spec) ? std::vector<int>{1, 2, 4, 8, 16, 64}
                                                 : std::vector<int>{10, 20, 40, 80, 160, 3000 + 16};
    std::vector<RecallRun> runs;
    for (int v : values) {
      runs.push_back(measure(*idx, queries, knob(spec, 10, v)));
      WARN(spec << " setting " << v << ": recall@10 " << runs.back().recall << ", keys scored/query "
                << runs.back().keys_scored / 60);
    }
    for (size_t i = 1; i < runs.size(); ++i) {
      INFO("setting " << values[i]);
      CHECK(runs[i].keys_scored > runs[i - 1].keys_scored);
      CHECK(runs[i].recall >= runs[i - 1].recall - 0.005);  // HNSW: per query not monotone, on average it is
    }
    CHECK(runs.front().ids != runs.back().ids);
    CHECK(runs.back().recall > runs.front().recall);
    if (spec == "faiss-ivf:nlist=64") CHECK(runs.back().recall == 1.0);  // nprobe = nlist: every list, exact
    // fp16 codes pick the k candidates: near-ties at the k-th place may differ
    if (spec == "faiss-ivf:nlist=64,codec=fp16") CHECK(runs.back().recall >= 0.99);
    // HNSW over inner product cannot reach keys that no other key links to, even
    // with ef > n: on this data about 30% of the keys (measured with M=16) and a
    // few per cent of the true top-10. Its ceiling is below 1.
    if (!is_ivf(spec)) CHECK(runs.back().recall >= 0.85);
  }
}

TEST_CASE("faiss-ivf: automatic nlist, training on a max_train sample, nprobe clipped to nlist") {
  Clustered gen(32, 8, 23);
  auto keys = make_store(gen.keys(4000), 32);
  auto q = gen.queries(20);
  // auto nlist = min(4 sqrt(n), n / 39) = min(253, 102); summaries_scored counts centroids per query
  auto a = KvIndex::create("faiss-ivf", one_thread());
  a->build(keys);
  auto r = a->search(q.data(), 2, params_k(10, 0, 5));
  CHECK(r.stats.summaries_scored == 2 * 102);
  // k-means on 300 sampled keys still files every key: probing all lists is exact
  auto b = KvIndex::create("faiss-ivf:nlist=20,max_train=300", one_thread());
  b->build(keys);
  for (int g = 0; g < 20; ++g) {
    auto all = b->search(q.data() + (size_t)g * 32, 1, params_k(10, 0, 1 << 20));
    CHECK(all.ids == exact_topk(*keys, q.data() + (size_t)g * 32, 10));
    CHECK(all.stats.keys_scored == 4000);
    CHECK(all.stats.summaries_scored == 20);
  }
  auto run = measure(*b, q, params_k(10, 0, 4));
  WARN("faiss-ivf nlist=20 trained on 300 keys, nprobe=4: recall@10 " << run.recall);
  CHECK(run.recall >= 0.8);
}

TEST_CASE("faiss_hnsw_search returns what IndexHNSW::search returns when ef == hnsw.efSearch") {
  Clustered gen(32, 6, 13);
  const int n = 2000, d = 32, nq = 40, k = 10;
  auto x = gen.keys(n);
  auto q = gen.queries(nq);
  faiss::IndexHNSWFlat ref(d, 8, faiss::METRIC_INNER_PRODUCT);
  ref.hnsw.efConstruction = 40;
  ref.add(n, x.data());
  for (int ef : {10, 16, 50, 200}) {
    ref.hnsw.efSearch = ef;
    std::vector<float> D((size_t)nq * k);
    std::vector<faiss::Index::idx_t> I((size_t)nq * k);
    ref.search(nq, q.data(), k, D.data(), I.data());
    FaissSearchCounts counts;
    std::vector<int64_t> ids;
    std::vector<float> scores;
    for (int g = 0; g < nq; ++g) {
      faiss_hnsw_search(ref, q.data() + (size_t)g * d, k, ef, ids, scores, counts);
      REQUIRE(ids.size() == (size_t)k);
      for (int t = 0; t < k; ++t) {
        CHECK(ids[(size_t)t] == I[(size_t)g * k + t]);
        CHECK(scores[(size_t)t] == D[(size_t)g * k + t]);
      }
    }
    CHECK(counts.keys_scored > 0);
  }
}

TEST_CASE("faiss_ivf_search returns what IndexIVF::search returns for the same nprobe") {
  Clustered gen(48, 6, 14);
  const int n = 3000, d = 48, nq = 30, k = 10;
  auto x = gen.keys(n);
  auto q = gen.queries(nq);
  faiss::IndexFlatIP coarse(d);
  faiss::IndexIVFFlat ref(&coarse, d, 40, faiss::METRIC_INNER_PRODUCT);
  ref.train(n, x.data());
  ref.add(n, x.data());
  for (int nprobe : {1, 3, 40, 1000}) {
    faiss::SearchParametersIVF sp;
    sp.nprobe = (size_t)std::min(nprobe, 40);
    std::vector<float> D((size_t)nq * k), D2((size_t)nq * k);
    std::vector<faiss::Index::idx_t> I((size_t)nq * k);
    std::vector<int64_t> I2((size_t)nq * k);
    ref.search(nq, q.data(), k, D.data(), I.data(), &sp);
    FaissSearchCounts counts;
    faiss_ivf_search(ref, q.data(), nq, k, nprobe, I2.data(), D2.data(), counts);
    for (size_t i = 0; i < I.size(); ++i) {
      CHECK(I2[i] == I[i]);
      CHECK(D2[i] == Approx(D[i]).epsilon(1e-5));
    }
    CHECK(counts.summaries_scored == 40 * nq);
    if (nprobe >= 40) CHECK(counts.keys_scored == (int64_t)n * nq);
  }
}

TEST_CASE("concurrent searches with different ef / nprobe give the sequential answers") {
  Clustered gen(64, 8, 15);
  auto keys = make_store(gen.keys(2500), 64);
  auto queries = gen.queries(24);
  const int d = 64, nq = 24;
  for (const auto& spec : kSpecs) {
    INFO(spec);
    auto idx = KvIndex::create(spec, two_threads());
    idx->build(keys);
    const std::vector<int> values = is_ivf(spec) ? std::vector<int>{1, 3, 9, 27} : std::vector<int>{10, 25, 60, 150};
    std::vector<std::vector<std::vector<int64_t>>> expected(values.size());
    for (size_t t = 0; t < values.size(); ++t)
      for (int g = 0; g < nq; ++g) expected[t].push_back(idx->search(queries.data() + g * d, 1, knob(spec, 10, values[t])).ids);
    std::atomic<int> mismatches{0};
    std::vector<std::thread> threads;
    for (size_t t = 0; t < values.size(); ++t)
      threads.emplace_back([&, t] {
        for (int rep = 0; rep < 5; ++rep)
          for (int g = 0; g < nq; ++g)
            if (idx->search(queries.data() + g * d, 1, knob(spec, 10, values[t])).ids != expected[t][(size_t)g])
              ++mismatches;
      });
    for (auto& th : threads) th.join();
    CHECK(mismatches == 0);
    CHECK(expected.front() != expected.back());  // the settings really differ
  }
}

TEST_CASE("appends folded in with add_new_rows while other threads search are found") {
  const int d = 64;
  Clustered gen(d, 8, 16);
  for (const auto& spec : kSpecs) {
    INFO(spec);
    auto keys = make_store(gen.keys(1500), d);
    auto idx = KvIndex::create(spec, two_threads());
    idx->build(keys);
    auto queries = gen.queries(8);
    std::atomic<bool> done{false};
    std::atomic<int64_t> searches{0}, bad{0};
    std::vector<std::thread> readers;
    for (int t = 0; t < 2; ++t)
      readers.emplace_back([&, t] {
        SearchParams p = knob(spec, 10, is_ivf(spec) ? 4 : 40);
        for (int i = 0; !done || i < 3; ++i) {
          const float* q = queries.data() + (size_t)((i + t) % 8) * d;
          int64_t n_before = idx->size();
          auto r = idx->search(q, 1, p);
          if (r.ids.size() != 10 || r.ids.back() >= idx->size() || r.ids.back() < 0 || n_before < 1500) ++bad;
          // every returned score is the exact q·k from the store
          for (size_t j = 0; j < r.ids.size(); ++j)
            if (r.scores[j] != idx->keys().dot(r.ids[j], q)) ++bad;
          ++searches;
          // A decode step's searches come with gaps; back-to-back readers would
          // starve the writer (std::shared_mutex prefers readers on glibc).
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      });
    // The writer appends batches (the store allows one writer beside readers)
    // and folds them in; each batch carries a key planted for query 0.
    std::vector<int64_t> planted;
    for (int batch = 0; batch < 12; ++batch) {
      auto rows = gen.keys(97 + batch * 13);
      for (int j = 0; j < d; ++j) rows[(size_t)j] = queries[(size_t)j] * (30.f + (float)batch);
      planted.push_back(keys->size());
      keys->append_f32(rows.data(), (int64_t)(rows.size() / d));
      idx->add_new_rows();
    }
    done = true;
    for (auto& th : readers) th.join();

    CHECK(bad == 0);
    CHECK(searches > 0);
    REQUIRE(idx->indexed_rows() == keys->size());
    auto r = idx->search(queries.data(), 1, knob(spec, 12, is_ivf(spec) ? 64 : 100));
    CHECK(r.stats.tail_scanned == 0);
    for (int64_t id : planted) CHECK(std::binary_search(r.ids.begin(), r.ids.end(), id));
  }
}

TEST_CASE("save then load gives identical results, f16 keys and GQA included") {
  const int d = 128;
  Clustered gen(d, 6, 17);
  auto keys = make_store(gen.keys(1200), d, DType::F16);
  auto queries = gen.queries(12);
  for (const auto& spec : kSpecs) {
    INFO(spec);
    auto idx = KvIndex::create(spec, one_thread());
    idx->build(keys);
    const std::string path = temp_path("save.idx");
    idx->save(path);
    auto loaded = KvIndex::load(path, keys, nullptr, one_thread());
    CHECK(loaded->name() == idx->name());
    CHECK(loaded->indexed_rows() == idx->indexed_rows());
    for (int g = 0; g < 12; g += 4) {
      for (GqaMode mode : {GqaMode::Union, GqaMode::Mean}) {
        SearchParams p = knob(spec, 10, is_ivf(spec) ? 5 : 30);
        p.gqa = mode;
        auto a = idx->search(queries.data() + (size_t)g * d, 4, p);
        auto b = loaded->search(queries.data() + (size_t)g * d, 4, p);
        CHECK(a.ids == b.ids);
        CHECK(a.scores == b.scores);
        CHECK(a.stats.keys_scored == b.stats.keys_scored);
      }
    }
    // the loaded index keeps growing like the original
    auto more = gen.keys(50);
    keys->append_f32(more.data(), 50);
    CHECK(loaded->add_new_rows() == 50);
    CHECK(idx->add_new_rows() == 50);
    auto a = idx->search(queries.data(), 1, knob(spec, 10, is_ivf(spec) ? 64 : 400));
    auto b = loaded->search(queries.data(), 1, knob(spec, 10, is_ivf(spec) ? 64 : 400));
    CHECK(a.ids == b.ids);
    std::filesystem::remove(path);
  }
}

namespace {
std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
}  // namespace

TEST_CASE("the embedded hnswlib graph is hnswlib's saveIndex layout, and loadIndex files import") {
  const int d = 40;
  Clustered gen(d, 5, 18);
  auto keys = make_store(gen.keys(700), d);
  auto idx = KvIndex::create("hnswlib:M=8,efc=50", two_threads());
  idx->build(keys);
  const std::string ours = temp_path("graph.idx"), native = temp_path("graph.hnswlib");
  idx->save(ours);
  export_hnswlib_graph(*idx, native);
  auto a = read_bytes(ours), b = read_bytes(native);
  // topkv file = header, flag, hnswlib's bytes, 8-byte checksum
  REQUIRE(a.size() > b.size() + 8);
  CHECK(std::equal(b.begin(), b.end(), a.end() - 8 - (std::ptrdiff_t)b.size()));

  // hnswlib's loadIndex() path and topkv's reader search alike
  auto imported = import_hnswlib_graph(native, keys, "M=8,efc=50");
  auto loaded = KvIndex::load(ours, keys);
  CHECK(imported->indexed_rows() == 700);
  auto q = gen.queries(20);
  for (int t = 0; t < 20; ++t) {
    auto p = params_k(10, 40);
    auto x = idx->search(q.data() + (size_t)t * d, 1, p);
    CHECK(imported->search(q.data() + (size_t)t * d, 1, p).ids == x.ids);
    CHECK(loaded->search(q.data() + (size_t)t * d, 1, p).ids == x.ids);
  }
  CHECK(imported->add_new_rows() == 0);

  CHECK_THROWS_AS(import_hnswlib_graph(native, make_store(gen.keys(700), d), "M=16"), Error);  // M differs
  Clustered wide(d + 4, 2, 3);
  CHECK_THROWS_AS(import_hnswlib_graph(native, make_store(wide.keys(700), d + 4), "M=8"), Error);
  CHECK_THROWS_AS(import_hnswlib_graph(native, make_store(gen.keys(300), d), "M=8"), Error);  // too few rows
  CHECK_THROWS_AS(import_hnswlib_graph(temp_path("missing.hnswlib"), keys, "M=8"), Error);
  auto flat = KvIndex::create("flat");
  flat->build(keys);
  CHECK_THROWS_AS(export_hnswlib_graph(*flat, native), Error);
  std::filesystem::remove(ours);
  std::filesystem::remove(native);
}

TEST_CASE("memory reports show each library's own copy of the keys") {
  const int d = 64, n = 1000;
  Clustered gen(d, 4, 19);
  auto keys = make_store(gen.keys(n), d, DType::F16);
  for (const auto& spec : kSpecs) {
    INFO(spec);
    auto idx = KvIndex::create(spec, one_thread());
    CHECK(idx->memory().owned() == 0);
    idx->build(keys);
    auto m = idx->memory();
    const size_t elem = spec.find("fp16") != std::string::npos ? 2 : 4;
    CHECK(m.key_copy_bytes >= (size_t)n * d * elem);
    CHECK(m.key_copy_bytes <= (size_t)n * d * elem * 2);
    CHECK(m.structure_bytes > 0);
    CHECK(m.shared_store_bytes == (size_t)n * d * 2);
    CHECK(m.note.find("copy") != std::string::npos);
  }
}

TEST_CASE("head_dim 64/128/256 (and odd 3, 20) with f16/bf16/f32 keys, tiny sizes, k > n") {
  const std::vector<std::pair<int, DType>> geometries = {
      {64, DType::F16}, {128, DType::BF16}, {256, DType::F32}, {3, DType::F32}, {20, DType::F16}};
  for (auto [d, t] : geometries) {
    {
      for (int n : {1, 2, 37, 301}) {
        Clustered gen(d, 3, (uint32_t)(d + n));
        auto keys = make_store(gen.keys(n), d, t);
        auto q = gen.queries(3);
        for (const auto& spec : kSpecs) {
          INFO(spec << " d=" << d << " " << dtype_name(t) << " n=" << n);
          auto idx = KvIndex::create(spec, one_thread());
          idx->build(keys);
          // exhaustive settings: the exact top-k (k > n returns every key);
          // HNSW misses keys without in-links beyond tiny n (see above)
          for (int64_t k : {int64_t(1), int64_t(10), int64_t(n + 5)}) {
            const double floor = is_ivf(spec) || n <= 37 || k > n ? 1.0 : 0.75;
            SearchParams p = params_k(k, n + 16, 1 << 20);
            auto r = idx->search(q.data(), 3, p);
            std::vector<int64_t> want;
            for (int g = 0; g < 3; ++g) {
              auto e = exact_topk(*keys, q.data() + (size_t)g * d, k);
              want.insert(want.end(), e.begin(), e.end());
            }
            std::sort(want.begin(), want.end());
            want.erase(std::unique(want.begin(), want.end()), want.end());
            if (floor == 1.0)
              CHECK(r.ids == want);
            else
              CHECK(overlap(r.ids, want) >= floor);
          }
        }
      }
    }
  }
}

TEST_CASE("an index built on an empty store starts with the first add_new_rows") {
  const int d = 64;
  Clustered gen(d, 3, 20);
  for (const auto& spec : kSpecs) {
    INFO(spec);
    auto keys = std::make_shared<RowStore>(d, DType::F32);
    auto idx = KvIndex::create(spec, one_thread());
    idx->build(keys);
    CHECK(idx->indexed_rows() == 0);
    CHECK(idx->memory().owned() == 0);
    auto rows = gen.keys(1);
    keys->append_f32(rows.data(), 1);
    CHECK(idx->add_new_rows() == 1);
    rows = gen.keys(200);
    keys->append_f32(rows.data(), 200);
    CHECK(idx->add_new_rows() == 200);
    auto q = gen.queries(1);
    auto r = idx->search(q.data(), 1, params_k(5, 500, 1 << 20));
    CHECK(r.ids == exact_topk(*keys, q.data(), 5));
    // a saved empty index loads as empty
    auto empty_keys = std::make_shared<RowStore>(d, DType::F32);
    auto empty = KvIndex::create(spec);
    empty->build(empty_keys);
    const std::string path = temp_path("empty.idx");
    empty->save(path);
    auto loaded = KvIndex::load(path, empty_keys);
    CHECK(loaded->indexed_rows() == 0);
    std::filesystem::remove(path);
  }
}

TEST_CASE("bad backend parameters are Errors that say what to use") {
  for (const char* bad : {"hnswlib:M=1", "hnswlib:efc=0", "hnswlib:ef=10", "faiss-hnsw:M=100000", "faiss-hnsw:efc=-3",
                          "faiss-ivf:nlist=-1", "faiss-ivf:nprobe=0", "faiss-ivf:codec=pq", "faiss-ivf:max_train=-5",
                          "faiss-ivf:nlists=8"}) {
    INFO(bad);
    CHECK_THROWS_AS(KvIndex::create(bad), Error);
  }
  // nlist larger than the keys is clipped to them, not an error
  Clustered gen(64, 3, 21);
  auto keys = make_store(gen.keys(5), 64);
  auto idx = KvIndex::create("faiss-ivf:nlist=4096");
  idx->build(keys);
  auto q = gen.queries(1);
  CHECK(idx->search(q.data(), 1, params_k(5)).ids == exact_topk(*keys, q.data(), 5));
}

// ---- timing: stock Faiss search vs the per-call paths (not run by default) ----

namespace {
// Median wall time of one call, in microseconds: robust to other load on a
// shared machine (each call is timed alone; calls take tens of us or more).
template <typename F>
double us_per_call(int reps, F&& f) {
  f();  // warm
  std::vector<double> t((size_t)reps);
  for (auto& x : t) {
    Timer one;
    f();
    x = one.us();
  }
  return percentile(t, 50);
}
}  // namespace

TEST_CASE("single-query overhead of stock Faiss search vs topkv's paths", "[.perf]") {
  // TOPKV_PERF_N keys (default 100000), d = 64; the HNSW is built with M=16 and
  // efc=TOPKV_PERF_EFC (default 40) so the build stays short on a small
  // machine; TOPKV_PERF_IVF=0 skips the IVF half. The stock path's extra cost
  // does not depend on graph quality: it is the OpenMP region and a visited
  // table of n bytes per thread per call.
  auto env_int = [](const char* name, int64_t def) {
    const char* v = std::getenv(name);
    return v ? std::atoll(v) : def;
  };
  const int64_t n = env_int("TOPKV_PERF_N", 100000);
  const int efc = (int)env_int("TOPKV_PERF_EFC", 40);
  const int d = 64, k = 10;
  Clustered gen(d, 16, 22);
  auto x = gen.keys(n);
  auto q = gen.queries(64);
  std::printf("n=%lld d=%d, OpenMP max threads %d\n", (long long)n, d, omp_get_max_threads());

  // What IndexHNSW::search pays per call and thread before any distance: a
  // fresh VisitedTable of ntotal bytes.
  for (int64_t size : {n, int64_t(1000000), int64_t(10000000)})
    std::printf("VisitedTable(%lld): %.1f us\n", (long long)size,
                us_per_call(30, [&] { faiss::VisitedTable vt((int)size); vt.set(1); }));

  Timer build;
  faiss::IndexHNSWFlat hnsw(d, 16, faiss::METRIC_INNER_PRODUCT);
  hnsw.hnsw.efConstruction = efc;
  hnsw.add(n, x.data());
  std::printf("faiss-hnsw M=16 efc=%d build %.1f s\n", efc, build.seconds());
  for (int ef : {16, 64, 256}) {
    hnsw.hnsw.efSearch = ef;
    std::vector<float> D(k);
    std::vector<faiss::Index::idx_t> I(k);
    int i = 0;
    double stock = us_per_call(200, [&] { hnsw.search(1, q.data() + (size_t)(i++ % 64) * d, k, D.data(), I.data()); });
    FaissSearchCounts c;
    std::vector<int64_t> ids;
    std::vector<float> sc;
    double ours = us_per_call(200, [&] { faiss_hnsw_search(hnsw, q.data() + (size_t)(i++ % 64) * d, k, ef, ids, sc, c); });
    std::printf("HNSW ef=%-4d IndexHNSW::search %9.1f us/query   faiss_hnsw_search %7.1f us/query\n", ef, stock, ours);
  }

  if (env_int("TOPKV_PERF_IVF", 1) == 0) return;
  build.reset();
  faiss::IndexFlatIP coarse(d);
  const int nlist = (int)std::lround(4 * std::sqrt((double)n));
  faiss::IndexIVFFlat ivf(&coarse, d, (size_t)nlist, faiss::METRIC_INNER_PRODUCT);
  ivf.train(std::min<int64_t>(n, 64 * nlist), x.data());
  ivf.add(n, x.data());
  std::printf("faiss-ivf nlist=%d build %.1f s\n", nlist, build.seconds());
  for (int nprobe : {1, 8, 32}) {
    faiss::SearchParametersIVF sp;
    sp.nprobe = (size_t)nprobe;
    std::vector<float> D(k);
    std::vector<faiss::Index::idx_t> I(k);
    std::vector<int64_t> I2(k);
    int i = 0;
    double stock = us_per_call(300, [&] { ivf.search(1, q.data() + (size_t)(i++ % 64) * d, k, D.data(), I.data(), &sp); });
    FaissSearchCounts c;
    double ours = us_per_call(300, [&] { faiss_ivf_search(ivf, q.data() + (size_t)(i++ % 64) * d, 1, k, nprobe, I2.data(), D.data(), c); });
    std::printf("IVF nprobe=%-3d IndexIVF::search %9.1f us/query   faiss_ivf_search %7.1f us/query\n", nprobe, stock, ours);
  }
}
