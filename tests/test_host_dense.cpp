// Host-dense attention (offload/host_dense_attention.h) and the context fill
// without a prefill (Model::write_kv, ModelOptions::override_layers,
// bench/synthetic_fill.h), on tiny synthetic models: host-dense decoding must
// give the dense model's logits; a synthetic fill must put the same keys
// where a read finds them, whichever holder (model cache, sliding ring,
// override) takes them.
#include <catch2/catch.hpp>
#include <cmath>

#include "bench/synthetic.h"
#include "bench/synthetic_fill.h"
#include "offload/host_dense_attention.h"
#include "src/common/error.h"
#include "src/model/model.h"
#include "src/model/synth.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

std::shared_ptr<const GgufFile> tiny(const std::string& arch, test::TempDir& dir) {
  SynthConfig c = synth_defaults(arch);
  c.layers = arch == "gemma3" ? 6 : 3, c.width = 128, c.heads = 4, c.kv_heads = arch == "gemma3" ? 1 : 2;
  c.head_dim = 64, c.ffn = 256, c.vocab = 512, c.context = 8192;
  c.sliding_window = 16, c.global_every = 3;
  const std::string path = dir.file(arch + ".gguf");
  synth_write(c, path);
  return GgufFile::open(path);
}

int argmax(const std::vector<float>& v) { return (int)(std::max_element(v.begin(), v.end()) - v.begin()); }

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, (double)std::fabs(a[i] - b[i]));
  return d;
}

}  // namespace

TEST_CASE("host-dense decoding gives the dense model's logits (llama GQA and gemma3, f32 and f16 rows)") {
  test::TempDir dir("topkv_test_host_dense");
  auto be = make_cpu_backend();
  for (const std::string arch : {"llama", "gemma3"})
    for (DType dt : {DType::F32, DType::F16}) {
      INFO(arch << " " << dtype_name(dt));
      auto file = tiny(arch, dir);
      const ModelConfig cfg = read_model_config(*file);
      const int prompt_len = 4500, steps = 6;  // > 2 split-K blocks of kMinBlock keys
      ModelOptions mo;
      mo.n_ctx = prompt_len + steps + 1, mo.max_chunk = 256;
      Model dense(file, *be, mo), host(file, *be, mo);
      std::vector<int32_t> prompt((size_t)prompt_len);
      for (int i = 0; i < prompt_len; ++i) prompt[(size_t)i] = (int32_t)((i * 7919 + 13) % cfg.n_vocab);
      auto ld = dense.prefill(prompt, 256), lh = host.prefill(prompt, 256);
      HostDenseAttention hd(cfg, /*dense_layers=*/0, dt, /*progress=*/false);
      CHECK(hd.layers() == offloaded_layers(cfg, 0));
      hd.take_prefill(host);
      for (int il : hd.layers()) host.release_kv(il);
      host.set_attention_override(&hd);
      CHECK(HostDenseAttention::blocks_per_head(prompt_len, cfg.n_head_kv, 8) >= 2);
      double worst = 0;
      for (int s = 0; s < steps; ++s) {
        const int tok = argmax(ld);  // teacher-forced on the dense run's tokens
        ld = dense.decode(tok);
        lh = host.decode(tok);
        worst = std::max(worst, max_diff(ld, lh));
      }
      INFO("max |logit difference| " << worst);
      CHECK(worst < (dt == DType::F32 ? 1e-3 : 1e-2));
      CHECK(std::isfinite(worst));
      CHECK(hd.stats().steps == steps);
      CHECK(hd.stats().attend_s > 0);
      CHECK(hd.n_tokens(hd.layers().front()) == prompt_len + steps);
      CHECK(hd.host_bytes() == 2 * (size_t)hd.layers().size() * cfg.n_head_kv * (prompt_len + steps) * cfg.head_dim *
                                   dtype_size(dt));
    }
}

TEST_CASE("override layers get no cache, attending or writing them without an override is an Error") {
  test::TempDir dir("topkv_test_override_layers");
  auto be = make_cpu_backend();
  auto file = tiny("gemma3", dir);
  const ModelConfig cfg = read_model_config(*file);
  ModelOptions mo;
  mo.n_ctx = 64, mo.max_chunk = 8;
  Model full(file, *be, mo);
  mo.override_layers = offloaded_layers(cfg, 0);  // gemma3 tiny: the global layers 2 and 5
  REQUIRE(mo.override_layers == std::vector<int>{2, 5});
  Model lean(file, *be, mo);
  CHECK(lean.kv_capacity(2) == 0);
  CHECK(lean.kv_capacity(0) == full.kv_capacity(0));
  CHECK(lean.kv_bytes() < full.kv_bytes());
  CHECK(Model::planned_kv_capacity(cfg, mo, 5) == 0);
  const std::vector<int32_t> toks{1, 2, 3};
  CHECK_THROWS_WITH(lean.prefill(toks, 8), Catch::Contains("layer 2 has no KV cache"));
  std::vector<float> k((size_t)cfg.n_head_kv * 4 * cfg.head_dim, 1.f);
  CHECK_THROWS_WITH(lean.write_kv(5, k.data(), k.data(), 0, 4), Catch::Contains("no KV cache to write"));
  CHECK_THROWS_WITH(full.write_kv(0, k.data(), k.data(), 62, 4), Catch::Contains("does not fit the context size"));
  mo.override_layers = {6};
  CHECK_THROWS_WITH(Model(file, *be, mo), Catch::Contains("override layer 6 is out of range"));
}

TEST_CASE("synthetic fill: write_kv / read_kv round trip, sliding rings wrap right, overrides see the same KV") {
  test::TempDir dir("topkv_test_synthetic_fill");
  auto be = make_cpu_backend();
  auto file = tiny("gemma3", dir);
  const ModelConfig cfg = read_model_config(*file);
  const int64_t n = 300;
  const SyntheticFill fill(cfg, n, /*seed=*/7, /*progress=*/false);

  // Round trip through an f32 cache is exact; through f16 within its rounding.
  for (DType dt : {DType::F32, DType::F16}) {
    ModelOptions mo;
    mo.n_ctx = n + 8, mo.max_chunk = 1, mo.kv_dtype = dt;
    Model m(file, *be, mo);
    fill.fill_model(m);
    CHECK(m.n_past() == n);
    std::vector<float> k, v, k0, v0;
    m.read_kv(2, k, v);
    fill.read(2, 0, n, k0, v0);
    REQUIRE(k.size() == k0.size());
    CHECK(max_diff(k, k0) <= (dt == DType::F32 ? 0.0 : 1e-2 * (1 + std::fabs(*std::max_element(k0.begin(), k0.end())))));
    CHECK(max_diff(v, v0) <= (dt == DType::F32 ? 0.0 : 1e-2));
    CHECK_THROWS_WITH(m.read_kv(0, k, v), Catch::Contains("sliding window"));  // a ring of 16 slots
    std::vector<float> ks, vs, kw;  // a range of positions: the same rows as the whole read's
    m.read_kv(2, ks, vs, 101, 57);
    test::slice_positions(k, n, cfg.head_dim, 101, 57, kw);
    CHECK(max_diff(ks, kw) == 0.0);
    CHECK_THROWS_WITH(m.read_kv(2, ks, vs, 290, 11), Catch::Contains("cannot read positions 290..301"));
  }
  // Each layer has its own data; the synthetic generator at t0 = 0 is generate_synthetic's.
  std::vector<float> ka, va, kb, vb;
  fill.read(2, 0, 64, ka, va);
  fill.read(5, 0, 64, kb, vb);
  CHECK(max_diff(ka, kb) > 0.1);
  SyntheticConfig sc = fill.layer_config(2);
  sc.dtype = DType::F32;
  const SyntheticData sd = generate_synthetic(sc, 0, false);
  std::vector<float> row((size_t)cfg.head_dim);
  sd.data.heads[0].keys->row_f32(37, row.data());
  CHECK(max_diff(row, std::vector<float>(ka.begin() + 37 * cfg.head_dim, ka.begin() + 38 * cfg.head_dim)) == 0.0);

  // The window's rows written into a ring of exactly the window (wrapping:
  // 284 % 16 = 12) and into one with room for every position (no wrap) decode
  // alike; so does a model that gives its global layers to host-dense
  // attention filled from the same reader. (Rows from t0 > 0 are a fresh draw,
  // not the full generation's, so both models get the same window rows.)
  ModelOptions wide, ring;
  wide.n_ctx = ring.n_ctx = n + 8;
  wide.max_chunk = 512, ring.max_chunk = 1;
  Model a(file, *be, wide), b(file, *be, ring);
  ModelOptions lean = ring;
  lean.override_layers = offloaded_layers(cfg, 0);
  Model c(file, *be, lean);
  CHECK(a.kv_capacity(0) >= n);
  CHECK(b.kv_capacity(0) == 16);
  fill.fill_model(b), fill.fill_model(c);
  for (int il = 0; il < cfg.n_layer; ++il) {  // a: what fill_model(b) writes, at the same positions
    const int64_t m = std::min(n, b.kv_capacity(il));
    fill.read(il, n - m, m, ka, va);
    a.write_kv(il, ka.data(), va.data(), n - m, m);
  }
  a.set_n_past(n);
  HostDenseAttention hd(cfg, 0, DType::F32, false);
  hd.take_context(n, fill.reader());
  c.set_attention_override(&hd);
  int tok = 5;
  for (int s = 0; s < 4; ++s) {
    auto la = a.decode(tok), lb = b.decode(tok), lc = c.decode(tok);
    CHECK(max_diff(la, lb) == 0.0);
    CHECK(max_diff(lb, lc) < 1e-3);
    tok = argmax(la);
  }
}

TEST_CASE("the synthetic reader's pieces continue each other: one read of the layer, bit for bit") {
  test::TempDir dir("topkv_test_synthetic_pieces");
  auto file = tiny("gemma3", dir);
  const ModelConfig cfg = read_model_config(*file);
  const int64_t n = 2 * kContextPiece + 8929;  // two whole pieces and an odd one
  const SyntheticFill fill(cfg, n, /*seed=*/3, /*progress=*/false);
  const KvReader read = fill.reader();
  for (int il : {2, 5}) {
    CAPTURE(il);
    std::vector<float> k0, v0, k, v, kw;
    fill.read(il, 0, n, k0, v0);
    for (int64_t t0 = 0; t0 < n; t0 += kContextPiece) {
      const int64_t m = std::min(kContextPiece, n - t0);
      read(il, t0, m, k, v);
      test::slice_positions(k0, n, cfg.head_dim, t0, m, kw);
      CHECK(max_diff(k, kw) == 0.0);
      test::slice_positions(v0, n, cfg.head_dim, t0, m, kw);
      CHECK(max_diff(v, kw) == 0.0);
    }
  }
  // A piece that does not continue the layer's last read would be a fresh
  // draw of the topic, another context: refused.
  std::vector<float> k, v;
  read(2, 0, kContextPiece, k, v);
  CHECK_THROWS_WITH(read(2, 2 * kContextPiece, 10, k, v), Catch::Contains("continue each other"));
}
