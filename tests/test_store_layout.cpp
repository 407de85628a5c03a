// A store type per layer (OffloadPolicy::store_dtype_at, --store-type-at):
// the spec's text and JSON forms, the checks against a model, the memory
// plan's store line, and a runtime whose layers hold different types, each
// layer attending as a runtime of its own type alone does, bit for bit.
#include <catch2/catch.hpp>

#include "offload/memory_plan.h"
#include "offload/offload_runtime.h"
#include "offload/policy.h"
#include "tests/test_util.h"

using namespace topkv;

using test::randn;
using test::runtime_test_config;

TEST_CASE("store types per layer: the spec's text, JSON and errors") {
  OffloadPolicy p;
  set_store_type_at(p, "8=f16, 0=bf16");
  CHECK(p.store_dtype_at.size() == 2);
  CHECK(store_type_at_spec(p) == "0=bf16,8=f16");  // layers in order
  p.store_dtype = DType::Q8_0;
  CHECK(p.store_dtype_of(0) == DType::BF16);
  CHECK(p.store_dtype_of(8) == DType::F16);
  CHECK(p.store_dtype_of(1) == DType::Q8_0);
  CHECK_NOTHROW(p.validate());

  OffloadPolicy q;
  q.apply_json(p.to_json(), "round trip");
  CHECK(store_type_at_spec(q) == "0=bf16,8=f16");
  CHECK(q.store_dtype == DType::Q8_0);
  q.apply_json(R"({"store_type_at":""})", "c.json");
  CHECK(q.store_dtype_at.empty());
  CHECK(q.store_dtype_of(0) == DType::Q8_0);

  CHECK_THROWS_WITH(set_store_type_at(p, "0=f32"), Catch::Contains("unknown KV store type 'f32'"));
  CHECK_THROWS_WITH(set_store_type_at(p, "x=f16"), Catch::Contains("LAYER=TYPE") && Catch::Contains("'x=f16'"));
  CHECK_THROWS_WITH(set_store_type_at(p, "-1=f16"), Catch::Contains("LAYER=TYPE"));
  CHECK_THROWS_WITH(set_store_type_at(p, "0"), Catch::Contains("LAYER=TYPE"));
  CHECK_THROWS_WITH(set_store_type_at(p, "0=f16,0=q8_0"), Catch::Contains("names layer 0 twice"));
  CHECK_THROWS_WITH(OffloadPolicy().apply_json(R"({"store_type_at":"3=i8"})", "c.json"),
                    Catch::Contains("c.json") && Catch::Contains("unknown KV store type 'i8'"));
  CHECK(store_type_at_spec(p) == "0=bf16,8=f16");  // a failed set leaves the policy as it was
}

TEST_CASE("store types per layer: checked against the model, counted layer by layer in the memory plan") {
  const ModelConfig cfg = runtime_test_config(4, 8, 2, 64);
  OffloadPolicy p;
  p.attn = AttnMode::TopK, p.index = "flat", p.store_dtype = DType::Q8_0;
  set_store_type_at(p, "4=f16");  // the model has layers 0..3
  CHECK_THROWS_WITH(OffloadRuntime(cfg, p, false), Catch::Contains("layer 4 is not a full-context layer") &&
                                                       Catch::Contains("0, 1, 2, 3"));
  ModelConfig sliding = cfg;
  sliding.layers[1].sliding = true, sliding.layers[1].window = 32;
  set_store_type_at(p, "1=f16");
  CHECK_THROWS_WITH(OffloadRuntime(sliding, p, false), Catch::Contains("layer 1 is not a full-context layer"));
  // A layer kept dense by --dense-layers has no store: naming it is no error
  // (a pack built without dense layers serves runs with some).
  set_store_type_at(p, "0=f16");
  p.dense_layers = 1;
  CHECK_NOTHROW(OffloadRuntime(cfg, p, false));
  p.dense_layers = 0;
  // q8_0 named for one layer of a head_dim that is not whole blocks.
  OffloadPolicy odd = p;
  odd.store_dtype = DType::F16;
  set_store_type_at(odd, "2=q8_0");
  CHECK_THROWS_WITH(OffloadRuntime(runtime_test_config(4, 8, 2, 48), odd, false),
                    Catch::Contains("--store-type q8_0 stores blocks of 32") && Catch::Contains("head_dim 48"));

  // The plan's store line: each layer at its own type.
  MemoryPlanInput in;
  in.cfg = &cfg, in.context = 100000, in.weight_bytes = 1e9;
  set_store_type_at(p, "0=f16,2=bf16");
  in.policy = &p;
  const MemoryPlan plan = plan_memory(in);
  const MemoryPlan::Line* store = nullptr;
  for (auto& l : plan.lines)
    if (l.what.find("host KV store") != std::string::npos) store = &l;
  REQUIRE(store);
  CHECK(store->what.find("(q8_0; layers 0=f16,2=bf16)") != std::string::npos);
  const double stored = 100000.0 - p.sinks - p.window;
  CHECK(store->host == Approx(stored * 2 * 2 * (2 * 128.0 + 2 * 68.0)));  // K and V, 2 KV heads; f16 + bf16 + 2 x q8_0
}

TEST_CASE("a runtime with a store type per layer attends each layer as a runtime of that type alone does") {
  struct Case { int heads, kv, d; int64_t n; std::string index; };
  const Case cases[] = {
      {6, 2, 64, 777, "flat"},                  // GQA 3, odd length
      {8, 8, 128, 401, "quest:page=8"},         // no GQA
      {4, 1, 256, 300, "centroid:block=64"},    // one KV head, head_dim 256
  };
  std::mt19937 rng(31);
  for (const Case& c : cases) {
    CAPTURE(c.heads, c.kv, c.d, c.n, c.index);
    const ModelConfig cfg = runtime_test_config(3, c.heads, c.kv, c.d);
    OffloadPolicy base;
    base.attn = AttnMode::TopK, base.index = c.index, base.search.k = 24, base.sinks = 3, base.window = 16;
    base.build_on = BuildOn::Host;
    OffloadPolicy mixed = base, all_q8 = base, all_f16 = base, all_bf16 = base;
    mixed.store_dtype = all_q8.store_dtype = DType::Q8_0;
    all_f16.store_dtype = DType::F16, all_bf16.store_dtype = DType::BF16;
    set_store_type_at(mixed, "0=f16,2=bf16");
    std::vector<std::vector<float>> ks, vs;
    for (int il = 0; il < 3; ++il) {  // keys with a shared offset, as real keys have
      ks.push_back(randn((size_t)c.kv * c.n * c.d, rng, 1.f, 0.3f));
      vs.push_back(randn(ks.back().size(), rng));
    }
    OffloadRuntime m(cfg, mixed, false), q8(cfg, all_q8, false), f16(cfg, all_f16, false), bf16(cfg, all_bf16, false);
    for (OffloadRuntime* rt : {&m, &q8, &f16, &bf16}) rt->take_context(c.n, test::whole_context_reader(ks, vs, c.n, c.d));
    const OffloadRuntime* same_as[3] = {&f16, &q8, &bf16};
    const DType types[3] = {DType::F16, DType::Q8_0, DType::BF16};
    for (int il = 0; il < 3; ++il)
      for (int h = 0; h < c.kv; ++h) {
        CAPTURE(il, h);
        REQUIRE(m.layer(il)->key_store(h)->dtype() == types[il]);
        REQUIRE(m.layer(il)->value_store(h)->dtype() == types[il]);
        const RowStore &a = *m.layer(il)->key_store(h), &b = *same_as[il]->layer(il)->key_store(h);
        REQUIRE(a.size() == b.size());
        std::vector<float> ra((size_t)c.d), rb((size_t)c.d);
        for (int64_t r = 0; r < a.size(); r += 37) {
          a.row_f32(r, ra.data()), b.row_f32(r, rb.data());
          REQUIRE(ra == rb);
        }
      }
    // Decoding on (each token appended to every runtime): the same attention, bit for bit.
    const size_t qn = (size_t)c.heads * c.d, kn = (size_t)c.kv * c.d;
    for (int step = 0; step < 6; ++step)
      for (int il = 0; il < 3; ++il) {
        const auto q = randn(qn, rng), k = randn(kn, rng, 1.f, 0.3f), v = randn(kn, rng);
        std::vector<float> out(qn), want(qn), other(qn);
        m.decode_attention(il, q.data(), k.data(), v.data(), c.n + step, 0.125f, out.data());
        for (OffloadRuntime* rt : {&q8, &f16, &bf16}) {
          rt->decode_attention(il, q.data(), k.data(), v.data(), c.n + step, 0.125f, other.data());
          if (rt == same_as[il]) want = other;
        }
        CHECK(out == want);
      }
  }
}
