// The prefill without a second copy (ModelOptions::host_kv_past): a retrieval
// layer's cache keeps only the chunk being prefilled and its past is read
// from the offload runtime's stores as they fill (OffloadedLayer::past_runs,
// OffloadRuntime as the KvPastSource, CpuBackend's attention over a ring).
//   1. past_runs returns every position of any range once, in order, as the
//      layer holds it (fp32 sinks and window, store rows at the store's type),
//      while a prefill arrives in odd pieces; f16 / bf16 / f8 stores, with and
//      without sinks, a window longer than a piece;
//   2. a model whose retrieval layers prefill into rings gives the full
//      caches' logits bit for bit with an f16 store and f16 caches (the same
//      values reach the attention), and fills the stores with the same rows;
//      an f8 store gives close logits (the past attended in E4M3);
//   3. a ring asked for its past with no source, a rewind, and the memory
//      plan's line.
// The CUDA backend's streamed attention over a ring: tests/gpu/test_cuda_streamed.cpp.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "offload/memory_plan.h"
#include "offload/offload_runtime.h"
#include "src/model/synth.h"
#include "src/session/session.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

std::vector<float> random_rows(size_t n, std::mt19937& rng, float mean) {
  std::normal_distribution<float> nd(mean, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

}  // namespace

TEST_CASE("past_runs serves every position of a range once, as the layer holds it, while a prefill arrives") {
  struct Case {
    int sinks, window, kv_heads, head_dim;
    int64_t n;
    DType store;
  };
  const Case cases[] = {
      {4, 16, 2, 64, 301, DType::F16},  {0, 8, 1, 128, 97, DType::F8E4M3}, {3, 40, 3, 256, 211, DType::BF16},
      {1, 1, 2, 64, 53, DType::F16},    {5, 300, 1, 64, 120, DType::F16},  // the window holds all but the sinks
      {2, 9, 2, 128, 149, DType::Q8_0}, {0, 3, 1, 64, 77, DType::Q8_0},   // int8 blocks
  };
  std::mt19937 rng(5);
  for (const Case& c : cases) {
    CAPTURE(c.sinks, c.window, c.kv_heads, c.head_dim, c.n, dtype_name(c.store));
    OffloadedLayer::Config cfg;
    cfg.n_heads = c.kv_heads * 2, cfg.kv_heads = c.kv_heads, cfg.head_dim = c.head_dim;
    cfg.sinks = c.sinks, cfg.window = c.window, cfg.k = 8, cfg.index = "flat", cfg.store_dtype = c.store;
    OffloadedLayer layer(cfg);
    const size_t d = (size_t)c.head_dim, tok = (size_t)c.kv_heads * d;
    const auto keys = random_rows((size_t)c.n * tok, rng, 0.3f), values = random_rows(keys.size(), rng, -0.2f);
    layer.begin_prefill(c.n, /*overlap=*/false);
    int64_t done = 0;
    for (int64_t piece : {1, 7, 33, 64, 1000}) {  // odd pieces, as chunks of a prefill
      const int64_t m = std::min(piece, c.n - done);
      if (m <= 0) break;
      layer.prefill_rows(keys.data() + done * tok, values.data() + done * tok, done, m, tok, d);
      done += m;
      const int64_t win_start = c.n - std::min<int64_t>(c.window, c.n - std::min<int64_t>(c.sinks, c.n));
      for (auto [b, e] : {std::pair<int64_t, int64_t>{0, done}, {done / 3, done}, {done / 2, done / 2},
                          {std::max<int64_t>(0, done - 5), done}}) {
        for (int h = 0; h < c.kv_heads; ++h)
          for (bool vals : {false, true}) {
            CAPTURE(done, b, e, h, vals);
            int64_t next = b;
            int64_t mismatches = 0;
            layer.past_runs(h, vals, b, e, [&](const KvPastRun& r) {
              CHECK(r.pos == next);
              CHECK(r.n >= 1);
              const bool stored = r.pos >= c.sinks && r.pos < win_start;
              CHECK(r.dtype == (stored ? c.store : DType::F32));
              std::vector<float> got((size_t)r.n * d);
              to_f32(r.dtype, r.rows, got.data(), got.size());
              const std::vector<float>& src = vals ? values : keys;
              for (int64_t i = 0; i < r.n; ++i) {
                const float* x = src.data() + (size_t)(r.pos + i) * tok + (size_t)h * d;
                const std::vector<float> want = stored ? test::through_store(c.store, x, 1, d) : std::vector<float>(x, x + d);
                for (size_t j = 0; j < d; ++j) mismatches += got[(size_t)i * d + j] != want[j];
              }
              next = r.pos + r.n;
            });
            CHECK(next == e);
            CHECK(mismatches == 0);
          }
      }
    }
    CHECK_THROWS_WITH(layer.past_runs(0, false, 0, done + 1, [](const KvPastRun&) {}),
                      Catch::Contains("internal: past positions"));
  }
}

namespace {

struct RingRun {
  std::vector<float> logits;
  std::vector<uint64_t> fingerprints;  // every retrieval layer's key and value stores
  std::vector<int> rings;
};

// A prompt prefilled in chunks with the runtime taking each chunk (the
// overlapped build), the retrieval layers' caches full or rings.
RingRun prefill_with_runtime(const std::shared_ptr<const GgufFile>& file, Backend& be, const OffloadPolicy& policy,
                             const std::vector<int32_t>& prompt, int chunk, bool rings) {
  const ModelConfig cfg = read_model_config(*file);
  OffloadRuntime rt(cfg, policy, false);
  ModelOptions mo = test::model_options((int64_t)prompt.size() + 8, chunk, DType::F16);
  if (rings) {
    mo.host_kv_candidates = rt.retrieval_layers();
    mo.kv_place = ModelOptions::KvPlace::Host;
    mo.host_kv_past = true;
  }
  Model model(file, be, mo);
  RingRun r;
  r.rings = model.ring_kv_layers();
  r.logits = prefill_into(model, prompt, chunk, &rt, /*overlap=*/true, /*progress=*/false);
  for (int il : rt.retrieval_layers())
    for (int h = 0; h < cfg.n_head_kv; ++h)
      for (const RowStore* s : {rt.layer(il)->key_store(h), rt.layer(il)->value_store(h)})
        r.fingerprints.push_back(s->fingerprint(s->size()));
  return r;
}

}  // namespace

TEST_CASE("a model prefilling its retrieval layers into rings gives the full caches' logits and stores") {
  test::TempDir tmp("topkv_ring");
  const std::string path = tmp.file("m.gguf");
  SynthConfig sc = synth_preset("tiny-qwen2");  // every layer global
  sc.layers = 3, sc.heads = 4, sc.kv_heads = 2;   // two retrieval layers, GQA 2:1 over two KV heads
  synth_write(sc, path);
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  const ModelConfig cfg = read_model_config(*file);
  auto be = make_cpu_backend();
  std::mt19937 rng(17);
  std::vector<int32_t> prompt(203);  // 6 chunks of 37 and a tail of 18
  for (auto& id : prompt) id = (int32_t)(rng() % (uint32_t)cfg.n_vocab);
  OffloadPolicy p;
  p.attn = AttnMode::TopK, p.index = "multipole", p.search.k = 16, p.sinks = 3, p.window = 24, p.dense_layers = 1;

  const RingRun full = prefill_with_runtime(file, *be, p, prompt, 37, false);
  const RingRun ring = prefill_with_runtime(file, *be, p, prompt, 37, true);
  CHECK(full.rings.empty());
  OffloadRuntime probe(cfg, p, false);
  CHECK(ring.rings == probe.retrieval_layers());
  CHECK(ring.logits == full.logits);  // bit for bit: the same f16 values attended in the same order
  CHECK(ring.fingerprints == full.fingerprints);

  // 8-bit stores: the past is attended as stored (E4M3, or Q8_0's int8
  // blocks), close to the f16 result; Q8_0 closer than E4M3.
  double rel[2] = {0, 0};
  for (DType t : {DType::F8E4M3, DType::Q8_0}) {
    CAPTURE(dtype_name(t));
    OffloadPolicy p8 = p;
    p8.store_dtype = t;
    const RingRun full8 = prefill_with_runtime(file, *be, p8, prompt, 37, false);
    const RingRun ring8 = prefill_with_runtime(file, *be, p8, prompt, 37, true);
    CHECK(full8.logits == full.logits);  // the full caches never read the store
    double num = 0, den = 0;
    for (size_t i = 0; i < full.logits.size(); ++i) {
      num += std::pow((double)ring8.logits[i] - full.logits[i], 2);
      den += std::pow((double)full.logits[i], 2);
    }
    double& r = rel[t == DType::Q8_0];
    r = std::sqrt(num / den);
    CHECK(r > 0);     // 8 bits change what the prefill attends
    CHECK(r < 0.05);  // but little
  }
  INFO("ring prefill logits, relative L2 to the f16 store's: f8 " << rel[0] << ", q8_0 " << rel[1]);
  CHECK(rel[1] < rel[0]);
}

TEST_CASE("prefill rings over awkward shapes: one-token chunks, head_dim 64/128, GQA 1-4, odd prompts") {
  struct Case { int heads, kv, head_dim, chunk, prompt, sinks, window; std::string index; };
  const Case cases[] = {
      {2, 1, 64, 1, 23, 2, 5, "multipole"},                // one token a chunk: the ring is one slot
      {8, 2, 128, 13, 61, 4, 16, "quest:page=4"},          // GQA 4, a window longer than a chunk
      {4, 4, 64, 64, 97, 0, 40, "flat"},                   // no GQA, no sinks
      {6, 2, 64, 29, 29, 3, 8, "centroid"},                // one chunk: no past read at all
  };
  test::TempDir tmp("topkv_ring_shapes");
  for (const Case& c : cases) {
    CAPTURE(c.heads, c.kv, c.head_dim, c.chunk, c.prompt, c.index);
    const std::string path = tmp.file(fmt::format("m{}_{}.gguf", c.head_dim, c.heads));
    SynthConfig sc = synth_preset("tiny-qwen2");
    sc.layers = 2, sc.heads = c.heads, sc.kv_heads = c.kv, sc.head_dim = c.head_dim, sc.width = c.heads * c.head_dim;
    synth_write(sc, path);
    std::shared_ptr<const GgufFile> file = GgufFile::open(path);
    auto be = make_cpu_backend();
    std::mt19937 rng(c.prompt);
    std::vector<int32_t> prompt((size_t)c.prompt);
    for (auto& id : prompt) id = (int32_t)(rng() % 1000u);
    OffloadPolicy p;
    p.attn = AttnMode::TopK, p.index = c.index, p.search.k = 8, p.sinks = c.sinks, p.window = c.window;
    const RingRun full = prefill_with_runtime(file, *be, p, prompt, c.chunk, false);
    const RingRun ring = prefill_with_runtime(file, *be, p, prompt, c.chunk, true);
    CHECK(ring.rings.size() == 2);
    CHECK(ring.logits == full.logits);
    CHECK(ring.fingerprints == full.fingerprints);
  }
}

TEST_CASE("a prefill ring refuses a chunk whose past no runtime serves, and a rewind") {
  test::TempDir tmp("topkv_ring_err");
  const std::string path = tmp.file("m.gguf");
  synth_write(synth_preset("tiny-qwen2"), path);
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  auto be = make_cpu_backend();
  ModelOptions mo = test::model_options(64, 16, DType::F16);
  mo.host_kv_candidates = {1};
  mo.kv_place = ModelOptions::KvPlace::Host;
  mo.host_kv_past = true;
  Model model(file, *be, mo);
  CHECK(model.ring_kv_layers() == std::vector<int>{1});
  CHECK(model.kv_capacity(1) == 16);
  std::vector<int32_t> prompt(40, 5);
  CHECK_THROWS_WITH(model.prefill(prompt, 16), Catch::Contains("keeps only the chunk being prefilled") &&
                                                   Catch::Contains("--prefill-kv host-copy"));
  model.reset();
  model.prefill(std::vector<int32_t>(12, 3), 16);  // one chunk needs no past
  CHECK_THROWS_WITH(model.rewind(6), Catch::Contains("prefill ring"));
  std::vector<float> k, v;
  model.read_kv(1, k, v, 0);  // the chunk is still there
  CHECK(k.size() == (size_t)model.config().n_head_kv * 12 * model.config().head_dim);
}

TEST_CASE("the memory plan counts rings instead of the retrieval layers' whole context") {
  test::TempDir tmp("topkv_ring_plan");
  const std::string path = tmp.file("m.gguf");
  synth_write(synth_preset("tiny-qwen2"), path);  // every layer global
  const ModelConfig cfg = read_model_config(*GgufFile::open(path));
  OffloadPolicy p;
  p.attn = AttnMode::TopK, p.dense_layers = 1;
  MemoryPlanInput in;
  in.cfg = &cfg, in.policy = &p, in.context = 131072, in.max_chunk = 4096, in.kv_dtype = DType::F16;
  const MemoryPlan full = plan_memory(in);
  in.retrieval_rings = true;
  const MemoryPlan rings = plan_memory(in);
  const double per_tok = 2.0 * cfg.n_head_kv * cfg.head_dim * 2;
  const int retrieval = cfg.n_layer - 1;
  REQUIRE(retrieval >= 1);
  CHECK(full.host_total() - rings.host_total() == Approx(retrieval * per_tok * (131072 - 4096)));
  const std::string line = fmt::format("prefill rings of {} top-k layers (4096 slots", retrieval);
  CHECK(std::any_of(rings.lines.begin(), rings.lines.end(),
                    [&](const MemoryPlan::Line& l) { return l.what.find(line) != std::string::npos; }));
}
