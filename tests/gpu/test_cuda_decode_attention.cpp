// The split-KV decode attention (T = 1, gpu/kernels_attention_decode.cu),
// both kernels (v2: one block per SM; v3: a wave of small blocks) over the
// same sweeps, against the CPU backend: contexts that cross the split
// boundaries (1, 31..33, 255..257, 4097, 100000 keys, odd counts) in caches
// far larger than the context (the plan is sized for the capacity, so most
// splits are empty), head dims 32..256, GQA 1..16 (row tiles), the Llama-3,
// Gemma 3 (4/1 x 256) and Qwen2.5 (12/2 x 128, 14/2 x 64) geometries, every
// cache type, sliding windows whose ring has wrapped many times. Caches hold
// random rows everywhere, so a read of the wrong slot shows. Then the
// position read from device memory (what a recorded step does) must give
// the very same bits as the host position, for any split count.
#include <catch2/catch.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_kernels.h"
#include "src/common/dtype.h"
#include "src/common/error.h"
#include "tests/gpu/cuda_test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

// The same random rows (uniform in [-1, 1) + bias, in the cache type) in a
// host cache and a device cache.
struct CachePair {
  KvLayerCache host, dev;
};
CachePair random_caches(Backend& cpu, Backend& be, int n_kv, int hd, int64_t cap, DType dt, uint32_t seed) {
  CachePair c{cpu.alloc_kv(n_kv, hd, cap, dt), be.alloc_kv(n_kv, hd, cap, dt)};
  const size_t n = (size_t)n_kv * cap * hd;
  std::vector<float> f(n);
  std::mt19937 rng(seed);
  for (auto [src, dst, bias] : {std::tuple{&c.host.k, &c.dev.k, 0.3f}, std::tuple{&c.host.v, &c.dev.v, 0.f}}) {
    for (auto& x : f) x = (float)(rng() >> 8) * 0x1.0p-23f - 1.f + bias;
    from_f32(dt, f.data(), src->as<uint8_t>(), n);
    be.from_host(src->as<uint8_t>(), *dst, 0, n * dtype_size(dt));
  }
  return c;
}

struct Case {
  int hd, n_kv, group;
  DType dt;
  int64_t window, capacity;
  std::vector<int64_t> positions;  // the query's position; it sees min(pos + 1, window) keys
};

constexpr cuda::DecodeKernel kKernels[] = {cuda::DecodeKernel::V2, cuda::DecodeKernel::V3};

// Restores the backend's kernel choice when a test case ends.
struct KernelChoice {
  cuda::DecodeKernel saved = cuda_be().decode_kernel();
  ~KernelChoice() { cuda_be().set_decode_kernel(saved); }
};

}  // namespace

TEST_CASE("decode attention (T = 1) matches the CPU across split boundaries, head dims, GQA and cache types") {
  auto cpu = make_cpu_backend();
  auto& be = cuda_be();
  KernelChoice restore;
  std::mt19937 rng(29);
  OpSummary s2("decode attention v2 vs CPU", 1e-5), s3("decode attention v3 vs CPU", 1e-5);
  const std::vector<Case> cases = {
      // keys 1, 255, 256, 257, 4097, 100000 in a 100000-slot cache: llama-like GQA 4, f16
      {128, 2, 4, DType::F16, 0, 100000, {0, 254, 255, 256, 4096, 99999}},
      {256, 1, 4, DType::F16, 0, 100000, {0, 30, 31, 32, 255, 256, 4096, 32767, 99999}},  // gemma global layer
      {256, 1, 4, DType::F16, 512, 512, {100, 511, 512, 777, 33333}},  // gemma local layer: a 512-slot ring
      {128, 2, 6, DType::F16, 0, 40000, {0, 62, 63, 64, 4097, 12344, 39999}},  // qwen2.5 1.5B: 12/2 x 128
      {64, 2, 7, DType::BF16, 0, 20000, {1, 127, 12345, 19999}},               // qwen2.5 0.5B: 14/2 x 64
      {64, 2, 7, DType::F16, 1000, 1003, {999, 1000, 5001}},                   // ... windowed, wrapped
      {256, 1, 8, DType::BF16, 0, 20000, {0, 254, 256, 4096, 19999}},
      {64, 4, 1, DType::F32, 0, 5000, {0, 254, 255, 256, 4096, 4999}},  // GQA 1
      {128, 8, 4, DType::F32, 0, 32768, {1000, 32767}},
      {128, 1, 16, DType::F16, 0, 3000, {0, 257, 2999}},  // two row tiles of 8
      {64, 2, 3, DType::BF16, 0, 600, {0, 300, 599}},     // 3 rows in a 4-row block
      {96, 1, 5, DType::F16, 0, 1000, {999}},             // head_dim 96: idle lanes; 5 rows of 8
      {96, 2, 2, DType::F32, 0, 3000, {40, 2999}},        // head_dim 96 fp32: 24 chunks on 32 lanes
      {32, 2, 2, DType::F32, 0, 700, {300, 699}},
      {32, 1, 6, DType::F16, 0, 700, {511}},
      {32, 2, 4, DType::F16, 0, 5000, {4998}},  // v3: 32 keys a warp step, short splits leave warps idle
      {256, 1, 4, DType::F32, 512, 512 + 63, {100, 511, 512, 513, 5000, 12345}},  // gemma local ring, wrapped
      {64, 4, 8, DType::F16, 16, 16 + 7, {3, 15, 16, 40, 1000}},
      {128, 2, 4, DType::BF16, 1000, 1000 + 4, {999, 1000, 3001, 77777}},
  };
  for (const Case& c : cases) {
    const int n_head = c.n_kv * c.group;
    CAPTURE(c.hd, c.n_kv, c.group, dtype_name(c.dt), c.window, c.capacity);
    const CachePair kv = random_caches(*cpu, be, c.n_kv, c.hd, c.capacity, c.dt, (uint32_t)(c.hd * 131 + c.group));
    const float scale = 1.f / std::sqrt((float)c.hd);
    for (int64_t pos : c.positions) {
      CAPTURE(pos);
      const auto q = randn((size_t)n_head * c.hd, rng, 2.f);
      std::vector<float> ref(q.size());
      cpu->attention(q.data(), 1, n_head, pos, kv.host, c.window, scale, ref.data());
      Buffer dq = upload(be, q);
      for (cuda::DecodeKernel k : kKernels) {
        CAPTURE(cuda::decode_kernel_name(k));
        be.set_decode_kernel(k);
        Buffer dout = poisoned(be, q.size());
        be.attention(dq.f32(), 1, n_head, pos, kv.dev, c.window, scale, dout.f32());
        (k == cuda::DecodeKernel::V2 ? s2 : s3).check(rel_err(download(be, dout, q.size()), ref));
      }
    }
  }
}

TEST_CASE("decode attention: the device position gives the host position's bits, any split count is exact") {
  auto cpu = make_cpu_backend();
  auto& be = cuda_be();
  std::mt19937 rng(31);
  std::map<cuda::DecodeKernel, int> bitwise_cases, bitwise_equal;
  OpSummary s2("decode attention v2, forced split counts", 1e-5), s3("decode attention v3, forced split counts", 1e-5);
  struct Geometry {
    int n_kv, group, hd;
    DType dt;
  };
  const Geometry geoms[] = {{2, 4, 128, DType::F32}, {2, 4, 128, DType::F16},  // llama-like
                            {1, 4, 256, DType::F16},                            // gemma
                            {2, 7, 64, DType::BF16},                            // qwen2.5 0.5B
                            {2, 2, 32, DType::F16}};  // v3: 128 keys a block round: warps without keys
  struct Ring {
    int64_t window, cap;
  };
  for (const Geometry& g : geoms)
    for (Ring ring : {Ring{0, 9000}, Ring{700, 9000}, Ring{700, 703}}) {  // the last wraps many times
      const int n_head = g.n_kv * g.group;
      const CachePair kv = random_caches(*cpu, be, g.n_kv, g.hd, ring.cap, g.dt, 77 + (uint32_t)(ring.window + ring.cap));
      for (int sms : {1, 7, 132, 100000})  // 1 split, a few, a wave, as many as the keys allow
        for (int64_t pos : {int64_t{0}, int64_t{31}, int64_t{255}, int64_t{256}, int64_t{4321}, int64_t{8999}}) {
          CAPTURE(g.n_kv, g.group, g.hd, dtype_name(g.dt), ring.window, ring.cap, sms, pos);
          const auto q = randn((size_t)n_head * g.hd, rng, 2.f);
          std::vector<float> ref(q.size());
          cpu->attention(q.data(), 1, n_head, pos, kv.host, ring.window, 0.09f, ref.data());
          Buffer dq = upload(be, q);
          const std::vector<int64_t> posv{pos};
          Buffer dpos = be.alloc(sizeof(int64_t));
          be.from_host(posv.data(), dpos, 0, sizeof(int64_t));
          for (cuda::DecodeKernel k : kKernels) {
            CAPTURE(cuda::decode_kernel_name(k));
            const int64_t max_keys = ring.window > 0 ? std::min(ring.window, ring.cap) : ring.cap;
            const cuda::DecodeAttentionPlan plan = cuda::plan_decode_attention(n_head, g.n_kv, g.hd, max_keys, sms, k);
            REQUIRE(plan.n_splits >= 1);
            REQUIRE(plan.kernel == k);
            Buffer d_host = poisoned(be, q.size()), d_dev = poisoned(be, q.size());
            cuda::DecodeAttentionArgs a;
            a.q = dq.f32(), a.kv_type = g.dt, a.k = kv.dev.k.mem.get(), a.v = kv.dev.v.mem.get();
            a.n_head = n_head, a.n_kv = g.n_kv, a.head_dim = g.hd, a.pos = pos, a.capacity = ring.cap;
            a.window = ring.window, a.scale = 0.09f;
            void* ws = plan.workspace_bytes ? be.scratch(cuda::CudaBackend::Scratch::Attention, plan.workspace_bytes)
                                            : nullptr;
            a.out = d_host.f32();
            cuda::decode_attention(a, plan, ws, be.stream());
            a.out = d_dev.f32(), a.pos = -12345, a.dev_pos = dpos.as<int64_t>();  // the host value must be ignored
            cuda::decode_attention(a, plan, ws, be.stream());
            const auto got_host = download(be, d_host, q.size()), got_dev = download(be, d_dev, q.size());
            (k == cuda::DecodeKernel::V2 ? s2 : s3).check(rel_err(got_host, ref));
            ++bitwise_cases[k];
            bitwise_equal[k] += std::memcmp(got_host.data(), got_dev.data(), got_host.size() * sizeof(float)) == 0;
          }
        }
    }
  for (cuda::DecodeKernel k : kKernels) {
    const std::string op = fmt::format("decode attention {}, device position", cuda::decode_kernel_name(k));
    std::printf("SUMMARY %-34s cases %5d   bitwise equal %5d   %s\n", op.c_str(), bitwise_cases[k],
                bitwise_equal[k], bitwise_cases[k] == bitwise_equal[k] ? "ok" : "FAIL");
    CHECK(bitwise_cases[k] == bitwise_equal[k]);
  }
}

TEST_CASE("decode attention plan: one wave of blocks, splits worth their merge, fixed by the cache geometry") {
  using cuda::DecodeKernel;
  // v2, one block per SM. llama-8b: 8 KV heads x 1 row tile on 132 SMs -> 16 splits; gemma: 1 KV head -> 132.
  auto p = cuda::plan_decode_attention(32, 8, 128, 131072, 132, DecodeKernel::V2);
  CHECK(p.n_splits == 16);
  CHECK(p.rows_per_block == 4);
  CHECK(p.blocks_per_sm == 1);
  CHECK(p.workspace_bytes == (size_t)32 * 16 * 130 * sizeof(float));
  p = cuda::plan_decode_attention(4, 1, 256, 32768, 132, DecodeKernel::V2);
  CHECK(p.n_splits == 128);  // 32768 keys / 256 per split at least
  p = cuda::plan_decode_attention(4, 1, 256, 512, 132, DecodeKernel::V2);
  CHECK(p.n_splits == 2);  // a 512-key window
  p = cuda::plan_decode_attention(64, 4, 64, 1 << 20, 132, DecodeKernel::V2);  // GQA 16: two tiles of 8 rows
  CHECK(p.rows_per_block == 8);
  CHECK(p.row_tiles == 2);
  CHECK(p.n_splits == 16);
  p = cuda::plan_decode_attention(32, 32, 128, 1 << 20, 16, DecodeKernel::V2);  // more KV heads than SMs: no split
  CHECK(p.n_splits == 1);
  CHECK(p.workspace_bytes == 0);

  // v3, a wave of 4 blocks per SM (R = 4) or 2 (R = 8), splits of >= 32 keys.
  p = cuda::plan_decode_attention(32, 8, 128, 131072, 132, DecodeKernel::V3);  // llama-8b
  CHECK(p.kernel == DecodeKernel::V3);
  CHECK(p.blocks_per_sm == 4);
  CHECK(p.n_splits == 66);  // 132 x 4 / 8 KV heads
  // m and l padded to 4 floats, so o starts 16-byte aligned
  CHECK(p.workspace_bytes == (size_t)(2 * 32 * 66 + 32 * 66 * 128) * sizeof(float));
  p = cuda::plan_decode_attention(4, 1, 256, 32768, 132, DecodeKernel::V3);  // gemma global layer
  CHECK(p.n_splits == 528);
  p = cuda::plan_decode_attention(4, 1, 256, 512, 132, DecodeKernel::V3);  // gemma local layer
  CHECK(p.n_splits == 16);
  p = cuda::plan_decode_attention(4, 1, 256, 31, 132, DecodeKernel::V3);  // fewer keys than a split: no merge
  CHECK(p.n_splits == 1);
  CHECK(p.workspace_bytes == 0);
  p = cuda::plan_decode_attention(12, 2, 128, 32768, 132, DecodeKernel::V3);  // qwen2.5 1.5B: 6 rows of 8
  CHECK(p.rows_per_block == 8);
  CHECK(p.blocks_per_sm == 2);
  CHECK(p.n_splits == 132);
  p = cuda::plan_decode_attention(5, 5, 64, 1 << 20, 132, DecodeKernel::V3);  // 5 x 105 partials: m, l padded
  CHECK(p.n_splits == 105);
  CHECK(p.workspace_bytes == (size_t)(2 * 528 + 5 * 105 * 64) * sizeof(float));
  p = cuda::plan_decode_attention(4, 1, 256, 1 << 24, 1000, DecodeKernel::V3);  // capped by the merge's table
  CHECK(p.n_splits == 1024);
  p = cuda::plan_decode_attention(64, 64, 128, 1 << 20, 16, DecodeKernel::V3);  // more blocks than the wave
  CHECK(p.n_splits == 1);

  for (DecodeKernel k : kKernels) {
    REQUIRE_THROWS_AS(cuda::plan_decode_attention(6, 4, 128, 100, 132, k), Error);
    REQUIRE_THROWS_AS(cuda::plan_decode_attention(4, 1, 80, 100, 132, k), Error);
  }
}

TEST_CASE("decode attention: every instantiation keeps the blocks per SM its plan assumes") {
  // A kernel that needs more registers or shared memory than planned turns
  // the one wave into two: the split count would then cost a second pass.
  auto& be = cuda_be();
  int cases = 0, short_of = 0;
  for (cuda::DecodeKernel k : kKernels)
    for (DType dt : {DType::F32, DType::F16, DType::BF16})
      for (int hd : {32, 64, 96, 128, 256})
        for (int group : {4, 8}) {
          const auto p = cuda::plan_decode_attention(group, 1, hd, 1 << 20, be.sm_count(), k);
          const int resident = cuda::decode_attention_resident_blocks(p, dt, hd);
          CAPTURE(cuda::decode_kernel_name(k), dtype_name(dt), hd, p.rows_per_block, resident, p.blocks_per_sm);
          ++cases;
          short_of += resident < p.blocks_per_sm;
          CHECK(resident >= p.blocks_per_sm);
        }
  std::printf("SUMMARY %-34s cases %5d   below plan    %5d   %s\n", "decode attention residency", cases, short_of,
              short_of == 0 ? "ok" : "FAIL");
}

TEST_CASE("decode attention: TOPKV_DECODE_ATTN picks the kernel, v3 by default") {
  const char* old = std::getenv("TOPKV_DECODE_ATTN");
  const std::string saved = old ? old : "";
  unsetenv("TOPKV_DECODE_ATTN");
  CHECK(cuda::decode_kernel_from_env() == cuda::DecodeKernel::V3);
  setenv("TOPKV_DECODE_ATTN", "v2", 1);
  CHECK(cuda::decode_kernel_from_env() == cuda::DecodeKernel::V2);
  setenv("TOPKV_DECODE_ATTN", "v3", 1);
  CHECK(cuda::decode_kernel_from_env() == cuda::DecodeKernel::V3);
  setenv("TOPKV_DECODE_ATTN", "fast", 1);
  CHECK_THROWS_AS(cuda::decode_kernel_from_env(), Error);
  if (old)
    setenv("TOPKV_DECODE_ATTN", saved.c_str(), 1);
  else
    unsetenv("TOPKV_DECODE_ATTN");
}
