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

namespace topkv::test {

// Rounds v through element type t (the values a store of type t holds exactly).
inline void round_through(DType t, std::vector<float>& v) {
  std::vector<uint8_t> raw(v.size() * dtype_size(t));
  from_f32(t, v.data(), raw.data(), v.size());
  to_f32(t, raw.data(), v.data(), v.size());
}

// Gives `ref` (CPU runtime) and `got` (on the device) the same random context
// of n tokens on each of cfg's layers (keys with a shared offset, as real keys
// have), then `steps` decode steps of random q, k, v on every layer; each
// step's output difference goes to `sum`. f16_exact: keys and values are
// rounded to f16 values, so that rows the device attends from its fp32 ring
// equal the CPU's f16 store rows.
inline void compare_offload_steps(OffloadRuntime& ref, OffloadRuntime& got, const ModelConfig& cfg, int64_t n,
                                  int steps, bool f16_exact, OpSummary& sum) {
  Backend& be = gpu();
  const int kv = cfg.n_head_kv, hd = cfg.head_dim;
  std::mt19937 rng(7);
  auto draw_kv = [&](size_t count, std::vector<float>& k, std::vector<float>& v) {
    k = randn(count, rng, 1.f, 0.3f), v = randn(count, rng);
    if (f16_exact) round_through(DType::F16, k), round_through(DType::F16, v);
  };
  std::vector<std::vector<float>> ctx_k((size_t)cfg.n_layer), ctx_v((size_t)cfg.n_layer);  // [kv][n][hd]
  for (int il = 0; il < cfg.n_layer; ++il) draw_kv((size_t)kv * n * hd, ctx_k[(size_t)il], ctx_v[(size_t)il]);
  auto reader = [&](int il, std::vector<float>& k, std::vector<float>& v) { k = ctx_k[(size_t)il], v = ctx_v[(size_t)il]; };
  ref.take_context(n, reader);
  got.take_context(n, reader);
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

}  // namespace topkv::test
