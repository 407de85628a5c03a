// The split-KV decode attention (T = 1, gpu/kernels_attention_decode.cu)
// against the CPU backend: contexts that cross the split boundaries (1, 255,
// 256, 257, 4097, 100000 keys) in caches far larger than the context (the
// plan is sized for the capacity, so most splits are empty), head dims
// 32..256, GQA 1..16 (row tiles), every cache type, sliding windows whose
// ring has wrapped many times. Caches hold random rows everywhere, so a read
// of the wrong slot shows. Then the position read from device memory (what a
// recorded step does) must give the very same bits as the host position.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>
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

}  // namespace

TEST_CASE("decode attention (T = 1) matches the CPU across split boundaries, head dims, GQA and cache types") {
  auto cpu = make_cpu_backend();
  auto& be = cuda_be();
  std::mt19937 rng(29);
  OpSummary s("decode attention vs CPU", 1e-5);
  const std::vector<Case> cases = {
      // keys 1, 255, 256, 257, 4097, 100000 in a 100000-slot cache: llama-like GQA 4, f16
      {128, 2, 4, DType::F16, 0, 100000, {0, 254, 255, 256, 4096, 99999}},
      {256, 1, 4, DType::F16, 0, 100000, {0, 255, 256, 99999}},  // gemma global layer
      {256, 1, 8, DType::BF16, 0, 20000, {0, 254, 256, 4096, 19999}},
      {64, 4, 1, DType::F32, 0, 5000, {0, 254, 255, 256, 4096, 4999}},  // GQA 1
      {128, 8, 4, DType::F32, 0, 32768, {1000, 32767}},
      {128, 1, 16, DType::F16, 0, 3000, {0, 257, 2999}},  // two row tiles of 8
      {64, 2, 3, DType::BF16, 0, 600, {0, 300, 599}},     // 3 rows in a 4-row block
      {96, 1, 5, DType::F16, 0, 1000, {999}},             // head_dim 96: idle lanes; 5 rows of 8
      {32, 2, 2, DType::F32, 0, 700, {300, 699}},
      {32, 1, 6, DType::F16, 0, 700, {511}},
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
      Buffer dq = upload(be, q), dout = poisoned(be, q.size());
      be.attention(dq.f32(), 1, n_head, pos, kv.dev, c.window, scale, dout.f32());
      s.check(rel_err(download(be, dout, q.size()), ref));
    }
  }
}

TEST_CASE("decode attention: the device position gives the host position's bits; any split count is exact") {
  auto cpu = make_cpu_backend();
  auto& be = cuda_be();
  std::mt19937 rng(31);
  OpSummary s("decode attention, forced split counts", 1e-5);
  int bitwise_cases = 0, bitwise_equal = 0;
  const int64_t cap = 9000;
  for (DType dt : {DType::F32, DType::F16})
    for (int64_t window : {int64_t{0}, int64_t{700}}) {
      const int n_kv = 2, group = 4, hd = 128, n_head = n_kv * group;
      const CachePair kv = random_caches(*cpu, be, n_kv, hd, cap, dt, 77 + (uint32_t)window);
      for (int sms : {1, 7, 132, 100000})  // 1 split, a few, one per SM, as many as the keys allow
        for (int64_t pos : {int64_t{0}, int64_t{255}, int64_t{256}, int64_t{8999}}) {
          CAPTURE(dtype_name(dt), window, sms, pos);
          const int64_t max_keys = window > 0 ? std::min(window, cap) : cap;
          const cuda::DecodeAttentionPlan plan = cuda::plan_decode_attention(n_head, n_kv, hd, max_keys, sms);
          REQUIRE(plan.n_splits >= 1);
          const auto q = randn((size_t)n_head * hd, rng, 2.f);
          std::vector<float> ref(q.size());
          cpu->attention(q.data(), 1, n_head, pos, kv.host, window, 0.09f, ref.data());
          Buffer dq = upload(be, q), d_host = poisoned(be, q.size()), d_dev = poisoned(be, q.size());
          const std::vector<int64_t> posv{pos};
          Buffer dpos = be.alloc(sizeof(int64_t));
          be.from_host(posv.data(), dpos, 0, sizeof(int64_t));
          cuda::DecodeAttentionArgs a;
          a.q = dq.f32(), a.kv_type = dt, a.k = kv.dev.k.mem.get(), a.v = kv.dev.v.mem.get();
          a.n_head = n_head, a.n_kv = n_kv, a.head_dim = hd, a.pos = pos, a.capacity = cap, a.window = window;
          a.scale = 0.09f;
          void* ws = plan.workspace_bytes ? be.scratch(cuda::CudaBackend::Scratch::Attention, plan.workspace_bytes)
                                          : nullptr;
          a.out = d_host.f32();
          cuda::decode_attention(a, plan, ws, be.stream());
          a.out = d_dev.f32(), a.pos = -12345, a.dev_pos = dpos.as<int64_t>();  // the host value must be ignored
          cuda::decode_attention(a, plan, ws, be.stream());
          const auto got_host = download(be, d_host, q.size()), got_dev = download(be, d_dev, q.size());
          s.check(rel_err(got_host, ref));
          ++bitwise_cases;
          bitwise_equal += std::memcmp(got_host.data(), got_dev.data(), got_host.size() * sizeof(float)) == 0;
        }
    }
  std::printf("SUMMARY %-34s cases %5d   bitwise equal %5d   %s\n", "decode attention, device position",
              bitwise_cases, bitwise_equal, bitwise_cases == bitwise_equal ? "ok" : "FAIL");
  CHECK(bitwise_cases == bitwise_equal);
}

TEST_CASE("decode attention plan: one block per SM, splits worth their merge, fixed by the cache geometry") {
  // llama-8b: 8 KV heads x 1 row tile on 132 SMs -> 16 splits; gemma: 1 KV head -> 132.
  auto p = cuda::plan_decode_attention(32, 8, 128, 131072, 132);
  CHECK(p.n_splits == 16);
  CHECK(p.rows_per_block == 4);
  CHECK(p.workspace_bytes == (size_t)32 * 16 * 130 * sizeof(float));
  p = cuda::plan_decode_attention(4, 1, 256, 32768, 132);
  CHECK(p.n_splits == 128);  // 32768 keys / 256 per split at least
  p = cuda::plan_decode_attention(4, 1, 256, 512, 132);
  CHECK(p.n_splits == 2);  // a 512-key window
  p = cuda::plan_decode_attention(64, 4, 64, 1 << 20, 132);  // GQA 16: two tiles of 8 rows
  CHECK(p.rows_per_block == 8);
  CHECK(p.row_tiles == 2);
  CHECK(p.n_splits == 16);
  p = cuda::plan_decode_attention(32, 32, 128, 1 << 20, 16);  // more KV heads than SMs: no split
  CHECK(p.n_splits == 1);
  CHECK(p.workspace_bytes == 0);
  REQUIRE_THROWS_AS(cuda::plan_decode_attention(6, 4, 128, 100, 132), Error);
  REQUIRE_THROWS_AS(cuda::plan_decode_attention(4, 1, 80, 100, 132), Error);
}
