// Recorded decode steps of whole models (Model::decode on the CUDA backend,
// src/model/model_decode.cpp): two models of the same file on the same
// device, one replaying recorded steps and one running every op directly,
// fed the same tokens, must give the same logits (bit for bit: the same
// kernels run on the same inputs) over 48+ steps, for a gemma3-like model
// whose sliding-window rings wrap several times and a llama-like one. Then
// the segment path: an attention override on one layer (on the device, and
// staged through the host), its removal (a new recording), release_kv (a new
// recording), rewind and a prefill between replays.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>

#include "gpu/cuda_sampler.h"
#include "src/common/error.h"
#include "src/model/model.h"
#include "src/model/sampler.h"
#include "src/model/synth.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

SynthConfig gemma_like() {  // head_dim 256, window 16 (rings of 16 + 8 - 1 slots), global layers 2 and 5
  SynthConfig c = synth_defaults("gemma3");
  c.layers = 6, c.width = 256, c.heads = 4, c.kv_heads = 1, c.head_dim = 256, c.ffn = 512, c.vocab = 1024;
  c.sliding_window = 16, c.global_every = 3, c.type = GgmlType::Q8_0, c.seed = 11;
  return c;
}
SynthConfig llama_like() {  // GQA 4, head_dim 64
  SynthConfig c = synth_defaults("llama");
  c.layers = 3, c.width = 256, c.heads = 8, c.kv_heads = 2, c.head_dim = 64, c.ffn = 512, c.vocab = 1024;
  c.type = GgmlType::Q8_0, c.seed = 13;
  return c;
}

// Dense attention of one layer from the override's own copy of the keys,
// with the backend's own kernels (on_device), or on the CPU from host
// copies of q, k, v (staged through the host by the model).
class DenseOverride final : public AttentionOverride {
 public:
  DenseOverride(Backend& be, int layer, int64_t n_ctx, bool on_device)
      : be_(be), cpu_(make_cpu_backend()), layer_(layer), n_ctx_(n_ctx), on_device_(on_device) {}
  bool overrides(int layer) const override { return layer == layer_; }
  bool on_device() const override { return on_device_; }
  void take_prefill(const Model& model) override {
    const ModelConfig& cfg = model.config();
    n_head_ = cfg.n_head;
    Backend& owner = on_device_ ? be_ : *cpu_;
    cache_ = owner.alloc_kv(cfg.n_head_kv, cfg.head_dim, n_ctx_, DType::F16);
    std::vector<float> k, v;
    model.read_kv(layer_, k, v);  // [n_kv][n_past][hd] fp32
    const size_t n = (size_t)model.n_past() * cfg.head_dim, es = dtype_size(cache_.dtype);
    std::vector<uint8_t> row(n * es);
    for (int h = 0; h < cfg.n_head_kv; ++h)
      for (auto [src, dst] : {std::pair{&k, &cache_.k}, std::pair{&v, &cache_.v}}) {
        from_f32(cache_.dtype, src->data() + h * n, row.data(), n);
        if (on_device_)
          be_.from_host(row.data(), *dst, h * cache_.head_stride() * es, row.size());
        else
          std::memcpy(dst->as<uint8_t>() + h * cache_.head_stride() * es, row.data(), row.size());
      }
  }
  void decode_attention(int, const float* q, const float* k, const float* v, int64_t pos, float scale,
                        float* out) override {
    cpu_->kv_write(cache_, k, v, 1, pos);
    cpu_->attention(q, 1, n_head_, pos, cache_, 0, scale, out);
  }
  void decode_attention_device(int, const float* q, const float* k, const float* v, int64_t pos, float scale,
                               float* out) override {
    be_.kv_write(cache_, k, v, 1, pos);
    be_.attention(q, 1, n_head_, pos, cache_, 0, scale, out);
  }

 private:
  Backend& be_;
  std::unique_ptr<Backend> cpu_;
  int layer_, n_head_ = 0;
  int64_t n_ctx_;
  bool on_device_;
  KvLayerCache cache_;
};

struct Pair {
  Model rec, eager;
  Pair(std::shared_ptr<const GgufFile> f, Backend& be, ModelOptions o)
      : rec(f, be, o), eager(f, be, [&] { o.record_decode = false; return o; }()) {}
};

// Decodes `steps` tokens on both models (the eager one's greedy pick feeds
// both) and compares the logits of every step.
void run_steps(Pair& p, int steps, std::vector<float>& last, OpSummary& s, int& bitwise) {
  for (int i = 0; i < steps; ++i) {
    const int32_t next = argmax(last);
    const auto a = p.rec.decode(next), b = p.eager.decode(next);
    s.check(rel_err(a, b));
    bitwise += std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    REQUIRE(p.rec.n_past() == p.eager.n_past());
    last = b;
  }
}

}  // namespace

TEST_CASE("recorded decode steps give the logits of op-by-op decode: gemma3-like (rings wrap) and llama-like") {
  auto& be = gpu();
  REQUIRE(be.can_record());
  TempDir td;
  OpSummary s("model decode, recorded vs op by op", 1e-6);
  int steps = 0, bitwise = 0;
  for (const SynthConfig& sc : {gemma_like(), llama_like()}) {
    CAPTURE(sc.arch);
    const std::string path = td.file(sc.arch + ".gguf");
    synth_write(sc, path);
    auto file = std::shared_ptr<const GgufFile>(GgufFile::open(path));
    ModelOptions opt;
    opt.n_ctx = 256, opt.max_chunk = 8, opt.kv_dtype = DType::F16;
    Pair p(file, be, opt);
    std::mt19937 rng(5);
    std::vector<int32_t> prompt(20);
    for (auto& id : prompt) id = (int32_t)(rng() % (uint32_t)sc.vocab);
    std::vector<float> last = p.eager.prefill(prompt, 8);
    REQUIRE(p.rec.prefill(prompt, 8) == last);

    run_steps(p, 48, last, s, bitwise);  // positions 20..67: the 23-slot rings wrap twice
    steps += 48;
    // Launch counting: a replayed step counts its graph's kernel nodes, an
    // op-by-op step every launch; both run the same kernels.
    {
      const int32_t t = argmax(last);
      const uint64_t l0 = cuda_kernel_launches();
      p.rec.decode(t);
      const uint64_t l1 = cuda_kernel_launches();
      last = p.eager.decode(t);
      const uint64_t l2 = cuda_kernel_launches();
      CAPTURE(l1 - l0, l2 - l1);
      CHECK(l1 - l0 == l2 - l1);
      CHECK(l1 - l0 >= (uint64_t)sc.layers * 5);  // at least the projections of every layer
      std::printf("SUMMARY %-34s %s: %llu kernel launches per decode step\n", "launches per step", sc.arch.c_str(),
                  (unsigned long long)(l1 - l0));
    }
    CHECK(p.rec.steps_recorded() == 1);  // step 1 op by op, recorded at step 2, replayed since
    CHECK(p.rec.last_decode_replayed());
    CHECK_FALSE(p.eager.last_decode_replayed());

    // Logits left on the device: the device argmax picks what the host would.
    const int32_t next = argmax(last);
    const float* dl = p.rec.decode_on_backend(next);
    last = p.eager.decode(next);
    CHECK(cuda_argmax(be, dl, sc.vocab) == argmax(last));

    // Rewind, then a prefill of 9 tokens (op by op) between replays: the recording stays valid.
    p.rec.rewind(p.rec.n_past() - 5), p.eager.rewind(p.eager.n_past() - 5);
    run_steps(p, 3, last, s, bitwise);
    std::vector<int32_t> more(9);
    for (auto& id : more) id = (int32_t)(rng() % (uint32_t)sc.vocab);
    last = p.eager.prefill(more, 8);
    REQUIRE(p.rec.prefill(more, 8) == last);
    run_steps(p, 8, last, s, bitwise);
    steps += 11;
    CHECK(p.rec.steps_recorded() == 1);
  }
  std::printf("SUMMARY %-34s steps %5d   bitwise equal %5d   %s\n", "model decode, recorded == op by op", steps,
              bitwise, steps == bitwise ? "ok" : "FAIL");
}

TEST_CASE("recorded decode with an attention override: segments, then re-recorded on removal and release_kv") {
  auto& be = gpu();
  TempDir td;
  OpSummary s("model decode with override, recorded", 1e-6);
  int bitwise = 0, steps = 0;
  struct Case {
    SynthConfig sc;
    int layer;
    bool on_device;
  };
  for (const Case& c : {Case{gemma_like(), 2, true}, Case{llama_like(), 1, false}, Case{llama_like(), 2, true}}) {
    CAPTURE(c.sc.arch, c.layer, c.on_device);
    const std::string path = td.file(c.sc.arch + ".gguf");
    synth_write(c.sc, path);
    auto file = std::shared_ptr<const GgufFile>(GgufFile::open(path));
    ModelOptions opt;
    opt.n_ctx = 200, opt.max_chunk = 8;
    Pair p(file, be, opt);
    std::mt19937 rng(7);
    std::vector<int32_t> prompt(30);
    for (auto& id : prompt) id = (int32_t)(rng() % (uint32_t)c.sc.vocab);
    std::vector<float> last = p.eager.prefill(prompt, 8);
    REQUIRE(p.rec.prefill(prompt, 8) == last);

    DenseOverride ov_rec(be, c.layer, opt.n_ctx, c.on_device), ov_eager(be, c.layer, opt.n_ctx, c.on_device);
    ov_rec.take_prefill(p.rec), ov_eager.take_prefill(p.eager);
    p.rec.set_attention_override(&ov_rec), p.eager.set_attention_override(&ov_eager);
    run_steps(p, 12, last, s, bitwise);  // two segments around the override's layer
    CHECK(p.rec.steps_recorded() == 1);
    CHECK(p.rec.last_decode_replayed());

    p.rec.set_attention_override(nullptr), p.eager.set_attention_override(nullptr);
    run_steps(p, 6, last, s, bitwise);  // one segment: recorded again
    CHECK(p.rec.steps_recorded() == 2);

    // Back to the override, and its layer's cache handed over: recorded again
    // (the earlier recording pointed into the released cache).
    DenseOverride ov2_rec(be, c.layer, opt.n_ctx, c.on_device), ov2_eager(be, c.layer, opt.n_ctx, c.on_device);
    ov2_rec.take_prefill(p.rec), ov2_eager.take_prefill(p.eager);
    p.rec.set_attention_override(&ov2_rec), p.eager.set_attention_override(&ov2_eager);
    p.rec.release_kv(c.layer), p.eager.release_kv(c.layer);
    run_steps(p, 6, last, s, bitwise);
    CHECK(p.rec.steps_recorded() == 3);
    CHECK(p.rec.last_decode_replayed());
    steps += 24;
    p.rec.set_attention_override(nullptr), p.eager.set_attention_override(nullptr);
    REQUIRE_THROWS_AS(p.rec.decode(1), Error);  // the released layer cannot attend densely
  }
  std::printf("SUMMARY %-34s steps %5d   bitwise equal %5d   %s\n", "decode with override, recorded", steps,
              bitwise, steps == bitwise ? "ok" : "FAIL");
}
