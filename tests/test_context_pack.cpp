// Context packs: what is restored from a pack must decode exactly as what was
// saved — bit for bit, for every index backend (and each of several built
// into one pack), layer geometry and model kind, top-k and dense — and keep
// working as tokens are appended after it; every way a pack can be wrong
// (other model, changed build-time policy, an index it does not hold,
// corruption of any part, truncation, newer format, too small a context) is
// an Error that says so before any work.
#include <catch2/catch.hpp>
#include <cstring>
#include <fstream>
#include <random>

#include "offload/context_pack.h"
#include "offload/offloaded_layer.h"
#include "src/common/error.h"
#include "src/model/synth.h"
#include "src/session/session.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

using test::model_options;

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

void flip_byte(const std::string& path, size_t at, char mask = 0x20) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg((std::streamoff)at);
  char c = 0;
  f.read(&c, 1);
  c ^= mask;
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
      {8, 2, 128, 2, 8, 300, 30, 32, "multipole", {}, DType::F8E4M3},  // 8-bit store rows in the pack
      {4, 2, 64, 3, 8, 2 * RowStore::kChunkRows + 5, 20, 32, "quest:page=7", {}, DType::Q8_0},  // int8 blocks, mapped
      {8, 1, 64, 2, 4, 600, 25, 64, "multipole:levels=2,coarse_ratio=3", {}},
      {4, 2, 64, 4, 16, 400, 30, 1 << 20, "hnswlib", {1, 0}},  // k covers all: appends re-seed the graph's levels
      {4, 2, 64, 4, 16, 400, 30, 1 << 20, "faiss-hnsw", {}},
      {4, 2, 64, 4, 16, 400, 30, 32, "faiss-ivf:nlist=9", {}},
      {2, 1, 8, 0, 1, big, 300, 16, "flat", {}},  // appends run past the file's pages into the tail's own
  };
  std::mt19937 rng(11);
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    INFO("case " << ci << ": " << c.index << " heads " << c.n_heads << "/" << c.kv_heads << " d " << c.d << " n " << c.n);
    OffloadedLayer::Config cfg;
    cfg.n_heads = c.n_heads, cfg.kv_heads = c.kv_heads, cfg.head_dim = c.d, cfg.sinks = c.sinks, cfg.window = c.window;
    cfg.k = c.k, cfg.index = c.index, cfg.streaming = c.streaming, cfg.store_dtype = c.store, cfg.build.n_threads = 1;
    cfg.fold_every = 4;  // appends fold into the restored index (in place: copy-on-write)
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
    // quest, centroid and multipole use their arrays in place (mapped, not
    // owned); hnswlib, Faiss and flat have none.
    const int h0 = c.streaming.empty() || !c.streaming[0] ? 0 : 1;
    const bool in_place = std::string(c.index).rfind("quest", 0) == 0 || std::string(c.index).rfind("centroid", 0) == 0 ||
                          std::string(c.index).rfind("multipole", 0) == 0;
    const int64_t indexed_at_restore = b.stored_rows(h0) ? b.index(h0)->indexed_rows() : 0;
    if (b.stored_rows(h0)) {
      // Every stored row in place: whole chunks from the read-only mapping,
      // the last partial one copy-on-write (two of them, and 37 rows, in the big case).
      CHECK(b.index(h0)->keys().mapped_bytes() == (size_t)b.stored_rows(h0) * b.index(h0)->keys().row_bytes());
      CHECK(b.value_store(h0)->mapped_bytes() == (size_t)b.stored_rows(h0) * b.value_store(h0)->row_bytes());
      const MemoryReport ma = a.index(h0)->memory(), mb = b.index(h0)->memory();
      CHECK((mb.mapped_bytes > 0) == in_place);
      if (in_place) CHECK(mb.structure_bytes < ma.structure_bytes);
    }
    check_same_answers(a, b, c.n_heads, c.d, rng);
    for (int64_t t = c.n; t < c.n + c.gen; ++t) {
      a.append(keys.data() + (size_t)t * tok, values.data() + (size_t)t * tok);
      b.append(keys.data() + (size_t)t * tok, values.data() + (size_t)t * tok);
      if ((t - c.n) % 9 == 8 || t + 1 == c.n + c.gen) check_same_answers(a, b, c.n_heads, c.d, rng);
    }
    // The folds wrote into the arrays b uses in place: private page copies.
    // The file is unchanged (every checksum holds) and a new restore answers
    // like a layer freshly prefilled with the pack's tokens.
    if (b.stored_rows(h0) && b.index(h0)->attached() && indexed_at_restore > 0)
      CHECK(b.index(h0)->indexed_rows() > indexed_at_restore);
    CHECK_NOTHROW(r.verify_all(false));
    {
      OffloadedLayer again(cfg), fresh(cfg);
      again.restore(r, "L7.", c.n);
      fresh.prefill(keys.data(), values.data(), c.n);
      check_same_answers(again, fresh, c.n_heads, c.d, rng);
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

TEST_CASE("a pack holds several indexes per head: each restores as a layer built with it alone") {
  test::TempDir tmp("topkv_pack_extra");
  std::mt19937 rng(5);
  OffloadedLayer::Config cfg;
  cfg.n_heads = 4, cfg.kv_heads = 2, cfg.head_dim = 64, cfg.sinks = 2, cfg.window = 8, cfg.k = 16;
  cfg.index = "multipole", cfg.extra_indexes = {"flat", "quest:page=5"}, cfg.build.n_threads = 1;
  const int64_t n = 333;
  const std::vector<float> keys = randn((size_t)n * 2 * 64, rng, 0.4f), values = randn(keys.size(), rng);
  OffloadedLayer built(cfg);
  built.prefill(keys.data(), values.data(), n);
  const std::string path = tmp.file("multi.pack");
  {
    PackWriter w;
    built.save(w, "L1.");
    w.write(path);
  }
  PackReader r(path);
  const std::vector<std::string> specs{"multipole", "flat", "quest:page=5"};
  for (int slot = 0; slot < 3; ++slot) {
    INFO(specs[(size_t)slot]);
    OffloadedLayer::Config one = cfg;
    one.index = specs[(size_t)slot], one.extra_indexes.clear();
    OffloadedLayer alone(one), restored(one);
    alone.prefill(keys.data(), values.data(), n);
    restored.restore(r, "L1.", n, slot);
    CHECK(restored.index(0)->name() == parse_spec(specs[(size_t)slot]).name);
    check_same_answers(alone, restored, 4, 64, rng);
  }
  OffloadedLayer::Config wrong = cfg;
  wrong.index = "flat", wrong.extra_indexes.clear();
  OffloadedLayer mismatched(wrong);
  CHECK_THROWS_WITH(mismatched.restore(r, "L1.", n, 0), Catch::Contains("holds a multipole index for L1.h0"));
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
  set_store_type_at(l.policy, "2=q8_0");  // layer 1 in bf16, layer 2 in q8_0: each restored at its own type
  ModelCase d = l;  // --attn dense: every layer's cache in the pack
  d.name = "llama-dense", d.policy = OffloadPolicy{}, d.heads_tsv.clear();
  return {g, l, d};
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
      Model a(file, *be, model_options(P + steps + 4, 32, kv));
      std::vector<float> la = a.prefill(prompt, 32);
      const bool topk = mc.policy.attn == AttnMode::TopK;
      std::unique_ptr<OffloadRuntime> ra, rb;
      if (topk) {
        ra = std::make_unique<OffloadRuntime>(cfg, mc.policy, false);
        ra->take_prefill(a);
        a.set_attention_override(ra.get());
      }
      save_context_pack(pack_path, *file, a, ra.get(), prompt, la, {{"source", "test"}});

      ContextPack pack(pack_path);
      CHECK(pack.n_tokens() == P);
      CHECK(pack.tokens() == prompt);
      CHECK(pack.topk() == topk);
      pack.check_model(*file);
      if (topk) rb = std::make_unique<OffloadRuntime>(cfg, pack.policy_for_run(pack.policy()), false);
      Model b(file, *be, model_options(P + steps + 40, 7, kv));
      std::vector<float> lb = pack.restore(b, rb.get());
      attach_runtime(b, rb.get(), /*release_kv=*/true);
      const std::vector<float> first = lb;
      CHECK(lb == la);
      CHECK(b.n_past() == P);
      if (topk) {
        CHECK(rb->stats().keys_indexed == ra->stats().keys_indexed);
        CHECK(rb->describe() == ra->describe());  // streaming heads come from the pack
      }
      for (int s = 0; s < steps; ++s) {
        const int32_t tok = argmax(la);
        la = a.decode(tok);
        lb = b.decode(tok);
        REQUIRE(la == lb);
      }
      // A prompt appended after the pack: several tokens in one chunk.
      const std::vector<int32_t> more{5, 77, 300};
      la = a.prefill(more, 3);
      CHECK(b.prefill(more, 3) == la);
      // Starting over from the pack (generate --prompts): the same logits again.
      b.reset();
      if (topk) rb = std::make_unique<OffloadRuntime>(cfg, pack.policy_for_run(pack.policy()), false);
      CHECK(pack.restore(b, rb.get()) == first);
      CHECK(b.n_past() == P);
    }
  }
}

namespace {

// A small top-k pack (tiny gemma3, multipole + flat built in) and its model.
struct SmallPack {
  test::TempDir tmp{"topkv_pack_small"};
  std::string model_path = tmp.file("m.gguf"), pack_path = tmp.file("m.pack");
  std::shared_ptr<const GgufFile> file;
  ModelConfig cfg;
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::vector<float> logits;
  explicit SmallPack(int64_t P) {
    ModelCase mc = model_cases()[0];
    synth_write(mc.synth, model_path);
    file = GgufFile::open(model_path);
    cfg = read_model_config(*file);
    std::vector<int32_t> prompt((size_t)P);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (int32_t)(i * 37 % 1000);
    Model a(file, *be, model_options(64, 16));
    logits = a.prefill(prompt, 16);
    OffloadRuntime ra(cfg, mc.policy, false);
    ra.build_extra_indexes({"flat"});
    ra.take_prefill(a);
    save_context_pack(pack_path, *file, a, &ra, prompt, logits, {});
  }
  // Opens (verifying every checksum) and restores into a fresh model and runtime.
  void restore(const std::string& path, const std::string& index = "") const {
    ContextPack pack(path);
    OffloadPolicy p = pack.policy();
    if (!index.empty()) p.index = index;
    OffloadRuntime rt(cfg, pack.policy_for_run(p), false);
    Model m(file, *be, model_options(64, 16));
    pack.restore(m, &rt);
  }
};

}  // namespace

TEST_CASE("a context pack refuses another model, a changed build-time policy and too small a context") {
  SmallPack sp(40);
  const std::string other_path = sp.tmp.file("other.gguf");
  SynthConfig other = model_cases()[0].synth;
  other.seed = 99;
  synth_write(other, other_path);
  ContextPack pack(sp.pack_path);
  CHECK(pack.indexes() == std::vector<std::string>{"multipole", "flat"});

  CHECK_THROWS_WITH(pack.check_model(*GgufFile::open(other_path)), Catch::Contains("was built with the model"));
  struct Change { std::function<void(OffloadPolicy&)> apply; const char* says; };
  const std::vector<Change> changes = {
      {[](OffloadPolicy& p) { p.window = 16; }, "--window 8; this run asks for 16"},
      {[](OffloadPolicy& p) { p.sinks = 0; }, "--sinks"},
      {[](OffloadPolicy& p) { p.index = "multipole:ratio=8"; }, "holds the indexes multipole, flat, not multipole:ratio=8"},
      {[](OffloadPolicy& p) { p.index = "hnswlib"; }, "holds the indexes multipole, flat, not hnswlib"},
      {[](OffloadPolicy& p) { p.dense_layers = 1; }, "--dense-layers"},
      {[](OffloadPolicy& p) { p.store_dtype = DType::BF16; }, "--store-type"},
      {[](OffloadPolicy& p) { set_store_type_at(p, "0=f16"); }, "--store-type-at (none); this run asks for 0=f16"},
      {[](OffloadPolicy& p) { p.heads_file = "duo.tsv"; }, "--heads (none); this run asks for duo.tsv"},
      {[](OffloadPolicy& p) { p.attn = AttnMode::Dense; }, "drop --attn dense"},
  };
  for (const Change& c : changes) {
    OffloadPolicy p = pack.policy();
    c.apply(p);
    CHECK_THROWS_WITH(pack.policy_for_run(p), Catch::Contains(c.says));
  }
  sp.restore(sp.pack_path, "flat");  // the other index built into the pack
  OffloadPolicy query = pack.policy();
  query.search.k = 3, query.k_schedule = KSchedule::Linear, query.search.threshold = 0.01;  // query-time: fine
  query.build_on = BuildOn::Gpu;  // as a pack built with --build-on gpu records it: nothing is built from a pack
  CHECK(pack.policy_for_run(query).build_on == BuildOn::Host);
  OffloadRuntime rq(sp.cfg, pack.policy_for_run(query), false);
  Model small(sp.file, *sp.be, model_options(39, 8));
  CHECK_THROWS_WITH(pack.restore(small, &rq), Catch::Contains("more than the context size 39"));
  Model fits(sp.file, *sp.be, model_options(41, 8));
  pack.restore(fits, &rq);
  CHECK(rq.k_per_layer() == std::vector<int64_t>{2, 4});  // k 3, linear over two layers
  // An evaluation's model holds every layer's KV (policy_for_run's model_holds_context): its run may keep more
  // first layers dense than the pack, and takes the pack's other layers alone; never fewer.
  OffloadPolicy more = pack.policy();
  more.dense_layers = 3;  // global layer 2 dense: only layer 5 from the pack
  OffloadRuntime rm(sp.cfg, pack.policy_for_run(more, /*model_holds_context=*/true), false);
  rm.take_pack(pack.file());
  CHECK(rm.retrieval_layers() == std::vector<int>{5});
  CHECK(rm.stats().keys_indexed * 2 == rq.stats().keys_indexed);  // one layer's rows of the two
  {
    const std::string path3 = sp.tmp.file("dense3.pack");
    Model a3(sp.file, *sp.be, model_options(64, 16));
    std::vector<int32_t> prompt3(40);
    for (size_t i = 0; i < prompt3.size(); ++i) prompt3[i] = (int32_t)(i * 37 % 1000);
    const std::vector<float> l3 = a3.prefill(prompt3, 16);
    OffloadRuntime r3(sp.cfg, more, false);
    r3.take_prefill(a3);
    save_context_pack(path3, *sp.file, a3, &r3, prompt3, l3, {});
    ContextPack pack3(path3);
    OffloadPolicy fewer = pack3.policy();
    fewer.dense_layers = 0;
    CHECK_THROWS_WITH(pack3.policy_for_run(fewer, true),
                      Catch::Contains("holds no index for layers 0..2, which --dense-layers 0 would serve with top-k; "
                                      "use 3 or more"));
    OffloadRuntime r0(sp.cfg, fewer, false);
    CHECK_THROWS_WITH(r0.take_pack(pack3.file()),
                      Catch::Contains("serves layers 5 with top-k attention but this run would serve 2,5"));
  }
  // Without that, a runtime serving other layers (more dense layers) cannot take the pack.
  OffloadPolicy dense1 = pack.policy();
  dense1.dense_layers = 3;
  OffloadRuntime rd(sp.cfg, dense1, false);
  Model md(sp.file, *sp.be, model_options(64, 8));
  CHECK_THROWS_WITH(pack.restore(md, &rd), Catch::Contains("KV of 4 model layers, this run needs 5"));
  // A dense pack is decoded dense.
  Model a(sp.file, *sp.be, model_options(64, 16));
  std::vector<int32_t> prompt(30, 11);
  const std::vector<float> la = a.prefill(prompt, 16);
  save_context_pack(sp.tmp.file("dense.pack"), *sp.file, a, nullptr, prompt, la, {});
  ContextPack dense(sp.tmp.file("dense.pack"));
  OffloadPolicy topk = pack.policy();
  CHECK_THROWS_WITH(dense.policy_for_run(topk), Catch::Contains("was built with --attn dense"));
}

TEST_CASE("a corrupted part, a truncation, a foreign file or a newer format is an Error before any work") {
  SmallPack sp(60);
  const std::string& path = sp.pack_path;
  const std::string good = test::slurp(path);
  uint64_t header = 0;
  std::memcpy(&header, good.data(), 8);
  CHECK(PackReader(path).verify_all(false) == good.size() - 8 - header);  // every tensor byte
  {  // The reader over memory (the fuzzer's) reads the same pack and finds the same damage.
    const auto* bytes = reinterpret_cast<const uint8_t*>(good.data());
    const PackReader f(path), m(bytes, good.size(), path);
    CHECK(m.meta() == f.meta());
    CHECK(m.file_bytes() == f.file_bytes());
    CHECK(m.verify_all(false) == f.verify_all(false));
    REQUIRE(m.tensors().size() == f.tensors().size());
    for (size_t i = 0; i < f.tensors().size(); ++i) CHECK(m.tensors()[i].name == f.tensors()[i].name);
    std::string bad = good;
    bad[tensor_offset(path, "offload.L5.h0.keys")] ^= 0x10;
    const PackReader mb(reinterpret_cast<const uint8_t*>(bad.data()), bad.size(), path);
    CHECK_THROWS_WITH(mb.verify_all(false), Catch::Contains("tensor 'offload.L5.h0.keys' does not match its checksum"));
  }
  sp.restore(path);
  const auto rewrite = [&](const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; };
  // A byte flipped in any part is found when the pack is opened.
  for (const char* part : {"tokens", "logits", "model.L0.k", "model.L4.v", "offload.L2.h0.sinks_v",
                           "offload.L2.h0.window_k", "offload.L5.h0.keys", "offload.L5.h0.values",
                           "offload.L2.h0.index.0", "offload.L5.h0.index.1", "offload.L5.h0.index.0.members",
                           "offload.L2.h0.index.0.key_centroids", "offload.L5.h0.index.0.value_means"}) {
    INFO(part);
    rewrite(good);
    const size_t at = tensor_offset(path, part);
    flip_byte(path, at + (good.size() - at > 40 ? 37 : 0));
    CHECK_THROWS_WITH(ContextPack(path), Catch::Contains(fmt::format("tensor '{}' does not match its checksum", part)));
  }
  rewrite(good);
  // Inside the manifest (a JSON string in the header, quotes escaped): sinks 2 -> 3.
  const size_t sinks_at = good.find("sinks\\\":");
  REQUIRE(sinks_at != std::string::npos);
  flip_byte(path, sinks_at + 8, 0x01);
  CHECK_THROWS_WITH(ContextPack(path), Catch::Contains("its manifest does not match its checksum"));
  // Truncated anywhere: in the length, in the header, in the data, by one byte.
  for (size_t keep : {size_t(5), size_t(8 + header / 2), size_t(8 + header + 100), good.size() / 2, good.size() - 1}) {
    INFO("truncated to " << keep);
    rewrite(good.substr(0, keep));
    CHECK_THROWS_AS(ContextPack(path), Error);
  }
  rewrite(good.substr(0, good.size() - 1));
  CHECK_THROWS_WITH(ContextPack(path), Catch::Contains("truncated"));
  rewrite(good);
  sp.restore(path);  // intact again
  // A safetensors file that is not a pack (a KV dump, say), a newer format, an empty manifest.
  SafetensorsWriter st;
  st.add("x", StDType::F32, {1}, sp.logits.data());
  st.write(path);
  CHECK_THROWS_WITH(ContextPack(path), Catch::Contains("not a topkv context pack"));
  PackWriter future;
  future.meta()["format"] = 3;
  future.add_owned("tokens", StDType::I32, {1}, std::vector<uint8_t>(4, 1));
  future.write(path);
  CHECK_THROWS_WITH(ContextPack(path), Catch::Contains("format 3, this topkv reads formats 1..2"));
  PackWriter incomplete;
  incomplete.meta()["format"] = 1;
  incomplete.write(path);
  CHECK_THROWS_WITH(ContextPack(path), Catch::Contains("incomplete metadata"));
}
