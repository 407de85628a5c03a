// Context packs: what is restored from a pack must decode exactly as what was
// saved — bit for bit, for every index backend, layer geometry and model kind
// — and keep working as tokens are appended after it; every way a pack can
// be wrong (other model, changed build-time policy, corruption, truncation,
// newer format, too small a context) is an Error that says so.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <random>

#include "offload/context_pack.h"
#include "offload/offloaded_layer.h"
#include "src/common/error.h"
#include "src/model/synth.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float shift = 0.f) {
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng) + shift;
  return v;
}

// Both layers answer the same queries with bit-identical outputs and counts.
void check_same_answers(const OffloadedLayer& a, const OffloadedLayer& b, int n_heads, int d, std::mt19937& rng) {
  REQUIRE(a.n_tokens() == b.n_tokens());
  for (int trial = 0; trial < 3; ++trial) {
    const std::vector<float> q = randn((size_t)n_heads * d, rng);
    std::vector<float> oa(q.size()), ob(q.size());
    AttendStats sa, sb;
    a.attend(q.data(), 0.125f, oa.data(), &sa);
    b.attend(q.data(), 0.125f, ob.data(), &sb);
    REQUIRE(oa == ob);
    CHECK(sa.retrieved == sb.retrieved);
    CHECK(sa.far_clusters == sb.far_clusters);
    CHECK(sa.exact == sb.exact);
  }
}

// A pack-wide byte offset of tensor `name` (safetensors: 8-byte length, JSON header, data).
size_t tensor_offset(const std::string& path, const std::string& name) {
  const std::string f = test::slurp(path);
  uint64_t n = 0;
  std::memcpy(&n, f.data(), 8);
  auto h = nlohmann::json::parse(f.substr(8, n));
  return 8 + n + h.at(name).at("data_offsets")[0].get<size_t>();
}

void flip_byte(const std::string& path, size_t at) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg((std::streamoff)at);
  char c = 0;
  f.read(&c, 1);
  c ^= 0x20;
  f.seekp((std::streamoff)at);
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("an offloaded layer restored from a pack answers exactly as the saved one, before and after appends") {
  test::TempDir tmp("topkv_pack_layer");
  struct Case {
    int n_heads, kv_heads, d, sinks, window;
    int64_t n, gen, k;
    const char* index;
    std::vector<char> streaming;
    DType store = DType::F16;
  };
  const int64_t big = 2 * RowStore::kChunkRows + 37;  // whole chunks used in place from the mapping
  const std::vector<Case> cases = {
      {4, 1, 64, 4, 16, 300, 40, 24, "flat", {}},
      {8, 2, 128, 0, 8, 257, 30, 32, "quest:page=7", {0, 1}},
      {8, 8, 64, 3, 5, 2, 20, 8, "multipole", {}},  // fewer tokens than sinks: no store yet
      {4, 4, 256, 8, 32, 1, 50, 16, "centroid:levels=2,block=100", {}, DType::BF16},
      {8, 1, 64, 2, 4, 600, 25, 64, "multipole:levels=2,coarse_ratio=3", {}},
      {4, 2, 64, 4, 16, 400, 30, 1 << 20, "hnswlib", {1, 0}},  // k covers all: appends re-seed the graph's levels
      {4, 2, 64, 4, 16, 400, 30, 1 << 20, "faiss-hnsw", {}},
      {4, 2, 64, 4, 16, 400, 30, 32, "faiss-ivf:nlist=9", {}},
      {2, 1, 8, 0, 1, big, 5, 16, "flat", {}},
  };
  std::mt19937 rng(11);
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    INFO("case " << ci << ": " << c.index << " heads " << c.n_heads << "/" << c.kv_heads << " d " << c.d << " n " << c.n);
    OffloadedLayer::Config cfg;
    cfg.n_heads = c.n_heads, cfg.kv_heads = c.kv_heads, cfg.head_dim = c.d, cfg.sinks = c.sinks, cfg.window = c.window;
    cfg.k = c.k, cfg.index = c.index, cfg.streaming = c.streaming, cfg.store_dtype = c.store, cfg.build.n_threads = 1;
    const size_t tok = (size_t)c.kv_heads * c.d;
    const std::vector<float> keys = randn((size_t)(c.n + c.gen) * tok, rng, 0.4f), values = randn(keys.size(), rng);
    OffloadedLayer a(cfg);
    a.prefill(keys.data(), values.data(), c.n);
    const std::string path = tmp.file("layer.pack");
    {
      PackWriter w;
      a.save(w, "L7.");
      w.write(path);
    }
    PackReader r(path);
    OffloadedLayer b(cfg);
    b.restore(r, "L7.", c.n);
    int64_t stored = 0;
    for (int h = 0; h < c.kv_heads; ++h) {
      CHECK(b.stored_rows(h) == a.stored_rows(h));
      stored += a.stored_rows(h);
    }
    if (c.n == big) CHECK(b.index(0)->keys().mapped_bytes() == 2 * (size_t)RowStore::kChunkRows * 2 * c.d);
    check_same_answers(a, b, c.n_heads, c.d, rng);
    for (int64_t t = c.n; t < c.n + c.gen; ++t) {
      a.append(keys.data() + (size_t)t * tok, values.data() + (size_t)t * tok);
      b.append(keys.data() + (size_t)t * tok, values.data() + (size_t)t * tok);
      if ((t - c.n) % 9 == 8 || t + 1 == c.n + c.gen) check_same_answers(a, b, c.n_heads, c.d, rng);
    }
    // A configuration that does not match the pack is refused by name (a
    // layer of fewer tokens than its sinks holds the same with any window).
    OffloadedLayer::Config other = cfg;
    other.window = c.window + 1;
    OffloadedLayer wrong_window(other);
    if (c.n > c.sinks) CHECK_THROWS_WITH(wrong_window.restore(r, "L7.", c.n), Catch::Contains("window_k"));
    if (c.kv_heads > 1 && stored > 0) {
      other = cfg;
      other.streaming.assign((size_t)c.kv_heads, 0);
      other.streaming[0] = cfg.streaming.empty() || !cfg.streaming[0];
      OffloadedLayer wrong_heads(other);
      CHECK_THROWS_WITH(wrong_heads.restore(r, "L7.", c.n), Catch::Contains("head pattern differs"));
    }
  }
}

namespace {

struct ModelCase {
  std::string name;
  SynthConfig synth;
  OffloadPolicy policy;
  std::string heads_tsv;  // DuoAttention gates, empty = none
};

std::vector<ModelCase> model_cases() {
  ModelCase g{"gemma3", synth_preset("tiny-gemma3"), {}, ""};
  g.policy.attn = AttnMode::TopK, g.policy.index = "multipole", g.policy.search.k = 8;
  g.policy.sinks = 2, g.policy.window = 8;
  ModelCase l{"llama", synth_defaults("llama"), {}, "0.9 0.9\n0.1 0.9\n0.9 0.2\n"};
  l.synth.layers = 3, l.synth.width = 128, l.synth.heads = 8, l.synth.kv_heads = 2, l.synth.head_dim = 32;
  l.synth.ffn = 256, l.synth.vocab = 1024;
  l.policy.attn = AttnMode::TopK, l.policy.index = "quest:page=4", l.policy.search.k = 12, l.policy.dense_layers = 1;
  l.policy.sinks = 3, l.policy.window = 6, l.policy.store_dtype = DType::BF16;
  return {g, l};
}

int argmax(const std::vector<float>& v) { return (int)(std::max_element(v.begin(), v.end()) - v.begin()); }

}  // namespace

TEST_CASE("a model and runtime restored from a context pack decode exactly as the ones that prefilled") {
  test::TempDir tmp("topkv_pack_ctx");
  for (ModelCase mc : model_cases()) {
    for (DType kv : {DType::F32, DType::F16}) {
      INFO(mc.name << " kv " << dtype_name(kv));
      const std::string model_path = tmp.file(mc.name + ".gguf"), pack_path = tmp.file(mc.name + ".pack");
      synth_write(mc.synth, model_path);
      if (!mc.heads_tsv.empty()) {
        mc.policy.heads_file = tmp.file("heads.tsv");
        std::ofstream(mc.policy.heads_file) << mc.heads_tsv;
      }
      std::shared_ptr<const GgufFile> file = GgufFile::open(model_path);
      const ModelConfig cfg = read_model_config(*file);
      auto be = make_cpu_backend();
      const int64_t P = 90;
      const int steps = 10;
      std::vector<int32_t> prompt((size_t)P);
      for (int64_t i = 0; i < P; ++i) prompt[(size_t)i] = (int32_t)((i * 7919 + 13) % cfg.n_vocab);
      Model a(file, *be, {.n_ctx = P + steps + 4, .max_chunk = 32, .kv_dtype = kv});
      std::vector<float> la = a.prefill(prompt, 32);
      OffloadRuntime ra(cfg, mc.policy, false);
      ra.take_prefill(a);
      a.set_attention_override(&ra);
      save_context_pack(pack_path, *file, a, ra, prompt, la, {{"source", "test"}});

      ContextPack pack(pack_path);
      CHECK(pack.n_tokens() == P);
      CHECK(pack.tokens() == prompt);
      pack.check_model(*file);
      OffloadRuntime rb(cfg, pack.policy_for_run(pack.policy()), false);
      Model b(file, *be, {.n_ctx = P + steps + 40, .max_chunk = 7, .kv_dtype = kv});
      std::vector<float> lb = pack.restore(b, rb);
      CHECK(lb == la);
      CHECK(b.n_past() == P);
      CHECK(rb.stats().keys_indexed == ra.stats().keys_indexed);
      CHECK(rb.describe() == ra.describe());  // streaming heads come from the pack
      for (int s = 0; s < steps; ++s) {
        const int32_t tok = argmax(la);
        la = a.decode(tok);
        lb = b.decode(tok);
        REQUIRE(la == lb);
      }
      // A prompt appended after the pack: several tokens in one chunk.
      const std::vector<int32_t> more{5, 77, 300};
      CHECK(a.prefill(more, 3) == b.prefill(more, 3));
    }
  }
}

TEST_CASE("a context pack refuses another model, a changed build-time policy and too small a context") {
  test::TempDir tmp("topkv_pack_refuse");
  ModelCase mc = model_cases()[0];
  const std::string model_path = tmp.file("m.gguf"), other_path = tmp.file("other.gguf"), pack_path = tmp.file("m.pack");
  synth_write(mc.synth, model_path);
  mc.synth.seed = 99;
  synth_write(mc.synth, other_path);
  std::shared_ptr<const GgufFile> file = GgufFile::open(model_path);
  const ModelConfig cfg = read_model_config(*file);
  auto be = make_cpu_backend();
  std::vector<int32_t> prompt(40, 9);
  Model a(file, *be, {.n_ctx = 64, .max_chunk = 16});
  const std::vector<float> la = a.prefill(prompt, 16);
  OffloadRuntime ra(cfg, mc.policy, false);
  ra.take_prefill(a);
  save_context_pack(pack_path, *file, a, ra, prompt, la, {});
  ContextPack pack(pack_path);

  CHECK_THROWS_WITH(pack.check_model(*GgufFile::open(other_path)), Catch::Contains("was built with the model"));
  struct Change { std::function<void(OffloadPolicy&)> apply; const char* says; };
  const std::vector<Change> changes = {
      {[](OffloadPolicy& p) { p.window = 16; }, "--window 8; this run asks for 16"},
      {[](OffloadPolicy& p) { p.sinks = 0; }, "--sinks"},
      {[](OffloadPolicy& p) { p.index = "multipole:ratio=8"; }, "--index multipole"},
      {[](OffloadPolicy& p) { p.index = "flat"; }, "--index"},
      {[](OffloadPolicy& p) { p.dense_layers = 1; }, "--dense-layers"},
      {[](OffloadPolicy& p) { p.store_dtype = DType::BF16; }, "--store-type"},
      {[](OffloadPolicy& p) { p.heads_file = "duo.tsv"; }, "--heads (none); this run asks for duo.tsv"},
      {[](OffloadPolicy& p) { p.attn = AttnMode::Dense; }, "--attn topk"},
  };
  for (const Change& c : changes) {
    OffloadPolicy p = pack.policy();
    c.apply(p);
    CHECK_THROWS_WITH(pack.policy_for_run(p), Catch::Contains(c.says));
  }
  OffloadPolicy query = pack.policy();
  query.search.k = 3, query.k_schedule = KSchedule::Linear, query.search.threshold = 0.01;  // query-time: fine
  OffloadRuntime rq(cfg, pack.policy_for_run(query), false);
  Model small(file, *be, {.n_ctx = 39, .max_chunk = 8});
  CHECK_THROWS_WITH(pack.restore(small, rq), Catch::Contains("more than the context size 39"));
  Model fits(file, *be, {.n_ctx = 41, .max_chunk = 8});
  pack.restore(fits, rq);
  CHECK(rq.k_per_layer() == std::vector<int64_t>{2, 4});  // k 3, linear over two layers
  // A runtime serving other layers (more dense layers) cannot take the pack.
  OffloadPolicy dense1 = pack.policy();
  dense1.dense_layers = 3;
  OffloadRuntime rd(cfg, dense1, false);
  Model md(file, *be, {.n_ctx = 64, .max_chunk = 8});
  CHECK_THROWS_WITH(pack.restore(md, rd), Catch::Contains("KV of 4 model layers, this run needs 5"));
}

TEST_CASE("a corrupted, truncated, foreign or newer pack is an Error naming the problem") {
  test::TempDir tmp("topkv_pack_bad");
  ModelCase mc = model_cases()[0];
  const std::string model_path = tmp.file("m.gguf"), pack_path = tmp.file("m.pack");
  synth_write(mc.synth, model_path);
  std::shared_ptr<const GgufFile> file = GgufFile::open(model_path);
  const ModelConfig cfg = read_model_config(*file);
  auto be = make_cpu_backend();
  std::vector<int32_t> prompt(60);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (int32_t)(i * 37 % 1000);
  Model a(file, *be, {.n_ctx = 64, .max_chunk = 16});
  const std::vector<float> la = a.prefill(prompt, 16);
  OffloadRuntime ra(cfg, mc.policy, false);
  ra.take_prefill(a);
  save_context_pack(pack_path, *file, a, ra, prompt, la, {});
  const std::string good = test::slurp(pack_path);
  uint64_t header = 0;
  std::memcpy(&header, good.data(), 8);
  CHECK(PackReader(pack_path).verify_all(false) == good.size() - 8 - header);  // every tensor byte

  const auto restore = [&](const std::string& path) {
    ContextPack pack(path);
    OffloadRuntime rt(cfg, pack.policy_for_run(pack.policy()), false);
    Model m(file, *be, {.n_ctx = 64, .max_chunk = 16});
    pack.restore(m, rt);
  };
  const auto rewrite = [&](const std::string& bytes) { std::ofstream(pack_path, std::ios::binary) << bytes; };
  // A bit flipped in a small tensor is found on load; in a store, by --verify.
  flip_byte(pack_path, tensor_offset(pack_path, "offload.L2.h0.window_k") + 5);
  CHECK_THROWS_WITH(restore(pack_path), Catch::Contains("tensor 'offload.L2.h0.window_k' does not match its checksum"));
  rewrite(good);
  flip_byte(pack_path, tensor_offset(pack_path, "offload.L5.h0.values") + 11);
  CHECK_THROWS_WITH(PackReader(pack_path).verify_all(false), Catch::Contains("tensor 'offload.L5.h0.values'"));
  rewrite(good);
  restore(pack_path);  // intact again
  rewrite(good.substr(0, good.size() - 100));
  CHECK_THROWS_WITH(restore(pack_path), Catch::Contains("truncated"));
  // A safetensors file that is not a pack (a KV dump, say), and a newer format.
  SafetensorsWriter st;
  st.add("x", StDType::F32, {1}, la.data());
  st.write(pack_path);
  CHECK_THROWS_WITH(restore(pack_path), Catch::Contains("not a topkv context pack"));
  PackWriter future;
  future.meta()["format"] = 2;
  future.add_owned("tokens", StDType::I32, {1}, std::vector<uint8_t>(4, 1));
  future.write(pack_path);
  CHECK_THROWS_WITH(restore(pack_path), Catch::Contains("format 2, this topkv reads formats 1..1"));
  PackWriter incomplete;
  incomplete.meta()["format"] = 1;
  incomplete.write(pack_path);
  CHECK_THROWS_WITH(restore(pack_path), Catch::Contains("incomplete metadata"));
}
