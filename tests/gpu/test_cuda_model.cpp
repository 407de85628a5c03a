// Whole models on the CUDA backend against the CPU backend: synthetic llama,
// gemma3 and qwen2 GGUF files (src/model/synth.h), the same prompt prefilled
// in chunks (gemma3's local layers wrap their rings), then decode steps fed
// the CPU's greedy token; the logits of every prefill position and of every
// decode step are compared, for both device weight modes:
//   --weights f16: 16-bit weights, activations cast to 16 bits in the GEMMs:
//     logits agree to ~1e-3 relative;
//   --weights quant: the file's blocks; chunks of <= 8 tokens and decode run
//     the MMVQ on q8_1 activations: ~1-3e-2 relative on these random-weight
//     models (the CPU twin of the kernels, run in place of the CPU matmul,
//     measured 1.2-2.7e-2), so the tolerance is 6e-2.
// The greedy token must agree wherever the CPU's top-2 margin is clearly
// larger than the difference.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <random>
#include <unistd.h>

#include "src/model/model.h"
#include "src/model/sampler.h"
#include "src/model/synth.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/test_util.h"

using namespace topkv;
using namespace topkv::test;
namespace fs = std::filesystem;

namespace {

using test::TempDir;

struct ModelCase {
  std::string label;
  SynthConfig synth;
  DType kv;
  int chunk;
};

std::vector<ModelCase> model_cases() {
  std::vector<ModelCase> cases;
  {  // llama, GQA 4, head_dim 64, Q8_0
    SynthConfig c = synth_defaults("llama");
    c.layers = 2, c.width = 256, c.heads = 8, c.kv_heads = 2, c.head_dim = 64, c.ffn = 512, c.vocab = 1024;
    c.type = GgmlType::Q8_0, c.seed = 3;
    cases.push_back({"llama hd64 GQA4 Q8_0 kv f32", c, DType::F32, 32});
  }
  {  // llama, head_dim 128, Q4_K, f16 cache, tied output
    SynthConfig c = synth_defaults("llama");
    c.layers = 3, c.width = 512, c.heads = 4, c.kv_heads = 1, c.head_dim = 128, c.ffn = 768, c.vocab = 1024;
    c.type = GgmlType::Q4_K, c.tied_output = true, c.seed = 5;
    cases.push_back({"llama hd128 GQA4 Q4_K kv f16", c, DType::F16, 7});
  }
  {  // gemma3: head_dim 256, window 16 rings, a global layer every 3rd, QK-norm, GELU
    SynthConfig c = synth_defaults("gemma3");
    c.layers = 6, c.width = 256, c.heads = 4, c.kv_heads = 1, c.head_dim = 256, c.ffn = 512, c.vocab = 1024;
    c.sliding_window = 16, c.global_every = 3, c.type = GgmlType::Q8_0, c.seed = 7;
    cases.push_back({"gemma3 hd256 window16 Q8_0 kv f32", c, DType::F32, 32});
  }
  {  // qwen2, GQA 7: width 448 is no multiple of 256, so Q4_K leaves Q5_0 for every matrix but ffn_down
    SynthConfig c = synth_defaults("qwen2");
    c.layers = 2, c.width = 448, c.heads = 7, c.kv_heads = 1, c.head_dim = 64, c.ffn = 768, c.vocab = 1024;
    c.type = GgmlType::Q4_K, c.seed = 11;
    cases.push_back({"qwen2 Q5_0 + Q4_K mix kv f32", c, DType::F32, 5});
  }
  {  // qwen2 with Q6_K: Q8_0 for the width-448 matrices, Q6_K for ffn_down; tied output
    SynthConfig c = synth_defaults("qwen2");
    c.layers = 2, c.width = 448, c.heads = 7, c.kv_heads = 7, c.head_dim = 64, c.ffn = 512, c.vocab = 1024;
    c.type = GgmlType::Q6_K, c.tied_output = true, c.seed = 13;
    cases.push_back({"qwen2 Q8_0 + Q6_K mix kv f16", c, DType::F16, 32});
  }
  {  // gemma3 with an f16 cache and F16 weights, prefill chunk 5
    SynthConfig c = synth_defaults("gemma3");
    c.layers = 3, c.width = 128, c.heads = 2, c.kv_heads = 1, c.head_dim = 64, c.ffn = 256, c.vocab = 1024;
    c.sliding_window = 8, c.global_every = 3, c.type = GgmlType::F16, c.seed = 9;
    cases.push_back({"gemma3 hd64 window8 F16 kv f16", c, DType::F16, 5});
  }
  return cases;
}

// The CPU's greedy pick is trustworthy as a comparison only when its top-2
// margin exceeds the largest logit difference between the backends.
bool argmax_decidable(const std::vector<float>& cpu, const std::vector<float>& gpu_l) {
  std::vector<float> s(cpu);
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  float diff = 0;
  for (size_t i = 0; i < cpu.size(); ++i) diff = std::max(diff, std::abs(cpu[i] - gpu_l[i]));
  return s[0] - s[1] > 4 * diff;
}

}  // namespace

TEST_CASE("synthetic llama, gemma3 and qwen2: prefill and decode logits on CUDA match the CPU backend") {
  TempDir td;
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  OpSummary s_pre("model prefill logits, f16 weights", 2e-2), s_dec("model decode logits, f16 weights", 2e-2);
  OpSummary q_pre("model prefill logits, quant weights", 6e-2), q_dec("model decode logits, quant weights", 6e-2);
  int greedy_checked = 0, greedy_agree = 0;
  for (const ModelCase& mc : model_cases())
    for (WeightMode mode : {WeightMode::F16, WeightMode::Quant}) {
      CAPTURE(mc.label, weight_mode_name(mode));
      const std::string path = (td.dir / "m.gguf").string();
      synth_write(mc.synth, path);
      std::shared_ptr<const GgufFile> file = GgufFile::open(path);
      ModelOptions opt;
      opt.n_ctx = 128, opt.max_chunk = 32, opt.kv_dtype = mc.kv;
      Model mc_cpu(file, *cpu, opt);
      opt.weights = mode;
      Model mc_gpu(file, be, opt);
      OpSummary& pre = mode == WeightMode::Quant ? q_pre : s_pre;
      OpSummary& dec = mode == WeightMode::Quant ? q_dec : s_dec;
      const int64_t V = mc_cpu.config().n_vocab;

      std::mt19937 rng(41);
      std::vector<int32_t> prompt(61);
      for (auto& id : prompt) id = (int32_t)(rng() % (uint32_t)V);
      const auto pre_cpu = mc_cpu.prefill(prompt, mc.chunk, /*all_logits=*/true);
      const auto pre_gpu = mc_gpu.prefill(prompt, mc.chunk, /*all_logits=*/true);
      REQUIRE(pre_cpu.size() == (size_t)V * prompt.size());
      pre.check(rel_err(pre_gpu, pre_cpu));

      std::vector<float> last_cpu(pre_cpu.end() - V, pre_cpu.end()), last_gpu(pre_gpu.end() - V, pre_gpu.end());
      for (int step = 0; step < 5; ++step) {
        CAPTURE(step);
        if (argmax_decidable(last_cpu, last_gpu)) {
          ++greedy_checked;
          greedy_agree += argmax(last_cpu) == argmax(last_gpu);
          CHECK(argmax(last_cpu) == argmax(last_gpu));
        }
        const int32_t next = argmax(last_cpu);  // both models see the same token
        last_cpu = mc_cpu.decode(next);
        last_gpu = mc_gpu.decode(next);
        dec.check(rel_err(last_gpu, last_cpu));
      }
      REQUIRE(mc_gpu.n_past() == mc_cpu.n_past());
    }
  std::printf("SUMMARY %-34s checked %3d   agree %3d   %s\n", "model greedy token (decidable)", greedy_checked,
              greedy_agree, greedy_checked == greedy_agree ? "ok" : "FAIL");
}

TEST_CASE("a model takes the first device reserve its budget holds, counting released caches, else refuses") {
  // ModelOptions::device_reserves (OffloadRuntime::device_reserves: the runtime's search tables, mirrors
  // and work space, one per device table type it may take) against what a 96 MiB budget leaves beside a
  // small model: the first that fits is taken (Model::device_reserve_choice); when none does, refused
  // before any prefill, with the numbers. The retrieval layers' caches on the GPU, which the prefill
  // releases, count as free.
  constexpr int64_t kMiB = int64_t(1) << 20;
  TempDir td;
  const std::string path = (td.dir / "m.gguf").string();
  SynthConfig c = synth_defaults("qwen2");
  c.context = 8192;
  synth_write(c, path);
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  CudaBackendOptions bo;
  bo.mem_budget = size_t(96) << 20;
  auto be = make_cuda_backend(bo);
  ModelOptions opt;
  opt.n_ctx = 8192, opt.max_chunk = 32;  // 16 MiB of f32 caches
  int64_t left = 0;
  {
    Model probe(file, *be, opt);  // what the model alone leaves
    left = be->memory_left();
    REQUIRE(left > 16 * kMiB);
  }
  const auto choice = [&](std::vector<int64_t> reserves) {
    opt.device_reserves = std::move(reserves);
    return Model(file, *be, opt).device_reserve_choice();
  };
  CHECK(choice({}) == 0);
  CHECK(choice({kMiB}) == 0);
  CHECK(choice({left - 4 * kMiB}) == 0);
  CHECK(choice({left / 2, left / 4}) == 0);        // the preferred fits
  CHECK(choice({left + 8 * kMiB, left / 2}) == 1);  // it does not: the next
  CHECK(choice({left + 8 * kMiB, left + 4 * kMiB, left / 4}) == 2);
  opt.device_reserves = {left + 8 * kMiB};
  CHECK_THROWS_WITH(Model(file, *be, opt), Catch::Contains("cannot hold what the top-k runtime needs") &&
                                               Catch::Contains("Raise --gpu-mem-budget") &&
                                               Catch::Contains("--device-table-type i8") &&
                                               !Catch::Contains("smallest tables"));
  opt.device_reserves = {left + 8 * kMiB, left + 4 * kMiB};
  CHECK_THROWS_WITH(Model(file, *be, opt), Catch::Contains("cannot hold what the top-k runtime needs") &&
                                               Catch::Contains("with the smallest tables the run may choose") &&
                                               !Catch::Contains("--device-table-type i8"));  // already tried

  // The retrieval layers' caches kept on the GPU count as freed by the prefill:
  // a reserve that fits only then is taken, one that would not fit even then is
  // passed over.
  const ModelConfig cfg = read_model_config(*file);
  const int64_t caches =
      (int64_t)kv_cache_shape(cfg.n_head_kv, cfg.head_dim, opt.n_ctx, opt.kv_dtype).bytes() * cfg.n_layer;
  REQUIRE(caches > 8 * kMiB);
  for (int il = 0; il < cfg.n_layer; ++il) opt.host_kv_candidates.push_back(il);
  opt.kv_place = ModelOptions::KvPlace::Device;
  CHECK(choice({left + caches / 2}) == 0);  // fits only once the caches are released
  CHECK(choice({left + caches / 2, left / 2}) == 0);
  CHECK(choice({left + caches + 4 * kMiB, left + caches / 2}) == 1);
  // Layers an override holds have no cache to count (a pack's restore, bench
  // decode's synthetic fill): the choice is made without one (session 28's
  // first GPU run refused here, sizing a cache of capacity 0).
  opt.host_kv_candidates.clear(), opt.kv_place = ModelOptions::KvPlace::Auto;
  for (int il = 0; il < cfg.n_layer; ++il) opt.override_layers.push_back(il);
  CHECK(choice({int64_t(1) << 50, kMiB}) == 1);
  CHECK(choice({kMiB}) == 0);
}
