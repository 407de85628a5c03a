// Device summary tables chosen by the budget (--device-table-type auto,
// OffloadPolicy::device_table_by_budget): the CUDA runtime's choices and what
// each reserves, and the session handing the type the model's memory check
// chose (tests/gpu/test_cuda_model.cpp) to its runtimes before the tables go up.
#include <catch2/catch.hpp>

#include <algorithm>
#include <random>

#include "gpu/gpu_offload_runtime.h"
#include "index/kv_index.h"
#include "src/model/model.h"
#include "src/model/synth.h"
#include "src/session/session.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/offload_test_util.h"
#include "tests/test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {


OffloadPolicy device_search_policy(const char* index) {
  OffloadPolicy pol;
  pol.attn = AttnMode::TopK, pol.index = index, pol.search_on = SearchOn::Gpu;
  pol.search.k = 64, pol.sinks = 4, pol.window = 32;
  return pol;
}

}  // namespace

TEST_CASE("the CUDA runtime's device table choices and the reserve each takes", "[offload]") {
  const ModelConfig cfg = runtime_test_config(2, 8, 2, 128);
  const int64_t n = 1 << 20;
  // Page bounds also fall to i8 with longer pages, as far as the index allows
  // (one level: 2 and 4; coarse pages of 4 pages: 2); clusters do not merge.
  const auto choices_of = [](int f_max) {
    std::vector<DeviceTableChoice> c{{DType::F16, 1}, {DType::I8, 1}};
    for (int f = 2; f <= f_max; f *= 2) c.push_back({DType::I8, f});
    return c;
  };
  for (const auto& [index, f_max] : {std::pair{"quest", 4}, std::pair{"quest:coarse_ratio=4", 2},
                                      std::pair{"multipole", 1}}) {
    CAPTURE(index);
    OffloadPolicy pol = device_search_policy(index);
    auto rt = make_gpu_offload_runtime(cuda_be(), cfg, pol, false);
    const std::vector<DeviceTableChoice> choices = rt->device_table_choices();
    REQUIRE(choices == choices_of(f_max));
    const std::vector<int64_t> r = rt->device_reserves(n);
    REQUIRE(r.size() == choices.size());
    // Neighbours differ by the tables alone: 4 heads of n keys at one choice's bytes against the next's.
    const auto idx = KvIndex::create(index);
    for (size_t i = 1; i < choices.size(); ++i) {
      const auto& [a, b] = std::pair{choices[i - 1], choices[i]};
      const double per_key = idx->summary_bytes_per_key(cfg.head_dim, dtype_size(a.type), a.page_factor) -
                             idx->summary_bytes_per_key(cfg.head_dim, dtype_size(b.type), b.page_factor);
      CHECK(per_key > 0);
      CHECK(std::abs((double)(r[i - 1] - r[i]) - 4.0 * (double)n * per_key) < 2.0);
    }
    CHECK(r.back() > 0);
    CHECK(rt->device_bytes_estimate(n) == r[0]);
    rt->set_device_tables(choices.back());
    CHECK(rt->device_tables() == choices.back());
    CHECK(rt->device_table_choices() == choices);  // taking one leaves the policy, and so the choices, as they were
    CHECK(rt->device_bytes_estimate(n) == r.back());
    const auto plan = rt->device_plan(n);
    CHECK(std::any_of(plan.begin(), plan.end(), [&](const MemoryPlan::Line& l) {
      return l.what.find("device search tables") != std::string::npos &&
             l.what.find(choices.back().name()) != std::string::npos;
    }));
    // A type the user named is the only choice, its own pages; i8 by the
    // budget leaves only the longer pages to fall to.
    pol.device_table_by_budget = false, pol.device_table_type = DType::F8E4M3;
    auto named = make_gpu_offload_runtime(cuda_be(), cfg, pol, false);
    CHECK(named->device_table_choices() == std::vector<DeviceTableChoice>{{DType::F8E4M3, 1}});
    CHECK(named->device_reserves(n).size() == 1);
    CHECK_THROWS_WITH(named->set_device_tables({DType::I8, 1}), Catch::Contains("not among this runtime's choices"));
    pol.device_table_by_budget = true, pol.device_table_type = DType::I8;
    std::vector<DeviceTableChoice> i8 = choices_of(f_max);
    i8.erase(i8.begin());
    CHECK(make_gpu_offload_runtime(cuda_be(), cfg, pol, false)->device_table_choices() == i8);
    // The host search keeps no tables on the device.
    pol = device_search_policy(index);
    pol.search_on = SearchOn::Host;
    auto host = make_gpu_offload_runtime(cuda_be(), cfg, pol, false);
    CHECK(host->device_table_choices().empty());
    CHECK(host->device_reserves(n) == std::vector<int64_t>{host->device_bytes_estimate(n)});
  }
}

TEST_CASE("the session hands the budget's device tables to its runtimes before the tables go up", "[offload]") {
  // The model's choice is forced here with leading reserves no GPU holds; the
  // run then decodes with those tables as a run that names them does, token
  // for token, and a fresh runtime for the next context takes them again.
  // Pages twice as long are a quest index of twice the page, named i8
  // (SummaryTables::coarsened: the same bounds).
  TempDir td;
  const std::string path = (td.dir / "m.gguf").string();
  SynthConfig sc = synth_defaults("llama");
  sc.layers = 2, sc.heads = 8, sc.kv_heads = 2, sc.head_dim = 64, sc.seed = 11;
  synth_write(sc, path);
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  std::mt19937 rng(5);
  std::vector<int32_t> prompt(777);
  for (auto& t : prompt) t = (int32_t)(rng() % 1000) + 16;
  SessionOptions so;
  so.backend.name = "cuda", so.progress = false, so.overlap_build = true;
  // `unheld`: how many of the leading reserves no GPU holds.
  const auto run = [&](const OffloadPolicy& pol, int unheld, std::vector<DeviceTableChoice>* tables) {
    Session s(file, so);
    OffloadRuntime* rt = s.prepare_runtime(pol);
    ModelOptions mo;
    mo.n_ctx = 1024, mo.max_chunk = 128, mo.kv_dtype = DType::F16;
    mo.device_reserves = rt->device_reserves(mo.n_ctx);
    for (int i = 0; i < unheld; ++i) mo.device_reserves[(size_t)i] = int64_t(1) << 50;
    s.load(mo);
    std::vector<int32_t> ids;
    for (int context = 0; context < 2; ++context) {  // the second start makes a fresh runtime
      // The caches stay (release_kv false, as the server runs): the second
      // context prefills into them before its fresh runtime takes the KV.
      std::vector<float> logits = s.start(pol, nullptr, prompt, mo.max_chunk, /*release_kv=*/false);
      tables->push_back(s.runtime()->device_tables());
      DecodeParams dp;
      dp.sampling.temperature = 0, dp.n_predict = 12, dp.n_ctx = mo.n_ctx, dp.ignore_eog = true;
      const DecodeResult d = s.decode(std::move(logits), dp, Timer());
      ids.insert(ids.end(), d.ids.begin(), d.ids.end());
    }
    return ids;
  };
  const auto named_i8 = [](const char* index) {
    OffloadPolicy p = device_search_policy(index);
    p.device_table_by_budget = false, p.device_table_type = DType::I8;
    return p;
  };
  const DeviceTableChoice i8{DType::I8, 1}, i8_x2{DType::I8, 2}, f16{DType::F16, 1};
  std::vector<DeviceTableChoice> by_budget, named;
  const std::vector<int32_t> got = run(device_search_policy("quest:page=4"), 1, &by_budget);
  CHECK(by_budget == std::vector<DeviceTableChoice>{i8, i8});
  CHECK(got == run(named_i8("quest:page=4"), 0, &named));
  CHECK(named == std::vector<DeviceTableChoice>{i8, i8});
  by_budget.clear(), named.clear();
  const std::vector<int32_t> longer = run(device_search_policy("quest:page=4"), 2, &by_budget);
  CHECK(by_budget == std::vector<DeviceTableChoice>{i8_x2, i8_x2});
  CHECK(longer == run(named_i8("quest:page=8"), 0, &named));
  // Without pressure the preferred f16 stays.
  std::vector<DeviceTableChoice> roomy;
  run(device_search_policy("quest:page=4"), 0, &roomy);
  CHECK(roomy == std::vector<DeviceTableChoice>{f16, f16});
}
