// The prefill over a host-resident KV cache (gpu/cuda_streamed_attention.cpp):
// a retrieval layer whose KV does not fit the GPU budget lives in pinned host
// memory and each chunk's attention streams it up in blocks.
//   1. the op: streamed attention against CpuBackend::attention and against
//      the same call over a device cache, with blocks small enough that a
//      call crosses many block edges (chunks cut by an edge, rows that see
//      nothing of a block), T from 1 (the fp32 kernel) to 333 (tensor
//      cores), GQA 1-4, head_dim 64/128/256, f32/f16/bf16 caches, windows;
//      kv_write into the host cache must store what the device cache stores,
//      bit for bit;
//   2. a model: a synthetic gemma3 prefilled with its global layers in host
//      memory (ModelOptions::kv_place Host) against the same model with every
//      cache on the device: logits of every position and the layers' KV;
//   3. prefill rings (ModelOptions::host_kv_past): a synthetic qwen2 whose
//      retrieval layers keep only the chunk and read the past from the top-k
//      runtime's stores (the CPU runtime's heap store, the CUDA runtime's
//      pinned one) gives the full host caches' logits bit for bit with an f16
//      store, close ones with an f8 store (the past in E4M3), and the CPU
//      backend's ring logits within the usual GPU/CPU tolerance.
// Run: gpu_test_cuda_streamed.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "gpu/cuda_backend_impl.h"
#include "src/model/model.h"
#include "src/model/synth.h"
#include "src/session/make_runtime.h"
#include "src/session/session.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

// Restores the backend's 64 MiB stages when a test case ends.
struct SmallStages {
  explicit SmallStages(size_t bytes) { cuda_be().set_stream_stage_bytes(bytes); }
  ~SmallStages() { cuda_be().set_stream_stage_bytes(size_t{64} << 20); }
};

}  // namespace

TEST_CASE("streamed attention over a host-resident cache equals the CPU and the device cache") {
  auto cpu = make_cpu_backend();
  auto& be = cuda_be();
  std::mt19937 rng(211);
  OpSummary s_cpu("streamed attention vs CPU (row rel err)", 2e-2),
      s_dev("streamed vs device-cache attention", 2e-2);
  struct Case {
    int T, n_head, n_kv, hd;
    int64_t pos0, window;
    DType dt;
    size_t stage;  // bytes of K + V per block
  };
  const Case cases[] = {
      {1, 4, 1, 256, 5000, 0, DType::F16, 64 * 1024},     // decode-sized: the fp32 kernel, 10 blocks
      {5, 8, 2, 128, 3001, 0, DType::F32, 128 * 1024},    // short chunk, fp32 cache
      {16, 4, 1, 256, 0, 0, DType::F16, 64 * 1024},       // the first chunk: one block, all causal
      {17, 4, 1, 256, 100, 0, DType::BF16, 64 * 1024},    // chunk cut by a block edge (128 keys per block)
      {333, 8, 2, 64, 777, 0, DType::F16, 32 * 1024},     // 64 keys per block: every tile its own block
      {333, 32, 8, 128, 2000, 0, DType::F16, 1 << 20},    // llama-like GQA 4
      {64, 4, 1, 256, 4096, 300, DType::F16, 64 * 1024},  // a window: blocks before it are skipped
      {200, 4, 4, 64, 1500, 0, DType::F32, 48 * 1024},    // no GQA, fp32: 32-key tiles
      {512, 4, 1, 256, 9000, 0, DType::F16, size_t{64} << 20},  // one 64 MiB block holds everything
  };
  for (const Case& c : cases) {
    CAPTURE(c.T, c.n_head, c.n_kv, c.hd, c.pos0, c.window, dtype_name(c.dt), c.stage);
    SmallStages stages(c.stage);
    const int64_t n = c.pos0 + c.T;
    KvLayerCache hc = cpu->alloc_kv(c.n_kv, c.hd, n, c.dt);
    KvLayerCache dc = be.alloc_kv(c.n_kv, c.hd, n, c.dt);
    KvLayerCache sc = be.alloc_kv_host(c.n_kv, c.hd, n, c.dt);
    REQUIRE(sc.in_host);
    // Written in chunks as a prefill writes them (the last chunk is the call's).
    for (int64_t p = 0; p < n;) {
      const int m = (int)std::min<int64_t>(p < c.pos0 ? 997 : c.T, n - p);
      const auto k = randn((size_t)m * c.n_kv * c.hd, rng, 1.f, 0.2f), v = randn(k.size(), rng);
      cpu->kv_write(hc, k.data(), v.data(), m, p);
      Buffer dk = upload(be, k), dv = upload(be, v);
      be.kv_write(dc, dk.f32(), dv.f32(), m, p);
      be.kv_write(sc, dk.f32(), dv.f32(), m, p);
      p += m;
    }
    be.synchronize();
    // The host cache holds what the device cache holds, bit for bit.
    const size_t half = dc.bytes() / 2;
    std::vector<uint8_t> dev_k(half), dev_v(half);
    be.to_host(dc.k, 0, dev_k.data(), half);
    be.to_host(dc.v, 0, dev_v.data(), half);
    CHECK(std::memcmp(dev_k.data(), sc.k.mem.get(), half) == 0);
    CHECK(std::memcmp(dev_v.data(), sc.v.mem.get(), half) == 0);

    const auto q = randn((size_t)c.T * c.n_head * c.hd, rng, 2.f);
    const float scale = 1.f / std::sqrt((float)c.hd);
    std::vector<float> ref(q.size());
    cpu->attention(q.data(), c.T, c.n_head, c.pos0, hc, c.window, scale, ref.data());
    Buffer dq = upload(be, q), d_out = poisoned(be, q.size()), s_out = poisoned(be, q.size());
    be.attention(dq.f32(), c.T, c.n_head, c.pos0, dc, c.window, scale, d_out.f32());
    be.attention(dq.f32(), c.T, c.n_head, c.pos0, sc, c.window, scale, s_out.f32());
    const auto got_dev = download(be, d_out, q.size()), got_str = download(be, s_out, q.size());
    const double tol = c.T >= 16 ? (c.dt == DType::BF16 ? 2e-2 : 3e-3) : 1e-5;
    const double e_cpu = max_row_rel_err(got_str, ref, c.hd), e_dev = max_row_rel_err(got_str, got_dev, c.hd);
    CHECK(e_cpu <= tol);
    CHECK(e_dev <= tol);
    s_cpu.check(e_cpu);
    s_dev.check(e_dev);
  }
}

TEST_CASE("a model prefilled with its global layers' KV in host memory gives the device caches' logits and KV") {
  TempDir td;
  auto& be = cuda_be();
  SmallStages stages(64 * 1024);  // 64 keys per block at head_dim 256 f16: many blocks per chunk
  OpSummary s_log("model logits, host-resident vs device KV", 5e-3);
  SynthConfig c = synth_defaults("gemma3");
  c.layers = 6, c.width = 256, c.heads = 4, c.kv_heads = 1, c.head_dim = 256, c.ffn = 512, c.vocab = 1024;
  c.sliding_window = 16, c.global_every = 3, c.type = GgmlType::Q8_0, c.seed = 13;
  const std::string path = (td.dir / "m.gguf").string();
  synth_write(c, path);
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  ModelOptions dev_opt;
  dev_opt.n_ctx = 700, dev_opt.max_chunk = 96, dev_opt.kv_dtype = DType::F16;
  ModelOptions host_opt = dev_opt;
  Model probe(file, be, dev_opt);
  for (int il = 0; il < probe.config().n_layer; ++il)
    if (probe.config().layers[(size_t)il].window == 0) host_opt.host_kv_candidates.push_back(il);
  REQUIRE(host_opt.host_kv_candidates.size() == 2);
  host_opt.kv_place = ModelOptions::KvPlace::Host;
  Model m_dev(file, be, dev_opt), m_host(file, be, host_opt);
  CHECK(m_host.host_kv_layers() == host_opt.host_kv_candidates);
  CHECK(m_dev.host_kv_layers().empty());

  std::mt19937 rng(43);
  std::vector<int32_t> prompt(651);  // 6 full chunks and a 75-token tail
  for (auto& id : prompt) id = (int32_t)(rng() % (uint32_t)probe.config().n_vocab);
  const auto l_dev = m_dev.prefill(prompt, 96, /*all_logits=*/true);
  const auto l_host = m_host.prefill(prompt, 96, /*all_logits=*/true);
  s_log.check(rel_err(l_host, l_dev));
  // The first global layer's KV comes from dense layers only: the same f16
  // values through either cache, bit for bit. A later one's inputs went
  // through the first one's streamed attention (another summation order).
  for (size_t i = 0; i < host_opt.host_kv_candidates.size(); ++i) {
    const int il = host_opt.host_kv_candidates[i];
    CAPTURE(il);
    std::vector<float> kd, vd, kh, vh;
    m_dev.read_kv(il, kd, vd);
    m_host.read_kv(il, kh, vh);
    if (i == 0) {
      CHECK(kh == kd);
      CHECK(vh == vd);
    } else {
      CHECK(rel_err(kh, kd) < 5e-3);
      CHECK(rel_err(vh, vd) < 5e-3);
    }
  }
  // Auto with a budget too small for the global layers' caches puts them in
  // host memory. The reserve leaves half a cache of room: less than a cache
  // (so neither fits the device) and more than the model's own buffers (so
  // the reserve itself still fits what is left, which Model checks since
  // session 18), with ~100 MiB of slack for other processes on the GPU
  // (compute-sanitizer runs tests side by side).
  ModelOptions auto_opt = dev_opt;
  auto_opt.n_ctx = 200000;  // 200 MiB a global layer's cache
  auto_opt.host_kv_candidates = host_opt.host_kv_candidates;
  const int64_t cache = (int64_t)kv_cache_shape(1, 256, auto_opt.n_ctx, DType::F16).bytes();
  auto_opt.device_reserves = {be.memory_left() - cache / 2};
  Model m_auto(file, be, auto_opt);
  CHECK(m_auto.host_kv_layers() == host_opt.host_kv_candidates);
}

namespace {

// Last-token logits of a prompt prefilled in chunks while `rt` takes each
// chunk; the retrieval layers' caches in host memory, full or rings.
std::vector<float> ring_prefill(const std::shared_ptr<const GgufFile>& file, Backend& be, OffloadRuntime& rt,
                                const std::vector<int32_t>& prompt, int chunk, bool rings) {
  ModelOptions mo;
  mo.n_ctx = (int64_t)prompt.size() + 8, mo.max_chunk = chunk, mo.kv_dtype = DType::F16;
  mo.host_kv_candidates = rt.retrieval_layers();
  mo.kv_place = ModelOptions::KvPlace::Host;
  mo.host_kv_past = rings;
  Model model(file, be, mo);
  CHECK(model.host_kv_layers().size() == (be.host_memory() ? 0 : rt.retrieval_layers().size()));
  CHECK(model.ring_kv_layers().size() == (rings ? rt.retrieval_layers().size() : 0));
  return prefill_into(model, prompt, chunk, &rt, /*overlap=*/true, /*progress=*/false);
}

}  // namespace

TEST_CASE("prefill rings read the past from the runtime's stores: the full host caches' logits") {
  TempDir td;
  auto& be = cuda_be();
  auto cpu = make_cpu_backend();
  SmallStages stages(96 * 1024);  // 96 keys per block (2 KV heads of 128, f16): blocks cut chunks and runs
  SynthConfig c = synth_defaults("qwen2");
  c.layers = 4, c.width = 512, c.heads = 8, c.kv_heads = 2, c.head_dim = 128, c.ffn = 1024, c.vocab = 1024;
  c.type = GgmlType::Q8_0, c.seed = 29;
  const std::string path = (td.dir / "m.gguf").string();
  synth_write(c, path);
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  const ModelConfig cfg = read_model_config(*file);
  std::mt19937 rng(61);
  std::vector<int32_t> prompt(777);  // 6 chunks of 120 and a tail of 57
  for (auto& id : prompt) id = (int32_t)(rng() % (uint32_t)cfg.n_vocab);
  OffloadPolicy p;
  p.attn = AttnMode::TopK, p.index = "multipole", p.search.k = 32, p.sinks = 5, p.window = 150, p.dense_layers = 1;

  OffloadRuntime host_rt_copy(cfg, p, false), host_rt_ring(cfg, p, false);
  const auto copy = ring_prefill(file, be, host_rt_copy, prompt, 120, false);
  const auto ring_heap = ring_prefill(file, be, host_rt_ring, prompt, 120, true);
  CHECK(ring_heap == copy);  // the same f16 values staged in the same places: bit for bit
  auto gpu_rt = make_offload_runtime(be, cfg, p, false);
  const auto ring_pinned = ring_prefill(file, be, *gpu_rt, prompt, 120, true);
  CHECK(ring_pinned == copy);

  OpSummary s_cpu("ring prefill logits, CUDA vs CPU backend", 5e-3), s_f8("ring prefill, f8 store vs f16", 5e-2);
  OffloadRuntime cpu_rt(cfg, p, false);
  const auto ring_cpu = ring_prefill(file, *cpu, cpu_rt, prompt, 120, true);
  s_cpu.check(rel_err(ring_heap, ring_cpu));

  OffloadPolicy p8 = p;
  p8.store_dtype = DType::F8E4M3;
  auto gpu_rt8 = make_offload_runtime(be, cfg, p8, false);
  const auto ring_f8 = ring_prefill(file, be, *gpu_rt8, prompt, 120, true);
  const double e_f8 = rel_err(ring_f8, copy);
  CHECK(e_f8 > 0);  // E4M3 changes what the prefill attends
  s_f8.check(e_f8);

  // q8_0 stores: the past's runs come up as blocks and cuda::convert decodes
  // them; the same bytes from the pinned (GPU runtime) and heap (host runtime)
  // stores, and the CPU backend's rings over its own q8_0 store as the twin.
  OffloadPolicy pq = p;
  pq.store_dtype = DType::Q8_0;
  auto gpu_rtq = make_offload_runtime(be, cfg, pq, false);
  OffloadRuntime host_rtq(cfg, pq, false), cpu_rtq(cfg, pq, false);
  const auto ring_q8 = ring_prefill(file, be, *gpu_rtq, prompt, 120, true);
  const auto ring_q8_heap = ring_prefill(file, be, host_rtq, prompt, 120, true);
  const auto ring_q8_cpu = ring_prefill(file, *cpu, cpu_rtq, prompt, 120, true);
  CHECK(ring_q8_heap == ring_q8);
  OpSummary s_q8cpu("ring prefill logits over q8_0, CUDA vs CPU backend", 5e-3);
  s_q8cpu.check(rel_err(ring_q8, ring_q8_cpu));
  const double e_q8 = rel_err(ring_q8, copy);
  CHECK(e_q8 > 0);
  CHECK(e_q8 < e_f8);  // 8 bits a code and a scale per 32 round less than E4M3's 3 mantissa bits
}
