// `topkv bench gpu-ops` group "quant" (--only quant: this group after the
// copy row): products on quantised weights kept in the file's blocks
// (gpu/cuda_quant.h) at the Llama-3-8B shapes (Q4_K and Q6_K) and the Gemma 3
// 270M ones (Q8_0):
//   quant gemv      T = 1, 2, 4, 8: q8_1 quantisation of x + the MMVQ launch,
//                   as CudaBackend::matmul queues them, for the old and the
//                   new kernel side by side (rows "... old", "... new": one
//                   call between events, so the host's two launches are in
//                   the time); then the device time per call when 8-256
//                   calls run in one CUDA graph as a recorded decode step
//                   runs them ("... old graph", "... new graph"), and the new
//                   GEMV alone on activations already quantised ("... new
//                   graph, GEMV alone": the product once a fused norm kernel
//                   writes the q8_1 activations); each with one activation
//                   term and with two ("T=1 x2 ...", q8_1x2, quant_units.h).
//                   GB/s of the weight's bytes, against the fp16 GEMV (cuBLAS
//                   at T = 8) beside it;
//   quant group     q/k/v (and gate/up) of one input in one launch (the new
//                   kernel through matmul_group, and the old kernel, both
//                   with the backend's activation terms) against the same
//                   products as separate matmuls;
//   quant prefill   T = 512: dequantise to fp16 (row tiles of <= 256 MiB) +
//                   cuBLAS, in TFLOP/s, beside the fp16 cuBLAS GEMM alone, and
//                   the dequantisation alone in GB/s (read + write).
// Weights rotate over copies larger than L2, as the decode step streams them.
#ifdef TOPKV_HAVE_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_bench_util.h"
#include "gpu/cuda_kernels.h"
#include "gpu/cuda_quant.h"
#include "gpu/quant_matvec_ref.h"
#include "src/model/ggml_types.h"

namespace topkv::bench {

namespace {

struct QuantShape {
  std::string name;
  int64_t rows, cols;
  GgmlType type;
  bool prefill;  // also time T = 512
};

// A rows x cols matrix of type t in the file's layout: a quantised tile of
// random rows, repeated.
std::vector<uint8_t> random_file_matrix(GgmlType t, int64_t rows, int64_t cols, uint32_t seed) {
  const size_t rb = ggml_row_bytes(t, cols);
  const int64_t tile = std::min<int64_t>(rows, 64);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 0.05f);
  std::vector<float> row((size_t)cols);
  std::vector<uint8_t> m(rb * (size_t)rows);
  for (int64_t r = 0; r < tile; ++r) {
    for (auto& v : row) v = nd(rng);
    quantize_row(t, row.data(), m.data() + rb * (size_t)r, cols);
  }
  for (int64_t r = tile; r < rows; r += tile)
    std::memcpy(m.data() + rb * (size_t)r, m.data(), rb * (size_t)std::min(tile, rows - r));
  return m;
}

// `copies` device copies of one matrix (together larger than L2).
struct Copies {
  std::vector<uint8_t> host;
  std::vector<Weight> w;
  size_t bytes = 0;  // of one copy on the device
};
Copies prepare_copies(CudaBackend& be, GgmlType t, int64_t rows, int64_t cols, WeightMode mode, uint32_t seed) {
  Copies c;
  c.host = random_file_matrix(t, rows, cols, seed);
  Weight src;
  src.name = fmt::format("bench_{}_{}x{}", ggml_type_name((uint32_t)t), rows, cols);
  src.type = t, src.rows = rows, src.cols = cols, src.data = c.host.data(), src.row_bytes = ggml_row_bytes(t, cols);
  c.bytes = be.prepared_weight_bytes(src, mode);
  const size_t l2_beat = size_t{256} << 20;
  const int n = (int)std::clamp<size_t>((l2_beat + c.bytes - 1) / c.bytes, 1, 256);
  for (int i = 0; i < n; ++i) c.w.push_back(be.prepare_weight(src, mode));
  return c;
}

void bench_shape(CudaBackend& be, EventTimer& tm, Report& rep, int reps, const QuantShape& s) {
  const char* tn = ggml_type_name((uint32_t)s.type).data();
  const int t_max = s.prefill ? 512 : cuda::kQuantGemvMaxTokens;
  Buffer x = random_device(be, DType::F32, (size_t)t_max * s.cols, 2, 1.f);
  Buffer y = be.alloc((size_t)t_max * s.rows * sizeof(float));
  {
    Copies q = prepare_copies(be, s.type, s.rows, s.cols, WeightMode::Quant, 7);
    Buffer ws = be.alloc(cuda::q8_activation_bytes(cuda::kQuantGemvMaxTokens, s.cols, qunits::kQ8MaxTerms));
    // Enough calls per graph that the weights they read exceed L2 (the copies rotate).
    const int graph_calls = (int)std::max<size_t>(8, q.w.size());
    for (int terms = 1; terms <= qunits::kQ8MaxTerms; ++terms)  // q8_1, then q8_1x2 (quant_units.h)
      for (int T : {1, 2, 4, 8}) {
        const double flops = 2.0 * T * s.rows * s.cols;
        const std::string x8 = terms == 2 ? " x2" : "";
        size_t i = 0;
        auto call = [&](cuda::MmvqKernel k, bool quantise) {
          const Weight& w = q.w[i++ % q.w.size()];
          if (quantise) cuda::quantize_q8_1(x.f32(), T, s.cols, ws.mem.get(), be.stream(), terms);
          cuda::QuantGemvJob job;
          job.type = w.type, job.w = w.data, job.rows = w.rows, job.y = y.f32();
          cuda::quant_gemv(&job, 1, s.cols, T, ws.mem.get(), be.stream(), cuda::MmvqOptions{k, 0, terms});
        };
        for (cuda::MmvqKernel k : {cuda::MmvqKernel::Old, cuda::MmvqKernel::New}) {
          const double us = tm.median_us(reps, [&] { call(k, true); });
          rep.add("quant", fmt::format("gemv {} {} T={}{} {}", s.name, tn, T, x8, cuda::mmvq_kernel_name(k)), us,
                  (double)q.bytes, flops);
        }
        for (cuda::MmvqKernel k : {cuda::MmvqKernel::Old, cuda::MmvqKernel::New}) {
          const double us = tm.graph_us(graph_calls, reps, [&] { call(k, true); });
          rep.add("quant", fmt::format("gemv {} {} T={}{} {} graph", s.name, tn, T, x8, cuda::mmvq_kernel_name(k)),
                  us, (double)q.bytes, flops);
        }
        const double alone = tm.graph_us(graph_calls, reps, [&] { call(cuda::MmvqKernel::New, false); });
        rep.add("quant", fmt::format("gemv {} {} T={}{} new graph, GEMV alone", s.name, tn, T, x8), alone,
                (double)q.bytes, flops);
      }
    if (s.prefill) {
      const int T = 512;
      size_t i = 0;
      const double us =
          tm.median_us(std::max(3, reps / 5), [&] { be.matmul(x.f32(), q.w[i++ % q.w.size()], T, y.f32()); });
      rep.add("quant", fmt::format("prefill {} {} T={} (dequant + cuBLAS)", s.name, tn, T), us, (double)q.bytes,
              2.0 * T * s.rows * s.cols);
      void* out = be.scratch(CudaBackend::Scratch::Dequant, (size_t)s.rows * s.cols * 2);
      i = 0;
      const double dq = tm.median_us(reps, [&] {
        const Weight& w = q.w[i++ % q.w.size()];
        cuda::dequant_16bit(w.type, w.data, w.rows, w.cols, 0, w.rows, DType::F16, out, be.stream());
      });
      rep.add("quant", fmt::format("dequant {} {} to fp16", s.name, tn), dq, (double)q.bytes + 2.0 * s.rows * s.cols,
              0);
    }
  }
  // The fp16 weight of the same shape: GEMV (cuBLAS at T = 8) and the prefill GEMM.
  Copies f = prepare_copies(be, s.type, s.rows, s.cols, WeightMode::F16, 7);
  for (int T : {1, 2, 4, 8}) {
    size_t i = 0;
    const double us = tm.median_us(reps, [&] { be.matmul(x.f32(), f.w[i++ % f.w.size()], T, y.f32()); });
    rep.add("quant", fmt::format("gemv {} f16 T={}{}", s.name, T, T > cuda::kGemvMaxTokens ? " cuBLAS" : ""), us,
            (double)f.bytes, 2.0 * T * s.rows * s.cols);
  }
  if (s.prefill) {
    size_t i = 0;
    const double us =
        tm.median_us(std::max(3, reps / 5), [&] { be.matmul(x.f32(), f.w[i++ % f.w.size()], 512, y.f32()); });
    rep.add("quant", fmt::format("prefill {} f16 T=512 cuBLAS", s.name), us, (double)f.bytes,
            2.0 * 512 * s.rows * s.cols);
  }
}

// q/k/v (or gate/up) of one input: one matmul_group launch against separate matmuls.
void bench_group(CudaBackend& be, EventTimer& tm, Report& rep, int reps, const std::string& name, GgmlType t,
                 int64_t cols, const std::vector<int64_t>& rows) {
  std::vector<Copies> ws;
  std::vector<Buffer> ys;
  double bytes = 0;
  for (size_t j = 0; j < rows.size(); ++j) {
    ws.push_back(prepare_copies(be, t, rows[j], cols, WeightMode::Quant, 11 + (uint32_t)j));
    ys.push_back(be.alloc((size_t)cuda::kQuantGemvMaxTokens * rows[j] * sizeof(float)));
    bytes += (double)ws.back().bytes;
  }
  Buffer x = random_device(be, DType::F32, (size_t)cuda::kQuantGemvMaxTokens * cols, 3, 1.f);
  const size_t n = std::min_element(ws.begin(), ws.end(), [](auto& a, auto& b) { return a.w.size() < b.w.size(); })
                       ->w.size();
  const int terms = be.q8_terms();  // what matmul_group uses
  Buffer q8 = be.alloc(cuda::q8_activation_bytes(cuda::kQuantGemvMaxTokens, cols, terms));
  for (int T : {1, 4}) {
    size_t i = 0;
    const double grouped = tm.median_us(reps, [&] {
      std::vector<MatmulJob> jobs;
      for (size_t j = 0; j < ws.size(); ++j) jobs.push_back(MatmulJob{&ws[j].w[i % n], ys[j].f32(), {}});
      ++i;
      be.matmul_group(x.f32(), T, jobs);
    });
    i = 0;
    const double grouped_old = tm.median_us(reps, [&] {  // what matmul_group queues, on the old kernel
      cuda::QuantGemvJob jobs[cuda::kQuantGroupMaxJobs];
      for (size_t j = 0; j < ws.size(); ++j) {
        const Weight& w = ws[j].w[i % n];
        jobs[j].type = w.type, jobs[j].w = w.data, jobs[j].rows = w.rows, jobs[j].y = ys[j].f32();
      }
      ++i;
      cuda::quantize_q8_1(x.f32(), T, cols, q8.mem.get(), be.stream(), terms);
      cuda::quant_gemv(jobs, (int)ws.size(), cols, T, q8.mem.get(), be.stream(),
                       cuda::MmvqOptions{cuda::MmvqKernel::Old, 0, terms});
    });
    i = 0;
    const double separate = tm.median_us(reps, [&] {
      for (size_t j = 0; j < ws.size(); ++j) be.matmul(x.f32(), ws[j].w[i % n], T, ys[j].f32());
      ++i;
    });
    double flops = 0;
    for (int64_t r : rows) flops += 2.0 * T * r * cols;
    rep.add("quant", fmt::format("group {} {} T={} (one launch)", name, ggml_type_name((uint32_t)t), T), grouped,
            bytes, flops);
    rep.add("quant", fmt::format("group {} {} T={} (one launch, old)", name, ggml_type_name((uint32_t)t), T),
            grouped_old, bytes, flops);
    rep.add("quant", fmt::format("group {} {} T={} (separate)", name, ggml_type_name((uint32_t)t), T), separate,
            bytes, flops);
  }
}

}  // namespace

void bench_quant_matmul(CudaBackend& be, EventTimer& tm, Report& rep, int reps, bool quick) {
  std::vector<QuantShape> shapes;
  for (GgmlType t : {GgmlType::Q4_K, GgmlType::Q6_K}) {
    shapes.push_back({"llama8b gate/up 14336x4096", 14336, 4096, t, true});
    if (quick) continue;
    shapes.push_back({"llama8b q/o 4096x4096", 4096, 4096, t, true});
    shapes.push_back({"llama8b k/v 1024x4096", 1024, 4096, t, true});
    shapes.push_back({"llama8b down 4096x14336", 4096, 14336, t, true});
    shapes.push_back({"llama8b lm_head 128256x4096", 128256, 4096, t, false});
  }
  shapes.push_back({"gemma270m lm_head 262144x640", 262144, 640, GgmlType::Q8_0, false});
  if (!quick)
    for (const QuantShape& s : {QuantShape{"gemma270m q 1024x640", 1024, 640, GgmlType::Q8_0, false},
                                QuantShape{"gemma270m k/v 256x640", 256, 640, GgmlType::Q8_0, false},
                                QuantShape{"gemma270m o 640x1024", 640, 1024, GgmlType::Q8_0, false},
                                QuantShape{"gemma270m gate/up 2048x640", 2048, 640, GgmlType::Q8_0, true},
                                QuantShape{"gemma270m down 640x2048", 640, 2048, GgmlType::Q8_0, false}})
      shapes.push_back(s);
  for (const QuantShape& s : shapes) bench_shape(be, tm, rep, reps, s);
  bench_group(be, tm, rep, reps, "llama8b q/k/v", GgmlType::Q4_K, 4096, {4096, 1024, 1024});
  bench_group(be, tm, rep, reps, "llama8b gate/up", GgmlType::Q4_K, 4096, {14336, 14336});
  bench_group(be, tm, rep, reps, "gemma270m q/k/v", GgmlType::Q8_0, 640, {1024, 256, 256});
}

}  // namespace topkv::bench
#endif  // TOPKV_HAVE_CUDA
