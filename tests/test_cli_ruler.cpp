// `topkv eval ruler` end to end through the built binary on a tiny synthetic
// gemma3 model: the rows and files it writes for dense and each method
// (a flat index with k = 100% of the prompt must decode as dense does), and
// its bad-input paths, each a non-zero exit with a message that names the
// problem.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <sstream>

#include "gpu/device.h"
#include "tests/real_models.h"
#include "tests/test_util.h"

using namespace topkv;
using test::run_topkv;

namespace {

const std::string& model() { return test::tiny_gemma3_model(); }

std::vector<std::string> csv_header(const std::string& text) {
  std::vector<std::string> cols;
  std::stringstream line(text.substr(0, text.find('\n')));
  for (std::string c; std::getline(line, c, ',');) cols.push_back(c);
  return cols;
}

}  // namespace

TEST_CASE("eval ruler: rows for dense and each method, flat at k = 100% decodes as dense does") {
  test::TempDir tmp("topkv_cli_ruler");
  const std::string csv = tmp.file("ruler.csv"), js = tmp.file("ruler.json");
  auto r = run_topkv("eval ruler -m " + model() + " --tasks niah_single_1,fwe --lengths 1024 --samples 1 "
                     "--methods-index flat --methods-k 100%,4 --agreement-tokens 6 --window 8 --sinks 2 --chunk 256 "
                     "--backend cpu -q --csv " + csv + " --json " + js);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("RULER score") != std::string::npos);
  CHECK(r.out.find("topk:flat@100%") != std::string::npos);

  const std::string text = test::slurp(csv);
  const std::vector<std::string> cols = csv_header(text);
  for (const char* want : {"task", "length", "prompt_tokens", "method", "k_tokens", "rows_attended", "score",
                           "agreement", "kl_mean",
                           "kl_max", "attn_err_per_layer", "decode_tok_s", "index_build_s", "answers", "generated"})
    CHECK(std::find(cols.begin(), cols.end(), want) != cols.end());
  CHECK(std::count(text.begin(), text.end(), '\n') >= 1 + 2 * 3);  // header + 2 tasks x (dense + 2 methods)

  const auto j = nlohmann::json::parse(test::slurp(js));
  CHECK(j["tasks"] == nlohmann::json({"niah_single_1", "fwe"}));
  CHECK(j["prompts"] == 2);  // rewritten after each prompt; the last write says it ran to the end
  CHECK(j["prompts_done"] == 2);
  CHECK(j["complete"] == true);
  CHECK(j["policy"]["sinks"] == 2);
  CHECK(j["policy"]["window"] == 8);
  CHECK(j["answer_tokens"]["niah_single_1"] == 128);  // RULER's; a prompt holds the length less these
  CHECK(j["answer_tokens"]["fwe"] == 50);
  REQUIRE(j["methods"].size() == 2);
  for (const auto& m : j["methods"]) CHECK(m["rerank"] == 1.0);  // flat does not rerank
  const auto& rows = j["rows"];
  REQUIRE(rows.size() == 6);
  std::map<std::string, nlohmann::json> dense;  // task -> its dense row
  for (const auto& row : rows) {
    CHECK(row["length"] == 1024);
    const int answer = row["task"] == "fwe" ? 50 : 128;
    CHECK(row["prompt_tokens"].get<int>() <= 1024 - answer);
    CHECK(row["prompt_tokens"].get<int>() >= (1024 - answer) * 95 / 100);
    CHECK(row["agreement"].get<double>() >= 0.0);
    CHECK(row["agreement"].get<double>() <= 1.0);
    CHECK(row["score"].get<double>() >= 0.0);
    CHECK(row["score"].get<double>() <= 100.0);
    CHECK(!row["answers"].empty());
    if (row["method"] == "dense") dense[row["task"]] = row;
  }
  REQUIRE(dense.size() == 2);
  for (const auto& row : rows) {
    if (row["method"] == "dense") continue;
    INFO(row["method"] << " " << row["task"]);
    CHECK(row["attention_rel_error_per_layer"].size() == 2);  // tiny-gemma3: global layers 2 and 5
    CHECK(row["index_build_s"].get<double>() >= 0.0);
    if (row["method"] == "topk:flat@100%") {  // every stored key retrieved: dense up to the f16 store
      CHECK(row["k_tokens"].get<double>() == Approx(row["prompt_tokens"].get<double>()).epsilon(0.01));
      // every store row each step: the prompt and the answer's tokens less sinks and window
      CHECK(row["rows_attended"].get<double>() >= row["prompt_tokens"].get<double>() - 2 - 8);
      CHECK(row["rows_attended"].get<double>() <= row["prompt_tokens"].get<double>() + 128);
      CHECK(row["agreement"].get<double>() == 1.0);
      CHECK(row["kl_mean"].get<double>() < 1e-3);
      CHECK(row["flip_margin"].get<double>() == 0.0);  // no step flipped
      CHECK(row["first_flip_step"] == -1);
      for (const auto& e : row["attention_rel_error_per_layer"]) CHECK(e.get<double>() < 1e-5);
      REQUIRE(row["oracle_topk_mass_per_layer"].size() == 2);  // every key kept: all of the attention
      for (const auto& m : row["oracle_topk_mass_per_layer"]) CHECK(m.get<double>() == Approx(1.0).margin(1e-6));
      CHECK(row["generated"] == dense[row["task"]]["generated"]);
      CHECK(row["score"] == dense[row["task"]]["score"]);
    } else {
      CHECK(row["k_tokens"].get<double>() == 4.0);
      // dense's preference for its token where this method chose another: > 0 exactly when a step flipped
      CHECK(row["flip_margin"].get<double>() >= 0.0);
      CHECK((row["flip_margin"].get<double>() > 0.0) == (row["agreement"].get<double>() < 1.0));
      // the first flip: a step of the teacher-forced run, its margin at most the largest
      CHECK((row["first_flip_step"].get<int>() >= 0) == (row["agreement"].get<double>() < 1.0));
      CHECK(row["first_flip_step"].get<int>() < 6);  // --agreement-tokens 6
      CHECK(row["first_flip_margin"].get<double>() >= 0.0);
      CHECK(row["first_flip_margin"].get<double>() <= row["flip_margin"].get<double>());
      // each query head's 4, their union per KV head: 4 .. 4 x group (tiny-gemma3: 2)
      CHECK(row["rows_attended"].get<double>() >= 4.0);
      CHECK(row["rows_attended"].get<double>() <= 8.0);
      double err = 0;  // 4 keys of ~1000: attention leaves most out
      for (const auto& e : row["attention_rel_error_per_layer"]) err += e.get<double>();
      CHECK(err > 1e-4);
      REQUIRE(row["oracle_topk_mass_per_layer"].size() == 2);
      for (const auto& m : row["oracle_topk_mass_per_layer"]) {
        CHECK(m.get<double>() > 0.0);
        CHECK(m.get<double>() < 1.0);
      }
    }
  }
  const auto& summary = j["summary"];
  REQUIRE(summary.size() == 3);
  CHECK(summary[0]["method"] == "dense");
  const auto& dense_ratio = summary[0]["ratio_to_dense"];  // 1, or null where dense scored nothing
  CHECK((dense_ratio.is_null() ? summary[0]["score"].get<double>() == 0.0 : dense_ratio.get<double>() == 1.0));
  CHECK(summary[0]["agreement"] == 1.0);
  for (const auto& m : summary) {
    CHECK(m["agreement"].get<double>() >= 0.0);
    CHECK(m["agreement"].get<double>() <= 1.0);
    CHECK(m["per_length"].size() == 1);
    CHECK(m["per_task"].size() == 2);
  }
  CHECK(j["timing"]["index_builds"] == 2);  // one flat build per prompt, shared by both k
  CHECK(j["builds"].size() == 2);
}

TEST_CASE("eval ruler: a spec's rerank= is a search parameter, so the methods share one build, and a repeat runs once") {
  test::TempDir tmp("topkv_cli_ruler_rerank");
  const std::string js = tmp.file("ruler.json");
  auto r = run_topkv("eval ruler -m " + model() + " --tasks niah_single_1 --lengths 1024 --samples 1 "
                     "--methods-index multipole,multipole:rerank=4,multipole --methods-k 16 --methods-k 16 "
                     "--agreement-tokens 4 --window 8 "
                     "--sinks 2 --chunk 256 --backend cpu -q --json " + js);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(test::slurp(js));
  CHECK(j["timing"]["index_builds"] == 1);  // "multipole" built once, searched both ways
  REQUIRE(j["rows"].size() == 3);  // dense and the two methods, each once
  CHECK(j["rows"][1]["method"] == "topk:multipole@16");
  CHECK(j["rows"][2]["method"] == "topk:multipole:rerank=4@16");
  CHECK(j["rows"][2]["index"] == "multipole:rerank=4");
}

TEST_CASE("eval ruler: bad input is a clear error and a non-zero exit") {
  struct Bad {
    std::string args, says;
  };
  const std::string m = "-m " + model() + " --backend cpu ";
  std::vector<Bad> cases = {
      {m + "--tasks niah,vt", "unknown RULER task 'niah'"},
      {m + "--tasks qa_1", "SQuAD"},
      {m + "--lengths 4X", "bad token count unit"},
      {m + "--lengths 0", "at least 1"},
      {m + "--lengths 100", "leaves no room for a prompt"},
      {m + "--methods-k 150%", "must be a percentage in (0%, 100%]"},
      {m + "--methods-k 0", "at least 1"},
      {m + "--methods-index nosuch", "unknown index backend 'nosuch'"},
      {m + "--methods-k-schedule steep", "unknown k schedule 'steep'"},
      {m + "--methods-dense-layers 9", "no layer to serve"},
      {m + "--methods-dense-layers two", "is not a layer count"},
      {m + "--index flat", "takes its methods from --methods-index"},
      {m + "--samples 0", "--samples must be at least 1"},
      {m + "--png out.png", "--png needs --json"},
      {m + "--tasks vt --answer-tokens 100 --chunk 64", "--chunk 101 or more"},
  };
  if (cuda_device_count() == 0) cases.push_back({"-m " + model() + " --backend cuda", "CUDA"});
  for (const Bad& b : cases) {
    INFO(b.args);
    auto r = run_topkv("eval ruler " + b.args);
    CHECK(r.rc != 0);
    CHECK(r.err.find(b.says) != std::string::npos);
  }
}

// The CI slice of the fidelity suite on a real model where every layer
// retrieves (Qwen2.5-Coder-0.5B: 24 global layers, GQA 7:1; scripts/fetch-model.sh
// qwen2.5-coder-0.5b; skipped without it): one needle task and variable
// tracking at 1K tokens in the chat template. The instruct model finds the
// needle densely; flat top-k over every key (k = 100%) answers and decodes as
// dense does; the default backend at k = 2% (+ sinks and window) keeps the
// needle. The full suite is run by hand (bench/results/ruler_qwen2*).
TEST_CASE("eval ruler: a slice on the real Qwen2.5-Coder-0.5B") {
  const std::string qwen = test::real_model_path(test::kQwen05);
  if (qwen.empty()) return;
  test::TempDir tmp("topkv_cli_ruler_qwen");
  const std::string js = tmp.file("ruler.json");
  auto r = run_topkv("eval ruler -m " + qwen + " --chat --tasks niah_single_1,vt --lengths 1K --samples 1 "
                     "--methods-index flat,multipole --methods-k 100%,2% --answer-tokens 24 --agreement-tokens 16 "
                     "--backend cpu -q --json " + js);
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const auto j = nlohmann::json::parse(test::slurp(js));
  std::map<std::pair<std::string, std::string>, nlohmann::json> by;  // (task, method) -> row
  for (const auto& row : j["rows"]) by[{row["task"], row["method"]}] = row;
  INFO(r.out);
  CHECK(by.at({"niah_single_1", "dense"})["score"].get<double>() == 100.0);
  for (const char* task : {"niah_single_1", "vt"}) {
    const auto& dense = by.at({task, "dense"});
    const auto& exact = by.at({task, "topk:flat@100%"});
    CHECK(exact["generated"] == dense["generated"]);
    CHECK(exact["agreement"].get<double>() == 1.0);
  }
  CHECK(by.at({"niah_single_1", "topk:multipole@2%"})["score"].get<double>() == 100.0);
  for (const auto& m : j["methods"])  // the factor each method's search ran: multipole's default, flat none
    CHECK(m["rerank"] == (m["name"].get<std::string>().find("multipole") != std::string::npos ? 4.0 : 1.0));
}
