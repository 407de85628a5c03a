// The index build overlapped with a chunked prefill
// (OffloadRuntime::begin_context / absorb / end_context, KvIndex::begin_build)
// makes the runtime take_context makes: the same stores, the same index
// structures (multipole/centroid cluster their blocks on other threads as the
// rows arrive, and must not depend on when), the same attention, bit for bit.
// And each index build of a runtime takes its share of the run's threads.
#include <catch2/catch.hpp>

#include <random>

#include "index/kmeans.h"
#include "offload/offload_runtime.h"
#include "src/common/omp_scope.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float mean = 0.f) {
  std::normal_distribution<float> nd(mean, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST_CASE("the index build overlapped with the prefill equals the build after it") {
  struct Case { std::string index; int kv, heads, d; int64_t n; };
  const std::vector<Case> cases = {
      {"multipole:block=64,ratio=8", 1, 4, 64, 1000},         {"multipole:levels=2,block=50,ratio=4", 2, 8, 32, 777},
      {"centroid:block=40", 2, 4, 64, 500},                   {"quest:page=4", 2, 4, 32, 301},
      {"flat", 1, 2, 16, 200},
      // (not hnswlib: its multi-threaded inserts make two builds differ anyway)
      {"multipole:block=64,ratio=8", 1, 4, 64, 9},  // shorter than sinks + window: no store
      {"multipole:block=1000", 1, 4, 32, 400},      // one block: built at the end
      {"quest:page=16", 1, 2, 16, 140001},          // take_context reads 65,536 positions at a time
  };
  std::mt19937 rng(11);
  for (const Case& c : cases) {
    CAPTURE(c.index, c.kv, c.n);
    ModelConfig cfg;
    cfg.n_layer = 3, cfg.n_head = c.heads, cfg.n_head_kv = c.kv, cfg.head_dim = c.d;
    cfg.layers.resize(3);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = c.index, pol.search.k = 24, pol.sinks = 3, pol.window = 10;
    std::vector<std::vector<float>> ks, vs;  // per layer [kv][n][d]
    for (int il = 0; il < 3; ++il) {
      ks.push_back(randn((size_t)c.kv * c.n * c.d, rng, 0.4f));
      vs.push_back(randn((size_t)c.kv * c.n * c.d, rng));
    }
    OffloadRuntime after(cfg, pol, false), during(cfg, pol, false);
    after.take_context(c.n, test::whole_context_reader(ks, vs, c.n, c.d));
    during.begin_context(c.n);
    std::uniform_int_distribution<int64_t> chunk(1, 37);
    for (int64_t done = 0; done < c.n;) {
      const int64_t upto = std::min(c.n, done + chunk(rng));
      during.absorb(upto, test::whole_context_reader(ks, vs, c.n, c.d));
      done = upto;
    }
    during.end_context();
    REQUIRE(during.stats().keys_indexed == after.stats().keys_indexed);
    for (int il : after.retrieval_layers())
      for (int h = 0; h < c.kv; ++h) {
        const OffloadedLayer &A = *after.layer(il), &B = *during.layer(il);
        REQUIRE(B.stored_rows(h) == A.stored_rows(h));
        REQUIRE(B.n_sinks() == A.n_sinks());
        REQUIRE(B.window_start() == A.window_start());
        if (!A.index(h)->attached()) continue;
        REQUIRE(B.index(h)->indexed_rows() == A.index(h)->indexed_rows());
        SummaryTables ta, tb;
        if (A.index(h)->export_summaries(ta)) {
          REQUIRE(B.index(h)->export_summaries(tb));
          CHECK(tb.counts == ta.counts);
          CHECK(tb.members == ta.members);
          CHECK(tb.rows == ta.rows);
          CHECK(tb.value_means == ta.value_means);
        }
      }
    // Decoding on: the same attention, bit for bit.
    const size_t qn = (size_t)c.heads * c.d, kn = (size_t)c.kv * c.d;
    const float scale = 0.2f;
    for (int step = 0; step < 12; ++step)
      for (int il : after.retrieval_layers()) {
        const auto q = randn(qn, rng), k = randn(kn, rng, 0.4f), v = randn(kn, rng);
        std::vector<float> a(qn), b(qn);
        after.decode_attention(il, q.data(), k.data(), v.data(), c.n + step, scale, a.data());
        during.decode_attention(il, q.data(), k.data(), v.data(), c.n + step, scale, b.data());
        REQUIRE(b == a);
      }
  }
}

namespace {

// A runtime whose layers cluster with LloydKMeans handed in directly.
class TwinRuntime : public OffloadRuntime {
 public:
  using OffloadRuntime::OffloadRuntime;
  OffloadedLayer::Config layer_config(int i) const override {
    auto c = OffloadRuntime::layer_config(i);
    c.build.kmeans = std::make_shared<LloydKMeans>();
    return c;
  }
};

}  // namespace

TEST_CASE("the k-means place lloyd clusters with the GPU engine's twin on the host, and host with Faiss") {
  ModelConfig cfg;
  cfg.n_layer = 2, cfg.n_head = 4, cfg.n_head_kv = 2, cfg.head_dim = 32;
  cfg.layers.resize(2);
  std::mt19937 rng(23);
  const int64_t n = 900;
  std::vector<std::vector<float>> ks, vs;
  for (int il = 0; il < 2; ++il) {
    ks.push_back(randn((size_t)2 * n * 32, rng, 0.3f));
    vs.push_back(randn(ks.back().size(), rng));
  }
  const KvReader read = test::whole_context_reader(ks, vs, n, 32);
  for (const char* index : {"multipole:block=200,ratio=8", "centroid:block=128"}) {
    CAPTURE(index);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = index, pol.search.k = 24, pol.sinks = 3, pol.window = 10;
    OffloadPolicy lloyd = pol, host = pol;
    lloyd.build_on = BuildOn::Lloyd, host.build_on = BuildOn::Host;
    OffloadRuntime by_policy(cfg, lloyd, false), by_faiss(cfg, host, false);
    TwinRuntime twin(cfg, pol, false);
    for (OffloadRuntime* rt : {&by_policy, &by_faiss, static_cast<OffloadRuntime*>(&twin)}) rt->take_context(n, read);
    int differ_from_faiss = 0;
    for (int il : twin.retrieval_layers())
      for (int h = 0; h < 2; ++h) {
        SummaryTables a, b, f;
        REQUIRE(by_policy.layer(il)->index(h)->export_summaries(a));
        REQUIRE(twin.layer(il)->index(h)->export_summaries(b));
        REQUIRE(by_faiss.layer(il)->index(h)->export_summaries(f));
        CHECK(a.counts == b.counts);
        CHECK(a.rows == b.rows);
        CHECK(a.members == b.members);
        differ_from_faiss += a.counts != f.counts;
      }
    CHECK(differ_from_faiss > 0);  // Faiss starts from other rows: other clusters
  }
}

TEST_CASE("a runtime's index builds take their share of the run's threads") {
  // A layer's KV heads build in parallel, each on threads / KV heads (at least
  // one); with the layers filling in parallel (more KV heads than half the
  // threads) one each. Not the machine's cores: a run given --threads keeps to them.
  struct Case { int kv, threads, want; };
  const std::vector<Case> cases = {{1, 4, 4}, {2, 4, 2}, {3, 8, 2}, {2, 3, 1}, {4, 4, 1}, {2, 1, 1}};
  std::mt19937 rng(5);
  const int64_t n = 300;
  for (const Case& c : cases) {
    CAPTURE(c.kv, c.threads);
    ModelConfig cfg;
    cfg.n_layer = 3, cfg.n_head = 2 * c.kv, cfg.n_head_kv = c.kv, cfg.head_dim = 16;
    cfg.layers.resize(3);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = "quest:page=4", pol.search.k = 24, pol.sinks = 3, pol.window = 10;
    std::vector<float> k = randn((size_t)c.kv * n * 16, rng), v = randn(k.size(), rng);
    ScopedOmpThreads threads(c.threads);
    OffloadRuntime rt(cfg, pol, false);
    const std::vector<std::vector<float>> ks(3, k), vs(3, v);
    rt.take_context(n, test::whole_context_reader(ks, vs, n, 16));
    for (int il : rt.retrieval_layers())
      for (int h = 0; h < c.kv; ++h) CHECK(rt.layer(il)->index(h)->build_threads() == c.want);
  }
}
