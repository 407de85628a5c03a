// The CUDA offloaded decode against its CPU twins: row_list_attention +
// merge_partials against partial_add on the same rows (rows in device memory
// and read in place from pinned host memory), and whole models whose
// retrieval layers decode through GpuOffloadRuntime against the CPU
// OffloadRuntime (gpu/gpu_offload_runtime.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_kernels.h"
#include "gpu/gpu_offload_runtime.h"
#include "offload/partial_attention.h"
#include "src/model/model.h"
#include "src/model/sampler.h"
#include "src/model/synth.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/offload_test_util.h"
#include "tests/test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

// Host memory the device reads in place (pinned, mapped; same address on both).
std::shared_ptr<uint8_t> pinned_mapped(size_t bytes) {
  void* p = nullptr;
  REQUIRE(cudaHostAlloc(&p, bytes, cudaHostAllocMapped) == cudaSuccess);
  return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFreeHost(q); });
}

}  // namespace

TEST_CASE("row_list_attention + merge_partials match partial_add on the same rows", "[offload]") {
  auto& be = cuda_be();
  OpSummary sum("row-list attention (device+pinned rows)", 1e-4);
  std::mt19937 rng(17);
  // shift: the rows' block starts that many bytes past an aligned address (q8_0: rows not aligned
  // to their 17 units, read lane by lane instead of in one load per lane). page > 0: rows listed in
  // runs of `page` back to back (pages shuffled, the last one short), as a Quest page's rows are,
  // which the kernel reads by whole lines for q8_0 (Q8Run); v_scatter: V rows apart while K's run.
  struct Case {
    DType type; int hd, nkv, group, splits; std::vector<int> counts; bool host; int shift = 0;
    int page = 0; bool v_scatter = false;
  };
  const std::vector<Case> cases = {
      {DType::F16, 256, 1, 4, 3, {777}, true},       {DType::F16, 256, 1, 4, 17, {1}, false},
      {DType::F32, 128, 8, 4, 5, {0, 1, 33, 64, 100, 5, 2, 129}, true},
      {DType::BF16, 128, 2, 8, 1, {300, 41}, false}, {DType::F16, 64, 2, 12, 7, {1000, 3}, true},
      {DType::F32, 64, 3, 1, 2, {31, 0, 9}, false},  {DType::F16, 128, 1, 1, 64, {4097}, true},
      // 8-bit store rows (--store-type f8, q8_0): q8_0 blocks are 34 bytes, so rows sit at 2-byte alignment
      {DType::F8E4M3, 128, 2, 6, 3, {250, 7}, true}, {DType::Q8_0, 64, 2, 7, 4, {301, 1}, true},
      {DType::Q8_0, 128, 1, 6, 2, {513}, false},     {DType::Q8_0, 256, 3, 2, 5, {0, 99, 40}, true},
      {DType::Q8_0, 128, 2, 4, 3, {200, 77}, true, 2}, {DType::Q8_0, 256, 1, 8, 2, {150}, false, 8},
      {DType::Q8_0, 64, 1, 2, 1, {33}, true, 2},
      // runs: pages of 16 (whole warp rounds), 3 and 5 (runs cut by a warp's 4 rows), shifted
      {DType::Q8_0, 128, 2, 4, 3, {515, 97}, true, 0, 16},       {DType::Q8_0, 128, 3, 4, 2, {67, 1, 130}, true, 8, 3},
      {DType::Q8_0, 64, 2, 5, 4, {301, 64}, true, 2, 5},         {DType::Q8_0, 256, 2, 8, 3, {160, 33}, false, 0, 16},
      {DType::Q8_0, 256, 1, 3, 1, {45}, true, 6, 7},
      {DType::Q8_0, 128, 2, 4, 2, {129, 40}, true, 0, 16, true},  // V rows apart while K's run
      {DType::F8E4M3, 128, 2, 4, 2, {200, 9}, true, 0, 16},      {DType::F16, 64, 1, 4, 1, {77}, false, 0, 4},
  };
  for (const Case& c : cases) {
    CAPTURE(dtype_name(c.type), c.hd, c.nkv, c.group, c.splits, c.host, c.shift, c.page, c.v_scatter);
    const int max_rows = *std::max_element(c.counts.begin(), c.counts.end()) + 2, nh = c.nkv * c.group;
    const size_t row_bytes = dtype_bytes(c.type, (size_t)c.hd);
    const int64_t total = std::accumulate(c.counts.begin(), c.counts.end(), 0);
    // Rows of every head in one block (K then V), listed in shuffled order.
    std::vector<float> kf = randn((size_t)total * c.hd, rng), vf = randn((size_t)total * c.hd, rng);
    std::vector<uint8_t> raw(2 * (size_t)total * row_bytes);
    from_f32(c.type, kf.data(), raw.data(), kf.size());
    from_f32(c.type, vf.data(), raw.data() + (size_t)total * row_bytes, vf.size());
    to_f32(c.type, raw.data(), kf.data(), kf.size());  // the reference sees the rounded rows
    to_f32(c.type, raw.data() + (size_t)total * row_bytes, vf.data(), vf.size());
    std::shared_ptr<uint8_t> host_rows;
    Buffer dev_rows;
    uint8_t* base;
    if (c.host) {
      host_rows = pinned_mapped(std::max<size_t>(raw.size() + c.shift, 1));
      std::copy(raw.begin(), raw.end(), host_rows.get() + c.shift);
      base = host_rows.get() + c.shift;
    } else {
      dev_rows = be.alloc(std::max<size_t>(raw.size() + c.shift, 1));
      be.from_host(raw.data(), dev_rows, (size_t)c.shift, raw.size());
      base = dev_rows.as<uint8_t>() + c.shift;
    }
    std::vector<const void*> kp((size_t)c.nkv * max_rows, nullptr), vp(kp.size(), nullptr);
    std::vector<std::vector<int64_t>> order((size_t)c.nkv);
    std::vector<int64_t> vrow((size_t)total);  // the V row listed beside K row r
    std::iota(vrow.begin(), vrow.end(), int64_t{0});
    if (c.v_scatter) std::shuffle(vrow.begin(), vrow.end(), rng);
    int64_t first = 0;
    for (int h = 0; h < c.nkv; ++h) {
      const int n = c.counts[(size_t)h];
      std::vector<int64_t>& ord = order[(size_t)h];
      if (c.page > 0) {  // pages in shuffled order, each page's rows in order
        std::vector<int64_t> pages((size_t)(n + c.page - 1) / c.page);
        std::iota(pages.begin(), pages.end(), int64_t{0});
        std::shuffle(pages.begin(), pages.end(), rng);
        for (int64_t pg : pages)
          for (int64_t r = pg * c.page; r < std::min<int64_t>(n, (pg + 1) * c.page); ++r) ord.push_back(first + r);
      } else {
        ord.resize((size_t)n);
        std::iota(ord.begin(), ord.end(), first);
        std::shuffle(ord.begin(), ord.end(), rng);
      }
      for (int j = 0; j < n; ++j) {
        const int64_t r = ord[(size_t)j];
        kp[(size_t)h * max_rows + j] = base + (size_t)r * row_bytes;
        vp[(size_t)h * max_rows + j] = base + ((size_t)total + vrow[(size_t)r]) * row_bytes;
      }
      first += n;
    }
    Buffer dk = be.alloc(kp.size() * sizeof(void*)), dv = be.alloc(vp.size() * sizeof(void*));
    be.from_host(kp.data(), dk, 0, kp.size() * sizeof(void*));
    be.from_host(vp.data(), dv, 0, vp.size() * sizeof(void*));
    std::vector<int32_t> counts(c.counts.begin(), c.counts.end());
    Buffer dc = be.alloc(counts.size() * 4);
    be.from_host(counts.data(), dc, 0, counts.size() * 4);
    const std::vector<float> q = randn((size_t)nh * c.hd, rng, 0.5f);
    Buffer dq = upload(be, q);
    // Partials: slot 0 and the last are empty parts the merge must ignore.
    const int parts = c.splits + 2;
    std::vector<float> m0((size_t)nh * parts, -INFINITY), l0((size_t)nh * parts, 0.f),
        o0((size_t)nh * parts * c.hd, 0.f);
    Buffer pm = upload(be, m0), pl = upload(be, l0), po = upload(be, o0), out = poisoned(be, (size_t)nh * c.hd);
    cuda::RowListArgs a;
    a.q = dq.f32(), a.row_type = c.type, a.k_rows = dk.as<const void*>(), a.v_rows = dv.as<const void*>();
    a.counts = dc.as<int32_t>(), a.n_kv = c.nkv, a.group = c.group, a.head_dim = c.hd, a.max_rows = max_rows;
    a.scale = 0.125f, a.n_splits = c.splits, a.part0 = 1, a.parts = parts;
    a.part_m = pm.f32(), a.part_l = pl.f32(), a.part_o = po.f32();
    cuda::row_list_attention(a, be.stream());
    cuda::merge_partials(pm.f32(), pl.f32(), po.f32(), nh, parts, c.hd, out.f32(), be.stream());
    const std::vector<float> got = download(be, out, (size_t)nh * c.hd);
    std::vector<float> ref((size_t)nh * c.hd);
    for (int h = 0; h < c.nkv; ++h)
      for (int g = 0; g < c.group; ++g) {
        const float* qr = q.data() + ((size_t)h * c.group + g) * c.hd;
        const auto& rows = order[(size_t)h];
        std::vector<float> s(rows.size()), vv(rows.size() * c.hd);
        for (size_t j = 0; j < rows.size(); ++j) {
          double acc = 0;
          for (int i = 0; i < c.hd; ++i) acc += (double)qr[i] * kf[(size_t)rows[j] * c.hd + i];
          s[j] = (float)acc * a.scale;
          std::copy_n(vf.data() + (size_t)vrow[(size_t)rows[j]] * c.hd, c.hd, vv.data() + j * c.hd);
        }
        AttnPartial p(c.hd);
        partial_add(p, s.data(), nullptr, vv.data(), (int64_t)rows.size());
        partial_finish(p, ref.data() + ((size_t)h * c.group + g) * c.hd);
      }
    sum.check(rel_err(got, ref));
  }
}

TEST_CASE("GpuOffloadRuntime serves the CPU OffloadRuntime's attention, step by step", "[offload]") {
  auto& be = cuda_be();
  OpSummary sum("offloaded attention vs CPU runtime", 2e-5);
  struct Case { std::string index; bool stage; int hd, heads, kv, n, window, sinks, k; DType store = DType::F16;
                std::string at = ""; };
  const std::vector<Case> cases = {
      {"flat", false, 64, 8, 2, 300, 8, 2, 12},          {"multipole", true, 128, 4, 1, 2000, 16, 4, 64},
      {"multipole:levels=2", false, 256, 4, 1, 5000, 32, 4, 128}, {"quest:page=4", false, 128, 8, 8, 700, 8, 0, 40},
      {"flat", true, 256, 4, 1, 3, 8, 4, 5},               {"centroid", false, 128, 32, 8, 1500, 64, 4, 100},
      // 8-bit store rows read by the row-list kernel, in place and staged
      {"multipole", false, 128, 8, 2, 1500, 16, 4, 64, DType::F8E4M3},
      {"flat", true, 64, 4, 1, 400, 8, 2, 20, DType::F8E4M3},
      {"quest:page=4", false, 256, 8, 1, 900, 8, 4, 40, DType::F8E4M3},
      {"multipole", false, 64, 14, 2, 1500, 16, 4, 64, DType::Q8_0},
      {"flat", true, 128, 12, 2, 400, 8, 2, 20, DType::Q8_0},
      {"quest:page=4", false, 256, 8, 1, 900, 8, 4, 40, DType::Q8_0},
      // a store type per layer (--store-type-at): each layer's rows read at its own type
      {"quest:page=4", false, 128, 8, 2, 700, 8, 2, 40, DType::Q8_0, "0=f16"},
      {"flat", true, 128, 12, 2, 400, 8, 2, 20, DType::Q8_0, "1=bf16"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.index, c.stage, c.hd, c.heads, c.kv, c.n, dtype_name(c.store), c.at);
    const ModelConfig cfg = runtime_test_config(2, c.heads, c.kv, c.hd);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = c.index, pol.search.k = c.k, pol.sinks = c.sinks, pol.window = c.window;
    pol.search.rerank = 1;  // the plain lookup (rerank: test_gpu_search)
    pol.stage_rows = c.stage, pol.store_dtype = c.store;
    set_store_type_at(pol, c.at);
    pol.search_on = SearchOn::Host;  // the host's search; tests/gpu/test_gpu_search.cpp checks the device's
    pol.build_on = BuildOn::Host;    // Faiss's k-means, as the reference's (the engine: test_gpu_search)
    OffloadRuntime ref(cfg, pol, false);
    auto got = make_gpu_offload_runtime(be, cfg, pol, false);
    REQUIRE(got->on_device());
    // The window wraps and evicts into the store.
    compare_offload_steps(ref, *got, cfg, c.n, 3 * c.window + 5, /*f16_exact=*/false, sum);
    CHECK(got->stats().retrieved == ref.stats().retrieved);
  }
}

namespace {

// Greedy decode of `steps` tokens after `prompt`; returns every step's logits.
std::vector<std::vector<float>> decode_run(const std::shared_ptr<const GgufFile>& file, Backend& be,
                                           const OffloadPolicy& pol, const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& forced, bool gpu_runtime,
                                           size_t* kv_device_bytes = nullptr) {
  ModelOptions opt;
  opt.n_ctx = 256, opt.max_chunk = 32;
  // fp16 weights on the device: this test is about the runtime, not the q8_1
  // rounding of the quantised GEMV (~2e-2 on these models' logits).
  if (is_cuda_backend(be)) opt.weights = WeightMode::F16;
  Model m(file, be, opt);
  auto rt = gpu_runtime ? make_gpu_offload_runtime(be, m.config(), pol, false)
                        : std::make_unique<OffloadRuntime>(m.config(), pol, false);
  std::vector<std::vector<float>> out{m.prefill(prompt, 32)};
  rt->take_prefill(m);
  for (int il : rt->retrieval_layers()) m.release_kv(il);
  m.set_attention_override(rt.get());
  for (int32_t t : forced) out.push_back(m.decode(t));
  if (kv_device_bytes) *kv_device_bytes = cuda_memory_use(be).kv_cache;
  REQUIRE(rt->stats().steps == (int64_t)forced.size());
  return out;
}

}  // namespace

TEST_CASE("GpuOffloadRuntime decodes like the CPU OffloadRuntime (synthetic llama and gemma3)", "[offload]") {
  TempDir td;
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  OpSummary sum("offloaded model decode logits vs CPU", 3e-2);
  struct Case { std::string arch, index; bool stage; int hd, heads, kv; };
  const std::vector<Case> cases = {{"llama", "flat", false, 64, 8, 2},      {"llama", "multipole", true, 128, 4, 1},
                                   {"gemma3", "flat", true, 256, 4, 1},     {"gemma3", "multipole", false, 256, 4, 1},
                                   {"llama", "quest:page=4", false, 128, 8, 8}};
  for (const Case& c : cases) {
    CAPTURE(c.arch, c.index, c.stage, c.hd);
    SynthConfig sc = synth_defaults(c.arch);
    sc.layers = c.arch == "gemma3" ? 6 : 3, sc.width = 256, sc.heads = c.heads, sc.kv_heads = c.kv;
    sc.head_dim = c.hd, sc.ffn = 512, sc.vocab = 512, sc.type = GgmlType::Q8_0, sc.seed = 11;
    if (c.arch == "gemma3") sc.sliding_window = 16, sc.global_every = 3;
    const std::string path = (td.dir / "m.gguf").string();
    synth_write(sc, path);
    auto file = std::shared_ptr<const GgufFile>(GgufFile::open(path));
    OffloadPolicy pol;
    // k covers the whole store: every backend then returns every row, so the
    // two models' ~1e-3 differences cannot flip a selection (the runtime test
    // above checks selections with identical inputs); this one checks the
    // model <-> runtime path: device pointers, released caches, mirrors.
    pol.attn = AttnMode::TopK, pol.index = c.index, pol.search.k = 1000, pol.sinks = 2, pol.window = 8;
    pol.search.rerank = 1;  // the plain lookup (rerank: test_gpu_search)
    pol.stage_rows = c.stage;
    pol.device_fold = 8;  // the device ring holds window + fold rows: keep it below the full cache
    pol.store_cache = 0;  // no copies of the store on the device (checked below)
    std::mt19937 rng(5);
    std::vector<int32_t> prompt(150), forced(12);
    for (auto& t : prompt) t = (int32_t)(rng() % 512);
    for (auto& t : forced) t = (int32_t)(rng() % 512);
    size_t kv_dev = 0;
    const auto ref = decode_run(file, *cpu, pol, prompt, forced, false);
    const auto got = decode_run(file, be, pol, prompt, forced, true, &kv_dev);
    for (size_t s = 0; s < ref.size(); ++s) sum.check(rel_err(got[s], ref[s]));
    // The retrieval layers' caches were released: what stays on the device is
    // sinks + window mirrors (+ gemma's rings), far below the 256-position caches.
    const size_t full_cache = 2 * (size_t)256 * sc.kv_heads * sc.head_dim * 4 * sc.layers;
    CHECK(kv_dev < full_cache / 2);
  }
}

// Ring mode of the same kernel (the runtime's sinks and window ring on the
// device): head h attends rows ring_first[h] .. + ring_count[h] of its ring,
// slots taken modulo the ring's capacity; with a prefix (the sinks) its
// first `pre` rows come before them. Twin: partial_add over those rows.
TEST_CASE("row_list_attention in ring mode matches partial_add over the ring's rows, wrapping", "[offload]") {
  auto& be = cuda_be();
  OpSummary sum("row-list attention, ring mode", 1e-4);
  std::mt19937 rng(19);
  struct Case { DType type; int hd, group, cap, splits; std::vector<int> first, count; int pre = 0, pre_cap = 1; };
  const std::vector<Case> cases = {
      {DType::F32, 256, 4, 50, 3, {45}, {20}},                        // wraps past the end
      {DType::F32, 128, 4, 1, 1, {0, 0}, {1, 0}},                      // a one-row ring; an empty head
      {DType::F16, 64, 8, 300, 8, {0, 299, 17}, {300, 300, 5}},       // full rings, one starting at the last slot
      {DType::BF16, 128, 1, 64, 2, {10, 63, 0, 32}, {54, 2, 64, 33}},  // no GQA
      // sinks as a prefix: splits that cross from prefix to ring, an empty ring, one split
      {DType::F32, 128, 4, 50, 4, {45, 0}, {20, 0}, 4, 4},
      {DType::F32, 64, 7, 300, 1, {299}, {300}, 1, 3},
      {DType::F32, 256, 2, 33, 9, {5, 30, 0}, {33, 7, 1}, 3, 5},
      {DType::Q8_0, 128, 4, 50, 3, {45, 7}, {20, 50}},                // blocked rows: ring slots by bytes
  };
  for (const Case& c : cases) {
    const int nkv = (int)c.first.size(), nh = nkv * c.group;
    CAPTURE(dtype_name(c.type), c.hd, c.group, c.cap, nkv);
    std::vector<float> kf = randn((size_t)nkv * c.cap * c.hd, rng), vf = randn(kf.size(), rng);
    round_through(c.type, kf), round_through(c.type, vf);  // the reference sees the ring's values
    std::vector<uint8_t> raw(dtype_bytes(c.type, kf.size()));
    Buffer dk = be.alloc(raw.size()), dv = be.alloc(raw.size());
    from_f32(c.type, kf.data(), raw.data(), kf.size());
    be.from_host(raw.data(), dk, 0, raw.size());
    from_f32(c.type, vf.data(), raw.data(), vf.size());
    be.from_host(raw.data(), dv, 0, raw.size());
    const std::vector<float> q = randn((size_t)nh * c.hd, rng, 0.5f);
    Buffer dq = upload(be, q);
    const std::vector<float> pk = randn((size_t)nkv * c.pre_cap * c.hd, rng), pv = randn(pk.size(), rng);
    Buffer dpk = upload(be, pk), dpv = upload(be, pv);
    const int parts = c.splits + 1;  // slot 0 stays empty
    std::vector<float> m0((size_t)nh * parts, -INFINITY), l0((size_t)nh * parts, 0.f),
        o0((size_t)nh * parts * c.hd, 0.f);
    Buffer pm = upload(be, m0), pl = upload(be, l0), po = upload(be, o0), out = poisoned(be, (size_t)nh * c.hd);
    cuda::RowListArgs a;
    a.q = dq.f32(), a.row_type = c.type, a.n_kv = nkv, a.group = c.group, a.head_dim = c.hd, a.scale = 0.125f;
    a.k_ring = dk.mem.get(), a.v_ring = dv.mem.get(), a.ring_cap = c.cap;
    for (int h = 0; h < nkv; ++h) a.ring_first[h] = c.first[(size_t)h], a.ring_count[h] = c.count[(size_t)h];
    if (c.pre > 0) a.k_prefix = dpk.mem.get(), a.v_prefix = dpv.mem.get(), a.prefix_cap = c.pre_cap, a.prefix_count = c.pre;
    a.n_splits = c.splits, a.part0 = 1, a.parts = parts;
    a.part_m = pm.f32(), a.part_l = pl.f32(), a.part_o = po.f32();
    cuda::row_list_attention(a, be.stream());
    cuda::merge_partials(pm.f32(), pl.f32(), po.f32(), nh, parts, c.hd, out.f32(), be.stream());
    std::vector<float> ref((size_t)nh * c.hd);
    for (int h = 0; h < nkv; ++h)
      for (int g = 0; g < c.group; ++g) {
        const float* qr = q.data() + ((size_t)h * c.group + g) * c.hd;
        const int n = c.pre + c.count[(size_t)h];
        std::vector<float> s((size_t)n), vv((size_t)n * c.hd);
        for (int j = 0; j < n; ++j) {
          const bool in_pre = j < c.pre;
          const size_t row = in_pre ? (size_t)h * c.pre_cap + (size_t)j
                                    : (size_t)h * c.cap + (size_t)((c.first[(size_t)h] + j - c.pre) % c.cap);
          const float* kr = (in_pre ? pk.data() : kf.data()) + row * c.hd;
          double acc = 0;
          for (int i = 0; i < c.hd; ++i) acc += (double)qr[i] * kr[i];
          s[(size_t)j] = (float)acc * a.scale;
          std::copy_n((in_pre ? pv.data() : vf.data()) + row * c.hd, c.hd, vv.data() + (size_t)j * c.hd);
        }
        AttnPartial p(c.hd);
        partial_add(p, s.data(), nullptr, vv.data(), n);
        partial_finish(p, ref.data() + ((size_t)h * c.group + g) * c.hd);
      }
    sum.check(rel_err(download(be, out, ref.size()), ref));
  }
}

// --measure-error on the GPU runtime with the search on the host (its
// pending-token state exists only with the device search): with k covering
// every row the served attention is exact, so the measured error is ~0.
TEST_CASE("GpuOffloadRuntime measures its attention error with either search", "[offload]") {
  auto& be = cuda_be();
  for (SearchOn where : {SearchOn::Host, SearchOn::Gpu}) {
    CAPTURE((int)where);
    const ModelConfig cfg = runtime_test_config(2, 8, 2, 64);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = "quest:page=4", pol.search.k = 1 << 20, pol.sinks = 2, pol.window = 8;
    pol.search.rerank = 1;  // the plain lookup (rerank: test_gpu_search)
    pol.search_on = where, pol.device_table_type = DType::F32;
    OffloadPolicy exact = pol;
    exact.index = "flat", exact.search_on = SearchOn::Host;
    OffloadRuntime ref(cfg, exact, false);
    auto got = make_gpu_offload_runtime(be, cfg, pol, false);
    got->set_measure_error(true);
    OpSummary sum(where == SearchOn::Host ? "measured runtime, host search" : "measured runtime, device search",
                  1e-4);
    compare_offload_steps(ref, *got, cfg, 300, 12, /*f16_exact=*/true, sum);
    const std::vector<double> err = got->attention_rel_error();
    REQUIRE(err.size() == 2);
    for (double e : err) CHECK(e < 1e-4);
  }
}
