// The tensor-core prefill attention (gpu/kernels_attention_tc.cu) against
// CpuBackend::attention: chunks of T >= 16 at several cache offsets, causal
// and sliding windows, ring caches that wrap, GQA groups, head dims 64 / 128 /
// 256, fp32 / fp16 / bf16 caches, large scores, forced key splits; and the
// dispatch (T >= 16 must take this path, so the old kernel cannot pass for
// it). Tolerances are per row (relative L2), from the CPU emulation of the
// kernel's rounding (tests/test_attention_tc_tiles.cpp): fp16 tiles 3e-3,
// bf16 tiles 2e-2, scores of sd ~20: 3e-2. Run: gpu_test_cuda_attention_tc "[tc]".
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <random>

#include "gpu/attention_tc_tiles.h"
#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_kernels.h"
#include "src/common/error.h"
#include "src/model/backend.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

// The same positions 0 .. n-1 of random k, v written into a CPU and a GPU cache.
struct Caches {
  KvLayerCache host, dev;
};
Caches make_caches(Backend& cpu, Backend& be, int n_kv, int hd, int64_t capacity, DType dt, int64_t n,
                   std::mt19937& rng) {
  Caches c{cpu.alloc_kv(n_kv, hd, capacity, dt), be.alloc_kv(n_kv, hd, capacity, dt)};
  const auto k = randn((size_t)n * n_kv * hd, rng, 1.f, 0.2f), v = randn(k.size(), rng);
  cpu.kv_write(c.host, k.data(), v.data(), (int)n, 0);  // only the last `capacity` positions stay
  Buffer dk = upload(be, k), dv = upload(be, v);
  be.kv_write(c.dev, dk.f32(), dv.f32(), (int)n, 0);
  return c;
}

double tolerance(DType dt, float q_sd) {
  if (q_sd > 5.f) return 3e-2;
  return dt == DType::BF16 ? 2e-2 : 3e-3;
}

}  // namespace

TEST_CASE("tensor-core attention equals the CPU: T x offset x window, GQA, head dims, cache types, rings", "[tc]") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(101);
  OpSummary s16("attention_tc fp16 tiles (row rel err)", 3e-3), sbf("attention_tc bf16 tiles (row rel err)", 2e-2);
  struct Heads {
    int n_head, n_kv;
  };
  const Heads heads[] = {{4, 1}, {8, 2}, {32, 8}, {1, 1}};
  const int hds[] = {64, 128, 256};
  const DType types[] = {DType::F32, DType::F16, DType::BF16};
  int idx = 0;
  for (int T : {16, 17, 64, 333, 1024})
    for (int64_t pos0 : {0, 1, 777})
      for (int64_t window : {0, 100, 512}) {
        // Every (heads, head dim, type) of the 36 comes up at least once over the 45 cases.
        const int cfg = (idx * 7) % 36;
        ++idx;
        const Heads hh = heads[cfg % 4];
        const int hd = hds[(cfg / 4) % 3];
        const DType dt = types[cfg / 12];
        // Sliding layers keep a ring of window + T - 1 slots (it wraps when
        // shorter than the context); global ones the context, some with room to spare.
        const int64_t n = pos0 + T;
        const int64_t capacity = window > 0 ? std::min(n, window + T - 1) : n + (idx % 2) * 37;
        CAPTURE(T, pos0, window, hh.n_head, hh.n_kv, hd, dtype_name(dt), capacity);
        Caches c = make_caches(*cpu, be, hh.n_kv, hd, capacity, dt, n, rng);
        const auto q = randn((size_t)T * hh.n_head * hd, rng, 2.f);
        const float scale = 1.f / std::sqrt((float)hd);
        std::vector<float> ref(q.size());
        cpu->attention(q.data(), T, hh.n_head, pos0, c.host, window, scale, ref.data());
        Buffer dq = upload(be, q), dout = poisoned(be, q.size());
        const int64_t before = cuda::attention_tc_launches();
        be.attention(dq.f32(), T, hh.n_head, pos0, c.dev, window, scale, dout.f32());
        CHECK(cuda::attention_tc_launches() == before + 1);  // the tensor-core path ran, once
        (dt == DType::BF16 ? sbf : s16).check(max_row_rel_err(download(be, dout, q.size()), ref, hd));
      }
}

TEST_CASE("tensor-core attention: large scores, tiny rings, chunked prefill of a sliding layer", "[tc]") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(103);
  OpSummary s("attention_tc special cases (row rel err)", 3e-2);
  struct Case {
    int T, n_head, n_kv, hd;
    int64_t pos0, window, capacity;
    DType dt;
    float q_sd;
  };
  const Case cases[] = {
      {333, 4, 1, 256, 777, 0, 1110, DType::F16, 20.f},     // scores of sd ~20: softmax stability
      {333, 4, 1, 256, 777, 0, 1110, DType::F32, 20.f},
      {64, 8, 2, 128, 3000, 0, 3064, DType::BF16, 2.f},     // longer bf16 context
      {17, 2, 1, 64, 50, 8, 8 + 17 - 1, DType::F16, 2.f},   // ring shorter than a key tile
      {40, 4, 1, 256, 100, 1, 40, DType::F32, 2.f},         // window of one: each query sees itself
      {16, 4, 1, 256, 5000, 512, 527, DType::F32, 2.f},     // gemma local layer, ring wrapped many times
  };
  for (const Case& c : cases) {
    CAPTURE(c.T, c.n_head, c.n_kv, c.hd, c.pos0, c.window, c.capacity, dtype_name(c.dt), c.q_sd);
    Caches kc = make_caches(*cpu, be, c.n_kv, c.hd, c.capacity, c.dt, c.pos0 + c.T, rng);
    const auto q = randn((size_t)c.T * c.n_head * c.hd, rng, c.q_sd);
    const float scale = 1.f / std::sqrt((float)c.hd);
    std::vector<float> ref(q.size());
    cpu->attention(q.data(), c.T, c.n_head, c.pos0, kc.host, c.window, scale, ref.data());
    Buffer dq = upload(be, q), dout = poisoned(be, q.size());
    be.attention(dq.f32(), c.T, c.n_head, c.pos0, kc.dev, c.window, scale, dout.f32());
    const double err = max_row_rel_err(download(be, dout, q.size()), ref, c.hd);
    CHECK(err <= tolerance(c.dt, c.q_sd));
    s.check(err);
  }

  // Gemma's local layers in a model: chunks of 512 through a 512 + 512 - 1 ring.
  const int hd = 256, n_head = 4, window = 512, chunk = 512;
  KvLayerCache hc = cpu->alloc_kv(1, hd, window + chunk - 1, DType::F16);
  KvLayerCache dc = be.alloc_kv(1, hd, window + chunk - 1, DType::F16);
  const float scale = 1.f / 16.f;  // gemma3: query_pre_attn_scalar 256
  for (int64_t pos = 0; pos < 4 * chunk; pos += chunk) {
    CAPTURE(pos);
    const auto k = randn((size_t)chunk * hd, rng, 1.f, 0.2f), v = randn(k.size(), rng);
    cpu->kv_write(hc, k.data(), v.data(), chunk, pos);
    Buffer dk = upload(be, k), dv = upload(be, v);
    be.kv_write(dc, dk.f32(), dv.f32(), chunk, pos);
    const auto q = randn((size_t)chunk * n_head * hd, rng, 2.f);
    std::vector<float> ref(q.size());
    cpu->attention(q.data(), chunk, n_head, pos, hc, window, scale, ref.data());
    Buffer dq = upload(be, q), dout = poisoned(be, q.size());
    be.attention(dq.f32(), chunk, n_head, pos, dc, window, scale, dout.f32());
    const double err = max_row_rel_err(download(be, dout, q.size()), ref, hd);
    CHECK(err <= 3e-3);
    s.check(err);
  }
}

TEST_CASE("tensor-core attention: any key split merges exactly (one tile per split, uneven splits)", "[tc]") {
  auto cpu = make_cpu_backend();
  auto& be = cuda_be();
  std::mt19937 rng(107);
  OpSummary s("attention_tc forced splits (row rel err)", 3e-3);
  for (DType dt : {DType::F16, DType::F32})
    for (int64_t window : {0, 300}) {
      const int T = 100, n_head = 8, n_kv = 2, hd = 128;
      const int64_t pos0 = 1500, capacity = window > 0 ? window + T - 1 : pos0 + T;
      Caches c = make_caches(*cpu, be, n_kv, hd, capacity, dt, pos0 + T, rng);
      const auto q = randn((size_t)T * n_head * hd, rng, 2.f);
      const float scale = 1.f / std::sqrt((float)hd);
      std::vector<float> ref(q.size());
      cpu->attention(q.data(), T, n_head, pos0, c.host, window, scale, ref.data());
      cuda::AttentionArgs a;
      Buffer dq = upload(be, q);
      a.q = dq.f32(), a.kv_type = dt, a.k = c.dev.k.mem.get(), a.v = c.dev.v.mem.get();
      a.T = T, a.n_head = n_head, a.n_kv = n_kv, a.head_dim = hd;
      a.pos0 = pos0, a.capacity = capacity, a.window = window, a.scale = scale;
      const int bn = cuda::tc_tile_keys((int)dtype_size(dt), hd);
      const int64_t key_lo = window > 0 ? pos0 - window + 1 : 0;
      const int64_t tiles = (pos0 + T - 1) / bn - key_lo / bn + 1;
      for (int64_t per : {int64_t{1}, int64_t{3}, tiles - 1, tiles}) {
        CAPTURE(dtype_name(dt), window, per, tiles);
        cuda::AttentionPlan plan;
        plan.split_keys = per * bn;
        plan.n_splits = (int)((tiles + per - 1) / per);
        plan.workspace_bytes = (size_t)T * n_head * plan.n_splits * (hd + 2) * sizeof(float);
        Buffer ws = be.alloc(plan.workspace_bytes), dout = poisoned(be, q.size());
        a.out = dout.f32();
        cuda::attention_tc(a, plan, plan.n_splits > 1 ? ws.mem.get() : nullptr, be.stream());
        s.check(max_row_rel_err(download(be, dout, q.size()), ref, hd));
      }
      // A plan whose splits do not cover every key tile is refused.
      cuda::AttentionPlan short_plan;
      short_plan.split_keys = bn, short_plan.n_splits = (int)tiles - 1;
      Buffer ws = be.alloc((size_t)T * n_head * tiles * (hd + 2) * sizeof(float));
      REQUIRE_THROWS_AS(cuda::attention_tc(a, short_plan, ws.mem.get(), be.stream()), Error);
    }
}

TEST_CASE("attention dispatch: T >= 16 with head_dim 64/128/256 on the tensor cores, the rest on fp32", "[tc]") {
  auto cpu = make_cpu_backend();
  auto& be = gpu();
  std::mt19937 rng(109);
  struct Case {
    int T, hd;
    bool tc;
  };
  for (const Case& c : {Case{1, 256, false}, Case{15, 256, false}, Case{16, 256, true}, Case{16, 64, true},
                        Case{64, 96, false}, Case{64, 32, false}, Case{512, 128, true}}) {
    CAPTURE(c.T, c.hd);
    const int n_head = 4, n_kv = 1;
    const int64_t pos0 = 40;
    Caches kc = make_caches(*cpu, be, n_kv, c.hd, pos0 + c.T, DType::F16, pos0 + c.T, rng);
    const auto q = randn((size_t)c.T * n_head * c.hd, rng, 2.f);
    Buffer dq = upload(be, q), dout = poisoned(be, q.size());
    const int64_t before = cuda::attention_tc_launches();
    be.attention(dq.f32(), c.T, n_head, pos0, kc.dev, 0, 0.1f, dout.f32());
    CHECK(cuda::attention_tc_launches() - before == (c.tc ? 1 : 0));
    std::vector<float> ref(q.size());
    cpu->attention(q.data(), c.T, n_head, pos0, kc.host, 0, 0.1f, ref.data());
    CHECK(max_row_rel_err(download(be, dout, q.size()), ref, c.hd) <= (c.tc ? 3e-3 : 2e-5));
  }
}
