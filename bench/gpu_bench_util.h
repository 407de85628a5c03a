// Helpers of the `topkv bench gpu-ops` groups (bench/gpu_ops_bench.cpp,
// bench/gpu_prefill_bench.cpp): event timing with medians, the BENCH line /
// JSON row report, random device buffers. CUDA builds only.
#pragma once
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "src/common/dtype.h"
#include "src/common/error.h"
#include "src/common/timer.h"

namespace topkv::bench {

using cuda::CudaBackend;

// Host wall time of one call of f, in microseconds: for calls that wait for
// their own results (the index build engines), as the build sees them.
template <class F> double wall_us(F&& f) {
  const Timer t;
  f();
  return t.us();
}
// Its median over `reps` calls after `warmups` (buffers grown, pages touched).
template <class F> double wall_median_us(int reps, F&& f, int warmups = 1) {
  for (int i = 0; i < warmups; ++i) f();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) t.push_back(wall_us(f));
  return percentile(t, 50);
}

class EventTimer {
 public:
  explicit EventTimer(cudaStream_t s) : s_(s) {
    TOPKV_CUDA_CHECK(cudaEventCreate(&a_));
    TOPKV_CUDA_CHECK(cudaEventCreate(&b_));
  }
  ~EventTimer() {
    cudaEventDestroy(a_);
    cudaEventDestroy(b_);
  }
  template <class F> double median_us(int reps, F&& f, int warmups = 3) {
    for (int i = 0; i < warmups; ++i) f();
    std::vector<double> t;
    for (int i = 0; i < reps; ++i) {
      TOPKV_CUDA_CHECK(cudaEventRecord(a_, s_));
      f();
      TOPKV_CUDA_CHECK(cudaEventRecord(b_, s_));
      TOPKV_CUDA_CHECK(cudaEventSynchronize(b_));
      float ms = 0;
      TOPKV_CUDA_CHECK(cudaEventElapsedTime(&ms, a_, b_));
      t.push_back(ms * 1e3);
    }
    return percentile(t, 50);
  }
  // Device time per call of f when `calls` of them run back to back in one
  // CUDA graph, as a recorded decode step runs its kernels (no host launch
  // in the time): the median over `reps` replays of the graph / calls. One
  // call runs first, outside the capture (first-use set-up).
  template <class F> double graph_us(int calls, int reps, F&& f) {
    f();
    TOPKV_CUDA_CHECK(cudaStreamSynchronize(s_));
    cudaGraph_t g = nullptr;
    TOPKV_CUDA_CHECK(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed));
    try {
      for (int i = 0; i < calls; ++i) f();
    } catch (...) {
      cudaStreamEndCapture(s_, &g);
      if (g) cudaGraphDestroy(g);
      throw;
    }
    TOPKV_CUDA_CHECK(cudaStreamEndCapture(s_, &g));
    cudaGraphExec_t exec = nullptr;
    const cudaError_t e = cudaGraphInstantiate(&exec, g, 0);
    cudaGraphDestroy(g);
    TOPKV_CUDA_CHECK(e);
    const double us = median_us(reps, [&] { TOPKV_CUDA_CHECK(cudaGraphLaunch(exec, s_)); }, 1);
    TOPKV_CUDA_CHECK(cudaGraphExecDestroy(exec));
    return us / calls;
  }

 private:
  cudaStream_t s_;
  cudaEvent_t a_ = nullptr, b_ = nullptr;
};

class Report {
 public:
  Report(const std::string& path, std::string device) : device_(std::move(device)) {
    if (!path.empty()) {
      out_.open(path);
      TOPKV_CHECK(out_.good(), "cannot write {}", path);
    }
    fmt::print("BENCH {:<9} {:<46} {:>10} {:>10} {:>9} {:>8}\n", "group", "case", "time", "GB/s", "TFLOP/s",
               "of copy");
  }
  // One measured row; bytes / flops are the fewest the op must move / do.
  void add(const std::string& group, const std::string& name, double us, double bytes, double flops) {
    const double gbps = bytes / (us * 1e3), tflops = flops / (us * 1e6);
    if (group == "copy" && copy_gbps_ == 0) copy_gbps_ = gbps;
    fmt::print("BENCH {:<9} {:<46} {:>8.2f}us {:>10.1f} {:>9.2f} {:>7.1f}%\n", group, name, us, gbps, tflops,
               copy_gbps_ > 0 ? 100 * gbps / copy_gbps_ : 0.0);
    std::fflush(stdout);
    if (out_.is_open())
      out_ << nlohmann::json{{"device", device_}, {"group", group}, {"case", name}, {"us", us}, {"bytes", bytes},
                             {"flops", flops}, {"gbps", gbps}, {"tflops", tflops}}
                  .dump()
           << "\n";
  }
  void note(const std::string& group, const std::string& name, const std::string& text) {
    fmt::print("BENCH {:<9} {:<46} {}\n", group, name, text);
    if (out_.is_open())
      out_ << nlohmann::json{{"device", device_}, {"group", group}, {"case", name}, {"note", text}}.dump() << "\n";
  }

 private:
  std::string device_;
  std::ofstream out_;
  double copy_gbps_ = 0;
};

// `elems` random values of type t in device memory (a random block of `tile`
// values, repeated; tile >= elems: all distinct, as a table that must have no
// ties needs).
inline Buffer random_device(CudaBackend& be, DType t, size_t elems, uint32_t seed, float sd = 0.05f,
                            size_t tile = size_t{4} << 20) {
  const size_t es = dtype_size(t), block = std::max<size_t>(1, std::min(elems, tile));
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, sd);
  std::vector<float> f(block);
  for (auto& x : f) x = nd(rng);
  std::vector<uint8_t> raw(block * es);
  from_f32(t, f.data(), raw.data(), block);
  Buffer b = be.alloc(elems * es);
  be.from_host(raw.data(), b, 0, raw.size());
  for (size_t done = block; done < elems; done += block)
    TOPKV_CUDA_CHECK(cudaMemcpyAsync(b.as<uint8_t>() + done * es, b.as<uint8_t>(),
                                     std::min(block, elems - done) * es, cudaMemcpyDeviceToDevice, be.stream()));
  be.synchronize();
  return b;
}
inline void fill_random(CudaBackend& be, const Buffer& dst, DType t, uint32_t seed) {
  Buffer r = random_device(be, t, dst.bytes / dtype_size(t), seed, 1.f);
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(dst.mem.get(), r.mem.get(), dst.bytes, cudaMemcpyDeviceToDevice, be.stream()));
  be.synchronize();
}

// Prefill attention, fp32 kernel vs tensor cores (bench/gpu_prefill_bench.cpp).
void bench_prefill_attention(CudaBackend& be, EventTimer& tm, Report& rep, int reps, bool quick);
// Decode attention (T = 1), the v2 and v3 kernels side by side (bench/gpu_decode_attn_bench.cpp).
void bench_decode_attention(CudaBackend& be, EventTimer& tm, Report& rep, int reps, bool quick);
// Products on quantised weights: MMVQ, grouped launches, dequantised prefill (bench/gpu_quant_bench.cpp).
void bench_quant_matmul(CudaBackend& be, EventTimer& tm, Report& rep, int reps, bool quick);
// The device search's steps at the million-token shapes (bench/gpu_search_bench.cpp).
void bench_device_search(CudaBackend& be, EventTimer& tm, Report& rep, int reps);
// The GPU k-means engine on one block of a multipole build (bench/gpu_kmeans_bench.cpp).
void bench_kmeans(CudaBackend& be, Report& rep, int reps);
// Quest's page bounds of one 8B KV head at 512K, the GPU engine and the host twin (bench/gpu_bounds_bench.cpp).
void bench_page_bounds(CudaBackend& be, Report& rep, int reps);
// The retrieved rows' attention per host store type, rows over PCIe and on the device (bench/gpu_rows_bench.cpp).
void bench_row_attention(CudaBackend& be, EventTimer& tm, Report& rep, int reps);

}  // namespace topkv::bench
