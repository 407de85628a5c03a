// topkv bench gpu-ops: times the CUDA backend's kernels at the shapes of real
// models and sets each against its ceiling (METHOD.md: "two numbers first"):
//   copy         device-to-device memcpy, read + write bytes: the measured
//                bandwidth ceiling every memory-bound row is compared with;
//   gemv / gemm  the decode GEMV (T <= 4) against cuBLAS at the same shapes
//                (Llama-3-8B and Gemma-3-270M projections), prefill GEMMs in
//                TFLOP/s; weights rotate over copies larger than L2;
//   quant        products on the file's quantised blocks: the MMVQ (T = 1..8)
//                beside the fp16 GEMV, grouped q/k/v launches, the
//                dequantised prefill (--only quant: this group alone,
//                bench/gpu_quant_bench.cpp);
//   attention    decode (T = 1, split-KV), the v2 and v3 kernels side by side
//                over 4k..512k-token f16 caches in GB/s of cache read, eager
//                and in a CUDA graph (--only attention: this group alone,
//                bench/gpu_decode_attn_bench.cpp); prefill chunks (T = 512)
//                in TFLOP/s;
//   prefill      prefill attention at 32k / 128k contexts, the fp32 kernel
//                against the tensor-core one (--only prefill: this group alone);
//   search       the device search's steps at the 1M Gemma / 512K Llama
//                shapes (--only search: this group alone, after the copy row);
//   kmeans       the GPU k-means engine (--build-on gpu) on one block of a
//                multipole build, alone and shared by 16 threads (--only
//                kmeans: this group alone, bench/gpu_kmeans_bench.cpp);
//   bounds       Quest's page bounds of one 8B KV head at 512K: the GPU
//                engine (--build-on gpu) and the host twin on one thread
//                (--only bounds: this group alone, bench/gpu_bounds_bench.cpp);
//   rows         the retrieved rows' attention (row-list kernel) at the
//                Llama-3-8B decode shape per host store type (f16, f8, q8_0),
//                rows over PCIe and on the device (--only rows: this group
//                alone, after the copy row; bench/gpu_rows_bench.cpp);
//   small ops    rms_norm, rope, glu, add, kv_write, embed, argmax, sampling
//                at decode (T=1) and prefill (T=512) sizes;
//   model        synthetic presets (--synth, default gemma3-270m and 4 layers
//                of llama3-8b) and --model FILE: prefill, and the decode step
//                op by op, as a CUDA graph, and as a graph with the greedy
//                pick on the device (bench/gpu_model_bench.cpp).
// Every time is the median of --reps runs between CUDA events after 3
// warm-ups. One "BENCH" line per row on stdout (scripts/gpu-check.sh prints
// them last) and one JSON object per row in --out.
#include "bench/gpu_ops_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "src/common/error.h"

#ifdef TOPKV_HAVE_CUDA
#include <nlohmann/json.hpp>

#include "bench/gpu_bench_util.h"
#include "bench/gpu_model_bench.h"
#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"
#include "src/common/options.h"
#include "src/common/timer.h"
#include "src/model/model.h"
#endif

namespace topkv::bench {
namespace {

#ifdef TOPKV_HAVE_CUDA
struct Shape {
  std::string name;
  int64_t rows, cols;
};

void bench_matmul(CudaBackend& be, EventTimer& tm, Report& rep, const GpuOpsArgs& a) {
  std::vector<Shape> shapes = {{"llama8b q/o 4096x4096", 4096, 4096},     {"llama8b k/v 1024x4096", 1024, 4096},
                               {"llama8b gate/up 14336x4096", 14336, 4096}, {"llama8b down 4096x14336", 4096, 14336},
                               {"llama8b lm_head 128256x4096", 128256, 4096}, {"gemma270m q 1024x640", 1024, 640},
                               {"gemma270m gate/up 2048x640", 2048, 640},    {"gemma270m down 640x2048", 640, 2048},
                               {"gemma270m lm_head 262144x640", 262144, 640}};
  if (a.quick) shapes.resize(3);
  const size_t l2_beat = size_t{256} << 20;  // rotate weights over more than any L2
  for (const Shape& s : shapes)
    for (DType wt : {DType::F16, DType::BF16}) {
      const bool main_shape = s.rows == 14336 && s.cols == 4096;
      if (wt == DType::BF16 && !main_shape) continue;
      const size_t wbytes = (size_t)s.rows * s.cols * 2;
      const int copies = (int)std::clamp<size_t>((l2_beat + wbytes - 1) / wbytes, 1, 256);
      const int t_max = s.rows > 20000 ? 4 : 512;  // lm_head is projected for a few rows only
      Buffer w = random_device(be, wt, (size_t)copies * s.rows * s.cols, 1);
      Buffer x = random_device(be, DType::F32, (size_t)t_max * s.cols, 2, 1.f);
      Buffer y = be.alloc((size_t)t_max * s.rows * sizeof(float));
      void* ws = be.scratch(CudaBackend::Scratch::Cast, cuda::gemm_workspace_bytes(s.cols, t_max));
      const char* tn = wt == DType::F16 ? "f16" : "bf16";
      for (int T : {1, 2, 4}) {
        if (T > 1 && !main_shape) continue;
        int i = 0;
        const double us = tm.median_us(a.reps, [&] {
          cuda::gemv(wt, w.as<uint8_t>() + (size_t)(i++ % copies) * wbytes, s.rows, s.cols, x.f32(), T, y.f32(),
                     be.stream());
        });
        rep.add("gemv", fmt::format("{} {} T={}", s.name, tn, T), us, (double)wbytes, 2.0 * T * s.rows * s.cols);
      }
      for (int T : {1, 4, 512}) {
        if (T == 4 && !main_shape) continue;
        if (T > t_max) continue;
        int i = 0;
        const double us = tm.median_us(a.reps, [&] {
          cuda::gemm(be.cublas(), wt, w.as<uint8_t>() + (size_t)(i++ % copies) * wbytes, s.rows, s.cols, x.f32(), T,
                     y.f32(), ws, be.cublas_scalars(), be.stream());
        });
        rep.add(T == 512 ? "gemm" : "gemv", fmt::format("{} {} T={} cuBLAS", s.name, tn, T), us,
                (double)wbytes + (double)T * s.cols * 4, 2.0 * T * s.rows * s.cols);
      }
    }
}

struct AttnGeom {
  std::string name;
  int n_head, n_kv, hd;
  int64_t ctx;
  DType dt;
};

// Prefill chunks (T = 512) at the end of the cache through the backend (the
// decode rows are bench_decode_attention's).
void bench_attention(CudaBackend& be, EventTimer& tm, Report& rep, const GpuOpsArgs& a) {
  std::vector<AttnGeom> geoms = {{"llama8b 32/8x128 f16 ctx 4k", 32, 8, 128, 4096, DType::F16},
                                 {"llama8b 32/8x128 f16 ctx 32k", 32, 8, 128, 32768, DType::F16},
                                 {"llama8b 32/8x128 f16 ctx 128k", 32, 8, 128, 131072, DType::F16},
                                 {"llama8b 32/8x128 f32 ctx 32k", 32, 8, 128, 32768, DType::F32},
                                 {"gemma270m 4/1x256 f16 ctx 32k", 4, 1, 256, 32768, DType::F16},
                                 {"gemma270m 4/1x256 f16 window 512", 4, 1, 256, 512, DType::F16}};
  if (a.quick) geoms.resize(1);
  for (const AttnGeom& g : geoms) {
    KvLayerCache c = be.alloc_kv(g.n_kv, g.hd, g.ctx, g.dt);
    fill_random(be, c.k, g.dt, 3);
    fill_random(be, c.v, g.dt, 4);
    const float scale = 1.f / std::sqrt((float)g.hd);
    const int T = 512;
    Buffer q = random_device(be, DType::F32, (size_t)T * g.n_head * g.hd, 5, 1.f);
    Buffer out = be.alloc((size_t)T * g.n_head * g.hd * sizeof(float));
    const int64_t pos0 = g.ctx - T;
    const double us = tm.median_us(a.reps, [&] { be.attention(q.f32(), T, g.n_head, pos0, c, 0, scale, out.f32()); });
    double keys = 0;  // (query, visible key) pairs per head
    for (int t = 0; t < T; ++t) keys += (double)(pos0 + t + 1);
    const double cache_bytes = 2.0 * g.ctx * g.n_kv * g.hd * dtype_size(g.dt);
    rep.add("attention", fmt::format("{} T={}", g.name, T), us, cache_bytes, 4.0 * g.hd * g.n_head * keys);
  }
}

void bench_small_ops(CudaBackend& be, EventTimer& tm, Report& rep, const GpuOpsArgs& a) {
  const int d = 4096, ff = 14336, nh = 32, nkv = 8, hd = 128;
  for (int T : {1, 512}) {
    Buffer x = random_device(be, DType::F32, (size_t)T * ff, 6, 1.f), u = random_device(be, DType::F32, (size_t)T * ff, 7, 1.f);
    Buffer y = be.alloc((size_t)T * ff * sizeof(float));
    std::vector<float> g(d, 1.f);
    Weight hw;
    hw.name = "bench_norm", hw.type = GgmlType::F32, hw.rows = 1, hw.cols = d;
    hw.data = reinterpret_cast<const uint8_t*>(g.data()), hw.row_bytes = d * sizeof(float);
    const Weight norm = be.prepare_weight(hw, WeightMode::Quant);
    const double n_d = (double)T * d * 4, n_ff = (double)T * ff * 4;
    rep.add("ops", fmt::format("rms_norm {}x{}", T, d), tm.median_us(a.reps, [&] {
      be.rms_norm(x.f32(), norm, T, d, 1e-6f, y.f32());
    }), 2 * n_d, 0);
    RopeParams rp;
    rp.n_rot = hd;
    rep.add("ops", fmt::format("rope q {}x{}x{}", T, nh, hd), tm.median_us(a.reps, [&] {
      be.rope(y.f32(), T, nh, hd, 1000, rp);
    }), 2.0 * T * nh * hd * 4, 0);
    rep.add("ops", fmt::format("glu SiLU {}x{}", T, ff), tm.median_us(a.reps, [&] {
      be.glu(GluKind::SiLU, x.f32(), u.f32(), (int64_t)T * ff, y.f32());
    }), 3 * n_ff, 0);
    rep.add("ops", fmt::format("add {}x{}", T, d), tm.median_us(a.reps, [&] {
      be.add(x.f32(), (int64_t)T * d, y.f32());
    }), 3 * n_d, 0);
    KvLayerCache c = be.alloc_kv(nkv, hd, 4096, DType::F16);
    rep.add("ops", fmt::format("kv_write f16 {}x{}x{}", T, nkv, hd), tm.median_us(a.reps, [&] {
      be.kv_write(c, x.f32(), u.f32(), T, 100);
    }), 2.0 * T * nkv * hd * (4 + 2), 0);
  }
  for (int64_t n : {128256, 262144}) {
    Buffer l = random_device(be, DType::F32, (size_t)n, 8, 3.f);
    auto* out = static_cast<int32_t*>(be.scratch(CudaBackend::Scratch::Sampling, cuda::sampling_workspace_bytes(n) + 64));
    void* ws = out + 16;
    rep.add("sampling", fmt::format("argmax n={}", n), tm.median_us(a.reps, [&] {
      cuda::argmax(l.f32(), n, out, ws, be.stream());
    }), (double)n * 4, 0);
    rep.add("sampling", fmt::format("temperature draw n={}", n), tm.median_us(a.reps, [&] {
      cuda::sample_temperature(l.f32(), n, 0.8f, 0.37, out, ws, be.stream());
    }), 2.0 * n * 4, 0);
  }
}

}  // namespace

void run_gpu_ops(const GpuOpsArgs& a) {
  TOPKV_CHECK(a.reps >= 1, "--reps must be at least 1, got {}", a.reps);
  CudaBackendOptions opt;
  opt.device = a.device;
  auto owner = make_cuda_backend(opt);
  auto& be = dynamic_cast<CudaBackend&>(*owner);
  Report rep(a.out, be.device_name());
  EventTimer tm(be.stream());
  rep.note("device", be.device_name(), fmt::format("{} SMs", be.sm_count()));
  bench::RowSink sink;
  sink.add = [&](const std::string& g, const std::string& n, double us, double b, double f) { rep.add(g, n, us, b, f); };
  sink.note = [&](const std::string& g, const std::string& n, const std::string& t) { rep.note(g, n, t); };
  bench::ModelBenchOptions mo;
  mo.prompt = a.prompt, mo.decode = a.decode;
  mo.weights = parse_weight_mode(a.weights), mo.synth_type = a.synth_type;
  if (a.model_only) {
    TOPKV_CHECK(!a.model.empty(), "--model-only needs --model FILE");
    bench::bench_model_file(be, a.model, "model", mo, sink);
    return;
  }
  if (a.only == "prefill") {
    bench_prefill_attention(be, tm, rep, a.reps, a.quick);
    return;
  }
  if (a.only == "kmeans") {
    bench_kmeans(be, rep, a.reps);
    return;
  }
  if (a.only == "bounds") {
    bench_page_bounds(be, rep, a.reps);
    return;
  }
  {  // the ceiling every "% of copy" is taken against
    const size_t bytes = a.quick ? size_t{256} << 20 : size_t{1} << 30;
    Buffer src = be.alloc(bytes), dst = be.alloc(bytes);
    const double us = tm.median_us(a.reps, [&] {
      TOPKV_CUDA_CHECK(cudaMemcpyAsync(dst.mem.get(), src.mem.get(), bytes, cudaMemcpyDeviceToDevice, be.stream()));
    });
    rep.add("copy", fmt::format("device memcpy {} (read + write)", format_bytes((double)bytes)), us, 2.0 * bytes, 0);
  }
  if (a.only == "rows") {
    bench_row_attention(be, tm, rep, a.reps);
    return;
  }
  if (a.only == "search") {  // after the copy row: each search row's GB/s as a share of it
    bench_device_search(be, tm, rep, a.reps);
    return;
  }
  if (a.only == "quant") {
    bench_quant_matmul(be, tm, rep, a.reps, a.quick);
    return;
  }
  if (a.only == "attention") {
    bench_decode_attention(be, tm, rep, a.reps, a.quick);
    return;
  }
  bench_matmul(be, tm, rep, a);
  bench_quant_matmul(be, tm, rep, a.reps, a.quick);
  bench_decode_attention(be, tm, rep, a.reps, a.quick);
  bench_attention(be, tm, rep, a);
  bench_prefill_attention(be, tm, rep, a.reps, a.quick);
  bench_device_search(be, tm, rep, a.reps);
  bench_kmeans(be, rep, a.reps);
  bench_page_bounds(be, rep, a.reps);
  bench_row_attention(be, tm, rep, a.reps);
  bench_small_ops(be, tm, rep, a);
  // --quick: the small synthetic model only, unless --synth says otherwise.
  const bool default_synth = a.synth == GpuOpsArgs{}.synth;
  bench::bench_synth_models(be, a.quick && default_synth ? "gemma3-270m" : a.synth, mo, sink);
  if (!a.model.empty()) bench::bench_model_file(be, a.model, "model", mo, sink);
}
#else
}  // namespace

void run_gpu_ops(const GpuOpsArgs&) {
  fail("bench gpu-ops needs the CUDA backend, and topkv was built without CUDA");
}
#endif

}  // namespace topkv::bench
