// The forward pass (chunked prefill + cached decode on the CPU backend)
// against the naive per-token reference (src/model/reference.cpp) on small
// synthetic llama, gemma3 and qwen2 models of several geometries; and every bad
// model / bad call path.
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <functional>
#include <random>

#include "src/common/error.h"
#include "src/model/gguf_writer.h"
#include "src/model/model.h"
#include "src/model/reference.h"
#include "src/model/synth.h"
#include "tests/model_test_util.h"
#include "tests/test_util.h"

using namespace topkv;
namespace fs = std::filesystem;

namespace {

using test::TempDir;
const TempDir& tmp() {
  static TempDir d;
  return d;
}

std::vector<int32_t> random_tokens(int n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(n);
  for (auto& t : ids) t = (int32_t)(rng() % vocab);
  return ids;
}

// Largest |a - b| relative to the scale of b.
double rel_err(const float* a, const float* b, size_t n) {
  double d = 0, m = 0;
  for (size_t i = 0; i < n; ++i) d = std::max(d, (double)std::abs(a[i] - b[i])), m = std::max(m, (double)std::abs(b[i]));
  return d / (1.0 + m);
}

struct Run {
  int prompt = 0;                  // tokens prefilled
  std::vector<int> chunks;         // chunk sizes tried for the prefill
  int decode = 0;                  // tokens decoded one at a time afterwards
  ModelOptions opt;
  double tol = 1e-4;
};

// Logits of every position from the reference, then from the model with each
// chunking; compares them position by position.
void check_against_reference(const std::string& path, const Run& r) {
  auto file = std::shared_ptr<const GgufFile>(GgufFile::open(path));
  ref::ReferenceModel refm(*file);
  const int64_t V = refm.config().n_vocab;
  const auto ids = random_tokens(r.prompt + r.decode, V, 1234);
  std::vector<std::vector<float>> want;
  for (int32_t t : ids) want.push_back(refm.forward(t));

  auto be = make_cpu_backend();
  Model m(file, *be, r.opt);
  for (int chunk : r.chunks) {
    CAPTURE(chunk);
    m.reset();
    const auto all = m.prefill(std::span(ids.data(), (size_t)r.prompt), chunk, /*all_logits=*/true);
    REQUIRE(all.size() == (size_t)r.prompt * V);
    for (int p = 0; p < r.prompt; ++p) {
      CAPTURE(p);
      REQUIRE(rel_err(all.data() + (size_t)p * V, want[p].data(), V) <= r.tol);
    }
    for (int i = 0; i < r.decode; ++i) {
      const int p = r.prompt + i;
      CAPTURE(p);
      const auto got = m.decode(ids[p]);
      REQUIRE(rel_err(got.data(), want[p].data(), V) <= r.tol);
    }
    REQUIRE(m.n_past() == r.prompt + r.decode);
  }
  // Last-token logits of a prefill equal the all-logits row.
  m.reset();
  const auto last = m.prefill(std::span(ids.data(), (size_t)r.prompt), r.chunks[0]);
  REQUIRE(rel_err(last.data(), want[r.prompt - 1].data(), V) <= r.tol);
}

std::string synth(const std::string& name, SynthConfig c) {
  const std::string path = tmp().file(name + ".gguf");
  synth_write(c, path);
  return path;
}

// Rewrites a GGUF file with every key and tensor of `src`, then `edit` (which
// may add keys and tensors): how the tests give a synthetic model what the
// synthesiser does not write (Llama 3.1 rope_freqs, RoPE scaling).
// `skip` leaves tensors out (to replace or drop them).
std::string copy_with(const std::string& src, const std::string& name, const std::function<void(GgufWriter&)>& edit,
                      const std::function<bool(const GgufTensor&)>& skip = {}) {
  auto f = GgufFile::open(src);
  GgufWriter w;
  for (const GgufKV& kv : f->metadata()) {
    if (kv.key == "general.alignment") continue;
    switch (kv.type) {
      case GgufType::U8: w.set_u8(kv.key, (uint8_t)kv.u); break;
      case GgufType::I8: w.set_i8(kv.key, (int8_t)kv.i); break;
      case GgufType::U16: w.set_u16(kv.key, (uint16_t)kv.u); break;
      case GgufType::I16: w.set_i16(kv.key, (int16_t)kv.i); break;
      case GgufType::U32: w.set_u32(kv.key, (uint32_t)kv.u); break;
      case GgufType::I32: w.set_i32(kv.key, (int32_t)kv.i); break;
      case GgufType::U64: w.set_u64(kv.key, kv.u); break;
      case GgufType::I64: w.set_i64(kv.key, kv.i); break;
      case GgufType::F32: w.set_f32(kv.key, (float)kv.f); break;
      case GgufType::F64: w.set_f64(kv.key, kv.f); break;
      case GgufType::BOOL: w.set_bool(kv.key, kv.i != 0); break;
      case GgufType::STR: w.set_str(kv.key, kv.str); break;
      case GgufType::ARR:
        if (kv.arr_type == GgufType::STR)
          w.set_arr_str(kv.key, std::vector<std::string>(kv.arr_str.begin(), kv.arr_str.end()));
        else
          w.set_arr(kv.key, kv.arr_type, kv.arr_data, kv.arr_count);
        break;
    }
  }
  for (const GgufTensor& t : f->tensors())
    if (!skip || !skip(t))
      w.add_tensor_raw(t.name, t.type, std::vector<int64_t>(t.ne, t.ne + t.n_dims),
                       std::vector<uint8_t>(t.data, t.data + t.nbytes));
  edit(w);
  const std::string path = tmp().file(name + ".gguf");
  w.write(path);
  return path;
}

}  // namespace

TEST_CASE("llama: chunked prefill and cached decode match the reference") {
  struct G { int heads, kv, hd; GgmlType type; bool tied; };
  for (const G& g : {G{4, 4, 64, GgmlType::F32, false}, G{8, 2, 128, GgmlType::Q8_0, true},
                     G{4, 1, 256, GgmlType::Q4_K, false}, G{8, 1, 64, GgmlType::Q5_0, true}}) {
    SynthConfig c = synth_defaults("llama");
    c.layers = 2, c.width = 256, c.heads = g.heads, c.kv_heads = g.kv, c.head_dim = g.hd, c.ffn = 512;
    c.vocab = 600, c.type = g.type, c.tied_output = g.tied, c.seed = (uint64_t)g.hd * 7 + g.kv;
    CAPTURE(g.heads, g.kv, g.hd, ggml_type_name((uint32_t)g.type), g.tied);
    Run r;
    r.prompt = 23, r.decode = 4, r.chunks = {5, 23, 1, 4};
    r.opt.n_ctx = 40, r.opt.max_chunk = 23;
    check_against_reference(synth(fmt::format("llama_{}_{}_{}", g.heads, g.kv, g.hd), c), r);
  }
}

TEST_CASE("llama 3.1 rope_freqs and linear RoPE scaling reach every layer") {
  SynthConfig c = synth_defaults("llama");
  c.layers = 2, c.width = 128, c.heads = 4, c.kv_heads = 2, c.head_dim = 32, c.ffn = 128, c.vocab = 400;
  const std::string plain = synth("llama_rope_plain", c);
  std::vector<float> factors(16);
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.f + 3.f * (float)i;  // far from 1: visible
  const std::string path = copy_with(plain, "llama_rope_freqs", [&](GgufWriter& w) {
    w.set_str("llama.rope.scaling.type", "linear");
    w.set_f32("llama.rope.scaling.factor", 4.f);
    w.add_tensor_f32("rope_freqs.weight", GgmlType::F32, {16}, factors);
  });
  auto file = GgufFile::open(path);
  const ModelConfig cfg = read_model_config(*file);
  for (const auto& l : cfg.layers) {
    REQUIRE(l.rope.freq_factors != nullptr);
    REQUIRE(l.rope.freq_factors[5] == 16.f);
    REQUIRE(l.rope.freq_scale == 0.25f);
  }
  Run r;
  r.prompt = 11, r.decode = 3, r.chunks = {4};
  r.opt.n_ctx = 16, r.opt.max_chunk = 4;
  check_against_reference(path, r);
  // ...and they change the output (the model does not ignore them).
  auto be = make_cpu_backend();
  Model with(std::shared_ptr<const GgufFile>(GgufFile::open(path)), *be, r.opt);
  Model without(std::shared_ptr<const GgufFile>(GgufFile::open(plain)), *be, r.opt);
  const auto ids = random_tokens(11, 400, 4);
  const auto a = with.prefill(ids, 4), b = without.prefill(ids, 4);
  REQUIRE(rel_err(a.data(), b.data(), a.size()) > 1e-3);

  const std::string yarn = copy_with(plain, "llama_yarn", [](GgufWriter& w) {
    w.set_str("llama.rope.scaling.type", "yarn");
    w.set_f32("llama.rope.scaling.factor", 4.f);
  });
  REQUIRE_THROWS_WITH(read_model_config(*GgufFile::open(yarn)), Catch::Contains("RoPE scaling 'yarn'"));
  const std::string short_freqs = copy_with(plain, "llama_short_freqs", [](GgufWriter& w) {
    w.add_tensor_f32("rope_freqs.weight", GgmlType::F32, {8}, std::vector<float>(8, 1.f));
  });
  REQUIRE_THROWS_WITH(read_model_config(*GgufFile::open(short_freqs)), Catch::Contains("rope_freqs.weight"));
}

TEST_CASE("gemma3: sliding-window ring wraps, global layers see everything") {
  SynthConfig c = synth_defaults("gemma3");
  c.layers = 4, c.global_every = 2, c.width = 128, c.heads = 4, c.kv_heads = 1, c.head_dim = 256;
  c.ffn = 256, c.vocab = 700, c.sliding_window = 8, c.type = GgmlType::Q8_0, c.seed = 5;
  const std::string path = synth("gemma3_w8", c);
  Run r;
  r.prompt = 29, r.decode = 9, r.chunks = {3, 7, 1};  // 29 + 9 positions through a window of 8
  r.opt.n_ctx = 64, r.opt.max_chunk = 7;
  check_against_reference(path, r);

  SECTION("f16 KV cache and dequantised weights") {
    Run f = r;
    f.chunks = {7};
    f.opt.kv_dtype = DType::F16, f.opt.weights = WeightMode::F32, f.tol = 5e-3;
    check_against_reference(path, f);
  }
  SECTION("the local layers' ring stays window + chunk - 1") {
    auto file = std::shared_ptr<const GgufFile>(GgufFile::open(path));
    auto be = make_cpu_backend();
    Model m(file, *be, r.opt);
    const size_t per_slot = 2 * 256 * sizeof(float);  // K and V of one KV head
    REQUIRE(m.kv_bytes() == per_slot * (2 * 64 + 2 * (8 + 7 - 1)));
    REQUIRE(m.config().layers[0].sliding);
    REQUIRE_FALSE(m.config().layers[1].sliding);
    REQUIRE(m.config().attn_scale == Approx(1.f / 16));
    REQUIRE(m.config().layers[1].rope.base == Approx(1e6f));
    REQUIRE(m.config().layers[0].rope.base == Approx(1e4f));
    // Memory accounting: the weights touched are the weights counted, in
    // both modes, and the two modes report each other's size.
    REQUIRE(m.touch_weights() == m.weight_bytes());
    Model f(file, *be, test::model_options(64, 7, DType::F32, WeightMode::F32));
    REQUIRE(f.touch_weights() == f.weight_bytes());
    REQUIRE(f.weight_bytes() == m.weight_bytes_other_mode());
    REQUIRE(m.weight_bytes() == f.weight_bytes_other_mode());
    REQUIRE(f.weight_bytes() > 3 * m.weight_bytes());  // Q8_0 is ~1.06 bytes per value
  }
}

TEST_CASE("gemma3 with GQA groups of 2 and head_dim 64, odd lengths") {
  SynthConfig c = synth_defaults("gemma3");
  c.layers = 3, c.global_every = 3, c.width = 96, c.heads = 4, c.kv_heads = 2, c.head_dim = 64;
  c.ffn = 160, c.vocab = 500, c.sliding_window = 5, c.type = GgmlType::F32, c.seed = 9;
  Run r;
  r.prompt = 13, r.decode = 6, r.chunks = {13, 2};
  r.opt.n_ctx = 19, r.opt.max_chunk = 13;
  check_against_reference(synth("gemma3_g2", c), r);
}

TEST_CASE("qwen2: q/k/v biases, NeoX RoPE and GQA 7:1 / 6:1 match the reference") {
  struct G { int heads, kv, hd; GgmlType type; bool tied; };
  for (const G& g : {G{7, 1, 64, GgmlType::F32, false}, G{6, 1, 128, GgmlType::Q8_0, true},
                     G{14, 2, 64, GgmlType::Q4_K, false}, G{4, 2, 256, GgmlType::Q6_K, true}}) {
    SynthConfig c = synth_defaults("qwen2");
    c.layers = 2, c.width = 256, c.heads = g.heads, c.kv_heads = g.kv, c.head_dim = g.hd, c.ffn = 512;
    c.vocab = 600, c.type = g.type, c.tied_output = g.tied, c.seed = (uint64_t)g.hd * 5 + g.heads;
    CAPTURE(g.heads, g.kv, g.hd, ggml_type_name((uint32_t)g.type), g.tied);
    Run r;
    r.prompt = 19, r.decode = 5, r.chunks = {19, 4, 1};
    r.opt.n_ctx = 32, r.opt.max_chunk = 19;
    const std::string path = synth(fmt::format("qwen2_{}_{}_{}", g.heads, g.kv, g.hd), c);
    check_against_reference(path, r);
    auto file = GgufFile::open(path);
    const ModelConfig cfg = read_model_config(*file);
    REQUIRE(cfg.arch == Arch::Qwen2);
    REQUIRE(cfg.qkv_bias);
    REQUIRE(cfg.layers[1].rope.style == RopeStyle::NeoX);
    REQUIRE(cfg.layers[1].rope.base == Approx(1e6f));
  }
}

TEST_CASE("qwen2: the biases matter, and a file without them is refused") {
  const std::string path = synth("qwen2_tiny", synth_preset("tiny-qwen2"));
  const auto is_bias = [](const GgufTensor& t) { return t.name.ends_with(".bias"); };
  // The same model with every bias zero: other logits (so the reference test
  // above would catch a forward pass that drops them).
  const auto src = GgufFile::open(path);
  const std::string zeroed = copy_with(path, "qwen2_zero_bias", [&](GgufWriter& w) {
    for (const GgufTensor& t : src->tensors())
      if (is_bias(t)) w.add_tensor_f32(t.name, GgmlType::F32, {t.ne[0]}, std::vector<float>((size_t)t.ne[0], 0.f));
  }, is_bias);
  auto be = make_cpu_backend();
  const ModelOptions opt = test::model_options(16, 8);
  Model with(std::shared_ptr<const GgufFile>(GgufFile::open(path)), *be, opt);
  Model without(std::shared_ptr<const GgufFile>(GgufFile::open(zeroed)), *be, opt);
  const auto ids = random_tokens(6, with.config().n_vocab, 11);
  const auto a = with.prefill(ids, 8), b = without.prefill(ids, 8);
  REQUIRE(rel_err(a.data(), b.data(), a.size()) > 1e-2);

  const std::string no_bias = copy_with(path, "qwen2_no_bias", [](GgufWriter&) {},
                                        [](const GgufTensor& t) { return t.name == "blk.1.attn_k.bias"; });
  REQUIRE_THROWS_WITH(Model(std::shared_ptr<const GgufFile>(GgufFile::open(no_bias)), *be, opt),
                      Catch::Contains("blk.1.attn_k.bias' is missing"));
}

TEST_CASE("bad calls: full context, chunk too large, token outside the vocabulary") {
  SynthConfig c = synth_defaults("llama");
  c.layers = 1, c.width = 64, c.heads = 2, c.kv_heads = 1, c.head_dim = 32, c.ffn = 64, c.vocab = 400;
  const std::string path = synth("llama_small", c);
  auto file = std::shared_ptr<const GgufFile>(GgufFile::open(path));
  auto be = make_cpu_backend();
  Model m(file, *be, test::model_options(8, 4));
  const auto ids = random_tokens(9, 400, 3);
  REQUIRE_THROWS_AS(m.prefill(ids, 4), Error);  // 9 > n_ctx
  REQUIRE(m.n_past() == 0);
  REQUIRE_THROWS_AS(m.prefill(std::span(ids.data(), 4), 5), Error);  // chunk > max_chunk
  REQUIRE_THROWS_AS(m.prefill(std::span(ids.data(), 4), 0), Error);
  REQUIRE_THROWS_AS(m.decode(400), Error);
  REQUIRE_THROWS_AS(m.decode(-1), Error);
  REQUIRE_THROWS_AS(m.prefill(std::span<const int32_t>(), 4), Error);
  m.prefill(std::span(ids.data(), 8), 4);
  REQUIRE_THROWS_AS(m.decode(ids[8]), Error);  // context full
  REQUIRE_THROWS_AS(Model(file, *be, test::model_options(0, 512)), Error);
  REQUIRE_THROWS_AS(Model(file, *be, test::model_options(8, 0)), Error);
}

// A one-layer llama written by hand, with one thing broken per case.
TEST_CASE("bad model files are clear errors") {
  const int d = 64, ff = 96, V = 300, hd = 32;
  const auto write = [&](const std::string& name, const std::string& drop_key, const std::string& drop_tensor,
                         const std::string& bad_shape, const std::string& arch) {
    GgufWriter w;
    w.set_str("general.architecture", arch);
    const std::vector<std::pair<std::string, uint32_t>> u32 = {
        {"llama.embedding_length", d}, {"llama.block_count", 1}, {"llama.feed_forward_length", ff},
        {"llama.attention.head_count", 2}, {"llama.attention.head_count_kv", 1}, {"llama.context_length", 128}};
    for (const auto& [k, v] : u32)
      if (k != drop_key) w.set_u32(k, v);
    if (drop_key != "llama.attention.layer_norm_rms_epsilon") w.set_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    const std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
        {"token_embd.weight", {d, V}}, {"output_norm.weight", {d}}, {"blk.0.attn_norm.weight", {d}},
        {"blk.0.attn_q.weight", {d, 2 * hd}}, {"blk.0.attn_k.weight", {d, hd}}, {"blk.0.attn_v.weight", {d, hd}},
        {"blk.0.attn_output.weight", {2 * hd, d}}, {"blk.0.ffn_norm.weight", {d}},
        {"blk.0.ffn_gate.weight", {d, ff}}, {"blk.0.ffn_up.weight", {d, ff}}, {"blk.0.ffn_down.weight", {ff, d}}};
    std::mt19937 rng(1);
    std::normal_distribution<float> nd(0.f, 0.1f);
    for (auto [n, ne] : tensors) {
      if (n == drop_tensor) continue;
      if (n == bad_shape) ne[0] += 32;
      int64_t count = 1;
      for (auto e : ne) count *= e;
      std::vector<float> vals(count);
      for (auto& x : vals) x = nd(rng);
      w.add_tensor_f32(n, GgmlType::F32, ne, vals);
    }
    const std::string path = tmp().file(name + ".gguf");
    w.write(path);
    return path;
  };
  const auto load = [&](const std::string& path) {
    auto file = std::shared_ptr<const GgufFile>(GgufFile::open(path));
    auto be = make_cpu_backend();
    Model m(file, *be, test::model_options(16, 4));
    return m.prefill(random_tokens(3, V, 1), 4);
  };
  const auto fails_with = [&](const std::string& path, const std::string& text) {
    try {
      load(path);
    } catch (const Error& e) {
      CAPTURE(e.what());
      REQUIRE(std::string(e.what()).find(text) != std::string::npos);
      return;
    }
    FAIL("no error for " << path);
  };
  REQUIRE(load(write("ok", "", "", "", "llama")).size() == (size_t)V);  // the helper itself is sound
  fails_with(write("arch", "", "", "", "mamba"), "architecture 'mamba' is not supported");
  fails_with(write("nokey", "llama.block_count", "", "", "llama"), "llama.block_count");
  fails_with(write("noeps", "llama.attention.layer_norm_rms_epsilon", "", "", "llama"), "layer_norm_rms_epsilon");
  fails_with(write("notensor", "", "blk.0.ffn_up.weight", "", "llama"), "blk.0.ffn_up.weight' is missing");
  fails_with(write("shape", "", "", "blk.0.attn_k.weight", "llama"), "blk.0.attn_k.weight' has shape");
  fails_with(write("normshape", "", "", "output_norm.weight", "llama"), "output_norm.weight' has shape");
  fails_with(write("embd", "", "", "token_embd.weight", "llama"), "token_embd.weight has shape");
}
