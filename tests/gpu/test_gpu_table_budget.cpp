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
  for (const char* index : {"quest", "multipole"}) {
    CAPTURE(index);
    OffloadPolicy pol = device_search_policy(index);
    auto rt = make_gpu_offload_runtime(cuda_be(), cfg, pol, false);
    REQUIRE(rt->device_table_choices() == std::vector<DType>{DType::F16, DType::I8});
    const std::vector<int64_t> r = rt->device_reserves(n);
    REQUIRE(r.size() == 2);
    // The two differ by the tables alone: 4 heads of n keys at f16's bytes against i8's.
    const auto idx = KvIndex::create(index);
    const double per_key = idx->summary_bytes_per_key(cfg.head_dim, 2) - idx->summary_bytes_per_key(cfg.head_dim, 1);
    CHECK(std::abs((double)(r[0] - r[1]) - 4.0 * (double)n * per_key) < 2.0);
    CHECK(r[1] > 0);
    CHECK(rt->device_bytes_estimate(n) == r[0]);
    rt->set_device_table_type(DType::I8);
    CHECK(rt->policy().device_table_type == DType::I8);
    CHECK(rt->device_bytes_estimate(n) == r[1]);
    const auto plan = rt->device_plan(n);
    CHECK(std::any_of(plan.begin(), plan.end(), [](const MemoryPlan::Line& l) {
      return l.what.find("device search tables") != std::string::npos && l.what.find("i8") != std::string::npos;
    }));
    // A type the user named is the only one; so is i8 by the budget (nothing smaller to fall to).
    pol.device_table_by_budget = false, pol.device_table_type = DType::F8E4M3;
    auto named = make_gpu_offload_runtime(cuda_be(), cfg, pol, false);
    CHECK(named->device_table_choices() == std::vector<DType>{DType::F8E4M3});
    CHECK(named->device_reserves(n).size() == 1);
    CHECK_THROWS_WITH(named->set_device_table_type(DType::I8), Catch::Contains("not among this runtime's choices"));
    pol.device_table_by_budget = true, pol.device_table_type = DType::I8;
    CHECK(make_gpu_offload_runtime(cuda_be(), cfg, pol, false)->device_table_choices() ==
          std::vector<DType>{DType::I8});
    // The host search keeps no tables on the device.
    pol = device_search_policy(index);
    pol.search_on = SearchOn::Host;
    auto host = make_gpu_offload_runtime(cuda_be(), cfg, pol, false);
    CHECK(host->device_table_choices().empty());
    CHECK(host->device_reserves(n) == std::vector<int64_t>{host->device_bytes_estimate(n)});
  }
}

TEST_CASE("the session hands the budget's table type to its runtimes before the tables go up", "[offload]") {
  // The model's choice is forced here with a first reserve no GPU holds; the
  // run then decodes with i8 tables, as a run that names i8 does, token for
  // token, and a fresh runtime for the next context takes i8 again.
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
  const auto run = [&](const OffloadPolicy& pol, bool force_smaller, std::vector<DType>* types) {
    Session s(file, so);
    OffloadRuntime* rt = s.prepare_runtime(pol);
    ModelOptions mo;
    mo.n_ctx = 1024, mo.max_chunk = 128, mo.kv_dtype = DType::F16;
    mo.device_reserves = rt->device_reserves(mo.n_ctx);
    if (force_smaller) mo.device_reserves[0] = int64_t(1) << 50;
    s.load(mo);
    std::vector<int32_t> ids;
    for (int context = 0; context < 2; ++context) {  // the second start makes a fresh runtime
      std::vector<float> logits = s.start(pol, nullptr, prompt, mo.max_chunk, /*release_kv=*/true);
      types->push_back(s.runtime()->policy().device_table_type);
      DecodeParams dp;
      dp.sampling.temperature = 0, dp.n_predict = 12, dp.n_ctx = mo.n_ctx, dp.ignore_eog = true;
      const DecodeResult d = s.decode(std::move(logits), dp, Timer());
      ids.insert(ids.end(), d.ids.begin(), d.ids.end());
    }
    return ids;
  };
  OffloadPolicy pol = device_search_policy("quest:page=4");
  std::vector<DType> by_budget, named;
  const std::vector<int32_t> got = run(pol, /*force_smaller=*/true, &by_budget);
  CHECK(by_budget == std::vector<DType>{DType::I8, DType::I8});
  pol.device_table_by_budget = false, pol.device_table_type = DType::I8;
  const std::vector<int32_t> want = run(pol, false, &named);
  CHECK(named == std::vector<DType>{DType::I8, DType::I8});
  CHECK(got == want);
  // Without pressure the preferred f16 stays.
  std::vector<DType> roomy;
  run(device_search_policy("quest:page=4"), false, &roomy);
  CHECK(roomy == std::vector<DType>{DType::F16, DType::F16});
}
