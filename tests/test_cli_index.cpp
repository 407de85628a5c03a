// topkv index build / index info / generate --pack end to end through the
// built binary: a run that goes on from a pack prints exactly what the run
// that prefilled the same document prints — top-k with each index built into
// the pack, and dense (tiny synthetic gemma3, and the real Gemma 3 270M when
// it is installed); --prompts answers each question as a run from the pack
// would; the query-time options change on a pack, the build-time ones are
// refused; every bad input is a non-zero exit with a message that names the
// problem.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/real_models.h"
#include "tests/test_util.h"

using namespace topkv;
using test::run_topkv;

namespace {

const std::string kDoc =
    "The lighthouse keeper wrote in his log every night. On the first night the sea was calm and the lamp burned "
    "bright. On the second night a storm came from the west and the keeper climbed the stairs twice. On the third "
    "night a ship passed close to the rocks, and the keeper rang the bell until dawn. The secret word is amber.";
const std::string kSearch = "--k 8 --window 4 --sinks 2", kPolicy = "--index multipole " + kSearch;

struct Fixture {
  test::TempDir dir{"topkv_cli_index"};
  std::string model = dir.file("tiny.gguf"), other = dir.file("other.gguf"), doc = dir.file("doc.txt"),
              pack = dir.file("doc.pack");
  Fixture() {
    REQUIRE(run_topkv("model synth --preset tiny-gemma3 -q -o " + model).rc == 0);
    REQUIRE(run_topkv("model synth --preset tiny-gemma3 --seed 5 -q -o " + other).rc == 0);
    std::ofstream(doc) << kDoc;
    auto r = run_topkv("index build -m " + model + " -f " + doc + " -o " + pack + " " + kPolicy +
                       " --index flat --json " + dir.file("build.json"));
    INFO(r.err);
    REQUIRE(r.rc == 0);
  }
};

Fixture& fixture() {
  static Fixture f;
  return f;
}

}  // namespace

TEST_CASE("index build writes a pack that index info describes and verifies") {
  Fixture& f = fixture();
  auto j = nlohmann::json::parse(test::slurp(f.dir.file("build.json")));
  CHECK(j["tokens"].get<int>() > 40);
  CHECK(j["retrieval_layers"] == nlohmann::json::array({2, 5}));
  CHECK(j["prefill_kv"]["mode"] == "auto");
  CHECK(j["pack_bytes"].get<size_t>() == std::filesystem::file_size(f.pack));
  auto r = run_topkv("index info " + f.pack + " --verify");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find(fmt::format("context        {} tokens", j["tokens"].get<int>())) != std::string::npos);
  CHECK(r.out.find("attn topk, sinks 2, window 4") != std::string::npos);
  CHECK(r.out.find("indexes        multipole, flat") != std::string::npos);
  CHECK(r.out.find("top-k          layers [2,5]") != std::string::npos);
  CHECK(r.out.find("L5           host stores") != std::string::npos);
  CHECK(r.out.find("on load        used in place (copy-on-write): the host stores") != std::string::npos);
  CHECK(r.out.find("verified       every tensor matches its checksum") != std::string::npos);
  // Several -f files are one document: the same pack as one file with their text.
  const std::string a = f.dir.file("a.txt"), b = f.dir.file("b.txt");
  std::ofstream(a) << kDoc.substr(0, 100);
  std::ofstream(b) << kDoc.substr(100);
  auto two = run_topkv("index build -q -m " + f.model + " -f " + a + " -f " + b + " -o " + f.dir.file("ab.pack") +
                       " " + kPolicy + " --index flat --json " + f.dir.file("ab.json"));
  REQUIRE(two.rc == 0);
  CHECK(nlohmann::json::parse(test::slurp(f.dir.file("ab.json")))["tokens"] == j["tokens"]);
  auto info2 = run_topkv("index info " + f.dir.file("ab.pack"));
  CHECK(info2.out.find(fmt::format("context        {} tokens", j["tokens"].get<int>())) != std::string::npos);
}

TEST_CASE("generate --pack prints what generate prints after prefilling the same document") {
  Fixture& f = fixture();
  const std::string common = " -m " + f.model + " -n 12 --seed 4 --temp 0.8 -q";
  auto direct = run_topkv("generate" + common + " -f " + f.doc + " --attn topk " + kPolicy + " -c 256");
  auto packed = run_topkv("generate" + common + " --pack " + f.pack + " -c 256 --json " + f.dir.file("g.json"));
  INFO(direct.err << packed.err);
  REQUIRE(direct.rc == 0);
  REQUIRE(packed.rc == 0);
  CHECK(packed.out == direct.out);
  auto j = nlohmann::json::parse(test::slurp(f.dir.file("g.json")));
  CHECK(j["pack"]["tokens"] == j["prompt_tokens"]);
  CHECK(j["offload"]["policy"]["index"] == "multipole");

  // The other index built into the pack, against a run that builds it.
  auto direct_flat = run_topkv("generate" + common + " -f " + f.doc + " --attn topk " + kSearch + " -c 256 --index flat");
  auto packed_flat = run_topkv("generate" + common + " --pack " + f.pack + " -c 256 --index flat");
  REQUIRE(direct_flat.rc == 0);
  REQUIRE(packed_flat.rc == 0);
  CHECK(packed_flat.out == direct_flat.out);

  // A prompt appended to the pack, and query-time options changed on it.
  auto more = run_topkv("generate -m " + f.model + " --pack " + f.pack + " -p ' What is the secret word?' -n 3 -q "
                        "--k 4 --k-schedule linear --json " + f.dir.file("q.json"));
  INFO(more.err);
  REQUIRE(more.rc == 0);
  auto q = nlohmann::json::parse(test::slurp(f.dir.file("q.json")));
  CHECK(q["prompt_tokens"].get<int>() > q["pack"]["tokens"].get<int>());
  CHECK(q["offload"]["k_per_layer"] == nlohmann::json::array({3, 5}));  // mean 4, rising linearly
}

TEST_CASE("index build overlapped with the prefill (--overlap-build on) gives the same run and the same pack") {
  Fixture& f = fixture();
  // Small k-means blocks and prefill chunks, so that blocks complete (and
  // are clustered on other threads) while the prefill goes on.
  const std::string policy = " --attn topk --index multipole:block=8,ratio=2 " + kSearch + " --chunk 5 -c 256";
  const std::string common = " -m " + f.model + " -n 10 --seed 4 --temp 0.8 -q" + policy;
  auto off = run_topkv("generate" + common + " -f " + f.doc + " --overlap-build off");
  auto on = run_topkv("generate" + common + " -f " + f.doc + " --overlap-build on");
  INFO(off.err << on.err);
  REQUIRE(off.rc == 0);
  REQUIRE(on.rc == 0);
  CHECK(on.out == off.out);
  const std::string build = "index build -m " + f.model + " -f " + f.doc + " --index multipole:block=8,ratio=2 " +
                            kSearch + " --chunk 5 -q";
  const std::string p_off = f.dir.file("off.tkv"), p_on = f.dir.file("on.tkv");
  REQUIRE(run_topkv(build + " --overlap-build off -o " + p_off).rc == 0);
  auto b = run_topkv(build + " --overlap-build on -o " + p_on + " --json " + f.dir.file("on.json"));
  INFO(b.err);
  REQUIRE(b.rc == 0);
  CHECK(nlohmann::json::parse(test::slurp(f.dir.file("on.json")))["overlap_build"] == true);
  auto g_off = run_topkv("generate -m " + f.model + " --pack " + p_off + " -n 10 --seed 4 --temp 0.8 -q -c 256");
  auto g_on = run_topkv("generate -m " + f.model + " --pack " + p_on + " -n 10 --seed 4 --temp 0.8 -q -c 256");
  REQUIRE(g_off.rc == 0);
  REQUIRE(g_on.rc == 0);
  CHECK(g_on.out == g_off.out);
  CHECK(g_on.out == off.out);
}

TEST_CASE("generate --pack: --k replaces the k fraction the pack was built with, --k-fraction replaces --k") {
  Fixture& f = fixture();
  const std::string pack = f.dir.file("fraction.pack");
  auto b = run_topkv("index build -q -m " + f.model + " -f " + f.doc + " -o " + pack +
                     " --index multipole --k-fraction 0.2 --window 4 --sinks 2");
  INFO(b.err);
  REQUIRE(b.rc == 0);
  const auto k_of = [&](const std::string& options) {
    const std::string json = f.dir.file("fraction.json");
    auto r = run_topkv("generate -q -n 2 -m " + f.model + " --pack " + pack + " --json " + json + options);
    INFO(r.err);
    REQUIRE(r.rc == 0);
    return nlohmann::json::parse(test::slurp(json))["offload"]["k_per_layer"].get<std::vector<int64_t>>();
  };
  const std::vector<int64_t> from_pack = k_of("");
  REQUIRE(from_pack.size() == 2);
  CHECK(from_pack[0] > 3);  // a fifth of the pack's tokens
  CHECK(k_of(" --k 3") == std::vector<int64_t>{3, 3});
  const std::vector<int64_t> tenth = k_of(" --k 3 --k-fraction 0.1");
  REQUIRE(tenth.size() == 2);
  CHECK(std::llabs(2 * tenth[0] - from_pack[0]) <= 2);  // a tenth of the tokens, not 3
  CHECK(tenth[1] == tenth[0]);
}

// The CLI's k when none is given follows the context (2% within [64, 1024],
// offload/policy.h): a short prompt gets 64 keys, as before; --k-fraction
// alone is not capped; --k-min/--k-max bound it; with a fixed --k they are refused.
TEST_CASE("generate: the default k follows the context within [64, 1024], --k-min and --k-max bound a fraction") {
  Fixture& f = fixture();
  const auto k_of = [&](const std::string& options) {
    const std::string json = f.dir.file("k.json");
    auto r = run_topkv("generate -q -n 2 -c 256 -m " + f.model + " -f " + f.doc + " --attn topk --json " + json +
                       options);
    INFO(options << "\n" << r.err);
    REQUIRE(r.rc == 0);
    auto j = nlohmann::json::parse(test::slurp(json));
    return std::pair{j["offload"]["k_per_layer"].get<std::vector<int64_t>>(), j["prompt_tokens"].get<int64_t>()};
  };
  const auto [dflt, n] = k_of("");
  REQUIRE(n > 20);
  CHECK(dflt == std::vector<int64_t>(dflt.size(), 64));  // 2% of a short prompt is below the floor
  const auto [half, n2] = k_of(" --k-fraction 0.5");
  CHECK(half[0] == (n2 + 1) / 2);  // no floor, no cap unless given
  CHECK(k_of(" --k-fraction 0.5 --k-max 7").first[0] == 7);
  CHECK(k_of(" --k-fraction 0.01 --k-min 9").first[0] == 9);
  CHECK(k_of(" --k 5").first[0] == 5);
  auto bad = run_topkv("generate -q -n 2 -m " + f.model + " -f " + f.doc + " --attn topk --k 5 --k-max 9");
  CHECK(bad.rc != 0);
  CHECK_THAT(bad.err, Catch::Contains("--k-min and --k-max bound a k that follows the context"));
  auto crossed = run_topkv("generate -q -n 2 -m " + f.model + " -f " + f.doc +
                           " --attn topk --k-fraction 0.1 --k-min 10 --k-max 5");
  CHECK(crossed.rc != 0);
  CHECK_THAT(crossed.err, Catch::Contains("--k-max must be 0 (no bound) or in [--k-min 10"));
  auto none = run_topkv("generate -q -n 2 -m " + f.model + " -f " + f.doc + " --attn topk --k-min 0");
  CHECK(none.rc != 0);
  CHECK_THAT(none.err, Catch::Contains("--k-min must be at least 1"));
}

TEST_CASE("a q8_0 store (--store-type q8_0): a pack of int8 rows decodes as the run that built it, other head dims are refused") {
  Fixture& f = fixture();
  const std::string common = " -m " + f.model + " -n 12 --seed 4 --temp 0.8 -q -c 256";
  const std::string pack = f.dir.file("q8.tkv");
  auto b = run_topkv("index build -m " + f.model + " -f " + f.doc + " -o " + pack + " " + kPolicy +
                     " --store-type q8_0 -q");
  INFO(b.err);
  REQUIRE(b.rc == 0);
  auto direct = run_topkv("generate" + common + " -f " + f.doc + " --attn topk " + kPolicy + " --store-type q8_0");
  auto packed = run_topkv("generate" + common + " --pack " + pack + " --json " + f.dir.file("q8.json"));
  INFO(direct.err << packed.err);
  REQUIRE(direct.rc == 0);
  REQUIRE(packed.rc == 0);
  CHECK(packed.out == direct.out);
  CHECK(nlohmann::json::parse(test::slurp(f.dir.file("q8.json")))["offload"]["policy"]["store_type"] == "q8_0");
  CHECK(run_topkv("index info " + pack + " --verify").rc == 0);
  // The store type is fixed by the pack.
  auto other = run_topkv("generate" + common + " --pack " + pack + " --store-type f16");
  CHECK(other.rc != 0);
  CHECK_THAT(other.err, Catch::Contains("--store-type"));
  // Q8_0 stores blocks of 32: a head_dim of 48 is refused before any prefill, naming what to use.
  const std::string odd = f.dir.file("hd48.gguf");
  REQUIRE(run_topkv("model synth --preset tiny-llama --head-dim 48 -q -o " + odd).rc == 0);
  auto r = run_topkv("generate -m " + odd + " -p 'one two three four five six seven' -n 2 -q --attn topk " + kSearch +
                     " --store-type q8_0");
  CHECK(r.rc != 0);
  CHECK_THAT(r.err, Catch::Contains("head_dim 48 is not a multiple") && Catch::Contains("use f16") &&
                        Catch::Contains("f8 for 8 bits"));
}

TEST_CASE("a store type per layer (--store-type-at): the pack keeps it, its decode is the run's, bad layers are refused") {
  Fixture& f = fixture();
  const std::string common = " -m " + f.model + " -n 12 --seed 4 --temp 0.8 -q -c 256";
  const std::string pack = f.dir.file("at.tkv"), layout = " --store-type q8_0 --store-type-at 2=f16";
  auto b = run_topkv("index build -m " + f.model + " -f " + f.doc + " -o " + pack + " " + kPolicy + layout + " -q");
  INFO(b.err);
  REQUIRE(b.rc == 0);
  auto direct = run_topkv("generate" + common + " -f " + f.doc + " --attn topk " + kPolicy + layout);
  auto packed = run_topkv("generate" + common + " --pack " + pack + " --json " + f.dir.file("at.json"));
  INFO(direct.err << packed.err);
  REQUIRE(direct.rc == 0);
  REQUIRE(packed.rc == 0);
  CHECK(packed.out == direct.out);
  const auto j = nlohmann::json::parse(test::slurp(f.dir.file("at.json")));
  CHECK(j["offload"]["policy"]["store_type"] == "q8_0");
  CHECK(j["offload"]["policy"]["store_type_at"] == "2=f16");
  auto info = run_topkv("index info " + pack);
  CHECK_THAT(info.out, Catch::Contains("store q8_0 (layers 2=f16)"));
  // The layout is fixed by the pack.
  auto other = run_topkv("generate" + common + " --pack " + pack + " --store-type-at 5=f16");
  CHECK(other.rc != 0);
  CHECK_THAT(other.err, Catch::Contains("--store-type-at 2=f16; this run asks for 5=f16"));
  // Layers 0, 1, 3, 4 of tiny gemma3 are sliding-window layers; 6 is past its last.
  for (const char* bad : {"0=f16", "6=f16"}) {
    auto r = run_topkv("generate" + common + " -f " + f.doc + " --attn topk " + kPolicy + " --store-type-at " + bad);
    CHECK(r.rc != 0);
    CHECK_THAT(r.err, Catch::Contains("is not a full-context layer of this model (those are 2, 5)"));
  }
  auto syntax = run_topkv("generate" + common + " -f " + f.doc + " --attn topk " + kPolicy + " --store-type-at 2:f16");
  CHECK(syntax.rc != 0);
  CHECK_THAT(syntax.err, Catch::Contains("LAYER=TYPE"));
}

TEST_CASE("a dense pack decodes as a dense run, --prompts answers each question from the pack afresh") {
  Fixture& f = fixture();
  const std::string dense = f.dir.file("dense.pack");
  auto b = run_topkv("index build -q -m " + f.model + " -f " + f.doc + " -o " + dense + " --attn dense");
  INFO(b.err);
  REQUIRE(b.rc == 0);
  const std::string common = " -m " + f.model + " -n 10 --seed 2 --temp 0.7 -q -c 256";
  auto direct = run_topkv("generate" + common + " -f " + f.doc + " --attn dense");
  auto packed = run_topkv("generate" + common + " --pack " + dense);
  REQUIRE(direct.rc == 0);
  REQUIRE(packed.rc == 0);
  CHECK(packed.out == direct.out);
  CHECK(run_topkv("index info " + dense).out.find("attn dense: the model's full caches, no index") != std::string::npos);

  const std::string qs = f.dir.file("questions.txt");
  std::ofstream(qs) << " Who kept the log?\n\n What rang until dawn?\n";
  auto many = run_topkv("generate" + common + " --pack " + f.pack + " --prompts " + qs + " --json " +
                        f.dir.file("qs.json"));
  INFO(many.err);
  REQUIRE(many.rc == 0);
  const size_t second = many.out.find("=== question 2/2:  What rang until dawn?\n");
  REQUIRE(many.out.rfind("=== question 1/2:  Who kept the log?\n", 0) == 0);
  REQUIRE(second != std::string::npos);
  auto alone = run_topkv("generate" + common + " --pack " + f.pack + " -p ' What rang until dawn?'");
  REQUIRE(alone.rc == 0);
  CHECK(many.out.substr(many.out.find('\n', second) + 1) == alone.out);  // the same answer as a run of its own
  auto j = nlohmann::json::parse(test::slurp(f.dir.file("qs.json")));
  REQUIRE(j["questions"].size() == 2);
  for (auto& q : j["questions"]) CHECK(q["first_token_s"].get<double>() > 0);
}

TEST_CASE("index build, index info and generate --pack: bad input is a clear error and a non-zero exit") {
  Fixture& f = fixture();
  const std::string corrupt = f.dir.file("corrupt.pack");
  {
    std::string bytes = test::slurp(f.pack);
    bytes[bytes.size() - 3] ^= 0x40;  // inside the last tensor's bytes
    std::ofstream(corrupt, std::ios::binary) << bytes;
  }
  struct Bad { std::string args, says; };
  const std::string build = "index build -m " + f.model + " -f " + f.doc + " ";
  const std::string gen = "generate -m " + f.model + " --pack " + f.pack + " -n 2 ";
  const std::string x = f.dir.file("x.pack"), no_questions = f.dir.file("none.txt");
  std::ofstream(no_questions) << "\n  \n";
  const std::vector<Bad> cases = {
      {build, "--out is required"},
      {build + "-o " + f.doc + "/x.pack", "the context pack '" + f.doc + "/x.pack' cannot be written"},
      {build + "-o " + x + " --attn dense --index flat", "--attn dense builds no index"},
      {build + "-o " + x + " --index nosuch", "unknown index backend 'nosuch'"},
      {build + "-o " + x + " --index flat --index quest --index flat", "--index flat is given twice"},
      {build + "-o " + x + " --backend cpu --weights f16", "--weights f16 is for the CUDA backend"},
      {build + "-o " + x + " --build-on gpu", "--build-on gpu needs the CUDA backend"},
      {"index build -m " + f.model + " -f /dev/null -o " + x, "the prompt is empty"},
      {gen + "--window 8", "--window is fixed when the pack is built"},
      {gen + "--index hnswlib", "holds the indexes multipole, flat, not hnswlib"},
      {gen + "--index flat --index multipole", "--index names 2 indexes"},
      {gen + "--index flat,multipole", "--index names 2 indexes"},
      {gen + "--attn dense", "drop --attn dense"},
      {gen + "--chat -p hi", "--chat cannot wrap a prompt appended to a context pack"},
      {gen + "-c 10", "more than the context size 10"},
      {gen + "--prompts " + no_questions, "has no question"},
      {gen + "--prompts " + no_questions + " -p hi", "either with --prompts or as -p/-f"},
      {"generate -m " + f.model + " -p hi --prompts " + no_questions, "--prompts needs --pack"},
      {"generate -m " + f.other + " --pack " + f.pack + " -n 2", "give that model with -m"},
      {"generate -m " + f.model + " --pack /nonexistent.pack", "nonexistent.pack"},
      {"generate -m " + f.model + " --pack " + corrupt, "does not match its checksum"},
      {"index info " + f.model, "not a safetensors file"},
      {"index info " + corrupt + " --verify", "does not match its checksum"},
      {"index", "A subcommand is required"},
  };
  for (const Bad& b : cases) {
    INFO(b.args);
    auto r = run_topkv(b.args);
    CHECK(r.rc != 0);
    CHECK(r.err.find(b.says) != std::string::npos);
  }
  CHECK(!std::filesystem::exists(x));
  CHECK(!std::filesystem::exists(x + ".tmp"));
}

TEST_CASE("gemma3 270M: generate --pack prints what generate prints after prefilling the document") {
  const std::string model = test::real_model_path(test::kGemma270m);
  if (model.empty()) return;
  test::TempDir dir("topkv_cli_index_real");
  std::string doc;
  for (int i = 0; i < 6; ++i) doc += kDoc + " ";
  std::ofstream(dir.file("doc.txt")) << doc;
  const std::string policy = " --index multipole --k 32 --window 64 --sinks 4";
  auto b = run_topkv("index build -q -m " + model + " -f " + dir.file("doc.txt") + " -o " + dir.file("d.pack") + policy);
  INFO(b.err);
  REQUIRE(b.rc == 0);
  const std::string common = " -m " + model + " -n 16 -q -c 600";
  auto direct = run_topkv("generate" + common + " -f " + dir.file("doc.txt") + " --attn topk" + policy);
  auto packed = run_topkv("generate" + common + " --pack " + dir.file("d.pack"));
  INFO(direct.err << packed.err);
  REQUIRE(direct.rc == 0);
  REQUIRE(packed.rc == 0);
  CHECK(!direct.out.empty());
  CHECK(packed.out == direct.out);
}
