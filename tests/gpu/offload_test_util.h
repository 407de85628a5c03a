// The GPU offload runtime tests' shared drive (tests/gpu/test_gpu_offload.cpp,
// test_gpu_search.cpp): the same random context and decode steps through a CPU
// runtime and a device one, compared step by step.
#pragma once
#include <cmath>
#include <random>
#include <vector>

#include "gpu/cuda_backend_impl.h"
#include "offload/offload_runtime.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/test_util.h"

namespace topkv::test {

// Rounds v through store type t (the values a store of type t holds exactly;
// for q8_0, v.size() a multiple of 32).
inline void round_through(DType t, std::vector<float>& v) { v = through_store(t, v.data(), 1, v.size()); }

// A random context of n tokens on each of cfg's layers (keys with a shared
// offset, as real keys have), per layer [kv][n][hd]. f16_exact: keys and
// values are rounded to f16 values, so that rows the device attends from its
// fp32 ring equal the CPU's f16 store rows.
struct RandomContext {
  std::vector<std::vector<float>> k, v;
  int64_t n = 0;
  int head_dim = 0;
  KvReader reader() const { return whole_context_reader(k, v, n, head_dim); }
};
inline RandomContext random_context(const ModelConfig& cfg, int64_t n, bool f16_exact, std::mt19937& rng) {
  RandomContext c;
  c.n = n, c.head_dim = cfg.head_dim;
  c.k.resize((size_t)cfg.n_layer), c.v.resize((size_t)cfg.n_layer);
  for (int il = 0; il < cfg.n_layer; ++il) {
    c.k[(size_t)il] = randn((size_t)cfg.n_head_kv * n * cfg.head_dim, rng, 1.f, 0.3f);
    c.v[(size_t)il] = randn(c.k[(size_t)il].size(), rng);
    if (f16_exact) round_through(DType::F16, c.k[(size_t)il]), round_through(DType::F16, c.v[(size_t)il]);
  }
  return c;
}

// `steps` decode steps through both runtimes, which hold the same n tokens.
inline void compare_decode_steps(OffloadRuntime& ref, OffloadRuntime& got, const ModelConfig& cfg, int64_t n,
                                 int steps, bool f16_exact, OpSummary& sum, std::mt19937& rng) {
  Backend& be = gpu();
  const int kv = cfg.n_head_kv, hd = cfg.head_dim;
  auto draw_kv = [&](size_t count, std::vector<float>& k, std::vector<float>& v) {
    k = randn(count, rng, 1.f, 0.3f), v = randn(count, rng);
    if (f16_exact) round_through(DType::F16, k), round_through(DType::F16, v);
  };
  const size_t qn = (size_t)cfg.n_head * hd, kn = (size_t)kv * hd;
  Buffer dq = be.alloc(qn * 4), dk = be.alloc(kn * 4), dv = be.alloc(kn * 4), dout = be.alloc(qn * 4);
  const float scale = 1.f / std::sqrt((float)hd);
  for (int step = 0; step < steps; ++step)
    for (int il = 0; il < cfg.n_layer; ++il) {
      CAPTURE(step, il);
      const auto q = randn(qn, rng, 1.5f);
      std::vector<float> k, v;
      draw_kv(kn, k, v);
      std::vector<float> want(qn);
      ref.decode_attention(il, q.data(), k.data(), v.data(), n + step, scale, want.data());
      be.from_host(q.data(), dq, 0, qn * 4), be.from_host(k.data(), dk, 0, kn * 4), be.from_host(v.data(), dv, 0, kn * 4);
      got.decode_attention_device(il, dq.f32(), dk.f32(), dv.f32(), n + step, scale, dout.f32());
      sum.check(rel_err(download(be, dout, qn), want));
    }
  CHECK(got.stats().steps == ref.stats().steps);
}

// Gives `ref` (CPU runtime) and `got` (on the device) the same random context
// of n tokens, then `steps` decode steps of random q, k, v on every layer; each
// step's output difference goes to `sum`.
inline void compare_offload_steps(OffloadRuntime& ref, OffloadRuntime& got, const ModelConfig& cfg, int64_t n,
                                  int steps, bool f16_exact, OpSummary& sum) {
  std::mt19937 rng(7);
  const RandomContext ctx = random_context(cfg, n, f16_exact, rng);
  ref.take_context(n, ctx.reader());
  got.take_context(n, ctx.reader());
  compare_decode_steps(ref, got, cfg, n, steps, f16_exact, sum, rng);
}

}  // namespace topkv::test
