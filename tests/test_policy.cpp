#include <catch2/catch.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <numeric>

#include "offload/head_pattern.h"
#include "offload/offload_runtime.h"
#include "offload/policy.h"

using namespace topkv;

TEST_CASE("k schedules keep the total and rise linearly") {
  for (int L : {1, 2, 3, 7, 16, 31})
    for (int64_t k : {1, 5, 64, 1000}) {
      auto u = k_per_layer(k, L, KSchedule::Uniform);
      auto l = k_per_layer(k, L, KSchedule::Linear);
      REQUIRE(std::accumulate(u.begin(), u.end(), int64_t(0)) == k * L);
      int64_t sum = std::accumulate(l.begin(), l.end(), int64_t(0));
      if (k >= L) REQUIRE(sum == k * L);  // with k < L the floor of 1 per layer may exceed it
      for (size_t i = 1; i < l.size(); ++i) REQUIRE(l[i] >= l[i - 1]);
      for (auto x : l) REQUIRE(x >= 1);
    }
  auto l = k_per_layer(100, 4, KSchedule::Linear);
  CHECK(l == std::vector<int64_t>{40, 80, 120, 160});
  // ends: weights 2, 1.5, 1, 1.5, 2 (sum 8) over five layers, 20 x 5 = 100 tokens
  CHECK(k_per_layer(20, 5, KSchedule::Ends) == std::vector<int64_t>{25, 19, 12, 19, 25});
  for (int L : {2, 3, 7, 24, 28})
    for (int64_t k : {1, 9, 64, 655}) {
      CAPTURE(L, k);
      auto e = k_per_layer(k, L, KSchedule::Ends);
      if (k >= L) CHECK(std::accumulate(e.begin(), e.end(), int64_t(0)) == k * L);
      for (auto x : e) CHECK(x >= 1);
      for (int i = 0; i < L; ++i) CHECK(std::abs(e[(size_t)i] - e[(size_t)(L - 1 - i)]) <= 1);  // symmetric
      if (k >= 4 * L) CHECK(e.front() >= e[(size_t)(L / 2)]);  // the ends hold the most
    }
  for (KSchedule s : {KSchedule::Uniform, KSchedule::Linear, KSchedule::Ends})
    CHECK(parse_k_schedule(k_schedule_name(s)) == s);
  CHECK_THROWS_WITH(parse_k_schedule("u-shaped"), Catch::Contains("uniform, linear or ends"));
  CHECK_THROWS_WITH(k_per_layer(0, 4, KSchedule::Uniform), Catch::Contains("at least 1"));
}

TEST_CASE("a weights schedule: k in proportion to one weight a layer, the same total, every bad spelling") {
  OffloadPolicy p;
  set_k_schedule(p, "weights:5/1/1/3");
  REQUIRE(p.k_schedule == KSchedule::Weights);
  CHECK(p.k_weights == std::vector<double>{5, 1, 1, 3});
  CHECK(k_schedule_spec(p) == "weights:5/1/1/3");
  // 100 x 4 = 400 tokens in the ratio 5:1:1:3 (sum 10)
  CHECK(k_per_layer(100, 4, p.k_schedule, p.k_weights) == std::vector<int64_t>{200, 40, 40, 120});
  for (int64_t k : {1, 7, 327, 1633}) {  // odd totals: the remainder is handed out, the total exact
    set_k_schedule(p, "weights:0.3/2.5/1/1/0.7/4.25/1");
    auto w = k_per_layer(k, 7, p.k_schedule, p.k_weights);
    CAPTURE(k);
    if (k >= 7) CHECK(std::accumulate(w.begin(), w.end(), int64_t(0)) == k * 7);
    for (auto x : w) CHECK(x >= 1);
    if (k >= 100) CHECK(w[5] > w[1]);
    if (k >= 100) CHECK(w[1] > w[2]);
  }
  // Equal weights are the uniform schedule.
  set_k_schedule(p, "weights:2/2/2");
  CHECK(k_per_layer(55, 3, p.k_schedule, p.k_weights) == k_per_layer(55, 3, KSchedule::Uniform));
  // Text round trips through the policy JSON (and so through packs).
  set_k_schedule(p, "weights:1.5/0.5");
  OffloadPolicy q;
  q.apply_json(p.to_json(), "roundtrip");
  CHECK(q.k_schedule == KSchedule::Weights);
  CHECK(q.k_weights == p.k_weights);
  set_k_schedule(q, "linear");
  CHECK(q.k_weights.empty());
  CHECK_THROWS_WITH(k_per_layer(10, 3, p.k_schedule, p.k_weights),
                    Catch::Contains("2 layer weights") && Catch::Contains("3 retrieval layers"));
  for (const char* bad : {"weights", "weights:", "weights:1/x", "weights:1/0", "weights:-1/2", "weights:1/nan"})
    CHECK_THROWS_WITH(set_k_schedule(p, bad), Catch::Contains("weights:w0/w1/...") || Catch::Contains("positive"));
  CHECK_THROWS_WITH(set_k_schedule(p, "u-shaped"), Catch::Contains("linear") && Catch::Contains("weights:"));
  OffloadPolicy v;
  v.k_schedule = KSchedule::Weights;
  CHECK_THROWS_WITH(v.validate(), Catch::Contains("needs its weights"));
}

TEST_CASE("DuoAttention head patterns: parse, threshold, sparsity, and every bad file") {
  std::string good = "# gates\n0.9\t0.1\t0.7\n0.2 0.05 1\n";
  auto p = parse_head_pattern(good, "t.tsv", 2, 3, 0.5);
  CHECK(p.n_streaming() == 3);
  CHECK_FALSE(p.is_streaming(0, 0));
  CHECK(p.is_streaming(0, 1));
  CHECK(p.is_streaming(1, 0));
  auto s = parse_head_pattern(good, "t.tsv", 2, 3, 0.5, 0.5);  // half the heads stream: the 3 lowest
  CHECK(s.n_streaming() == 3);
  CHECK(s.is_streaming(1, 1));
  CHECK(parse_head_pattern(good, "t.tsv", 2, 3, 0.5, 0.0).n_streaming() == 0);
  CHECK(parse_head_pattern(good, "t.tsv", 2, 3, 0.5, 1.0).n_streaming() == 6);
  CHECK_THROWS_WITH(parse_head_pattern(good, "t.tsv", 3, 3), Catch::Contains("2 rows") && Catch::Contains("3 layers"));
  CHECK_THROWS_WITH(parse_head_pattern(good, "t.tsv", 1, 3), Catch::Contains("more rows"));
  CHECK_THROWS_WITH(parse_head_pattern(good, "t.tsv", 2, 4), Catch::Contains("3 values") && Catch::Contains("4 KV heads"));
  CHECK_THROWS_WITH(parse_head_pattern(good, "t.tsv", 2, 2), Catch::Contains("more than"));
  CHECK_THROWS_WITH(parse_head_pattern("0.5 abc\n", "t.tsv", 1, 2), Catch::Contains("'abc' is not a number"));
  CHECK_THROWS_WITH(parse_head_pattern("0.5 nan\n", "t.tsv", 1, 2), Catch::Contains("outside [0, 1]"));
  CHECK_THROWS_WITH(parse_head_pattern("0.5 1.5\n", "t.tsv", 1, 2), Catch::Contains("line 1, column 2"));
  CHECK_THROWS_WITH(parse_head_pattern("0.5 -0.1\n", "t.tsv", 1, 2), Catch::Contains("outside"));
  CHECK_THROWS_WITH(load_head_pattern("/nonexistent/heads.tsv", 1, 1), Catch::Contains("cannot open"));
}

TEST_CASE("policy config files: fields, unknown keys, bad values") {
  OffloadPolicy p;
  p.apply_json(R"({"attn":"topk","index":"flat","k":128,"k_schedule":"linear","window":64,"sinks":8,"store_type":"bf16"})",
               "c.json");
  CHECK(p.store_dtype == DType::BF16);
  CHECK_THROWS_WITH(OffloadPolicy().apply_json(R"({"store_type":"f32"})", "c.json"), Catch::Contains("f16, bf16, f8 (8-bit E4M3) or q8_0"));
  CHECK(p.attn == AttnMode::TopK);
  CHECK(p.search.k == 128);
  CHECK(p.k_schedule == KSchedule::Linear);
  OffloadPolicy q;
  q.apply_json(p.to_json(), "roundtrip");
  CHECK(q.to_json() == p.to_json());
  // The f8 store and the store cache (a size, "auto", "off") survive the round trip too.
  OffloadPolicy f;
  f.apply_json(R"({"store_type":"f8","store_cache":"16G"})", "c.json");
  CHECK(f.store_dtype == DType::F8E4M3);
  CHECK(f.store_cache == int64_t(16) << 30);
  OffloadPolicy g;
  g.apply_json(f.to_json(), "roundtrip");
  CHECK(g.to_json() == f.to_json());
  CHECK(g.store_dtype == DType::F8E4M3);
  OffloadPolicy q8;
  q8.apply_json(R"({"store_type":"q8_0"})", "c.json");
  CHECK(q8.store_dtype == DType::Q8_0);
  OffloadPolicy q2;
  q2.apply_json(q8.to_json(), "roundtrip");
  CHECK(q2.store_dtype == DType::Q8_0);
  g.apply_json(R"({"store_cache":"off"})", "c.json");
  CHECK(g.store_cache == 0);
  g.apply_json(R"({"store_cache":"auto"})", "c.json");
  CHECK(g.store_cache == -1);
  CHECK_THROWS_WITH(g.apply_json(R"({"store_cache":-2})", "c.json"), Catch::Contains("store_cache must be -1"));
  CHECK_THROWS_WITH(p.apply_json(R"({"kk":1})", "c.json"), Catch::Contains("unknown key 'kk'"));
  CHECK_THROWS_WITH(p.apply_json(R"({"k":"many"})", "c.json"), Catch::Contains("wrong type"));
  CHECK_THROWS_WITH(p.apply_json(R"({"window":0})", "c.json"), Catch::Contains("window"));
  CHECK_THROWS_WITH(p.apply_json(R"({"attn":"sparse"})", "c.json"), Catch::Contains("dense or topk"));
  CHECK_THROWS_WITH(p.apply_json("{", "c.json"), Catch::Contains("not valid JSON"));
  // rerank: a search parameter (0: the index spec's own, 1: off, R up to 1024).
  OffloadPolicy r;
  r.apply_json(R"({"index":"multipole","rerank":4})", "c.json");
  CHECK(r.search.rerank == 4.0);
  OffloadPolicy r2;
  r2.apply_json(r.to_json(), "roundtrip");
  CHECK(r2.search.rerank == 4.0);
  for (const char* bad : {R"({"rerank":0.5})", R"({"rerank":-1})", R"({"rerank":2000})", R"({"rerank":"x"})"})
    CHECK_THROWS(OffloadPolicy().apply_json(bad, "c.json"));
  CHECK_THROWS_WITH(OffloadPolicy().apply_json(R"({"rerank":0.5})", "c.json"), Catch::Contains("--rerank"));
}

TEST_CASE("policy: k follows the context within its bounds, a fixed k, a fraction and their JSON") {
  OffloadPolicy p;
  p.search.k = 77;
  for (int64_t n : {1, 5, 1000, 123457}) CHECK(p.mean_k(n) == 77);  // fixed k, whatever the context
  p.k_fraction = kDefaultKFraction, p.k_min = kDefaultKMin, p.k_max = kDefaultKMax;
  CHECK(p.mean_k(1) == 64);
  CHECK(p.mean_k(3199) == 64);    // 2% = 63.98
  CHECK(p.mean_k(3226) == 65);    // 64.52
  CHECK(p.mean_k(12345) == 247);  // 246.9
  CHECK(p.mean_k(51200) == 1024);
  CHECK(p.mean_k(1 << 20) == 1024);
  CHECK(k_spec(p) == "2% of the context within [64, 1024]");
  OffloadPolicy open = p;
  open.k_min = 1, open.k_max = 0;
  CHECK(open.mean_k(1 << 20) == 20972);
  CHECK(open.mean_k(10) == 1);  // at least one key
  CHECK(k_spec(open) == "2% of the context");
  // JSON: "k" alone fixes k; "k_fraction" alone drops bounds it does not name; a round trip keeps all three.
  OffloadPolicy j = p;
  j.apply_json(R"({"k":128})", "c.json");
  CHECK(j.k_fraction == 0);
  CHECK(j.mean_k(1 << 20) == 128);
  j = p;
  j.apply_json(R"({"k_fraction":0.1})", "c.json");
  CHECK(j.mean_k(1 << 20) == 104858);
  j = p;
  j.apply_json(R"({"k_fraction":0.1,"k_max":500})", "c.json");
  CHECK(j.mean_k(1 << 20) == 500);
  CHECK(j.mean_k(20) == 2);  // k_min back to 1
  OffloadPolicy r;
  r.apply_json(p.to_json(), "roundtrip");
  CHECK(r.to_json() == p.to_json());
  CHECK(r.mean_k(12345) == 247);
  CHECK_THROWS_WITH(OffloadPolicy().apply_json(R"({"k_fraction":0.1,"k_min":10,"k_max":5})", "c.json"),
                    Catch::Contains("--k-max must be 0 (no bound) or in [--k-min 10"));
  CHECK_THROWS_WITH(OffloadPolicy().apply_json(R"({"k_min":0})", "c.json"), Catch::Contains("--k-min must be at least 1"));
}

TEST_CASE("policy: where the search runs, the device tables' type and fold") {
  OffloadPolicy p;
  CHECK(p.search_on == SearchOn::Auto);
  p.apply_json(R"({"search_on":"gpu","device_table_type":"f32","device_fold":64})", "c.json");
  CHECK(p.search_on == SearchOn::Gpu);
  CHECK(p.device_table_type == DType::F32);
  CHECK(p.device_fold == 64);
  CHECK_FALSE(p.device_table_by_budget);  // named: the user's, whatever the budget
  OffloadPolicy q;
  q.apply_json(p.to_json(), "roundtrip");
  CHECK(q.to_json() == p.to_json());
  // By default the budget chooses: f16 preferred, "auto" in a pack or config, and back.
  OffloadPolicy a;
  CHECK(a.device_table_by_budget);
  CHECK(a.device_table_type == DType::F16);
  CHECK(nlohmann::json::parse(a.to_json()).at("device_table_type") == "auto");
  q.apply_json(R"({"device_table_type":"auto"})", "c.json");
  CHECK(q.device_table_by_budget);
  CHECK(q.device_table_type == DType::F16);
  q.apply_json(R"({"device_table_type":"i8"})", "c.json");
  CHECK_FALSE(q.device_table_by_budget);
  CHECK(q.device_table_type == DType::I8);
  CHECK_THROWS_WITH(OffloadPolicy().apply_json(R"({"device_table_type":"q8_0"})", "c.json"),
                    Catch::Contains("unknown device table type 'q8_0'") && Catch::Contains("or auto"));
  CHECK_THROWS_WITH(OffloadPolicy().apply_json(R"({"search_on":"tpu"})", "c.json"), Catch::Contains("auto, host or gpu"));
  CHECK_THROWS_WITH(OffloadPolicy().apply_json(R"({"device_fold":0})", "c.json"), Catch::Contains("--device-fold"));
  // The device search stages its rows through the host when asked (a store that is not pinned).
  CHECK_NOTHROW(OffloadPolicy().apply_json(R"({"search_on":"gpu","stage_rows":true})", "c.json"));
  CHECK_NOTHROW(OffloadPolicy().apply_json(R"({"search_on":"auto","stage_rows":true})", "c.json"));
}

TEST_CASE("policy: where the index build's engines run, auto by default, chosen by the index's capability") {
  OffloadPolicy p;
  CHECK(p.build_on == BuildOn::Auto);
  for (const char* index : {"multipole", "centroid", "multipole:levels=2", "quest", "quest:coarse_ratio=16"}) {
    p.index = index;
    CHECK(build_on_gpu(p, /*cuda=*/true));
    CHECK_FALSE(build_on_gpu(p, /*cuda=*/false));  // the CPU runtime builds on the host
  }
  for (const char* index : {"flat", "hnswlib", "faiss-ivf"}) {  // nothing to cluster or bound
    p.index = index;
    CHECK_FALSE(build_on_gpu(p, true));
  }
  p.index = "multipole", p.build_on = BuildOn::Host;
  CHECK_FALSE(build_on_gpu(p, true));
  p.index = "flat", p.build_on = BuildOn::Gpu;  // asked for: the engines are made (and idle)
  CHECK(build_on_gpu(p, true));
  p.index = "multipole", p.build_on = BuildOn::Lloyd;  // the engine's twin, on the host
  CHECK_FALSE(build_on_gpu(p, true));
  for (const char* v : {"auto", "host", "gpu", "lloyd"}) {
    OffloadPolicy q;
    q.apply_json(fmt::format(R"({{"build_on":"{}"}})", v), "c.json");
    CHECK(build_on_name(q.build_on) == std::string(v));
    OffloadPolicy r;
    r.apply_json(q.to_json(), "roundtrip");
    CHECK(r.build_on == q.build_on);
  }
  CHECK_THROWS_WITH(OffloadPolicy().apply_json(R"({"build_on":"tpu"})", "c.json"), Catch::Contains("auto, host, gpu or lloyd"));
}

#include "offload/memory_plan.h"

TEST_CASE("memory plans: lines add up, top-k moves KV to the store, a run that cannot fit is refused with numbers") {
  ModelConfig c;
  c.n_layer = 32, c.n_head = 32, c.n_head_kv = 8, c.head_dim = 128, c.n_embd = 4096;
  c.layers.resize(32);
  OffloadPolicy dense, topk;
  topk.attn = AttnMode::TopK;
  topk.index = "faiss-ivf:codec=fp16";
  topk.dense_layers = 2;
  MemoryPlanInput in;
  in.cfg = &c;
  in.context = 131072;
  in.weight_bytes = 16e9;
  in.policy = &dense;
  MemoryPlan d = plan_memory(in);
  // 2 (K,V) x 32 layers x 8 heads x 128 x 4 bytes x 131072 tokens
  CHECK(d.host_total() == Approx(16e9 + 2.0 * 32 * 8 * 128 * 4 * 131072));
  in.policy = &topk;
  MemoryPlan t = plan_memory(in);
  CHECK(t.host_total() > d.host_total());  // prefill is dense, plus the stores and indexes
  double store = 0;
  for (auto& l : t.lines)
    if (l.what.find("store") != std::string::npos) store = l.host;
  CHECK(store == Approx(30.0 * 8 * (131072 - 4 - 256) * 2 * 128 * 2));
  CHECK_NOTHROW(check_plan_fits(t, 1e15));
  CHECK_NOTHROW(check_plan_fits(t, 0));  // unknown: no check
  CHECK_THROWS_WITH(check_plan_fits(t, 1e9), Catch::Contains("host memory") && Catch::Contains("memory plan"));
  CHECK(t.table().find("indexes (faiss-ivf:codec=fp16") != std::string::npos);
}
