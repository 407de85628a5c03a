// SharedContext (src/eval/shared_context.h), the index reuse of eval ruler and
// eval passkey: a method restored from the one pack built for its index
// decodes bit for bit as a runtime that took the prefill itself, for several
// k and schedules and with more dense layers than the pack (each layer with
// its own streaming heads); a method's decode (evictions, folds) leaves
// nothing for the next; the model's dense decoding of the prompt is unchanged
// in between.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "offload/offload_runtime.h"
#include "src/eval/fidelity_runs.h"
#include "src/eval/shared_context.h"
#include "src/model/synth.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

struct Decoded {
  std::vector<std::vector<float>> logits;
  std::vector<double> attn_err;
};

// The model of `path` holding a P-token prompt, the dense decode of `steps`
// tokens after it, and the shared context over it; every method is
// teacher-forced on the dense tokens.
struct Prompted {
  std::shared_ptr<const GgufFile> file;
  ModelConfig cfg;
  std::unique_ptr<Backend> be = make_cpu_backend();
  std::unique_ptr<Model> model;
  std::vector<float> first;
  DenseReference ref;
  std::vector<int32_t> feed;
  std::unique_ptr<SharedContext> ctx;

  Prompted(const std::string& path, int64_t P, int steps, const std::string& dir)
      : file(GgufFile::open(path)), cfg(read_model_config(*file)) {
    std::vector<int32_t> prompt((size_t)P);
    for (int64_t i = 0; i < P; ++i) prompt[(size_t)i] = (int32_t)((i * 7919 + 13) % cfg.n_vocab);
    model = std::make_unique<Model>(file, *be, test::model_options(P + steps + 4, 32));
    first = model->prefill(prompt, 32);
    ref = decode_reference(*model, first, steps + 1, steps + 1);
    feed.assign(ref.ids.begin(), ref.ids.end() - 1);
    ctx = std::make_unique<SharedContext>(*file, *model, prompt, first, dir);
  }
  // Teacher-forced with `rt` serving the model, which is then dense again.
  Decoded decode_with(OffloadRuntime& rt) {
    model->set_attention_override(&rt);
    Decoded d;
    d.logits.push_back(first);
    for (int32_t id : feed) d.logits.push_back(model->decode(id));
    d.attn_err = rt.attention_rel_error();
    ctx->detach();
    return d;
  }
  // The reference: `fresh` (built for the method's policy) takes the prefill itself.
  Decoded decode_fresh(OffloadRuntime& fresh) {
    ctx->detach();
    fresh.set_measure_error(true);
    fresh.take_prefill(*model);
    return decode_with(fresh);
  }
};

}  // namespace

TEST_CASE("shared context: every method restored from its index's pack decodes as a fresh build does") {
  test::TempDir tmp("topkv_shared_ctx");
  const std::string path = tmp.file("m.gguf");
  synth_write(synth_preset("tiny-gemma3"), path);  // global layers 2 and 5; windows of 16 elsewhere
  // 14 steps: past the window of 8, evictions into the store and folds into the index.
  Prompted m(path, 157, 14, tmp.dir.string());
  SharedContext& ctx = *m.ctx;
  int methods = 0;
  for (const char* index : {"multipole", "quest:page=4", "flat"})
    for (int dense : {0, 3})  // 3: global layer 2 dense, only layer 5 from the pack (built with both)
      for (auto [k, schedule] : {std::pair{6, KSchedule::Uniform}, {6, KSchedule::Linear}, {40, KSchedule::Uniform}}) {
        INFO(index << " dense layers " << dense << " k " << k << " schedule " << (int)schedule);
        OffloadPolicy p;
        p.attn = AttnMode::TopK, p.index = index, p.search.k = k, p.k_schedule = schedule, p.sinks = 2, p.window = 8;
        p.dense_layers = dense;
        OffloadRuntime fresh(m.cfg, p, false);
        const Decoded want = m.decode_fresh(fresh);
        REQUIRE(fresh.retrieval_layers() == (dense ? std::vector<int>{5} : std::vector<int>{2, 5}));
        // From the shared pack, twice: the first restore's decode must not reach the second.
        const SharedContext::Build& b = ctx.prepare(*m.be, p);
        CHECK(b.keys_indexed == fresh.stats().keys_indexed * (dense ? 2 : 1));  // the pack indexes both layers
        CHECK(b.pack_bytes > 0);
        CHECK(std::distance(std::filesystem::directory_iterator(tmp.dir), {}) == 1);  // the model; the pack unlinked
        for (int again = 0; again < 2; ++again) {
          auto rt = ctx.attach(*m.be, p, /*measure_error=*/true);
          CHECK(rt->retrieval_layers() == fresh.retrieval_layers());
          CHECK(rt->k_per_layer() == fresh.k_per_layer());
          const Decoded got = m.decode_with(*rt);
          REQUIRE(got.logits == want.logits);
          CHECK(got.attn_err == want.attn_err);
        }
        ++methods;
      }
  CHECK(methods == 18);
  CHECK(ctx.builds() == 3);  // one per index, shared by its dense layers, k and schedules
  // Dense decoding of the prompt is as it was before any method ran.
  ctx.detach();
  const int n = (int)m.feed.size() + 1;
  const DenseReference again = decode_reference(*m.model, m.first, n, n);
  CHECK(again.ids == m.ref.ids);
  CHECK(again.log_p == m.ref.log_p);
}

TEST_CASE("shared context: a method with more dense layers takes the pack's streaming heads of its own layers") {
  // DuoAttention masks differ per layer, so a layer given another layer's mask decodes differently.
  test::TempDir tmp("topkv_shared_ctx_heads");
  SynthConfig sc = synth_defaults("llama");
  sc.layers = 3, sc.width = 128, sc.heads = 8, sc.kv_heads = 2, sc.head_dim = 32, sc.ffn = 256, sc.vocab = 1024;
  const std::string path = tmp.file("m.gguf"), heads = tmp.file("heads.tsv");
  synth_write(sc, path);
  std::ofstream(heads) << "0.9 0.9\n0.1 0.9\n0.9 0.2\n";  // layer 1: KV head 0 streams; layer 2: head 1
  Prompted m(path, 121, 12, tmp.dir.string());
  for (int dense : {0, 1, 2}) {
    INFO("dense layers " << dense);
    OffloadPolicy p;
    p.attn = AttnMode::TopK, p.index = "quest:page=4", p.search.k = 6, p.sinks = 2, p.window = 8;
    p.heads_file = heads, p.dense_layers = dense;
    OffloadRuntime fresh(m.cfg, p, false);
    const Decoded want = m.decode_fresh(fresh);
    m.ctx->prepare(*m.be, p);
    auto rt = m.ctx->attach(*m.be, p, /*measure_error=*/true);
    CHECK(rt->describe() == fresh.describe());  // layers, k and the count of streaming heads
    const Decoded got = m.decode_with(*rt);
    REQUIRE(got.logits == want.logits);
    CHECK(got.attn_err == want.attn_err);
  }
  CHECK(m.ctx->builds() == 1);
}
