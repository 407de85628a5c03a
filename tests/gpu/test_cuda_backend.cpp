// Every op of the CUDA backend against the CPU backend on the same random
// inputs (never zeros), over awkward sizes, with outputs poisoned with NaN
// before each run; then the bad-input paths and the memory budget. Each test
// case prints one SUMMARY line: the op, the cases run, the worst
// ||gpu - cpu|| / ||cpu|| and its tolerance (fp32 ops ~1e-5; ops through
// 16-bit weights ~1e-2).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "gpu/cuda_backend.h"
#include "src/common/error.h"
#include "src/model/backend.h"
#include "tests/gpu/cuda_test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

// A host weight of random values in type t (quantised as a GGUF file holds it).
struct HostWeight {
  std::vector<uint8_t> bytes;
  Weight w;
};
HostWeight make_weight(GgmlType t, int64_t rows, int64_t cols, std::mt19937& rng, float sd = 0.5f) {
  HostWeight hw;
  const auto src = randn((size_t)(rows * cols), rng, sd);
  const size_t rb = ggml_row_bytes(t, cols);
  hw.bytes.resize(rb * rows);
  for (int64_t r = 0; r < rows; ++r) quantize_row(t, src.data() + r * cols, hw.bytes.data() + r * rb, cols);
  hw.w.name = fmt::format("test_{}_{}x{}", ggml_type_name((uint32_t)t), rows, cols);
  hw.w.type = t, hw.w.rows = rows, hw.w.cols = cols, hw.w.data = hw.bytes.data(), hw.w.row_bytes = rb;
  return hw;
}

Weight f32_host_weight(const std::vector<float>& v, int64_t rows = 1) {
  Weight w;
  w.name = "norm";
  w.type = GgmlType::F32, w.rows = rows, w.cols = (int64_t)v.size() / rows;
  w.data = reinterpret_cast<const uint8_t*>(v.data()), w.row_bytes = (size_t)w.cols * sizeof(float);
  return w;
}

}  // namespace

TEST_CASE("device: what the tests run on") {
  auto& be = gpu();
  std::printf("SUMMARY-DEVICE backend %s, memory %s\n", be.name().c_str(), cuda_memory_use(be).describe().c_str());
  REQUIRE(is_cuda_backend(be));
}

// --weights f16: every matrix as 16-bit rows (the quantised path, --weights
// quant, is tests/gpu/test_cuda_quant.cpp's).
TEST_CASE("matmul: GEMV (T<=4) and cuBLAS (T>4) paths against the CPU, every weight type") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(11);
  OpSummary gemv("matmul GEMV T<=4 (16-bit W)", 1e-2), gemm("matmul cuBLAS T>4 (16-bit W)", 1e-2);
  // 1-row weights stay fp32 on the device; the CPU's fused quantised dot
  // (K-quants: min * sum(x) subtracted per block) rounds at ~1e-5 of the terms.
  OpSummary exact("matmul 1-row F32 W", 1e-4);
  const GgmlType types[] = {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_0,
                            GgmlType::Q5_1, GgmlType::Q4_K, GgmlType::Q6_K};
  for (GgmlType t : types)
    for (int64_t rows : {1, 63, 130, 1000})
      for (int T : {1, 2, 3, 4, 5, 7, 64, 300}) {
        const bool kq = ggml_type_info(t).block_elems > 32;
        const int64_t cols = kq ? 512 : rows == 63 && ggml_type_info(t).block_elems == 1 ? 37 : 96;
        if (rows == 1000 && T == 300) continue;  // the CPU reference would dominate the runtime
        CAPTURE(ggml_type_name((uint32_t)t), rows, cols, T);
        HostWeight hw = make_weight(t, rows, cols, rng);
        const auto x = randn((size_t)T * cols, rng);
        std::vector<float> ref((size_t)T * rows);
        cpu->matmul(x.data(), hw.w, T, ref.data());
        const Weight dw = be.prepare_weight(hw.w, WeightMode::F16);
        REQUIRE(dw.type == (rows == 1 ? GgmlType::F32 : t == GgmlType::BF16 ? GgmlType::BF16 : GgmlType::F16));
        Buffer dx = upload(be, x), dy = poisoned(be, ref.size());
        be.matmul(dx.f32(), dw, T, dy.f32());
        const double err = rel_err(download(be, dy, ref.size()), ref);
        (rows == 1 ? exact : T <= 4 ? gemv : gemm).check(err);
      }
}

TEST_CASE("matmul: unaligned activations, fp16 overflow of weights and of activations") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(12);
  OpSummary s("matmul edge cases", 1e-2);
  // x one float past an aligned address: the GEMV takes its scalar path.
  for (int T : {1, 3}) {
    HostWeight hw = make_weight(GgmlType::F16, 77, 256, rng);
    const auto x = randn((size_t)T * 256 + 1, rng);
    std::vector<float> ref((size_t)T * 77);
    cpu->matmul(x.data() + 1, hw.w, T, ref.data());
    const Weight dw = be.prepare_weight(hw.w, WeightMode::Quant);
    Buffer dx = upload(be, x), dy = poisoned(be, ref.size());
    be.matmul(dx.f32() + 1, dw, T, dy.f32());
    s.check(rel_err(download(be, dy, ref.size()), ref));
  }
  // A weight value beyond fp16 (65504): uploaded as bf16 instead of inf.
  {
    auto v = randn(40 * 64, rng);
    v[123] = 1.0e6f;
    const Weight hw = f32_host_weight(v, 40);
    const Weight dw = be.prepare_weight(hw, WeightMode::Quant);
    REQUIRE(dw.type == GgmlType::BF16);
    for (int T : {1, 9}) {
      const auto x = randn((size_t)T * 64, rng);
      std::vector<float> ref((size_t)T * 40);
      cpu->matmul(x.data(), hw, T, ref.data());
      Buffer dx = upload(be, x), dy = poisoned(be, ref.size());
      be.matmul(dx.f32(), dw, T, dy.f32());
      s.check(rel_err(download(be, dy, ref.size()), ref));
    }
  }
  // Activations beyond fp16 (Gemma's residual stream grows large): the
  // cuBLAS path scales them by a power of two and undoes it exactly.
  {
    HostWeight hw = make_weight(GgmlType::Q8_0, 50, 128, rng);
    const int T = 17;
    auto x = randn((size_t)T * 128, rng, 2000.f);
    x[5] = 3.0e6f, x[700] = -1.5e5f;
    std::vector<float> ref((size_t)T * 50);
    cpu->matmul(x.data(), hw.w, T, ref.data());
    const Weight dw = be.prepare_weight(hw.w, WeightMode::Quant);
    Buffer dx = upload(be, x), dy = poisoned(be, ref.size());
    be.matmul(dx.f32(), dw, T, dy.f32());
    s.check(rel_err(download(be, dy, ref.size()), ref));
  }
}

TEST_CASE("embed: rows of the uploaded table, scaled") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(5);
  OpSummary s("embed", 1e-2);
  for (GgmlType t : {GgmlType::F32, GgmlType::BF16, GgmlType::Q8_0, GgmlType::Q4_K})
    for (float scale : {1.f, 25.3f}) {
      const int64_t vocab = 37, d = 256;
      HostWeight hw = make_weight(t, vocab, d, rng);
      const std::vector<int32_t> ids{0, 36, 5, 5, 17, 2, 36};
      const int T = (int)ids.size();
      std::vector<float> ref((size_t)T * d);
      cpu->embed(hw.w, ids.data(), T, scale, ref.data());
      const Weight dw = be.prepare_weight(hw.w, WeightMode::Quant);
      Buffer dy = poisoned(be, ref.size());
      be.embed(dw, ids.data(), T, scale, dy.f32());
      s.check(rel_err(download(be, dy, ref.size()), ref));
      const int32_t bad[] = {3, 37}, neg[] = {-1};
      REQUIRE_THROWS_AS(be.embed(dw, bad, 2, 1.f, dy.f32()), Error);
      REQUIRE_THROWS_AS(be.embed(dw, neg, 1, 1.f, dy.f32()), Error);
    }
}

TEST_CASE("rms_norm: rows of the model width and per-head QK-norm, in place") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(7);
  OpSummary s("rms_norm", 1e-5);
  for (int dim : {1, 64, 100, 256, 640, 1025, 4096})
    for (int64_t rows : {1, 3, 64, 300}) {
      CAPTURE(dim, rows);
      const auto x = randn((size_t)rows * dim, rng, 3.f, 0.5f);
      const auto w = randn(dim, rng, 1.f, 1.f);
      std::vector<float> ref(x.size());
      cpu->rms_norm(x.data(), f32_host_weight(w), rows, dim, 1e-6f, ref.data());
      const Weight dw = be.prepare_weight(f32_host_weight(w), WeightMode::Quant);
      REQUIRE(dw.type == GgmlType::F32);
      Buffer dx = upload(be, x);
      be.rms_norm(dx.f32(), dw, rows, dim, 1e-6f, dx.f32());
      s.check(rel_err(download(be, dx, x.size()), ref));
    }
  const std::vector<float> w32(32, 1.f);
  const Weight dw = be.prepare_weight(f32_host_weight(w32), WeightMode::Quant);
  Buffer dx = poisoned(be, 64);
  REQUIRE_THROWS_AS(be.rms_norm(dx.f32(), dw, 1, 64, 1e-6f, dx.f32()), Error);          // 32 gains for 64 values
  REQUIRE_THROWS_AS(be.rms_norm(dx.f32(), f32_host_weight(w32), 1, 32, 1e-6f, dx.f32()), Error);  // host weight
}

TEST_CASE("rope: interleaved and NeoX, partial rotation, factors, far positions") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(9);
  OpSummary s("rope", 1e-5);
  std::vector<float> factors(128);
  for (auto& f : factors) f = 1.f + (float)(rng() % 8);
  for (RopeStyle style : {RopeStyle::Interleaved, RopeStyle::NeoX})
    for (int hd : {64, 128, 256})
      for (int n_rot : {hd, hd / 2})
        for (int64_t pos0 : {0, 1, 4097, 1000003})
          for (int T : {1, 7, 64}) {
            RopeParams p;
            p.style = style, p.n_rot = n_rot, p.base = hd == 256 ? 1e6f : 10000.f;
            p.freq_scale = n_rot == hd ? 1.f : 0.125f;
            p.freq_factors = hd == 128 ? factors.data() : nullptr;
            const int heads = 3;
            CAPTURE(hd, n_rot, pos0, T, (int)style);
            const auto x = randn((size_t)T * heads * hd, rng);
            std::vector<float> ref(x);
            cpu->rope(ref.data(), T, heads, hd, pos0, p);
            Buffer dx = upload(be, x);
            be.rope(dx.f32(), T, heads, hd, pos0, p);
            s.check(rel_err(download(be, dx, x.size()), ref));
          }
  RopeParams odd;
  odd.n_rot = 63;
  Buffer dx = poisoned(be, 64);
  REQUIRE_THROWS_AS(be.rope(dx.f32(), 1, 1, 64, 0, odd), Error);
  odd.n_rot = 128;
  REQUIRE_THROWS_AS(be.rope(dx.f32(), 1, 1, 64, 0, odd), Error);  // more dims than the head
}

TEST_CASE("glu and add") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(13);
  OpSummary sg("glu (SiLU, GeluTanh)", 1e-5), sa("add", 1e-7);
  for (GluKind k : {GluKind::SiLU, GluKind::GeluTanh})
    for (int64_t n : {1, 7, 2048, 100003}) {
      const auto g = randn(n, rng, 3.f), u = randn(n, rng);
      std::vector<float> ref(n);
      cpu->glu(k, g.data(), u.data(), n, ref.data());
      Buffer dg = upload(be, g), du = upload(be, u);
      be.glu(k, dg.f32(), du.f32(), n, dg.f32());  // out aliases gate
      sg.check(rel_err(download(be, dg, n), ref));
    }
  for (int64_t n : {1, 1001, 100003}) {
    const auto a = randn(n, rng), b = randn(n, rng);
    std::vector<float> ref(b);
    cpu->add(a.data(), n, ref.data());
    Buffer da = upload(be, a), db = upload(be, b);
    be.add(da.f32(), n, db.f32());
    sa.check(rel_err(download(be, db, n), ref));
  }
}

// Chunks written into both caches (rings when capacity < positions) and
// attended; a negative chunk is written without attending (to reach long
// contexts cheaply, where decode takes the split-KV path). The caches must
// match bit for bit, the outputs to fp32 rounding. Every T = 1 step runs
// both decode kernels (v2 and v3) on the same query.
TEST_CASE("kv_write and attention: chunks, ring wrap, windows, GQA, head dims, cache types, split-KV decode") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  const cuda::DecodeKernel kernel_before = cuda_be().decode_kernel();
  std::mt19937 rng(17);
  // T >= 16 runs on the tensor cores with fp16 tiles (only f32/f16 caches
  // here): ~1e-3 (tests/gpu/test_cuda_attention_tc.cpp sweeps that path).
  OpSummary s_attn("attention (fp32 kernel, 1 < T < 16)", 2e-5), s_attn_tc("attention (tensor cores, T >= 16)", 3e-3),
      s_dec2("attention decode v2 (T = 1)", 2e-5), s_dec3("attention decode v3 (T = 1)", 2e-5),
      s_kv("kv_write (cache rows differing)", 0);
  struct Case {
    int hd, n_kv, group;
    int64_t window, capacity;
    std::vector<int> chunks;
    DType dt;
  };
  const std::vector<Case> cases = {
      {64, 1, 1, 0, 512, {1, 7, 64, 300, 1, 1, 13}, DType::F32},                 // T = 1, 7, 64, 300
      {128, 2, 4, 0, 4200, {-4000, 1, 1, 7, 1}, DType::F16},                     // decode over 4000 keys, GQA 4
      {256, 1, 8, 0, 3000, {-2500, 1, 3, 1}, DType::BF16},                       // GQA 8, head_dim 256
      {256, 1, 4, 512, 512 + 64 - 1, {64, 64, 64, 64, 64, 64, 64, 64, 64, 1, 1, 64, 1}, DType::F32},  // gemma local
      {256, 1, 4, 512, 512, {-700, 1, 1, -333, 1}, DType::F16},                  // gemma local: a 512-slot ring
      {256, 1, 4, 0, 9000, {-8191, 1, 1, 1}, DType::F16},                        // gemma global, 8192+ keys
      {128, 2, 6, 0, 5000, {-4095, 1, 1, 3, 1}, DType::F16},                     // qwen2.5 1.5B: 12/2 x 128
      {64, 2, 7, 0, 3000, {-2047, 1, 1, -100, 1}, DType::BF16},                  // qwen2.5 0.5B: 14/2 x 64
      {64, 4, 8, 16, 16 + 9 - 1, {9, 9, 1, 9, 2, 9}, DType::F16},                // ring wraps many times
      {128, 1, 1, 1, 1 + 3 - 1, {3, 1, 3, 2}, DType::F32},                       // window of one: itself
      {128, 2, 4, 0, 700, {300, 300, 1, 1}, DType::F32},                         // prefill T = 300
      {64, 1, 1, 1000, 1000 + 5 - 1, {-3000, 1, 1, 5}, DType::F16},              // window + split-KV; write > capacity
      {128, 8, 1, 0, 2100, {-2048, 1, 2, 4}, DType::BF16},                       // GQA 1, 8 KV heads
      {32, 2, 2, 0, 100, {5, 1, 40, 1}, DType::F16},                             // head_dim 32
      {96, 1, 3, 8, 8 + 7 - 1, {7, 7, 1, 3, 7}, DType::BF16},                     // head_dim 96, GQA 3
  };
  for (const Case& c : cases) {
    const int n_head = c.n_kv * c.group;
    CAPTURE(c.hd, c.n_kv, c.group, c.window, c.capacity, dtype_name(c.dt));
    KvLayerCache hc = cpu->alloc_kv(c.n_kv, c.hd, c.capacity, c.dt);
    KvLayerCache dc = be.alloc_kv(c.n_kv, c.hd, c.capacity, c.dt);
    const float scale = 1.f / std::sqrt((float)c.hd);
    int64_t pos = 0;
    std::vector<uint8_t> written((size_t)c.capacity, 0);
    for (int chunk : c.chunks) {
      const int T = std::abs(chunk);
      CAPTURE(pos, T);
      const auto k = randn((size_t)T * c.n_kv * c.hd, rng, 1.f, 0.2f), v = randn(k.size(), rng);
      cpu->kv_write(hc, k.data(), v.data(), T, pos);
      Buffer dk = upload(be, k), dv = upload(be, v);
      be.kv_write(dc, dk.f32(), dv.f32(), T, pos);
      for (int64_t p = std::max<int64_t>(0, pos + T - c.capacity); p < pos + T; ++p) written[p % c.capacity] = 1;
      const size_t row = (size_t)c.hd * dtype_size(c.dt);
      for (const auto* pair : {&hc.k, &hc.v}) {  // the written slots, byte for byte
        const Buffer& dbuf = pair == &hc.k ? dc.k : dc.v;
        std::vector<uint8_t> got(pair->bytes);
        be.to_host(dbuf, 0, got.data(), got.size());
        size_t differ = 0;
        for (int h = 0; h < c.n_kv; ++h)
          for (int64_t slot = 0; slot < c.capacity; ++slot) {
            if (!written[slot]) continue;  // the CPU cache is uninitialised there
            const size_t off = ((size_t)h * c.capacity + slot) * row;
            differ += std::memcmp(got.data() + off, pair->as<uint8_t>() + off, row) != 0;
          }
        s_kv.check((double)differ);
      }
      if (chunk > 0) {
        const auto q = randn((size_t)T * n_head * c.hd, rng, 2.f);
        std::vector<float> ref(q.size());
        cpu->attention(q.data(), T, n_head, pos, hc, c.window, scale, ref.data());
        Buffer dq = upload(be, q);
        const bool tc = T >= 16 && (c.hd == 64 || c.hd == 128 || c.hd == 256);
        REQUIRE((!tc || c.dt != DType::BF16));  // bf16 tiles would need 2e-2
        for (cuda::DecodeKernel dk_kind : {cuda::DecodeKernel::V2, cuda::DecodeKernel::V3}) {
          if (T > 1 && dk_kind == cuda::DecodeKernel::V2) continue;  // the kernel choice is for T = 1 only
          CAPTURE(cuda::decode_kernel_name(dk_kind));
          cuda_be().set_decode_kernel(dk_kind);
          Buffer dout = poisoned(be, q.size());
          be.attention(dq.f32(), T, n_head, pos, dc, c.window, scale, dout.f32());
          OpSummary& s = T == 1 ? (dk_kind == cuda::DecodeKernel::V2 ? s_dec2 : s_dec3) : tc ? s_attn_tc : s_attn;
          s.check(rel_err(download(be, dout, q.size()), ref));
        }
      }
      pos += T;
    }
  }
  cuda_be().set_decode_kernel(kernel_before);
}

TEST_CASE("attention refuses what the CPU refuses, and head dims without a kernel") {
  auto& be = gpu();
  KvLayerCache cache = be.alloc_kv(1, 64, 8, DType::F32);
  Buffer q = poisoned(be, 9 * 3 * 64), out = poisoned(be, 9 * 3 * 64);
  REQUIRE_THROWS_AS(be.attention(q.f32(), 9, 1, 0, cache, 0, 0.125f, out.f32()), Error);   // 9 positions, 8 slots
  REQUIRE_THROWS_AS(be.attention(q.f32(), 6, 1, 10, cache, 4, 0.125f, out.f32()), Error);  // window 4 + 6 - 1 > 8
  REQUIRE_THROWS_AS(be.attention(q.f32(), 1, 3, 0, be.alloc_kv(2, 64, 8, DType::F32), 0, 0.1f, out.f32()), Error);
  REQUIRE_THROWS_AS(be.attention(q.f32(), 1, 1, 0, be.alloc_kv(1, 80, 8, DType::F32), 0, 0.1f, out.f32()), Error);
  auto cpu = make_cpu_backend();
  KvLayerCache host_cache = cpu->alloc_kv(1, 64, 8, DType::F32);
  REQUIRE_THROWS_AS(be.attention(q.f32(), 1, 1, 0, host_cache, 0, 0.1f, out.f32()), Error);
}

TEST_CASE("matmul and memory refuse host weights, bad copies and a full budget") {
  auto& be = gpu();
  std::mt19937 rng(19);
  HostWeight hw = make_weight(GgmlType::Q8_0, 8, 64, rng);
  Buffer x = poisoned(be, 64), y = poisoned(be, 8);
  REQUIRE_THROWS_AS(be.matmul(x.f32(), hw.w, 1, y.f32()), Error);  // not prepared
  const Weight dw = be.prepare_weight(hw.w, WeightMode::Quant);
  REQUIRE_THROWS_AS(be.prepare_weight(dw, WeightMode::Quant), Error);  // already on the device
  std::vector<float> host(100);
  REQUIRE_THROWS_AS(be.to_host(x, 0, host.data(), 65 * sizeof(float)), Error);
  REQUIRE_THROWS_AS(be.from_host(host.data(), x, 8, 64 * sizeof(float)), Error);

  CudaBackendOptions opt;
  opt.mem_budget = 1 << 20;
  auto small = make_cuda_backend(opt);
  const CudaMemoryUse before = cuda_memory_use(*small);
  {
    Buffer a = small->alloc(256 << 10);
    KvLayerCache c = small->alloc_kv(1, 64, 512, DType::F16);  // 2 x 64 KiB
    const CudaMemoryUse u = cuda_memory_use(*small);
    REQUIRE(u.activations == before.activations + (256 << 10));
    REQUIRE(u.kv_cache == 128 << 10);
    try {
      small->alloc(1 << 20);
      FAIL("an allocation past the budget was granted");
    } catch (const Error& e) {
      const std::string msg = e.what();
      CHECK(msg.find("budget") != std::string::npos);
      CHECK(msg.find("kv cache 128.00 KiB") != std::string::npos);
      std::printf("SUMMARY-BUDGET %s\n", msg.c_str());
    }
  }
  const CudaMemoryUse after = cuda_memory_use(*small);
  REQUIRE(after.total() == before.total());  // freed buffers are uncounted
  auto cpu = make_cpu_backend();
  REQUIRE_THROWS_AS(cuda_memory_use(*cpu), Error);
  REQUIRE_FALSE(is_cuda_backend(*cpu));
  CudaBackendOptions bad;
  bad.device = 999;
  REQUIRE_THROWS_AS(make_cuda_backend(bad), Error);
}

TEST_CASE("attention_prologue: QK-norm + RoPE + cache write in one kernel equals the three ops on the CPU") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(23);
  OpSummary s_q("attention_prologue q, k (vs CPU)", 1e-5), s_c("attention_prologue cache (vs CPU)", 1e-3);
  struct Case {
    int hd, n_kv, group, T;
    bool qk_norm;
    RopeStyle style;
    int64_t pos0, capacity;
    DType dt;
  };
  const std::vector<Case> cases = {
      {64, 2, 7, 1, false, RopeStyle::NeoX, 0, 64, DType::F16},           // qwen2.5-0.5b: GQA 7
      {128, 2, 6, 1, false, RopeStyle::NeoX, 31000, 32768, DType::F16},   // qwen2.5-1.5b: GQA 6
      {256, 1, 4, 1, true, RopeStyle::NeoX, 1000003, 1100000, DType::F32}, // gemma3 global layer, far position
      {256, 1, 4, 5, true, RopeStyle::NeoX, 600, 512 + 8 - 1, DType::F16}, // gemma3 ring slots wrap
      {128, 8, 4, 17, false, RopeStyle::Interleaved, 77, 200, DType::BF16}, // llama 8B geometry, a chunk
      {96, 1, 3, 3, true, RopeStyle::Interleaved, 5, 40, DType::F32},     // head_dim 96
      {128, 2, 2, 9, false, RopeStyle::NeoX, 10, 4, DType::F16},          // T > capacity: last 4 written
  };
  for (const Case& c : cases)
    for (bool with_cache : {true, false}) {
      const int nh = c.n_kv * c.group;
      CAPTURE(c.hd, c.n_kv, c.group, c.T, c.qk_norm, (int)c.style, c.pos0, with_cache);
      RopeParams rp;
      rp.style = c.style, rp.n_rot = c.hd, rp.base = 1e6f;
      const auto q = randn((size_t)c.T * nh * c.hd, rng), k = randn((size_t)c.T * c.n_kv * c.hd, rng, 1.f, 0.3f);
      const auto v = randn(k.size(), rng);
      const auto wq = randn((size_t)c.hd, rng, 0.1f, 1.f), wk = randn((size_t)c.hd, rng, 0.1f, 1.f);
      std::vector<float> hq(q), hk(k);
      KvLayerCache hc = cpu->alloc_kv(c.n_kv, c.hd, c.capacity, c.dt), dc = be.alloc_kv(c.n_kv, c.hd, c.capacity, c.dt);
      const Weight hwq = f32_host_weight(wq), hwk = f32_host_weight(wk);
      cpu->attention_prologue(hq.data(), hk.data(), v.data(), c.T, nh, c.n_kv, c.hd, c.qk_norm ? &hwq : nullptr,
                              c.qk_norm ? &hwk : nullptr, 1e-6f, c.pos0, rp, with_cache ? &hc : nullptr);
      const Weight dwq = be.prepare_weight(hwq, WeightMode::Quant), dwk = be.prepare_weight(hwk, WeightMode::Quant);
      Buffer dq = upload(be, q), dk = upload(be, k), dv = upload(be, v);
      be.attention_prologue(dq.f32(), dk.f32(), dv.f32(), c.T, nh, c.n_kv, c.hd, c.qk_norm ? &dwq : nullptr,
                            c.qk_norm ? &dwk : nullptr, 1e-6f, c.pos0, rp, with_cache ? &dc : nullptr);
      s_q.check(rel_err(download(be, dq, q.size()), hq));
      s_q.check(rel_err(download(be, dk, k.size()), hk));
      if (!with_cache) continue;
      // The slots this call wrote (the last min(T, capacity) positions), as fp32.
      for (const auto* hb : {&hc.k, &hc.v}) {
        const Buffer& db = hb == &hc.k ? dc.k : dc.v;
        const size_t es = dtype_size(c.dt), n = (size_t)c.n_kv * c.capacity * c.hd;
        std::vector<uint8_t> got(n * es);
        be.to_host(db, 0, got.data(), got.size());
        std::vector<float> g32, w32;
        for (int h = 0; h < c.n_kv; ++h)
          for (int64_t p = std::max<int64_t>(c.pos0, c.pos0 + c.T - c.capacity); p < c.pos0 + c.T; ++p) {
            const size_t off = ((size_t)h * c.capacity + (size_t)(p % c.capacity)) * c.hd;
            std::vector<float> a(c.hd), b(c.hd);
            to_f32(c.dt, got.data() + off * es, a.data(), c.hd);
            to_f32(c.dt, hb->as<uint8_t>() + off * es, b.data(), c.hd);
            g32.insert(g32.end(), a.begin(), a.end()), w32.insert(w32.end(), b.begin(), b.end());
          }
        s_c.check(rel_err(g32, w32));
      }
    }
}
