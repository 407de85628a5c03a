// The summary backends (quest, centroid, multipole) on keys with structure,
// where their approximations are meant to work: keys drawn around topic
// centres plus a shared offset, in sticky runs (neighbouring tokens share a
// topic, so Quest's pages are meaningful), and queries from a shifted
// distribution (the query/key gap of real attention). Checks the recall and
// attention mass reached at a moderate budget, the hierarchical lookup's
// saving, threshold mode, the multipole far-field approximation, and each
// backend's summaries against a plain reference computed here.
#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include <fmt/format.h>

#include "offload/partial_attention.h"
#include "index/ann_util.h"
#include "index/kmeans.h"
#include "index/kv_index.h"

using namespace topkv;

namespace {

struct Clustered {
  int d = 128, dv = 96;
  int64_t n = 0;
  std::shared_ptr<RowStore> keys, values;
  std::vector<float> queries;  // nq x d
  int nq = 0;
  float scale() const { return 1.f / std::sqrt((float)d); }
};

Clustered make_clustered(int64_t n, int nq, uint64_t seed, int topics = 64) {
  Clustered c;
  c.n = n;
  c.nq = nq;
  const int d = c.d, dv = c.dv;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::uniform_real_distribution<float> u01(0.f, 1.f);
  auto gauss = [&](int m, float s) {
    std::vector<float> v((size_t)m);
    for (auto& x : v) x = s * nd(rng);
    return v;
  };
  auto offset = gauss(d, 1.5f), shift = gauss(d, 1.0f);
  std::vector<std::vector<float>> centre, vcentre;
  for (int t = 0; t < topics; ++t) {
    centre.push_back(gauss(d, 1.f));
    vcentre.push_back(gauss(dv, 1.f));
  }
  c.keys = std::make_shared<RowStore>(d, DType::F16);
  c.values = std::make_shared<RowStore>(dv, DType::F16);
  std::vector<float> k((size_t)d), v((size_t)dv);
  int topic = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (u01(rng) < 0.05f) topic = (int)(rng() % topics);  // runs of ~20 tokens
    for (int j = 0; j < d; ++j) k[(size_t)j] = offset[(size_t)j] + centre[(size_t)topic][(size_t)j] + 1.1f * nd(rng);
    for (int j = 0; j < dv; ++j) v[(size_t)j] = vcentre[(size_t)topic][(size_t)j] + 0.5f * nd(rng);
    c.keys->append_f32(k.data(), 1);
    c.values->append_f32(v.data(), 1);
  }
  // Queries: a blend of two topics, off the key distribution by a fixed shift.
  c.queries.resize((size_t)nq * d);
  for (int g = 0; g < nq; ++g) {
    int a = (int)(rng() % topics), b = (int)(rng() % topics);
    float w = 0.5f + 0.5f * u01(rng);
    for (int j = 0; j < d; ++j)
      c.queries[(size_t)g * d + j] = 0.9f * (w * centre[(size_t)a][(size_t)j] + (1 - w) * centre[(size_t)b][(size_t)j]) +
                                     shift[(size_t)j] + 0.8f * nd(rng);
  }
  return c;
}

// One build thread for the large data (Faiss's OpenMP workers and OpenBLAS's
// threads fight over CI's two cores); the small reference tests build with two.
BuildOptions opts(int threads = 1) {
  BuildOptions o;
  o.n_threads = threads;
  o.seed = 5;
  return o;
}

std::unique_ptr<KvIndex> build(const std::string& spec, const Clustered& c) {
  auto idx = KvIndex::create(spec, opts());
  idx->build(c.keys, idx->needs_values() ? c.values : nullptr);
  return idx;
}

// One data set for the quality tests, each index built once (k-means is the
// slow part of this file).
const Clustered& data() {
  static const Clustered c = make_clustered(8192, 32, 11);
  return c;
}
const KvIndex& built(const std::string& spec) {
  static std::map<std::string, std::unique_ptr<KvIndex>> cache;
  auto& idx = cache[spec];
  if (!idx) idx = build(spec, data());
  return *idx;
}

// Exact softmax weights of every key for query g, and its top-K ids.
struct Truth {
  std::vector<std::vector<double>> p;       // [g][i]
  std::vector<std::vector<int64_t>> top;    // [g] ids of the K best
};

Truth truth(const Clustered& c, int K) {
  Truth t;
  for (int g = 0; g < c.nq; ++g) {
    const float* q = c.queries.data() + (size_t)g * c.d;
    std::vector<double> s((size_t)c.n);
    for (int64_t i = 0; i < c.n; ++i) s[(size_t)i] = (double)c.keys->dot(i, q) * c.scale();
    double m = *std::max_element(s.begin(), s.end()), z = 0;
    for (auto& x : s) z += std::exp(x - m);
    std::vector<double> p((size_t)c.n);
    for (int64_t i = 0; i < c.n; ++i) p[(size_t)i] = std::exp(s[(size_t)i] - m) / z;
    std::vector<int64_t> ids((size_t)c.n);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + K, ids.end(), [&](int64_t a, int64_t b) { return s[(size_t)a] > s[(size_t)b]; });
    ids.resize((size_t)K);
    t.p.push_back(std::move(p));
    t.top.push_back(std::move(ids));
  }
  return t;
}

struct Quality {
  double recall = 0, mass = 0, tokens = 0, summaries = 0;
};

// Mean over the queries (each searched alone) of recall@K and attention mass.
Quality measure(const KvIndex& idx, const Clustered& c, const Truth& t, const SearchParams& p) {
  Quality qa;
  for (int g = 0; g < c.nq; ++g) {
    auto r = idx.search(c.queries.data() + (size_t)g * c.d, 1, p);
    int64_t hit = 0;
    for (int64_t id : t.top[(size_t)g]) hit += std::binary_search(r.ids.begin(), r.ids.end(), id);
    double mass = 0;
    for (int64_t id : r.ids) mass += t.p[(size_t)g][(size_t)id];
    qa.recall += (double)hit / (double)t.top[(size_t)g].size() / c.nq;
    qa.mass += mass / c.nq;
    qa.tokens += (double)r.ids.size() / c.nq;
    qa.summaries += (double)r.stats.summaries_scored / c.nq;
  }
  return qa;
}

void report(const std::string& what, const Quality& q) {
  std::printf("  %-34s recall@32 %.3f  mass %.3f  tokens %.0f  summaries scored %.0f\n", what.c_str(), q.recall,
              q.mass, q.tokens, q.summaries);
}

}  // namespace

TEST_CASE("clustered keys: each summary backend reaches high recall and attention mass at a 6% budget") {
  const auto& c = data();
  static const Truth t = truth(c, 32);
  SearchParams p;
  p.k = 512;  // 6.25% of the keys
  p.n_threads = 2;
  std::printf("clustered keys n=%lld d=%d, budget k=%lld:\n", (long long)c.n, c.d, (long long)p.k);
  struct Expect {
    const char* spec;
    double recall, mass;
  };
  // Floors set below the measured values (printed; see the commit message) with margin.
  for (auto e : {Expect{"quest", 0.65, 0.6}, Expect{"centroid", 0.9, 0.8}, Expect{"centroid:levels=2", 0.85, 0.75}, Expect{"centroid:block=2048", 0.85, 0.75},
                 Expect{"multipole", 0.9, 0.8}}) {
    auto q = measure(built(e.spec), c, t, p);
    report(e.spec, q);
    INFO(e.spec);
    CHECK(q.recall >= e.recall);
    CHECK(q.mass >= e.mass);
    CHECK(q.tokens >= (double)p.k);
    CHECK(q.tokens <= 1.5 * (double)p.k);
  }
}

TEST_CASE("clustered keys: the Lloyd k-means engine (the GPU build's twin) builds indexes as good as Faiss's") {
  // BuildOptions::kmeans replaces Faiss's k-means in the blockwise build;
  // LloydKMeans is what the GPU engine computes (gpu/gpu_kmeans.h), so its
  // indexes must reach the same recall and attention mass as the default's.
  const auto& c = data();
  static const Truth t = truth(c, 32);
  SearchParams p;
  p.k = 512;
  p.n_threads = 2;
  for (const char* spec : {"multipole", "centroid:block=2048", "multipole:levels=2"}) {
    INFO(spec);
    BuildOptions o = opts();
    o.kmeans = std::make_shared<LloydKMeans>();
    auto lloyd = KvIndex::create(spec, o);
    lloyd->build(c.keys, lloyd->needs_values() ? c.values : nullptr);
    const Quality faiss = measure(built(spec), c, t, p), ours = measure(*lloyd, c, t, p);
    report(std::string(spec) + " (faiss)", faiss);
    report(std::string(spec) + " (lloyd)", ours);
    CHECK(ours.recall >= faiss.recall - 0.03);
    CHECK(ours.mass >= faiss.mass - 0.03);
    CHECK(ours.tokens <= 1.5 * (double)p.k);
    // The same structure: a one-level lookup scores every cluster, and both
    // builds keep as many within 10% (empty ones are dropped either way).
    if (std::string(spec).find("levels=2") == std::string::npos)
      CHECK(std::abs(ours.summaries - faiss.summaries) <= 0.1 * faiss.summaries);
  }
}

TEST_CASE("clustered keys: the hierarchical lookup scores fewer centroids at close recall") {
  const auto& c = data();
  static const Truth t = truth(c, 32);
  SearchParams p;
  p.k = 512;
  auto a = measure(built("centroid"), c, t, p), b = measure(built("centroid:levels=2"), c, t, p);
  CHECK(b.summaries < 0.6 * a.summaries);
  CHECK(b.recall >= a.recall - 0.1);
  CHECK(b.mass >= a.mass - 0.1);
}

TEST_CASE("clustered keys: threshold mode keeps fewer tokens as the threshold rises") {
  const auto& c = data();
  static const Truth t = truth(c, 32);
  for (const char* spec : {"centroid", "centroid:levels=2", "multipole"}) {
    INFO(spec);
    const auto& idx = built(spec);
    double last_tokens = 1e30;
    std::vector<double> tokens;
    for (double thr : {1e-6, 1e-5, 1e-4, 1e-3, 1e-2}) {
      SearchParams p;
      p.threshold = thr;
      auto q = measure(idx, c, t, p);
      report(std::string(spec) + " threshold " + fmt::format("{:g}", thr), q);
      CHECK(q.tokens <= last_tokens);
      last_tokens = q.tokens;
      tokens.push_back(q.tokens);
      if (thr == 1e-4) CHECK(q.mass >= 0.8);
    }
    CHECK(tokens.front() > 10 * tokens.back());
    // a threshold outside [0, 1] is refused
    SearchParams bad;
    bad.threshold = 1.5;
    CHECK_THROWS_WITH(idx.search(c.queries.data(), 1, bad), Catch::Contains("threshold"));
  }
}

TEST_CASE("clustered keys: half the context folded in by appends is found as well as a full build finds it") {
  const auto& c = data();
  static const Truth t = truth(c, 32);
  // Stores holding the first half, an index built on it, then the rest appended in chunks.
  Clustered half = c;
  half.keys = std::make_shared<RowStore>(c.d, DType::F16);
  half.values = std::make_shared<RowStore>(c.dv, DType::F16);
  auto copy_rows = [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      half.keys->append_raw(c.keys->row(i), 1);
      half.values->append_raw(c.values->row(i), 1);
    }
  };
  copy_rows(0, c.n / 2);
  SearchParams p;
  p.k = 512;
  for (const char* spec : {"quest", "centroid", "centroid:levels=2", "multipole"}) {
    INFO(spec);
    auto idx = build(spec, half);
    for (int64_t lo = c.n / 2; lo < c.n; lo += 1000) {
      copy_rows(lo, std::min(c.n, lo + 1000));
      idx->add_new_rows();
    }
    REQUIRE(idx->indexed_rows() == c.n);
    auto full = measure(built(spec), c, t, p), grown = measure(*idx, c, t, p);
    report(std::string(spec) + " (half appended)", grown);
    CHECK(grown.recall >= full.recall - 0.1);
    CHECK(grown.mass >= full.mass - 0.1);
    half.keys = std::make_shared<RowStore>(c.d, DType::F16);
    half.values = std::make_shared<RowStore>(c.dv, DType::F16);
    copy_rows(0, c.n / 2);
  }
}

TEST_CASE("multipole: exact attention = retrieved part (+) far-cluster part, closer than the retrieved part alone") {
  const auto& c = data();
  const float scale = c.scale();
  // The plain lookup (rerank=1): with rerank a kept cluster's other rows are dropped.
  for (const char* spec : {"multipole:rerank=1", "multipole:levels=2"}) {
    const auto& idx = built(spec);
    SearchParams p;
    p.k = 164;  // 2% of the keys
    p.scale = scale;
    double err_near = 0, err_both = 0, norm = 0;
    for (int g = 0; g < c.nq; ++g) {
      const float* q = c.queries.data() + (size_t)g * c.d;
      std::vector<float> exact((size_t)c.dv), near((size_t)c.dv), both((size_t)c.dv);
      attention_exact(q, scale, *c.keys, *c.values, c.n, exact.data());
      auto r = idx.search(q, 1, p);
      REQUIRE(r.summaries != nullptr);
      const auto& S = *r.summaries;
      // Every token is in exactly one part.
      int64_t far_tokens = 0;
      for (int32_t j : r.far_clusters) far_tokens += S.counts[(size_t)j];
      CHECK((int64_t)r.ids.size() + far_tokens == c.n);
      // Retrieved rows, exact scores.
      AttnPartial a(c.dv);
      std::vector<float> s(r.ids.size());
      for (size_t j = 0; j < r.ids.size(); ++j) s[j] = r.scores[j] * scale;
      partial_add_rows(a, s.data(), *c.values, r.ids.data(), (int64_t)r.ids.size());
      partial_finish(a, near.data());
      // Far clusters: one row each, score s·q·C_j + ln N_j, value V̄_j.
      const size_t nfar = r.far_clusters.size();
      std::vector<float> fs(nfar), lw(nfar), fv(nfar * (size_t)c.dv);
      for (size_t t = 0; t < nfar; ++t) {
        int32_t j = r.far_clusters[t];
        double ref = 0;
        for (int e = 0; e < c.d; ++e) ref += (double)q[e] * S.key_centroids[(size_t)j * c.d + e];
        REQUIRE(r.far_scores[t] == Approx(ref).epsilon(1e-4).margin(1e-3));
        fs[t] = r.far_scores[t] * scale;
        lw[t] = std::log((float)S.counts[(size_t)j]);
        std::copy_n(S.value_means.data() + (size_t)j * c.dv, c.dv, fv.data() + t * c.dv);
      }
      AttnPartial f(c.dv);
      partial_add(f, fs.data(), lw.data(), fv.data(), (int64_t)nfar);
      partial_merge(a, f);
      partial_finish(a, both.data());
      for (int e = 0; e < c.dv; ++e) {
        err_near += std::pow(near[(size_t)e] - exact[(size_t)e], 2);
        err_both += std::pow(both[(size_t)e] - exact[(size_t)e], 2);
        norm += std::pow(exact[(size_t)e], 2);
      }
    }
    double rel_near = std::sqrt(err_near / norm), rel_both = std::sqrt(err_both / norm);
    std::printf("  %-22s k=%lld: relative attention-output error retrieved only %.4f, with far clusters %.4f\n",
                spec, (long long)p.k, rel_near, rel_both);
    INFO(spec);
    CHECK(rel_both < 0.75 * rel_near);
    CHECK(rel_both < 0.35);
  }
}

TEST_CASE("quest picks the pages a plain min/max bound picks, also after appends fill the last page") {
  std::mt19937_64 rng(21);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int page : {16, 7})
    for (DType t : {DType::F32, DType::F16}) {
      INFO("page=" << page << " " << dtype_name(t));
      const int d = 64, G = 3;
      auto K = std::make_shared<RowStore>(d, t);
      std::vector<float> rows(1003 * d);
      for (auto& x : rows) x = nd(rng) + 0.3f;
      K->append_f32(rows.data(), 1003);
      auto idx = KvIndex::create("quest:page=" + std::to_string(page), opts(2));
      idx->build(K);
      std::vector<float> q((size_t)G * d);
      for (auto& x : q) x = nd(rng);
      for (int round = 0; round < 3; ++round) {
        if (round > 0) {  // 5 then 40 more rows: the partial last page grows, new pages start
          int64_t m = round == 1 ? 5 : 40;
          std::vector<float> more((size_t)m * d);
          for (auto& x : more) x = nd(rng) + 0.3f;
          K->append_f32(more.data(), m);
          idx->add_new_rows();
        }
        const int64_t n = K->size(), pages = (n + page - 1) / page, k = 150;
        // Reference: per head, bound of each page from its rows, pages by bound until k tokens.
        std::set<int64_t> expect;
        std::vector<float> row((size_t)d);
        for (int g = 0; g < G; ++g) {
          const float* qg = q.data() + (size_t)g * d;
          std::vector<std::pair<double, int64_t>> b;
          for (int64_t pg = 0; pg < pages; ++pg) {
            std::vector<float> mn((size_t)d, INFINITY), mx((size_t)d, -INFINITY);
            for (int64_t i = pg * page; i < std::min(n, (pg + 1) * page); ++i) {
              K->row_f32(i, row.data());
              for (int j = 0; j < d; ++j) mn[(size_t)j] = std::min(mn[(size_t)j], row[(size_t)j]), mx[(size_t)j] = std::max(mx[(size_t)j], row[(size_t)j]);
            }
            double u = 0;
            for (int j = 0; j < d; ++j) u += std::max((double)qg[j] * mn[(size_t)j], (double)qg[j] * mx[(size_t)j]);
            b.push_back({u, pg});
          }
          std::sort(b.begin(), b.end(), [](auto& x, auto& y) { return x.first > y.first; });
          int64_t covered = 0;
          for (auto& [u, pg] : b) {
            if (covered >= k) break;
            for (int64_t i = pg * page; i < std::min(n, (pg + 1) * page); ++i) expect.insert(i);
            covered += std::min<int64_t>(page, n - pg * page);
          }
        }
        SearchParams p;
        p.k = k;
        auto r = idx->search(q.data(), G, p);
        CHECK(std::vector<int64_t>(expect.begin(), expect.end()) == r.ids);
        CHECK(r.stats.summaries_scored == pages * G);
      }
    }
}

TEST_CASE("centroid and multipole summaries are the means of their clusters' keys and values, also after appends") {
  std::mt19937_64 rng(22);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (const char* spec : {"centroid:rerank=1", "centroid:levels=2,coarse_ratio=3", "multipole:ratio=9,rerank=1",
                           "multipole:levels=2,ratio=7"}) {
    INFO(spec);
    const int d = 64, dv = 40;
    auto K = std::make_shared<RowStore>(d, DType::F16), V = std::make_shared<RowStore>(dv, DType::F32);
    auto append = [&](int64_t m) {
      std::vector<float> k((size_t)m * d), v((size_t)m * dv);
      for (auto& x : k) x = nd(rng) + 1.f;
      for (auto& x : v) x = nd(rng);
      V->append_f32(v.data(), m);
      K->append_f32(k.data(), m);
    };
    append(1201);
    auto idx = KvIndex::create(spec, opts(2));
    idx->build(K, V);
    std::vector<float> q(2 * d);
    for (auto& x : q) x = nd(rng);
    for (int round = 0; round < 2; ++round) {
      if (round == 1) {
        append(77);
        REQUIRE(idx->add_new_rows() == 77);
      }
      SearchParams p;
      p.k = 100;
      auto r = idx->search(q.data(), 2, p);
      REQUIRE(r.summaries != nullptr);
      const auto& S = *r.summaries;
      const int64_t n = K->size(), nf = S.n_fine;
      // Fine clusters partition the keys; coarse ones (if any) partition them again.
      int64_t fine_total = 0, coarse_total = 0;
      std::vector<double> sum_k((size_t)d, 0), fine_k((size_t)d, 0), coarse_k((size_t)d, 0);
      std::vector<double> sum_v((size_t)dv, 0), fine_v((size_t)dv, 0);
      std::vector<float> row((size_t)std::max(d, dv));
      for (int64_t i = 0; i < n; ++i) {
        K->row_f32(i, row.data());
        for (int j = 0; j < d; ++j) sum_k[(size_t)j] += row[(size_t)j];
        V->row_f32(i, row.data());
        for (int j = 0; j < dv; ++j) sum_v[(size_t)j] += row[(size_t)j];
      }
      for (int64_t c = 0; c < S.size(); ++c) {
        REQUIRE(S.counts[(size_t)c] >= 1);
        (c < nf ? fine_total : coarse_total) += S.counts[(size_t)c];
        for (int j = 0; j < d; ++j)
          (c < nf ? fine_k : coarse_k)[(size_t)j] += (double)S.counts[(size_t)c] * S.key_centroids[(size_t)c * d + j];
        if (c < nf && !S.value_means.empty())
          for (int j = 0; j < dv; ++j) fine_v[(size_t)j] += (double)S.counts[(size_t)c] * S.value_means[(size_t)c * dv + j];
      }
      CHECK(fine_total == n);
      CHECK((S.size() == nf || coarse_total == n));
      CHECK(nf >= 1);
      for (int j = 0; j < d; ++j) {
        REQUIRE(fine_k[(size_t)j] == Approx(sum_k[(size_t)j]).epsilon(1e-3).margin(0.05));
        if (S.size() > nf) REQUIRE(coarse_k[(size_t)j] == Approx(sum_k[(size_t)j]).epsilon(1e-3).margin(0.05));
      }
      if (idx->needs_values()) {
        REQUIRE(S.value_dim == dv);
        for (int j = 0; j < dv; ++j) REQUIRE(fine_v[(size_t)j] == Approx(sum_v[(size_t)j]).epsilon(1e-3).margin(0.05));
        // returned and far clusters cover every key exactly once
        int64_t far = 0;
        for (int32_t c : r.far_clusters) far += S.counts[(size_t)c];
        CHECK((int64_t)r.ids.size() + far == n);
        CHECK(r.far_scores.size() == 2 * r.far_clusters.size());
      } else {
        CHECK(r.far_clusters.empty());
      }
      CHECK((int64_t)r.ids.size() >= p.k);
    }
  }
}

TEST_CASE("ScopedBlasThreads reaches the OpenBLAS that Faiss's sgemm_ comes from") {
  // Debian loads two OpenBLAS copies (libopenblas.so.0, and the openblas-pthread
  // libblas.so.3 that provides sgemm_); each has its own thread count.
  const int before = topkv::ScopedBlasThreads::sgemm_threads();
  REQUIRE(before >= 1);  // scripts/setup.sh installs OpenBLAS as the BLAS
  {
    topkv::ScopedBlasThreads one(1);
    CHECK(topkv::ScopedBlasThreads::sgemm_threads() == 1);
  }
  CHECK(topkv::ScopedBlasThreads::sgemm_threads() == before);
}

TEST_CASE("rerank: each head keeps the k best rows of its R*k-token clusters, flat's top-k when they are all") {
  const Clustered c = make_clustered(1500, 6, 29, 24);
  const int K = 24;
  const Truth t = truth(c, K);
  for (const char* family : {"centroid", "multipole"}) {
    INFO(family);
    CHECK(KvIndex::create(std::string(family))->summary_kind().has_value());
    CHECK(KvIndex::create(std::string(family) + ":rerank=4")->summary_kind().has_value());  // the device reranks too
    CHECK(KvIndex::create(std::string(family) + ":rerank=4")->own_rerank() == 4.0);
    CHECK(KvIndex::create(std::string(family))->own_rerank() == 4.0);  // the default of the one-level lookup
    CHECK(KvIndex::create(std::string(family) + ":levels=2")->own_rerank() == 1.0);
    CHECK_THROWS_WITH(KvIndex::create(std::string(family) + ":rerank=0.5"), Catch::Contains("rerank"));
    CHECK_THROWS_WITH(KvIndex::create(std::string(family) + ":rerank=2,levels=2"), Catch::Contains("levels=1"));

    // R*k past every key: every cluster is a candidate, and the rows kept are exactly the K best.
    auto all = KvIndex::create(std::string(family) + ":rerank=1000", opts(2));
    all->build(c.keys, all->needs_values() ? c.values : nullptr);
    SearchParams p;
    p.k = K;
    for (int g = 0; g < c.nq; ++g) {
      auto r = all->search(c.queries.data() + (size_t)g * c.d, 1, p);
      std::vector<int64_t> want = t.top[(size_t)g];
      std::sort(want.begin(), want.end());
      CHECK(r.ids == want);
    }
    // Two heads at once: the union of each head's K best.
    auto two = all->search(c.queries.data(), 2, p);
    std::vector<int64_t> both = t.top[0];
    both.insert(both.end(), t.top[1].begin(), t.top[1].end());
    std::sort(both.begin(), both.end());
    both.erase(std::unique(both.begin(), both.end()), both.end());
    CHECK(two.ids == both);

    // At R = 4 the exact ranking finds more of the true top-K than the clusters alone at the same budget.
    auto plain = KvIndex::create(std::string(family) + ":rerank=1", opts(2));
    auto ranked = KvIndex::create(std::string(family) + ":rerank=4", opts(2));
    plain->build(c.keys, plain->needs_values() ? c.values : nullptr);
    ranked->build(c.keys, ranked->needs_values() ? c.values : nullptr);
    const Quality qp = measure(*plain, c, t, p), qr = measure(*ranked, c, t, p);
    report(std::string(family) + " k=24", qp);
    report(std::string(family) + ":rerank=4 k=24", qr);
    CHECK(qr.tokens <= K);
    CHECK(qr.recall > qp.recall);

    // Rerank as a search parameter: the index built without it, searched with
    // SearchParams::rerank = 4, returns what the index built with rerank=4
    // does (the same build), bit for bit; rerank = 1 turns a built-in one off.
    SearchParams p4 = p, p1 = p;
    p4.rerank = 4.0, p1.rerank = 1.0;
    for (int g = 0; g + 1 < c.nq; g += 2) {
      const float* q = c.queries.data() + (size_t)g * c.d;
      const SearchResult a = plain->search(q, 2, p4), b = ranked->search(q, 2, p);
      CHECK(a.ids == b.ids);
      CHECK(a.scores == b.scores);
      const SearchResult off = ranked->search(q, 2, p1), base = plain->search(q, 2, p);
      CHECK(off.ids == base.ids);
      CHECK(off.far_clusters == base.far_clusters);
    }
    auto two_level = KvIndex::create(std::string(family) + ":levels=2", opts(2));
    two_level->build(c.keys, two_level->needs_values() ? c.values : nullptr);
    CHECK_THROWS_WITH(two_level->search(c.queries.data(), 1, p4), Catch::Contains("levels=1"));
  }
}

TEST_CASE("multipole spread: far scores carry min(a s^2/2 q^2.var, ln clip) / s, after appends too") {
  // Two specs: the damped term (a = 0.5, clip 4) and one where the clip binds.
  for (const char* spec : {"multipole:spread=0.5,rerank=1", "multipole:spread=4,spread_clip=1.5,rerank=1,ratio=9"}) {
    INFO(spec);
    const Clustered c = make_clustered(1200, 3, 41, 12);
    const int64_t half = 700;
    // Values of the key dimension (export_summaries' tables need it): the
    // keys themselves, reversed; only the far scores are checked.
    auto keys = std::make_shared<RowStore>(c.d, DType::F16), values = std::make_shared<RowStore>(c.d, DType::F16);
    std::vector<float> k((size_t)c.d), v((size_t)c.d);
    auto copy_rows = [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) {
        c.keys->row_f32(i, k.data());
        std::reverse_copy(k.begin(), k.end(), v.begin());
        keys->append_f32(k.data(), 1), values->append_f32(v.data(), 1);
      }
    };
    copy_rows(0, half);
    auto idx = KvIndex::create(spec, opts(2));
    CHECK(idx->summary_kind() == SummaryTables::Kind::Centroid);  // the device search has the term too
    idx->build(keys, values);
    const Params params = parse_spec(spec).params;
    const double a = params.get_double("spread", 0), clip = params.get_double("spread_clip", 4);
    int clipped = 0, checked = 0;
    for (int round = 0; round < 2; ++round) {
      if (round == 1) copy_rows(half, c.n), idx->add_new_rows();  // the running means of squares
      SummaryTables t;
      REQUIRE(idx->export_summaries(t));
      REQUIRE(t.key_var.size() == t.rows.size());  // what the device's far kernel reads
      CHECK(t.spread == a);
      CHECK(t.spread_clip == clip);
      SearchParams p;
      p.k = 64, p.scale = c.scale();
      const double s = p.scale;
      for (int g = 0; g < c.nq; ++g) {
        const float* q = c.queries.data() + (size_t)g * c.d;
        const SearchResult r = idx->search(q, 1, p);
        REQUIRE(!r.far_clusters.empty());
        for (size_t f = 0; f < r.far_clusters.size(); ++f) {
          const int32_t j = r.far_clusters[f];
          const float* C = t.rows.data() + (size_t)j * c.d;
          // The variance from the cluster's members, against its centroid.
          std::vector<double> sq((size_t)c.d, 0.0);
          for (int32_t m = 0; m < t.counts[(size_t)j]; ++m) {
            keys->row_f32(t.members[(size_t)t.offsets[(size_t)j] + m], k.data());
            for (int i = 0; i < c.d; ++i) sq[(size_t)i] += (double)k[(size_t)i] * k[(size_t)i];
          }
          double qc = 0, qvq = 0;
          for (int i = 0; i < c.d; ++i) {
            qc += (double)q[i] * C[i];
            const double var = std::max(0.0, sq[(size_t)i] / t.counts[(size_t)j] - (double)C[i] * C[i]);
            CHECK(t.key_var[(size_t)j * c.d + i] == Approx(var).epsilon(2e-3).margin(2e-3));
            qvq += (double)q[i] * q[i] * var;
          }
          const double term = a * 0.5 * s * s * qvq;
          clipped += term > std::log(clip);
          const double want = qc + std::min(term, std::log(clip)) / s;
          CHECK(r.far_scores[f] == Approx(want).epsilon(2e-3).margin(2e-2));
          ++checked;
        }
      }
    }
    INFO(checked << " far scores, " << clipped << " clipped");
    CHECK(checked > 50);
    if (a >= 4) CHECK(clipped > 0);
  }
  CHECK_THROWS_WITH(KvIndex::create("multipole:spread=-1"), Catch::Contains("spread"));
  CHECK_THROWS_WITH(KvIndex::create("multipole:spread_clip=0.5"), Catch::Contains("spread_clip"));
  CHECK_THROWS_WITH(KvIndex::create("centroid:spread=0.5"), Catch::Contains("unknown parameter 'spread'"));
}

TEST_CASE("split_search_params: rerank= of a reranking backend is a search parameter, the rest is the build") {
  SearchParams p;
  p.rerank = 0;
  CHECK(KvIndex::split_search_params("multipole: ratio=9, rerank=2.5", p) == "multipole:ratio=9");
  CHECK(p.rerank == 2.5);
  p.rerank = 0;
  CHECK(KvIndex::split_search_params("centroid:rerank=1", p) == "centroid");
  CHECK(p.rerank == 1.0);
  // Nothing to move: the spec in its canonical spelling, the parameters untouched.
  p.rerank = 7;
  CHECK(KvIndex::split_search_params("multipole", p) == "multipole");
  CHECK(KvIndex::split_search_params("quest: page=16", p) == "quest:page=16");
  // levels=2 does not rerank (reranks() is false): nothing moves.
  CHECK(KvIndex::split_search_params("multipole:levels=2", p) == "multipole:levels=2");
  CHECK(p.rerank == 7);
  CHECK_THROWS_WITH(KvIndex::split_search_params("multipole:levels=2,rerank=3", p), Catch::Contains("levels=1"));
  CHECK_THROWS_WITH(KvIndex::split_search_params("multipole:rerank=-1", p), Catch::Contains("rerank"));
  CHECK_THROWS_WITH(KvIndex::split_search_params("nosuch", p), Catch::Contains("nosuch"));
}

// exp(s q.k) of every key of c (double), and their sum in `all`.
std::vector<double> exp_scores(const Clustered& c, const float* q, double s, double& all) {
  std::vector<double> e((size_t)c.n);
  std::vector<float> k((size_t)c.d);
  all = 0;
  for (int64_t i = 0; i < c.n; ++i) {
    c.keys->row_f32(i, k.data());
    double dot = 0;
    for (int a = 0; a < c.d; ++a) dot += (double)q[a] * k[(size_t)a];
    all += e[(size_t)i] = std::exp(s * dot);
  }
  return e;
}

TEST_CASE("multipole far_mass=oracle: each far row's mass is the exact sum over its keys (fine and coarse rows)") {
  // rerank=1: the selected clusters' keys and the far rows partition the keys.
  for (const char* tail : {"rerank=1", "levels=2,ratio=7"}) {
    INFO(tail);
    const Clustered c = make_clustered(1100, 3, 43, 12);
    auto idx = KvIndex::create(std::string("multipole:far_mass=oracle,") + tail, opts(2));
    CHECK(!idx->summary_kind());  // host search only: the device search has no exact far mass
    idx->build(c.keys, c.keys);  // values of the key dimension, so that the tables export; only masses are checked
    // The same build with the estimated mass: its tables give the fine clusters' members.
    auto estimate = KvIndex::create(std::string("multipole:") + tail, opts(2));
    estimate->build(c.keys, c.keys);
    SummaryTables t;
    const bool fine_members = estimate->export_summaries(t);
    SearchParams p;
    p.k = 48, p.scale = c.scale();
    const double s = p.scale;
    int checked = 0, coarse = 0;
    for (int g = 0; g < c.nq; ++g) {
      const float* q = c.queries.data() + (size_t)g * c.d;
      double all = 0;
      const std::vector<double> e = exp_scores(c, q, s, all);
      const SearchResult r = idx->search(q, 1, p), est = estimate->search(q, 1, p);
      CHECK(r.ids == est.ids);  // the same selection; only the far scores differ
      REQUIRE(r.far_clusters == est.far_clusters);
      REQUIRE(!r.far_clusters.empty());
      const ClusterSummaries& sum = *r.summaries;
      double parts = 0;
      for (int64_t id : r.ids) parts += e[(size_t)id];
      for (size_t f = 0; f < r.far_clusters.size(); ++f) {
        const int32_t j = r.far_clusters[f];
        const double got = (double)sum.counts[(size_t)j] * std::exp(s * r.far_scores[f]);
        parts += got;
        coarse += j >= sum.n_fine;
        if (!fine_members || j >= sum.n_fine) continue;
        double exact = 0;
        for (int32_t m = 0; m < t.counts[(size_t)j]; ++m) exact += e[(size_t)t.members[(size_t)t.offsets[(size_t)j] + m]];
        CHECK(got == Approx(exact).epsilon(1e-4));
        ++checked;
      }
      CHECK(parts == Approx(all).epsilon(1e-4));  // every key once: exactly, or in its far row's exact mass
    }
    INFO(checked << " far rows checked one by one, " << coarse << " coarse far rows");
    if (fine_members) CHECK(checked > 50);
    else CHECK(coarse > 0);
  }
  CHECK_THROWS_WITH(KvIndex::create("multipole:far_mass=exact"), Catch::Contains("far_mass=exact is not known"));
}

TEST_CASE("multipole rerank_far (the default): the rows a rerank drops come back as far rows with their exact mass") {
  const Clustered c = make_clustered(1300, 8, 47, 12);
  // With the oracle's exact far mass the parts add up to every key's exp(s q.k)
  // for each head of a GQA group: exactly when rerank_far keeps the dropped
  // rows, short of it without.
  auto with = KvIndex::create("multipole:far_mass=oracle", opts(2));  // rerank_far=1 is the default
  auto without = KvIndex::create("multipole:far_mass=oracle,rerank_far=0", opts(2));
  // rerank_far has a device search (SummaryTables::far_dropped); the oracle has not.
  CHECK(KvIndex::create("multipole:rerank_far=1", opts(2))->summary_kind());
  CHECK(!KvIndex::create("multipole:far_mass=oracle", opts(2))->summary_kind());
  CHECK(KvIndex::create("multipole:rerank_far=0", opts(2))->summary_kind());
  with->build(c.keys, c.keys);
  without->build(c.keys, c.keys);
  SearchParams p;
  p.k = 40, p.scale = c.scale();
  const double s = p.scale;
  int lost = 0, heads = 0;
  for (int g = 0; g + 1 < c.nq; g += 2) {
    const float* q = c.queries.data() + (size_t)g * c.d;
    const SearchResult a = with->search(q, 2, p), b = without->search(q, 2, p);
    CHECK(a.ids == b.ids);  // the same rows attended exactly
    CHECK(a.far_clusters.size() > b.far_clusters.size());
    for (int h = 0; h < 2; ++h) {
      const float* qh = q + (size_t)h * c.d;
      double all = 0;
      const std::vector<double> e = exp_scores(c, qh, s, all);
      const auto parts = [&](const SearchResult& r) {
        double sum = 0;
        for (int64_t id : r.ids) sum += e[(size_t)id];
        const size_t nf = r.far_clusters.size();
        for (size_t f = 0; f < nf; ++f)
          sum += (double)r.summaries->counts[(size_t)r.far_clusters[f]] * std::exp(s * r.far_scores[(size_t)h * nf + f]);
        return sum;
      };
      CHECK(parts(a) == Approx(all).epsilon(1e-4));
      lost += parts(b) < 0.999 * all;
      ++heads;
    }
  }
  INFO(lost << " of " << heads << " heads lose mass without rerank_far");
  CHECK(lost > heads / 2);
  CHECK_THROWS_WITH(KvIndex::create("multipole:rerank_far=2"), Catch::Contains("rerank_far"));
}
