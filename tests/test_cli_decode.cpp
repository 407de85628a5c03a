// The decoding commands end to end through the built binary on a tiny
// synthetic gemma3 model: generate (dense and top-k), eval passkey, kv dump
// read back by bench recall, tokenize; and their bad-input paths, each a
// non-zero exit with a message that names the problem.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include "gpu/device.h"
#include "tests/real_models.h"
#include "tests/test_util.h"

using namespace topkv;
using test::run_topkv;

namespace {

const std::string& model() { return test::tiny_gemma3_model(); }

const std::string kPrompt = "'the quick brown fox jumps over the lazy dog and the cat sat on the mat'";

}  // namespace

TEST_CASE("generate: dense and top-k runs stream tokens and write their statistics") {
  test::TempDir tmp("topkv_cli_gen");
  for (const std::string attn : {"dense", "topk --index multipole --k 8 --window 4 --sinks 2"}) {
    INFO(attn);
    const std::string js = tmp.file("stats.json");
    auto r = run_topkv("generate -m " + model() + " -p " + kPrompt + " -n 6 --seed 3 --attn " + attn + " --json " + js);
    REQUIRE(r.rc == 0);
    CHECK(!r.out.empty());
    auto j = nlohmann::json::parse(test::slurp(js));
    CHECK(j["generated_tokens"].get<int>() >= 1);
    CHECK(j["prompt_tokens"].get<int>() > 5);
    CHECK(j["attn"].get<std::string>() == attn.substr(0, attn.find(' ')));
    // The prefill KV's place: every cache is host memory on the CPU, none a ring or "host" layer.
    CHECK(j["prefill_kv"]["mode"] == "auto");
    if (!cuda_device_count()) CHECK(j["prefill_kv"]["ring_layers"].empty());
    // The other weight mode of the backend that ran (auto: CUDA when there is a device).
    CHECK(r.err.find(cuda_device_count() ? "--weights f16 would take" : "--weights f32 would take") !=
          std::string::npos);
    if (attn != "dense") {
      CHECK(j["offload"]["retrieval_layers"].size() == 2);  // tiny-gemma3: global layers 2 and 5 of 6
      CHECK(r.err.find("memory plan") != std::string::npos);
      // The time after the prefill, and what of it readied the layers (only the GPU runtime readies any).
      const double build_s = j["offload"]["index_build_s"].get<double>(), ready_s = j["offload"]["layers_ready_s"];
      CHECK(build_s >= ready_s);
      CHECK(ready_s >= 0.0);
      CHECK((r.err.find("readying the layers") != std::string::npos) == (cuda_device_count() > 0));
    }
  }
}

TEST_CASE("generate --measure-error: top-k attention against exact attention, zero when k covers everything") {
  test::TempDir tmp("topkv_cli_err");
  for (const std::string spec : {"--index flat --k 100000", "--index quest:page=2 --k 2"}) {
    INFO(spec);
    const std::string js = tmp.file("stats.json");
    auto r = run_topkv("generate -m " + model() + " -p " + kPrompt + " -n 5 --seed 3 --attn topk --window 4 --sinks 2 " +
                       spec + " --measure-error --json " + js);
    REQUIRE(r.rc == 0);
    CHECK(r.err.find("attention error against exact attention") != std::string::npos);
    const auto err = nlohmann::json::parse(test::slurp(js))["offload"]["attention_rel_error_per_layer"];
    REQUIRE(err.size() == 2);
    for (const auto& e : err) {
      CHECK(e.get<double>() >= 0.0);
      if (spec.find("flat") != std::string::npos) CHECK(e.get<double>() < 1e-5);  // every row retrieved: exact
    }
    if (spec.find("quest") != std::string::npos)  // one page of 2 of the ~10 stored rows: rows left out
      CHECK(err[0].get<double>() + err[1].get<double>() > 1e-6);
  }
}

TEST_CASE("generate: bad input is a clear error and a non-zero exit") {
  test::TempDir tmp("topkv_cli_gen_bad");
  const std::string heads = tmp.file("heads.tsv"), cfg = tmp.file("policy.json"), tables = tmp.file("tables.json");
  { std::ofstream(heads) << "0.5 0.5\n"; }  // 1 row of 2 heads; the model has 6 layers of 1
  { std::ofstream(cfg) << "{\"window\": -3}"; }
  { std::ofstream(tables) << "{\"device_table_type\": \"q8_0\"}"; }
  struct Bad { std::string args, says; };
  std::vector<Bad> cases = {
      {"-m /nonexistent.gguf -p hi", "nonexistent.gguf"},
      {"-m " + model() + " -p hi -n -1", "-n must be >= 0"},
      {"-m " + model() + " -p hi --attn sparse", "sparse"},
      {"-m " + model() + " -p hi --attn topk --index nosuch", "unknown index backend 'nosuch'"},
      {"-m " + model() + " -p hi --attn topk --k 0", "--k must be at least 1"},
      {"-m " + model() + " -p hi --attn topk --heads " + heads, "more than the model's 1 KV heads per row"},
      {"-m " + model() + " -p hi --attn topk --config " + cfg, "--window must be at least 1"},
      {"-m " + model() + " -p " + kPrompt + " -c 4", "raise it with -c"},
      {"-m " + model() + " -p hi -f /etc/hostname", "not both"},
      {"-m " + model() + " -p hi --top-p 2", "top-p"},
      {"-m " + model() + " -p hi --seed -7", "a seed is a whole number >= 0 (got '-7')"},
      {"-m " + model() + " -p hi --seed 1e3", "a seed is a whole number >= 0 (got '1e3')"},
      {"-m " + model() + " -p hi --backend cpu --gpu-mem-budget 1G", "--gpu-mem-budget applies to the CUDA backend"},
      {"-m " + model() + " -p hi --backend cpu --gpu-mem-budget 12Q", "12Q"},
      {"-m " + model() + " -p hi --backend tpu", "tpu"},
      {"-m " + model() + " -p hi --backend cpu --attn topk --search-on gpu", "--search-on gpu needs the CUDA backend"},
      {"-m " + model() + " -p hi --backend cpu --attn topk --stage-rows", "--stage-rows applies to the CUDA backend"},
      {"-m " + model() + " -p hi --attn topk --search-on disk", "disk"},
      {"-m " + model() + " -p hi --attn topk --device-fold 0", "--device-fold must be at least 1"},
      {"-m " + model() + " -p hi --attn topk --device-table-type q8_0", "q8_0"},
      {"-m " + model() + " -p hi --attn topk --device-table-type q8_0", "auto"},  // the choices are listed
      {"-m " + model() + " -p hi --attn topk --config " + tables, "unknown device table type 'q8_0'"},
      {"-m " + model() + " -p hi --attn topk --overlap-build sometimes", "sometimes"},
      {"-m " + model() + " -p hi --attn topk --prefill-kv disk", "disk"},
      {"-m " + model() + " -p hi --backend cpu --attn topk --prefill-kv host", "--prefill-kv host applies to the CUDA"},
      {"-m " + model() + " -p hi --backend cpu --attn topk --prefill-kv gpu", "--prefill-kv gpu applies to the CUDA"},
      {"-m " + model() + " -p hi --backend cpu --attn topk --prefill-kv host-copy",
       "--prefill-kv host-copy applies to the CUDA"},
      {"-m " + model() + " -p hi --measure-error", "--measure-error compares top-k attention"},
      {"-m " + model() + " -p hi --backend cpu --weights f16", "--weights f16 is for the CUDA backend"},
      {"-m " + model() + " -p hi --weights f8", "f8"},
      {"-m " + model() + " -p hi --q8-terms 0", "--q8-terms: 0 not in {1,2}"},
      {"-m " + model() + " -p hi --backend cpu --q8-terms 2", "--q8-terms applies to the CUDA backend"},
      {"-m " + model() + " -p hi --attn topk --rerank 0.5", "--rerank must be 0"},
      {"-m " + model() + " -p hi --attn topk --rerank nan", "--rerank"},
      {"-m " + model() + " -p hi --attn topk --index quest --rerank 4", "index 'quest' would ignore it"},
      {"-m " + model() + " -p hi --attn topk --index multipole:levels=2 --rerank 4", "would ignore it"},
      {"-m " + model() + " -p hi --attn topk --index multipole:spread=-1", "spread=-1 must be in [0, 4]"},
      {"-m " + model() + " -p hi --attn topk --index multipole:spread=nan", "spread='nan' is not a number"},
      {"-m " + model() + " -p hi --attn topk --index multipole:spread_clip=0.5", "spread_clip=0.5 must be in"},
      {"-m " + model() + " -p hi --attn topk --index centroid:spread=0.5", "unknown parameter 'spread'"},
      {"-m " + model() + " -p hi --attn topk --k-schedule steep", "--k-schedule"},
      {"-m " + model() + " -p hi --attn topk --k-schedule weights:1/0/2", "every weight must be a positive number"},
      {"-m " + model() + " -p hi --attn topk --k-schedule weights:1/2/3/4/5/6/7", "7 layer weights but the model has"},
      {"-m " + model() + " -p hi --backend cpu --attn topk --build-on gpu", "--build-on gpu needs the CUDA backend"},
      {"-m " + model() + " -p hi --attn topk --build-on disk", "disk"},
      {"-m " + model() + " -p hi --attn topk --search-on device", "--search-on"},
      {"-m " + model() + " -p hi --attn topk --index multipole:rerank_far=2", "rerank_far"},
      {"-m " + model() + " -p hi --attn topk --index multipole:far_mass=exact", "far_mass=exact is not known"},
  };
  if (cuda_device_count() == 0)  // without a device, asking for one is refused with the reason
    cases.push_back({"-m " + model() + " -p hi --backend cuda", "CUDA"});
  else
    cases.push_back({"-m " + model() + " -p hi --backend cuda --weights f32", "--weights f32 is for the CPU backend"});
  for (const Bad& b : cases) {
    INFO(b.args);
    auto r = run_topkv("generate " + b.args);
    CHECK(r.rc != 0);
    CHECK(r.err.find(b.says) != std::string::npos);
  }
}

TEST_CASE("bench gpu-ops: a group that does not exist is refused, with or without a GPU") {
  auto r = run_topkv("bench gpu-ops --only nosuch");
  CHECK(r.rc != 0);
  CHECK(r.err.find("nosuch") != std::string::npos);
}

TEST_CASE("eval passkey: rows for dense and each method, bad methods refused before work") {
  test::TempDir tmp("topkv_cli_eval");
  const std::string csv = tmp.file("pk.csv"), js = tmp.file("pk.json");
  auto r = run_topkv("eval passkey -m " + model() + " --lengths 400 --depths 0.5 --methods-index flat,quest "
                     "--methods-k 16 --answer-tokens 3 --window 8 --csv " + csv + " --json " + js);
  REQUIRE(r.rc == 0);
  const std::string text = test::slurp(csv);
  CHECK(text.find("\ndense,") != std::string::npos);
  CHECK(text.find("\ntopk:flat@16,") != std::string::npos);
  CHECK(text.find("\ntopk:quest@16,") != std::string::npos);
  auto j = nlohmann::json::parse(test::slurp(js));
  CHECK(j["summary"].size() == 3);
  for (auto& m : j["summary"]) CHECK(m["attention_rel_error_per_layer"].size() == (m["method"] == "dense" ? 0 : 2));
  auto bad = run_topkv("eval passkey -m " + model() + " --methods-index nosuch");
  CHECK(bad.rc != 0);
  CHECK(bad.err.find("unknown index backend") != std::string::npos);
  // A spec's own comma-separated parameters stay with it (here: refused for its value, not as a backend).
  bad = run_topkv("eval passkey -m " + model() + " --methods-index flat,multipole:levels=2,coarse_ratio=1");
  CHECK(bad.rc != 0);
  CHECK(bad.err.find("coarse_ratio=1 must be at least 2") != std::string::npos);
  bad = run_topkv("eval passkey -m " + model() + " --methods-k 0%");
  CHECK(bad.rc != 0);
  bad = run_topkv("eval passkey -m " + model() + " --task haystack");
  CHECK(bad.rc != 0);
}

TEST_CASE("kv dump: a dump of the global layer is read back by bench recall, bad layers refused") {
  test::TempDir tmp("topkv_cli_kv");
  const std::string dump = tmp.file("kv.safetensors");
  auto r = run_topkv("kv dump -m " + model() + " -p " + kPrompt + " --queries 4 -o " + dump);
  REQUIRE(r.rc == 0);
  auto b = run_topkv("bench recall --dump " + dump + " --index flat --index quest --k 4 --quiet");
  CHECK(b.rc == 0);
  CHECK(b.out.find("quest") != std::string::npos);
  auto bad = run_topkv("kv dump -m " + model() + " -p " + kPrompt + " --layers 0 -o " + dump + ".bad");
  CHECK(bad.rc != 0);
  CHECK(bad.err.find("sliding-window layer") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(dump + ".bad"));
  bad = run_topkv("kv dump -m " + model() + " -p " + kPrompt + " --layers 99 -o " + dump + ".bad");
  CHECK(bad.rc != 0);
  CHECK(bad.err.find("does not exist") != std::string::npos);
}

TEST_CASE("tokenize: ids of a text, a missing model is an error") {
  auto r = run_topkv("tokenize -m " + model() + " -p hello --ids");
  CHECK(r.rc == 0);
  CHECK(!r.out.empty());
  auto bad = run_topkv("tokenize -m /nonexistent.gguf -p hello");
  CHECK(bad.rc != 0);
}

// --ignore-eos (the soaks generate 100K tokens from a real model): the real
// instruct Qwen answers "Yes" and ends its turn after one token; with the flag
// it goes on to -n. Skipped without the model (scripts/fetch-model.sh
// qwen2.5-coder-0.5b).
TEST_CASE("generate --ignore-eos: goes on past end-of-generation to -n") {
  const std::string qwen = test::real_model_path(test::kQwen05);
  if (qwen.empty()) return;
  const std::string args = "generate -m " + qwen + " --chat -p 'Reply with the single word: yes' -n 12 --temp 0";
  auto stop = run_topkv(args);
  REQUIRE(stop.rc == 0);
  CHECK(stop.err.find("stop: eog") != std::string::npos);
  CHECK(stop.err.find("generated 12 tokens") == std::string::npos);
  auto go_on = run_topkv(args + " --ignore-eos");
  REQUIRE(go_on.rc == 0);
  CHECK(go_on.err.find("generated 12 tokens") != std::string::npos);
  CHECK(go_on.err.find("stop: length") != std::string::npos);
  CHECK(go_on.out.rfind(stop.out.substr(0, stop.out.find_last_not_of("\n") + 1), 0) == 0);  // the same start
}
