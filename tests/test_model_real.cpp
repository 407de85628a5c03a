// The forward pass on the real models (scripts/fetch-model.sh NAME): Gemma 3
// 270M (env TOPKV_MODEL overrides its path), Qwen2.5-Coder-0.5B and -1.5B
// (TOPKV_QWEN05_MODEL, TOPKV_QWEN15_MODEL). Each case WARNs and returns when
// a model (or its golden file) is absent, so CI without the download passes.
//   - cached chunked forward == the plain reference on the first tokens
//   - logits against Hugging Face transformers' golden top-20 per position
//     (tests/data/<model>_golden_logits.json, scripts/make_golden*.py:
//      {"prompt": str, "ids": [...], "top20": [[[id, logit], ...] per position],
//       "greedy_continuation_ids": [...]})
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "src/model/model.h"
#include "src/model/reference.h"
#include "src/model/sampler.h"
#include "tests/model_test_util.h"
#include "tests/real_models.h"

using namespace topkv;
namespace fs = std::filesystem;

namespace {

struct RealModel {
  test::RealModel model;
  const char* golden;  // under tests/data/
};
const RealModel kGemma{test::kGemma270m, "gemma3_golden_logits.json"};
const RealModel kQwen05{test::kQwen05, "qwen2.5-coder-0.5b_golden_logits.json"};
const RealModel kQwen15{test::kQwen15, "qwen2.5-coder-1.5b_golden_logits.json"};

std::shared_ptr<const GgufFile> open_real_model(const RealModel& m = kGemma) {
  const std::string path = test::real_model_path(m.model);
  return path.empty() ? nullptr : GgufFile::open(path);
}

// The cached, chunked forward against the plain reference on a few token ids
// (the tokenizer is not under test): every position's logits within tol, same argmax.
void check_reference(const std::shared_ptr<const GgufFile>& file, const std::vector<int32_t>& ids, double tol) {
  ref::ReferenceModel refm(*file);
  auto be = make_cpu_backend();
  Model m(file, *be, test::model_options(64, 4));
  const size_t n_prefill = ids.size() - 3;
  const auto all = m.prefill(std::span(ids.data(), n_prefill), 3, /*all_logits=*/true);
  const int64_t V = m.config().n_vocab;
  for (size_t p = 0; p < ids.size(); ++p) {
    const auto want = refm.forward(ids[p]);
    const auto got =
        p < n_prefill ? std::vector<float>(all.begin() + p * V, all.begin() + (p + 1) * V) : m.decode(ids[p]);
    double worst = 0;
    for (int64_t i = 0; i < V; ++i) worst = std::max(worst, (double)std::abs(got[i] - want[i]));
    CAPTURE(p, worst);
    REQUIRE(worst < tol);
    REQUIRE(argmax(got) == argmax(want));
  }
}

// Our logits of the golden ids against transformers' top-20 at every position,
// and transformers' greedy continuation token for token.
void check_golden(const RealModel& rm) {
  const std::string golden = std::string(TOPKV_SOURCE_DIR) + "/tests/data/" + rm.golden;
  if (!fs::exists(golden)) {
    WARN("skipped: no golden logits at " << golden);
    return;
  }
  auto file = open_real_model(rm);
  if (!file) return;
  std::ifstream in(golden);
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::vector<int32_t> ids = j.at("ids").get<std::vector<int32_t>>();
  const auto& top20 = j.at("top20");
  REQUIRE(top20.size() == ids.size());
  auto be = make_cpu_backend();
  Model m(file, *be, test::model_options((int64_t)ids.size(), 64));
  const auto all = m.prefill(ids, 64, /*all_logits=*/true);
  const int64_t V = m.config().n_vocab;
  double worst = 0;
  int argmax_agree = 0;
  for (size_t p = 0; p < ids.size(); ++p) {
    const float* got = all.data() + p * V;
    double diff = 0;
    for (const auto& e : top20[p]) diff = std::max(diff, (double)std::abs(got[e[0].get<int>()] - e[1].get<float>()));
    worst = std::max(worst, diff);
    const int32_t want_top = top20[p][0][0].get<int32_t>();
    const int32_t got_top = (int32_t)(std::max_element(got, got + V) - got);
    argmax_agree += got_top == want_top;
    CAPTURE(p, diff, want_top, got_top);
    // transformers loaded this GGUF (weights dequantised to float32), so the
    // two runs share weights and differ only by fp32 summation order: 3e-5
    // measured on Gemma; 1e-2 leaves room for another BLAS or thread count.
    CHECK(diff < 1e-2);
  }
  WARN(rm.model.fetch_name << " golden: " << ids.size() << " positions, max |logit diff| over the top-20 " << worst
                     << ", argmax agrees at " << argmax_agree << "/" << ids.size());
  REQUIRE(argmax_agree == (int)ids.size());

  // transformers' greedy continuation of the same ids, token for token.
  if (j.contains("greedy_continuation_ids")) {
    const auto want = j.at("greedy_continuation_ids").get<std::vector<int32_t>>();
    Model g(file, *be, test::model_options((int64_t)(ids.size() + want.size()), 64));
    std::vector<float> logits = g.prefill(ids, 64);
    std::vector<int32_t> got;
    for (size_t i = 0; i < want.size(); ++i) {
      got.push_back(argmax(logits));
      if (i + 1 < want.size()) logits = g.decode(got.back());
    }
    REQUIRE(got == want);
  }
}

}  // namespace

TEST_CASE("gemma3 270M: the chunked, cached forward equals the reference") {
  auto file = open_real_model();
  if (!file) return;
  const ModelConfig cfg = read_model_config(*file);
  REQUIRE(cfg.arch == Arch::Gemma3);
  REQUIRE(cfg.n_layer == 18);
  REQUIRE(cfg.head_dim == 256);
  REQUIRE(cfg.attn_scale == Approx(1.f / 16));
  for (int il = 0; il < cfg.n_layer; ++il) REQUIRE(cfg.layers[il].sliding == ((il + 1) % 6 != 0));
  REQUIRE(cfg.layers[5].rope.base == Approx(1e6f));
  REQUIRE(cfg.layers[0].rope.base == Approx(1e4f));
  REQUIRE(cfg.layers[0].window == 512);

  // <bos> and arbitrary ordinary token ids (the tokenizer is not under test).
  check_reference(file, {2, 818, 5279, 529, 7001, 563, 9079, 236761}, 2e-3);
}

TEST_CASE("gemma3 270M: logits agree with Hugging Face transformers (golden top-20)") { check_golden(kGemma); }

TEST_CASE("qwen2.5-coder: the chunked, cached forward equals the reference") {
  for (const RealModel* rm : {&kQwen05, &kQwen15}) {
    auto file = open_real_model(*rm);
    if (!file) continue;
    CAPTURE(rm->model.fetch_name);
    const ModelConfig cfg = read_model_config(*file);
    REQUIRE(cfg.arch == Arch::Qwen2);
    REQUIRE(cfg.qkv_bias);
    REQUIRE(cfg.n_head % cfg.n_head_kv == 0);
    REQUIRE((cfg.n_head / cfg.n_head_kv == 7 || cfg.n_head / cfg.n_head_kv == 6));  // GQA 7:1 (0.5B), 6:1 (1.5B)
    for (const LayerConfig& l : cfg.layers) {
      REQUIRE_FALSE(l.sliding);  // every layer global: every layer retrieves
      REQUIRE(l.rope.style == RopeStyle::NeoX);
      REQUIRE(l.rope.base == Approx(1e6f));
    }
    // Ordinary token ids ("def quicksort(items):" and a few more).
    check_reference(file, {750, 3974, 15413, 24337, 982, 262, 421, 2422, 24337, 8, 2651}, 2e-3);
  }
}

TEST_CASE("qwen2.5-coder: logits agree with Hugging Face transformers (golden top-20)") {
  check_golden(kQwen05);
  check_golden(kQwen15);
}
