// The per-call Faiss search paths (index/faiss_search.h) against stock Faiss
// search on the same index: identical answers when given the same settings.
// A `[.perf]` case times both (not run by default:
//   ./build/tests/test_faiss_search "[.perf]", TOPKV_PERF_N=... to resize).
#include <catch2/catch.hpp>
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVFFlat.h>
#include <faiss/impl/AuxIndexStructures.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "index/faiss_search.h"
#include "src/common/timer.h"
#include "tests/clustered_keys.h"

using namespace topkv;
using topkv::testing::Clustered;

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
    std::printf("VisitedTable(%lld): %.1f us\n", (long long)size, us_per_call(30, [&] {
                  faiss::VisitedTable vt((int)size);
                  asm volatile("" : : "r"(vt.visited.data()) : "memory");  // keep the table
                }));

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
