// `topkv bench decode` end to end through the built binary on a tiny
// synthetic gemma3 model, CPU backend: every mode at two contexts, the
// numbers consistent with each other, the files as the schema says; a budget
// that skips the dense rows; bad input refused with a clear message.
#include <catch2/catch.hpp>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "bench/decode_memory.h"
#include "offload/policy.h"
#include "src/common/options.h"
#include "src/model/model.h"
#include "src/model/synth.h"
#include "tests/test_util.h"

using namespace topkv;
using test::run_topkv;
using json = nlohmann::json;

namespace {

const std::string& model() { return test::tiny_gemma3_model(); }

const std::string kBase = "bench decode --backend cpu --steps 3 --warmup 1 --k 16 --window 8 --sinks 2 --no-plot -q ";

// What the schema promises (checked with python's jsonschema when it is there).
void check_schema(const std::string& json_path) {
  if (std::system("python3 -c 'import jsonschema' >/dev/null 2>&1") != 0) {
    WARN("no python3 jsonschema: schema not checked");
    return;
  }
  const std::string schema = std::string(TOPKV_SOURCE_DIR) + "/bench/decode_schema.json";
  const std::string cmd = "python3 -c \"import json,jsonschema,sys; jsonschema.validate(json.load(open(sys.argv[1])),"
                          " json.load(open(sys.argv[2])))\" " + json_path + " " + schema;
  CHECK(std::system(cmd.c_str()) == 0);
}

}  // namespace

TEST_CASE("bench decode: every mode at two contexts, consistent numbers, CSV and JSON") {
  test::TempDir out("topkv_decode_out");
  auto r = run_topkv(kBase + "-m " + model() + " --contexts 256,600 --modes dense,topk,host-dense "
                     "--index flat,quest:page=8 --out-dir " + out.dir.string());
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("context fill: synthetic") != std::string::npos);
  CHECK(r.out.find("topk quest:page=8") != std::string::npos);
  const json j = json::parse(test::slurp(out.file("decode.json")));
  check_schema(out.file("decode.json"));
  CHECK(j["fill"] == "synthetic");
  CHECK(j["model"]["offloaded_layers"] == json::array({2, 5}));
  const json& rows = j["results"];
  REQUIRE(rows.size() == 8);  // 2 contexts x (dense + 2 topk + host-dense)
  std::map<std::pair<int64_t, std::string>, json> by;
  for (const json& row : rows) {
    const std::string mode = row["mode"], index = row["index"];
    INFO(row.dump());
    CHECK(row["skipped"].is_null());
    CHECK(row["fill"] == "synthetic");
    CHECK(row["backend"] == "cpu");
    CHECK(row["launches_per_step"].is_null());  // CUDA only
    CHECK(row["steps"] == 3);
    CHECK(row["context_tokens"] == row["context"]);
    const double tok_s = row["tok_s"], p50 = row["step_ms"]["p50"], p99 = row["step_ms"]["p99"];
    const double step = row["step_ms"]["mean"];
    CHECK(tok_s > 0);
    CHECK(p50 > 0);
    CHECK(p50 <= p99);
    CHECK(std::fabs(1e3 / tok_s - p50) <= 0.5 * p50);  // the median rate is about the median step
    const json& s = row["split_ms"];
    const double attn = s["attn"], parts = s["search"].get<double>() + s["gpu"].get<double>() +
                                           s["transfer"].get<double>() + s["wait"].get<double>() +
                                           s["host_attn"].get<double>();
    CHECK(s["gpu"] == 0.0);  // the CPU runtime has no GPU part
    CHECK(parts <= attn * (1 + 1e-9) + 1e-9);
    CHECK(attn + s["model"].get<double>() <= step * (1 + 1e-9) + 1e-9);
    CHECK(attn <= step);
    CHECK(row["memory"]["gpu"].is_null());
    CHECK(row["memory"]["device_table_type"] == "");  // the CPU runtime keeps no tables on a device
    CHECK(row["memory"]["device_table_page_factor"] == 0);
    CHECK(row["fill_s"].get<double>() >= row["build_s"].get<double>());
    if (mode == "dense") {
      CHECK(attn == 0.0);
      CHECK(row["memory"]["kv_host_bytes"] == 0);
      CHECK(row["k"] == 0);
    } else {
      CHECK(attn > 0);
      CHECK(row["memory"]["kv_host_bytes"].get<int64_t>() > 0);
    }
    if (mode == "topk") {
      CHECK(row["k"] == 16);
      CHECK(row["keys_indexed"].get<int64_t>() > 0);
      // The synthetic context's reading, summed over layers: a part of the build unless layers ran at once.
      CHECK(row["read_s"].get<double>() > 0);
      CHECK(row["read_s"].get<double>() <= row["build_s"].get<double>() * std::max(1, omp_get_max_threads()) + 1e-3);
      CHECK(s["search"].get<double>() > 0);
    }
    by[{row["context"].get<int64_t>(), mode + index}] = row;
  }
  for (int64_t n : {256, 600}) {  // the dense model holds the global layers' KV; the others do not
    const int64_t dense_kv = by[{n, "dense"}]["memory"]["kv_backend_bytes"];
    CHECK(by[{n, "host-dense"}]["memory"]["kv_backend_bytes"].get<int64_t>() < dense_kv);
    CHECK(by[{n, "topkflat"}]["memory"]["kv_backend_bytes"].get<int64_t>() < dense_kv);
  }
  const std::string csv = test::slurp(out.file("decode.csv"));
  CHECK(csv.rfind("model,backend,fill,context,context_tokens,mode,index,k,skipped,steps,tok_s,", 0) == 0);
  CHECK(std::count(csv.begin(), csv.end(), '\n') == 9);
}

TEST_CASE("bench decode: a real prefill fill, a synthesised model, and a budget that skips dense") {
  test::TempDir out("topkv_decode_prefill");
  auto r = run_topkv(kBase + "-m " + model() + " --fill prefill --contexts 300 --modes dense,host-dense --out-dir " +
                     out.dir.string());
  INFO(r.err);
  REQUIRE(r.rc == 0);
  json j = json::parse(test::slurp(out.file("decode.json")));
  CHECK(j["fill"] == "prefill");
  for (const json& row : j["results"]) {
    CHECK(row["fill"] == "prefill");
    CHECK(row["context_tokens"].get<int64_t>() <= 300);
    CHECK(row["context_tokens"].get<int64_t>() > 250);
    CHECK(row["tok_s"].get<double>() > 0);
  }

  r = run_topkv(kBase + "--synth-preset tiny-llama --contexts 128 --modes host-dense");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("synthetic tiny-llama") != std::string::npos);

  // A budget above what every mode needs without the offloaded layers' KV and
  // below what dense needs with it: dense is skipped, saying why; the rest runs.
  auto file = GgufFile::open(model());
  const ModelConfig cfg = read_model_config(*file);
  ModelOptions mo;
  mo.n_ctx = 4000 + 1 + 3, mo.max_chunk = 1, mo.kv_dtype = DType::F16;
  const double dense = estimate_model_memory(*file, cfg, mo, false).total();
  mo.override_layers = offloaded_layers(cfg, 0);
  const double lean = estimate_model_memory(*file, cfg, mo, false).total();
  REQUIRE(lean < dense);
  const std::string budget = std::to_string((uint64_t)((lean + dense) / 2));
  r = run_topkv(kBase + "-m " + model() + " --contexts 4000 --modes dense,host-dense --gpu-mem-budget " + budget +
                " --out-dir " + out.dir.string());
  INFO(r.err);
  REQUIRE(r.rc == 0);
  j = json::parse(test::slurp(out.file("decode.json")));
  REQUIRE(j["results"].size() == 2);
  CHECK(j["results"][0]["mode"] == "dense");
  CHECK(j["results"][0]["skipped"].get<std::string>().find("over --gpu-mem-budget") != std::string::npos);
  CHECK(j["results"][1]["skipped"].is_null());
  CHECK(r.out.find("skipped") != std::string::npos);
  check_schema(out.file("decode.json"));
}

TEST_CASE("bench decode: --out-dir draws decode.png when matplotlib is there, and warns when it is not") {
  test::TempDir out("topkv_decode_png");
  const std::string base = "bench decode --backend cpu --steps 2 --warmup 0 -q -m " + model();
  auto r = run_topkv(base + " --contexts 256,300 --modes dense,host-dense --out-dir " + out.dir.string());
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(!test::slurp(out.file("decode.json")).empty());
  if (std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") != 0) {
    CHECK(r.err.find("warning: no decode.png") != std::string::npos);
    return;
  }
  const std::string png = test::slurp(out.file("decode.png"));
  REQUIRE(png.size() > 1000);
  CHECK(png.substr(1, 3) == "PNG");
}

TEST_CASE("bench decode: context 0 decodes from an empty context, other modes skip it with the reason") {
  test::TempDir out("topkv_decode_ctx0");
  // --out-dir is created when missing (two levels here).
  const std::string dir = (out.dir / "new" / "folder").string();
  auto r = run_topkv(kBase + "-m " + model() + " --contexts 0,64 --modes dense,topk --index flat --out-dir " + dir);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const json j = json::parse(test::slurp(dir + "/decode.json"));
  check_schema(dir + "/decode.json");
  REQUIRE(j["results"].size() == 4);
  const json& dense0 = j["results"][0];
  CHECK(dense0["context"] == 0);
  CHECK(dense0["mode"] == "dense");
  CHECK(dense0["skipped"].is_null());
  CHECK(dense0["tok_s"].get<double>() > 0);
  const json& topk0 = j["results"][1];
  CHECK(topk0["mode"] == "topk");
  CHECK(topk0["skipped"].get<std::string>().find("context 0") != std::string::npos);
  CHECK(j["results"][3]["skipped"].is_null());  // topk at 64 runs
}

TEST_CASE("bench decode: bad input is a clear error and a non-zero exit") {
  struct Bad { std::string args, says; };
  const std::string m = "-m " + model() + " ";
  const std::vector<Bad> cases = {
      {m + "--modes dense,sparse", "unknown decode mode 'sparse'"},
      {m + "--contexts 8Q", "bad token count unit in '8Q'"},
      {m + "--contexts -1", "whole number of tokens, at least 0"},
      {m + "--contexts 1.5", "whole number of tokens"},
      {m + "--contexts 0 --fill prefill", "--fill prefill needs contexts of at least 1 token"},
      {m + "--contexts 1M", "--beyond-trained"},
      {m + "--contexts 256 --gpu-mem-budget 1K", "--gpu-mem-budget 1.00 KiB is too small"},
      {m + "--contexts 256 --index nosuch", "unknown index backend 'nosuch'"},
      {m + "--contexts 256 --attn topk", "drop --attn"},
      {m + "--contexts 256 --chunk 0", "--chunk must be positive"},
      {m + "--contexts 256 --dense-layers 6", "--dense-layers"},
      {m + "--contexts 256 --out-dir /proc/nonexistent/x", "cannot create the folder"},
      {"--contexts 256", "give the model either as -m FILE or as --synth-preset"},
      {"--synth-preset nosuch --contexts 256", "unknown preset 'nosuch'"},
      {m + "--contexts 256 --weights f16", "--weights f16 is for the CUDA backend"},
      {m + "--contexts 256 --q8-terms 3", "--q8-terms: 3 not in {1,2}"},
      {m + "--contexts 256 --q8-terms 1", "--q8-terms applies to the CUDA backend"},
  };
  for (const Bad& b : cases) {
    INFO(b.args);
    auto r = run_topkv(kBase + b.args);
    INFO(r.err);
    CHECK(r.rc != 0);
    CHECK(r.err.find(b.says) != std::string::npos);
  }
}

TEST_CASE("bench decode's memory estimate holds the weights as each backend and weight mode keep them") {
  test::TempDir dir("topkv_mem_estimate");
  SynthConfig c = synth_preset("tiny-llama");
  c.type = GgmlType::Q8_0;
  synth_write(c, dir.file("m.gguf"));
  std::shared_ptr<const GgufFile> file = GgufFile::open(dir.file("m.gguf"));
  const ModelConfig cfg = read_model_config(*file);
  double matrix_bytes = 0, matrix_values = 0, row_values = 0, largest = 0;
  for (const GgufTensor& t : file->tensors()) {
    if (t.nrows() == 1) {
      row_values += (double)t.nelements();
    } else {
      REQUIRE(t.type == GgmlType::Q8_0);
      matrix_bytes += (double)t.nbytes, matrix_values += (double)t.nelements();
      largest = std::max(largest, (double)t.nelements());
    }
  }
  ModelOptions mo;
  mo.n_ctx = 64, mo.max_chunk = 8;
  const double planned = (double)Model::planned_scratch_bytes(cfg, mo);
  mo.weights = WeightMode::Quant;  // CUDA: the blocks, and a dequantisation scratch for the largest matrix
  ModelMemory m = estimate_model_memory(*file, cfg, mo, true);
  CHECK(m.weights == matrix_bytes + 4 * row_values);
  CHECK(m.scratch == planned + 2 * largest);
  m = estimate_model_memory(*file, cfg, mo, false);  // CPU: the file's rows
  CHECK(m.weights == matrix_bytes + 4 * row_values);
  CHECK(m.scratch == planned);
  mo.weights = WeightMode::F16;
  m = estimate_model_memory(*file, cfg, mo, true);
  CHECK(m.weights == 2 * matrix_values + 4 * row_values);
  CHECK(m.scratch == planned);
  mo.weights = WeightMode::F32;
  CHECK(estimate_model_memory(*file, cfg, mo, false).weights == 4 * (matrix_values + row_values));
}

TEST_CASE("token counts: K and M suffixes, lists") {
  CHECK(parse_count("8K") == 8192);
  CHECK(parse_count("1M") == 1048576);
  CHECK(parse_count(" 1000 ") == 1000);
  CHECK(parse_count("0.5K") == 512);
  CHECK(parse_count_list("2K,8K") == std::vector<int64_t>{2048, 8192});
  CHECK_THROWS_WITH(parse_count("-1"), Catch::Contains("at least 1"));
  CHECK_THROWS_WITH(parse_count("0"), Catch::Contains("at least 1"));
  CHECK(parse_count("0", 0) == 0);
  CHECK_THROWS_WITH(parse_count("8G"), Catch::Contains("use K (1024) or M"));
  CHECK_THROWS_WITH(parse_count_list("8K,"), Catch::Contains("bad token count ''"));
}
