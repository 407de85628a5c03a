// Top-k decoding through the offloaded runtime against dense decoding on the
// same synthetic model: with k at least the context it must give the same
// logits and tokens (DESIGN.md: the three parts are disjoint and the merge is
// exact), for llama and gemma3 geometries, GQA groups, sinks and windows
// small enough that many tokens leave the window during generation.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>

#include "offload/offload_runtime.h"
#include "src/model/model.h"
#include "src/model/synth.h"

using namespace topkv;

namespace {

std::string synth_model(const std::string& name, const SynthConfig& c) {
  auto dir = std::filesystem::temp_directory_path() / "topkv_test_topk_decode";
  std::filesystem::create_directories(dir);
  std::string path = (dir / (name + ".gguf")).string();
  synth_write(c, path);
  return path;
}

int argmax(const std::vector<float>& v) { return (int)(std::max_element(v.begin(), v.end()) - v.begin()); }

// Greedy-decodes `steps` tokens after `prompt` densely and with the runtime;
// returns the max |logit difference| over all steps and checks tokens agree.
// Teacher-forced on the dense run's greedy tokens, so the two runs see the same tokens.
double compare(const std::string& path, const OffloadPolicy& pol, int prompt_len, int steps, int* topk_layers,
               int* mismatches) {
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  ModelConfig cfg = read_model_config(*file);
  auto be = make_cpu_backend();
  ModelOptions mo;
  mo.n_ctx = prompt_len + steps + 1;
  mo.max_chunk = 32;
  Model dense(file, *be, mo), topk(file, *be, mo);
  std::vector<int32_t> prompt((size_t)prompt_len);
  for (int i = 0; i < prompt_len; ++i) prompt[(size_t)i] = (int32_t)((i * 7919 + 13) % cfg.n_vocab);
  auto ld = dense.prefill(prompt, 32), lt = topk.prefill(prompt, 32);
  OffloadRuntime rt(cfg, pol, /*progress=*/false);
  rt.set_measure_error(true);
  rt.take_prefill(topk);
  topk.set_attention_override(&rt);
  *topk_layers = (int)rt.retrieval_layers().size();
  double worst = 0;
  *mismatches = 0;
  for (int s = 0; s < steps; ++s) {
    int a = argmax(ld), b = argmax(lt);
    *mismatches += a != b;
    ld = dense.decode(a);
    lt = topk.decode(a);
    for (size_t i = 0; i < ld.size(); ++i) worst = std::max(worst, (double)std::fabs(ld[i] - lt[i]));
  }
  CHECK(rt.stats().steps == steps);
  for (double e : rt.attention_rel_error()) {  // exhaustive k: ~0 (fp16 store); tiny k: clearly not
    if (pol.search.k >= prompt_len + steps) CHECK(e < 1e-2);
    if (pol.search.k == 1 && prompt_len > 40) CHECK(e > 1e-2);
  }
  return worst;
}

}  // namespace

TEST_CASE("top-k decoding with k >= context equals dense decoding (llama and gemma3)") {
  struct Case { const char* arch; int heads, kv, hd, sinks, window, prompt, dense_layers; const char* index; };
  for (Case c : {Case{"llama", 4, 2, 64, 4, 8, 70, 0, "flat"}, Case{"llama", 8, 1, 128, 0, 5, 33, 1, "flat"},
                 Case{"llama", 4, 4, 64, 2, 16, 1, 0, "flat"}, Case{"gemma3", 4, 1, 256, 4, 8, 61, 0, "flat"},
                 Case{"llama", 4, 2, 64, 4, 8, 70, 0, "quest:page=8"},
                 Case{"llama", 4, 2, 64, 4, 8, 70, 0, "hnswlib"}}) {
    INFO(c.arch << " heads " << c.heads << "/" << c.kv << " hd " << c.hd << " window " << c.window << " prompt "
                << c.prompt << " index " << c.index);
    SynthConfig sc = synth_defaults(c.arch);
    sc.layers = c.arch == std::string("gemma3") ? 6 : 3;
    sc.width = 128;
    sc.heads = c.heads;
    sc.kv_heads = c.kv;
    sc.head_dim = c.hd;
    sc.ffn = 256;
    sc.sliding_window = 16;
    sc.global_every = 3;
    std::string path = synth_model(fmt::format("{}_{}_{}_{}", c.arch, c.heads, c.kv, c.hd), sc);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK;
    pol.index = c.index;
    pol.search.k = 1 << 20;
    pol.search.ef = 4096;
    pol.sinks = c.sinks;
    pol.window = c.window;
    pol.dense_layers = c.dense_layers;
    int n_topk = 0, mismatches = 0;
    double worst = compare(path, pol, c.prompt, 20, &n_topk, &mismatches);
    CHECK(n_topk >= 1);
    CHECK(mismatches == 0);
    CHECK(worst < 2e-3);  // the store is fp16; logits of a model with unit-scale weights
    if (c.prompt > 40) {  // and the runtime really serves those layers: a tiny k changes the logits
      pol.search.k = 1;
      pol.sinks = 1;
      pol.window = 1;
      CHECK(compare(path, pol, c.prompt, 5, &n_topk, &mismatches) > 1e-2);
    }
  }
}

TEST_CASE("the runtime refuses what it cannot serve, before any work") {
  SynthConfig sc = synth_defaults("llama");
  sc.layers = 2;
  std::string path = synth_model("llama_refuse", sc);
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  ModelConfig cfg = read_model_config(*file);
  OffloadPolicy pol;
  pol.attn = AttnMode::TopK;
  pol.dense_layers = 2;
  CHECK_THROWS_WITH(OffloadRuntime(cfg, pol, false), Catch::Contains("--dense-layers"));
  pol.dense_layers = 0;
  pol.index = "nosuch";
  CHECK_THROWS_WITH(OffloadRuntime(cfg, pol, false), Catch::Contains("unknown index backend"));
  pol.index = "flat";
  pol.heads_file = "/nonexistent.tsv";
  CHECK_THROWS_WITH(OffloadRuntime(cfg, pol, false), Catch::Contains("cannot open head pattern"));
  // The host runtime keeps no tables on a device: no type to choose, one
  // reserve (nothing on the GPU without a k-means engine there), and a
  // choice handed to it is refused.
  pol.heads_file.clear();
  pol.index = "multipole";
  OffloadRuntime rt(cfg, pol, false);
  CHECK(rt.device_table_choices().empty());
  CHECK(rt.device_reserves(4096) == std::vector<int64_t>{0});
  CHECK_THROWS_WITH(rt.set_device_tables({DType::I8, 1}), Catch::Contains("not among this runtime's choices"));
}

TEST_CASE("rewinding the model replays a continuation exactly, within the ring's slack") {
  SynthConfig sc = synth_defaults("gemma3");
  sc.layers = 3;
  sc.width = 128;
  sc.heads = 2;
  sc.kv_heads = 1;
  sc.head_dim = 64;
  sc.ffn = 256;
  sc.sliding_window = 8;
  sc.global_every = 3;
  std::string path = synth_model("gemma3_rewind", sc);
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  auto be = make_cpu_backend();
  ModelOptions mo;
  mo.n_ctx = 128;
  mo.max_chunk = 8;  // ring slack: 7 positions
  Model m(file, *be, mo);
  std::vector<int32_t> prompt(40);
  for (int i = 0; i < 40; ++i) prompt[(size_t)i] = (int32_t)(i * 31 % 200 + 5);
  m.prefill(prompt, 8);
  auto first = m.decode(11);
  for (int i = 0; i < 5; ++i) m.decode(12 + i);
  m.rewind(40);
  auto again = m.decode(11);
  for (size_t i = 0; i < first.size(); ++i) REQUIRE(again[i] == first[i]);
  for (int i = 0; i < 7; ++i) m.decode(20 + i);
  CHECK_THROWS_WITH(m.rewind(40), Catch::Contains("sliding-window ring"));
  CHECK_THROWS_WITH(m.rewind(1000), Catch::Contains("cannot rewind"));
}
