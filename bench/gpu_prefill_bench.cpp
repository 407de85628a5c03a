// `topkv bench gpu-ops --only prefill` (and a group of the full run): prefill
// attention at long contexts, the fp32 kernel (kernels_attention.cu) against
// the tensor-core one (kernels_attention_tc.cu), in TFLOP/s.
#ifdef TOPKV_HAVE_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "bench/gpu_bench_util.h"
#include "gpu/cuda_kernels.h"

namespace topkv::bench {

// Prefill attention, T = 512 and 2048 queries at the end of 32k / 128k-token
// caches, through cuda::attention (the fp32 kernel) and cuda::attention_tc
// (tensor cores) with their own plans; 4 * head_dim flops per (query head,
// visible key). The fp32 rows are slow (up to ~0.3 s a call): each row runs
// as many times as fit in ~0.6 s, at least 3. Last, the 1M-token gemma3-270m
// prefill (3 global layers) that the tensor-core rate implies.
void bench_prefill_attention(CudaBackend& be, EventTimer& tm, Report& rep, int max_reps, bool quick) {
  struct Geom {
    std::string name;
    int n_head, n_kv, hd;
    DType dt;
    bool fp32_too;  // also time the fp32 kernel
  };
  const Geom geoms[] = {{"gemma270m 4/1x256 f16", 4, 1, 256, DType::F16, true},
                        {"llama8b 32/8x128 f16", 32, 8, 128, DType::F16, true},
                        {"gemma270m 4/1x256 f32", 4, 1, 256, DType::F32, false}};
  double gemma_tc_tflops = 0;
  for (const Geom& g : geoms)
    for (int64_t ctx : {int64_t{32768}, int64_t{131072}}) {
      if (quick && ctx > 32768) continue;
      KvLayerCache c = be.alloc_kv(g.n_kv, g.hd, ctx, g.dt);
      fill_random(be, c.k, g.dt, 3);
      fill_random(be, c.v, g.dt, 4);
      for (int T : {512, 2048}) {
        Buffer q = random_device(be, DType::F32, (size_t)T * g.n_head * g.hd, 5, 1.f);
        Buffer out = be.alloc((size_t)T * g.n_head * g.hd * sizeof(float));
        cuda::AttentionArgs args;
        args.q = q.f32(), args.out = out.f32(), args.kv_type = g.dt, args.k = c.k.mem.get(), args.v = c.v.mem.get();
        args.T = T, args.n_head = g.n_head, args.n_kv = g.n_kv, args.head_dim = g.hd;
        args.pos0 = ctx - T, args.capacity = ctx, args.window = 0, args.scale = 1.f / std::sqrt((float)g.hd);
        const double keys = (double)T * (ctx - T) + (double)T * (T + 1) / 2;  // (query, visible key) pairs
        const double flops = 4.0 * g.hd * g.n_head * keys, cache_bytes = 2.0 * ctx * g.n_kv * g.hd * dtype_size(g.dt);
        double us_by[2] = {0, 0};
        for (int tc = g.fp32_too ? 0 : 1; tc < 2; ++tc) {
          const cuda::AttentionPlan plan =
              tc ? cuda::plan_attention_tc(args, be.sm_count()) : cuda::plan_attention(args, be.sm_count());
          void* ws = plan.workspace_bytes ? be.scratch(CudaBackend::Scratch::Attention, plan.workspace_bytes) : nullptr;
          auto run = [&] {
            if (tc)
              cuda::attention_tc(args, plan, ws, be.stream());
            else
              cuda::attention(args, plan, ws, be.stream());
          };
          const double probe = tm.median_us(1, run, 1);
          const int reps = (int)std::clamp(6e5 / std::max(probe, 1.0), 3.0, (double)max_reps);
          us_by[tc] = tm.median_us(reps, run, 0);
          rep.add("prefill", fmt::format("{} ctx {}k T={} {} ({} splits)", g.name, ctx / 1024, T,
                                         tc ? "tensor" : "fp32", plan.n_splits),
                  us_by[tc], cache_bytes, flops);
        }
        if (us_by[0] > 0)
          rep.note("prefill", fmt::format("{} ctx {}k T={}", g.name, ctx / 1024, T),
                   fmt::format("tensor cores {:.1f}x the fp32 kernel", us_by[0] / us_by[1]));
        if (g.hd == 256 && g.dt == DType::F16 && ctx == 131072 && T == 512) gemma_tc_tflops = flops / (us_by[1] * 1e6);
      }
    }
  if (gemma_tc_tflops > 0) {
    // 3 global layers, 4 query heads x 256: sum over 1M queries of their keys.
    const double n = 1048576, flops = 3 * 4.0 * 256 * 4 * n * (n + 1) / 2;
    rep.note("prefill", "gemma270m 1M tokens, 3 global layers",
             fmt::format("{:.1f} s of attention at the 128k T=512 tensor-core rate ({:.0f} TFLOP/s)",
                         flops / (gemma_tc_tflops * 1e12), gemma_tc_tflops));
  }
}

}  // namespace topkv::bench
#endif  // TOPKV_HAVE_CUDA
