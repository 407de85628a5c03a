// `topkv bench gpu-ops --only attention` (and a group of the full run): the
// decode attention (T = 1) kernels side by side, v2 (one 16-warp block per
// SM) and v3 (a wave of 4-warp blocks), at 4K..512K keys for the Llama-3-8B
// (32/8 x 128), Gemma 3 (4/1 x 256; global layers, and a local layer's
// 512-key window) and Qwen2.5-1.5B (12/2 x 128) geometries, f16 caches, in
// GB/s of cache read and % of the copy row. Two timings per row:
//   "... eager"  one call between CUDA events: what an op-by-op step pays,
//                host launch latency included (it dominates the small rows);
//   "... graph"  20 calls recorded in one CUDA graph, the replay's time / 20:
//                device time per call with the launch gaps of a recorded
//                decode step, no host in it.
// The calls rotate over copies of the cache adding up to > 256 MB, so no
// row is served from L2 (a model's layers each read their own cache).
// Last, v3 at forced split counts (half and twice its plan; rows "v3 ...
// S=<splits> graph") for the 32K rows: which way the split count should
// move if a row misses.
#ifdef TOPKV_HAVE_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "bench/gpu_bench_util.h"
#include "gpu/cuda_kernels.h"

namespace topkv::bench {
namespace {

constexpr int kGraphCalls = 20;

struct DecodeCase {
  std::string name;
  int n_head, n_kv, hd;
  int64_t keys;
  int64_t window = 0;  // a local layer: the cache is a ring of `keys` slots
};

// The copies of one geometry's cache and the call's arguments.
struct DecodeBench {
  std::vector<Buffer> k, v;
  Buffer q, out, ws;
  cuda::DecodeAttentionArgs args;
  double bytes = 0;  // the visible keys' K and V
};

DecodeBench make_bench(CudaBackend& be, const DecodeCase& c, size_t ws_bytes) {
  DecodeBench b;
  const DType dt = DType::F16;
  const size_t half = (size_t)c.n_kv * c.keys * c.hd * dtype_size(dt);  // K (or V) of one copy
  const int copies = (int)std::clamp<size_t>((size_t{256} << 20) / (2 * half) + 1, 1, 256);
  b.k.push_back(random_device(be, dt, half / dtype_size(dt), 3, 1.f));
  b.v.push_back(random_device(be, dt, half / dtype_size(dt), 4, 1.f));
  for (int i = 1; i < copies; ++i)
    for (auto* vec : {&b.k, &b.v}) {
      vec->push_back(be.alloc(half));
      TOPKV_CUDA_CHECK(cudaMemcpyAsync(vec->back().mem.get(), vec->front().mem.get(), half,
                                       cudaMemcpyDeviceToDevice, be.stream()));
    }
  be.synchronize();
  b.q = random_device(be, DType::F32, (size_t)c.n_head * c.hd, 5, 1.f);
  b.out = be.alloc((size_t)c.n_head * c.hd * sizeof(float));
  b.ws = be.alloc(std::max<size_t>(ws_bytes, 16));
  auto& a = b.args;
  a.q = b.q.f32(), a.out = b.out.f32(), a.kv_type = dt;
  a.n_head = c.n_head, a.n_kv = c.n_kv, a.head_dim = c.hd;
  a.capacity = c.keys, a.window = c.window, a.scale = 1.f / std::sqrt((float)c.hd);
  a.pos = c.window > 0 ? 5 * c.keys + 3 : c.keys - 1;  // a local layer's ring has wrapped
  b.bytes = 2.0 * (double)half;
  return b;
}

// Median us per call: one call between events, or a replayed graph of kGraphCalls.
double time_eager(EventTimer& tm, int reps, DecodeBench& b, const cuda::DecodeAttentionPlan& p, cudaStream_t s) {
  size_t i = 0;
  return tm.median_us(reps, [&] {
    b.args.k = b.k[i % b.k.size()].mem.get(), b.args.v = b.v[i % b.v.size()].mem.get(), ++i;
    cuda::decode_attention(b.args, p, b.ws.mem.get(), s);
  });
}
double time_graph(EventTimer& tm, int reps, DecodeBench& b, const cuda::DecodeAttentionPlan& p, cudaStream_t s) {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  TOPKV_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  try {
    for (int i = 0; i < kGraphCalls; ++i) {
      b.args.k = b.k[i % b.k.size()].mem.get(), b.args.v = b.v[i % b.v.size()].mem.get();
      cuda::decode_attention(b.args, p, b.ws.mem.get(), s);
    }
  } catch (...) {
    cudaStreamEndCapture(s, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  TOPKV_CUDA_CHECK(cudaStreamEndCapture(s, &graph));
  TOPKV_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  const double us = tm.median_us(reps, [&] { TOPKV_CUDA_CHECK(cudaGraphLaunch(exec, s)); });
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  return us / kGraphCalls;
}

}  // namespace

void bench_decode_attention(CudaBackend& be, EventTimer& tm, Report& rep, int reps, bool quick) {
  std::vector<DecodeCase> cases;
  const std::pair<const char*, int64_t> ctxs[] = {{"4k", 4096}, {"32k", 32768}, {"128k", 131072}, {"512k", 524288}};
  struct Geom {
    const char* name;
    int n_head, n_kv, hd;
  };
  const Geom geoms[] = {{"llama8b 32/8x128", 32, 8, 128}, {"gemma270m 4/1x256", 4, 1, 256},
                        {"qwen2.5-1.5b 12/2x128", 12, 2, 128}};
  for (const Geom& g : geoms) {
    if (quick && g.n_kv == 2) continue;
    for (const auto& [cn, keys] : ctxs) {
      if (quick && keys > 32768) continue;
      cases.push_back({fmt::format("{} f16 ctx {}", g.name, cn), g.n_head, g.n_kv, g.hd, keys});
    }
    if (g.n_kv == 1) cases.push_back({fmt::format("{} f16 window 512", g.name), g.n_head, g.n_kv, g.hd, 512, 512});
  }
  const cuda::DecodeKernel kernels[] = {cuda::DecodeKernel::V2, cuda::DecodeKernel::V3};
  const int sms = be.sm_count();
  for (const DecodeCase& c : cases) {
    auto plan_of = [&](cuda::DecodeKernel k, int sm) {
      return cuda::plan_decode_attention(c.n_head, c.n_kv, c.hd, c.window > 0 ? c.window : c.keys, sm, k);
    };
    const bool sweep = c.keys == 32768 && c.window == 0;
    size_t ws = 0;
    for (auto k : kernels) ws = std::max(ws, plan_of(k, sms).workspace_bytes);
    if (sweep) ws = std::max(ws, plan_of(cuda::DecodeKernel::V3, 2 * sms).workspace_bytes);
    DecodeBench b = make_bench(be, c, ws);
    std::string plans;
    for (auto k : kernels) {
      const auto p = plan_of(k, sms);
      plans += fmt::format("{}{}: {} splits x {} blocks, {}/SM", plans.empty() ? "" : "; ", cuda::decode_kernel_name(k),
                           p.n_splits, c.n_kv * p.row_tiles, p.blocks_per_sm);
    }
    rep.note("attention", fmt::format("decode {} plans", c.name), fmt::format("{}; {} cache copies", plans, b.k.size()));
    for (auto k : kernels) {
      const auto p = plan_of(k, sms);
      const char* kn = cuda::decode_kernel_name(k);
      rep.add("attention", fmt::format("{} {} eager", kn, c.name), time_eager(tm, reps, b, p, be.stream()), b.bytes, 0);
      rep.add("attention", fmt::format("{} {} graph", kn, c.name), time_graph(tm, reps, b, p, be.stream()), b.bytes, 0);
    }
    if (sweep)
      for (int sm : {sms / 2, 2 * sms}) {
        const auto p = plan_of(cuda::DecodeKernel::V3, sm);
        rep.add("attention", fmt::format("v3 {} S={} graph", c.name, p.n_splits),
                time_graph(tm, reps, b, p, be.stream()), b.bytes, 0);
      }
  }
}

}  // namespace topkv::bench
#endif
