// End-to-end tests of `topkv bench recall`: runs the built binary on tiny
// synthetic data and checks its CSV and JSON (the JSON against
// bench/recall_schema.json), a dump round trip, the plot, and bad input.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include "tests/test_util.h"

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {


using Run = topkv::test::CliRun;
using topkv::test::slurp;
using topkv::test::run_topkv;

fs::path temp_dir() {
  auto p = fs::temp_directory_path() / ("topkv_test_bench_cli_" + std::to_string(::getpid()));
  fs::create_directories(p);
  return p;
}


std::vector<std::vector<std::string>> parse_csv(const std::string& text) {
  std::vector<std::vector<std::string>> rows;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> cells(1);
    bool quoted = false;
    for (size_t i = 0; i < line.size(); ++i) {
      char c = line[i];
      if (quoted && c == '"' && i + 1 < line.size() && line[i + 1] == '"') cells.back() += '"', ++i;
      else if (c == '"') quoted = !quoted;
      else if (c == ',' && !quoted) cells.emplace_back();
      else cells.back() += c;
    }
    rows.push_back(cells);
  }
  return rows;
}

// The subset of JSON Schema (2020-12) that bench/recall_schema.json uses.
void validate(const json& v, const json& schema, const json& root, const std::string& at) {
  INFO("at " << at);
  if (schema.contains("$ref")) {
    std::string ref = schema["$ref"];
    REQUIRE(ref.rfind("#/$defs/", 0) == 0);
    validate(v, root["$defs"][ref.substr(8)], root, at);
  }
  if (schema.contains("oneOf")) {  // the schema's branches differ by type: check the one that matches
    int matching = 0;
    for (auto& s : schema["oneOf"]) {
      const std::string t = s.value("type", "");
      if ((t == "null" && v.is_null()) || (t == "object" && v.is_object())) {
        ++matching;
        validate(v, s, root, at);
      }
    }
    CHECK(matching == 1);
  }
  if (schema.contains("const")) CHECK(v == schema["const"]);
  if (schema.contains("enum")) {
    bool found = false;
    for (auto& e : schema["enum"]) found = found || e == v;
    CHECK(found);
  }
  if (schema.contains("type")) {
    const std::string t = schema["type"];
    if (t == "object") REQUIRE(v.is_object());
    if (t == "array") REQUIRE(v.is_array());
    if (t == "string") CHECK(v.is_string());
    if (t == "integer") CHECK(v.is_number_integer());
    if (t == "number") CHECK(v.is_number());
    if (t == "null") CHECK(v.is_null());
  }
  if (v.is_number()) {
    if (schema.contains("minimum")) CHECK(v.get<double>() >= schema["minimum"].get<double>());
    if (schema.contains("maximum")) CHECK(v.get<double>() <= schema["maximum"].get<double>());
    if (schema.contains("exclusiveMinimum")) CHECK(v.get<double>() > schema["exclusiveMinimum"].get<double>());
  }
  if (v.is_array()) {
    if (schema.contains("minItems")) CHECK(v.size() >= schema["minItems"].get<size_t>());
    if (schema.contains("items"))
      for (size_t i = 0; i < v.size(); ++i) validate(v[i], schema["items"], root, at + "[" + std::to_string(i) + "]");
  }
  if (v.is_object()) {
    for (auto& r : schema.value("required", json::array())) CHECK(v.contains(r.get<std::string>()));
    for (auto& [k, x] : v.items()) {
      if (schema.contains("properties") && schema["properties"].contains(k))
        validate(x, schema["properties"][k], root, at + "." + k);
      else if (schema.contains("additionalProperties")) {
        const json& ap = schema["additionalProperties"];
        if (ap.is_boolean()) CHECK(ap.get<bool>());
        else validate(x, ap, root, at + "." + k);
      }
    }
  }
}

const std::string kTiny =
    "bench recall --synthetic --n-keys 3000 --head-dim 64 --queries 12 --gqa-group 2 --threads 2 --quiet";

}  // namespace

TEST_CASE("bench recall: CSV and JSON (valid against the schema) hold one row per backend and sweep point") {
  auto dir = temp_dir();
  auto csv = dir / "r.csv", js = dir / "r.json";
  auto r = run_topkv(kTiny + " --heads 2 --k 16 --index flat --sweep flat.k=4,16 --sweep gqa=union,mean --csv " +
                 csv.string() + " --json " + js.string());
  INFO(r.err);
  REQUIRE(r.rc == 0);
  CHECK(r.out.find("recall@16") != std::string::npos);
  CHECK(r.out.find("flat") != std::string::npos);

  auto rows = parse_csv(slurp(csv));
  REQUIRE(rows.size() == 5);  // header + 2 k x 2 gqa
  const auto& h = rows[0];
  auto col = [&](const std::string& name) {
    auto it = std::find(h.begin(), h.end(), name);
    REQUIRE(it != h.end());
    return (size_t)(it - h.begin());
  };
  for (size_t i = 1; i < rows.size(); ++i) {
    REQUIRE(rows[i].size() == h.size());
    CHECK(rows[i][col("index")] == "flat");
    const double recall = std::stod(rows[i][col("recall_mean")]);
    const int k = std::stoi(rows[i][col("k")]);
    if (k == 16 && rows[i][col("gqa")] == "union") {
      CHECK(recall == 1.0);  // the exact scan
      CHECK(std::stod(rows[i][col("fraction_scored")]) == 1.0);
      CHECK(std::stod(rows[i][col("err_mean")]) >= 0.0);
    }
    if (k == 4) CHECK(recall < 0.5);  // 4 of the best 16, plus what the other head's union adds
    CHECK(std::stoi(rows[i][col("layer_heads")]) == 2);
    CHECK(std::stod(rows[i][col("qps")]) > 0);
  }
  CHECK(rows[1][col("label")] == "k=4,gqa=union");  // quoted in the file: it holds a comma

  const json j = json::parse(slurp(js));
  const json schema = json::parse(slurp(fs::path(TOPKV_SOURCE_DIR) / "bench" / "recall_schema.json"));
  validate(j, schema, schema, "$");
  REQUIRE(j["results"].size() == 4);
  CHECK(j["data"]["n_keys"] == 3000);
  CHECK(j["data"]["group"] == 2);
  CHECK(j["data"]["kv_heads"] == 2);
  CHECK(j["config"]["k"] == 16);
  CHECK(j["config"]["kmeans"] == "faiss");
  CHECK(j["config"]["build_seed"] == 1234);
  CHECK(j["results"][3]["search"]["gqa"] == "mean");
  CHECK(j["results"][3]["layer"]["heads"] == 2);
  fs::remove_all(dir);
}

TEST_CASE("bench recall: synthetic data saved as a dump benchmarks the same through --dump") {
  auto dir = temp_dir();
  auto dump = dir / "kv.safetensors", a = dir / "a.json", b = dir / "b.json";
  auto r1 = run_topkv(kTiny + " --heads 2 --k 8 --save-dump " + dump.string() + " --json " + a.string());
  INFO(r1.err);
  REQUIRE(r1.rc == 0);
  auto r2 = run_topkv("bench recall --dump " + dump.string() + " --layer 0 --head 1 --heads 0 --k 8 --quiet --json " +
                  b.string());
  INFO(r2.err);
  REQUIRE(r2.rc == 0);
  const json ja = json::parse(slurp(a)), jb = json::parse(slurp(b));
  CHECK(jb["data"]["n_keys"] == 3000);
  CHECK(jb["data"]["kv_heads"] == 2);
  CHECK(jb["data"]["dtype"] == "f16");
  CHECK(jb["data"]["scale"].get<double>() == Approx(ja["data"]["scale"].get<double>()));
  CHECK(jb["results"][0]["recall"]["mean"] == 1.0);
  CHECK(jb["data"]["source"].get<std::string>().find("head 1") != std::string::npos);
  // --skip-keys: the runtime's sinks left out of the index and the ground truth
  auto c = dir / "c.json";
  auto r3 = run_topkv("bench recall --dump " + dump.string() + " --skip-keys 4 --k 8 --quiet --json " + c.string());
  INFO(r3.err);
  REQUIRE(r3.rc == 0);
  const json jc = json::parse(slurp(c));
  CHECK(jc["data"]["n_keys"] == 2996);
  CHECK(jc["data"]["source"].get<std::string>().find("first 4 keys left out") != std::string::npos);
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {" --skip-keys 3000", "leaves none"}, {" --skip-keys -1", "skip-keys"}}) {
    auto bad = run_topkv("bench recall --dump " + dump.string() + args + " --k 8 --quiet");
    INFO(args << "\n" << bad.err);
    CHECK(bad.rc != 0);
    CHECK(bad.err.find(needle) != std::string::npos);
  }
  fs::remove_all(dir);
}

TEST_CASE("bench recall: --png draws the plot when matplotlib is there") {
  if (std::system("/usr/bin/python3 -c 'import matplotlib' >/dev/null 2>&1") != 0) {
    WARN("no python3 with matplotlib: plot not tested");
    return;
  }
  auto dir = temp_dir();
  auto png = dir / "r.png";
  auto r = run_topkv(kTiny + " --index flat --sweep k=2,8 --png " + png.string() + " --png-metric mass");
  INFO(r.err);
  REQUIRE(r.rc == 0);
  const std::string bytes = slurp(png);
  REQUIRE(bytes.size() > 1000);
  CHECK(bytes.substr(1, 3) == "PNG");
  fs::remove_all(dir);
}

TEST_CASE("bench recall: bad input is a clear error, a non-zero exit, and no output file") {
  auto dir = temp_dir();
  auto csv = dir / "never.csv";
  auto bad = [&](const std::string& args, const std::string& needle) {
    auto r = run_topkv(args + " --csv " + csv.string());
    INFO(args << "\n" << r.err);
    CHECK(r.rc != 0);
    CHECK(r.err.find(needle) != std::string::npos);
    CHECK_FALSE(fs::exists(csv));
  };
  bad(kTiny + " --index nosuch", "unknown index backend 'nosuch'");
  bad(kTiny + " --index flat:M=3", "unknown parameter 'M'");
  bad(kTiny + " --sweep hnswlib.ef=16,32", "no --index uses it");
  bad(kTiny + " --sweep k=0", "k must be at least 1");
  bad(kTiny + " --sweep k=16:8:x2", "bad sweep");
  bad(kTiny + " --sweep foo=1", "unknown search parameter 'foo'");
  bad(kTiny + " --sweep k=1,2 --sweep flat.k=3", "swept twice");
  bad(kTiny + " --sweep gqa=both", "union or mean");
  bad(kTiny + " --k 0", "--k must be at least 1");
  bad(kTiny + " --topic-weight 2", "topic_weight");
  bad("bench recall --synthetic --head-dim 63 --quiet", "head_dim");
  bad(kTiny + " --png-metric speed", "--png-metric");
  bad(kTiny + " --dtype f8", "unknown element type");
  bad(kTiny + " --kmeans gpu", "--kmeans: gpu not in {faiss,lloyd}");
  bad(kTiny + " --build-seed -3", "a seed is a whole number >= 0 (got '-3')");
  bad(kTiny + " --seed -1", "a seed is a whole number >= 0 (got '-1')");
  bad(kTiny + " --layer 2", "--layer selects a layer");
  bad(kTiny + " --skip-keys 4", "--skip-keys leaves keys of a --dump file out");
  bad("bench recall --quiet", "exactly one data source");
  bad("bench recall --dump " + (dir / "missing.safetensors").string(), "cannot open");
  bad("bench recall --dump x.safetensors --n-keys 10", "needs --synthetic");
  std::ofstream((dir / "plain").string()) << "a file, not a folder";
  bad(kTiny + " --json " + (dir / "plain" / "dir.json").string(), "cannot be written");
  fs::remove_all(dir);
}
