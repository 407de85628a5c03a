#include <catch2/catch.hpp>

#include "bench/recall_bench.h"
#include "bench/synthetic.h"
#include "src/common/error.h"

using namespace topkv;

TEST_CASE("sweep specs: backends, aliases, lists, ranges, and every bad form") {
  auto s = parse_sweep_spec("hnswlib.ef=16:128:x2");
  CHECK(s.backend == "hnswlib");
  CHECK(s.param == "ef");
  CHECK(s.values == std::vector<std::string>{"16", "32", "64", "128"});
  s = parse_sweep_spec("budget=100,300");
  CHECK(s.backend.empty());
  CHECK(s.param == "k");
  CHECK(s.values == std::vector<std::string>{"100", "300"});
  s = parse_sweep_spec("centroid.threshold=0.001,0.01");
  CHECK(s.values.size() == 2);
  s = parse_sweep_spec("gqa=union,mean");
  CHECK(s.values == std::vector<std::string>{"union", "mean"});
  s = parse_sweep_spec("faiss-ivf.nprobe=1:9:+4");
  CHECK(s.backend == "faiss-ivf");
  CHECK(s.values == std::vector<std::string>{"1", "5", "9"});

  SearchParams p;
  apply_search_param(p, "k", "7");
  apply_search_param(p, "ef", "40");
  apply_search_param(p, "nprobe", "3");
  apply_search_param(p, "threshold", "0.01");
  apply_search_param(p, "gqa", "mean");
  CHECK(p.k == 7);
  CHECK(p.ef == 40);
  CHECK(p.nprobe == 3);
  CHECK(p.threshold == 0.01);
  CHECK(p.gqa == GqaMode::Mean);
  CHECK(search_label(p, {"ef", "gqa"}) == "k=7,ef=40,gqa=mean");

  for (const char* bad : {"", "k", "=16", "k=", ".k=1", "x.y=1", "k=0", "k=a,b", "k=16:8:x2", "k=1:8:x1",
                          "threshold=2", "threshold=x", "gqa=both", "ef=-1"})
    CHECK_THROWS_AS(parse_sweep_spec(bad), Error);
}

TEST_CASE("run_recall_bench: exact backend, sweeps, layer heads, and errors before any work") {
  SyntheticConfig c;
  c.n_keys = 2000;
  c.head_dim = 64;
  c.n_queries = 15;
  c.group = 4;
  c.kv_heads = 3;
  auto s = generate_synthetic(c, 2);
  RecallBenchConfig cfg;
  cfg.k = 10;
  cfg.threads = 2;
  cfg.progress = false;
  cfg.sweeps = {parse_sweep_spec("flat.k=5,10"), parse_sweep_spec("gqa=union,mean")};
  auto res = run_recall_bench(s.data, cfg);
  REQUIRE(res.rows.size() == 4);
  CHECK(res.n_keys == 2000);
  CHECK(res.kv_heads == 3);
  CHECK(res.oracle_mass > 0);
  CHECK(res.oracle_mass <= 1.0 + 1e-9);
  for (auto& r : res.rows) {
    CHECK(r.layer_heads == 3);
    CHECK(r.latency_us.p50 > 0);
    CHECK(r.layer_latency_us.p50 > 0);
    CHECK(r.qps > 0);
    CHECK(r.n_keys == 2000);
    if (r.params.k == 10 && r.params.gqa == GqaMode::Union) {
      CHECK(r.recall.mean == 1.0);
      CHECK(r.recall.p5 == 1.0);
      CHECK(r.mass_recall.mean >= res.oracle_mass - 1e-6);  // the union holds at least each head's top-k
      CHECK(r.fraction_scored == 1.0);
      CHECK(r.ids_per_search >= 10);
      CHECK(r.ids_per_search <= 40);
    }
    if (r.params.k == 5 && r.params.gqa == GqaMode::Union) CHECK(r.recall.p50 >= 0.5);
    if (r.params.gqa == GqaMode::Mean) CHECK(r.fraction_scored == Approx(0.25));  // one search for 4 heads
  }
  // More ids, more mass: the k=10 union holds everything k=5 holds.
  CHECK(res.rows[2].mass_recall.mean >= res.rows[0].mass_recall.mean);

  auto fails = [&](RecallBenchConfig bad, const char* needle) {
    try {
      run_recall_bench(s.data, bad);
      FAIL("no error for " << needle);
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  RecallBenchConfig b = cfg;
  b.index_specs = {"nosuch"};
  fails(b, "unknown index backend");
  b = cfg;
  b.k = 0;
  fails(b, "--k must be at least 1");
  b = cfg;
  b.sweeps = {parse_sweep_spec("quest.k=16")};
  fails(b, "no --index uses it");
  b = cfg;
  b.index_specs = {};
  fails(b, "no index backend");
  AttentionData empty;
  CHECK_THROWS_AS(run_recall_bench(empty, cfg), Error);
}
