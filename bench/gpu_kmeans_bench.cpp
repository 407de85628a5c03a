// `topkv bench gpu-ops --only kmeans` (and a group of the full run): the GPU
// k-means engine (gpu/gpu_kmeans.h, --build-on gpu) on one block of a
// multipole build (8192 unit keys into 512 clusters, 10 rounds, head_dim 128
// and 256), wall time of one call from the host as the build sees it (the
// call waits for its results): alone, and 16 host threads calling at once
// (the build's block threads; the calls take turns), as blocks per second.
// The flops are the products' (11 of 2 n k d); the bytes the rows' upload.
#ifdef TOPKV_HAVE_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>
#include <vector>

#include "bench/gpu_bench_util.h"
#include "gpu/gpu_kmeans.h"

namespace topkv::bench {

void bench_kmeans(CudaBackend& be, Report& rep, int reps) {
  const auto engine = make_gpu_kmeans(be);
  const int64_t n = 8192, k = 512;
  const int iters = 10, threads = 16;
  for (int d : {128, 256}) {
    std::mt19937 rng(7);
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<float> x((size_t)n * d);
    for (int64_t i = 0; i < n; ++i) {
      double s = 0;
      for (int j = 0; j < d; ++j) s += std::pow(x[(size_t)i * d + j] = nd(rng), 2);
      for (int j = 0; j < d; ++j) x[(size_t)i * d + j] /= (float)std::sqrt(s);
    }
    const double flops = (iters + 1) * 2.0 * n * k * d, bytes = (double)n * d * 4;
    std::vector<float> cent((size_t)k * d);
    std::vector<int32_t> lab((size_t)n);
    auto one = [&] { engine->cluster(x.data(), n, x.data(), n, d, k, iters, 1, cent.data(), lab.data()); };
    const std::string shape = fmt::format("block {}x{} k={} {} rounds", n, d, k, iters);
    rep.add("kmeans", shape + ", one call", wall_median_us(std::max(reps / 5, 5), one, 3), bytes, flops);
    // 16 threads, 4 calls each: the time per call when the build's threads share the engine.
    const double all = wall_us([&] {
      std::vector<std::thread> pool;
      for (int t = 0; t < threads; ++t)
        pool.emplace_back([&] {
          std::vector<float> c((size_t)k * d);
          std::vector<int32_t> l((size_t)n);
          for (int i = 0; i < 4; ++i) engine->cluster(x.data(), n, x.data(), n, d, k, iters, 1, c.data(), l.data());
        });
      for (auto& th : pool) th.join();
    });
    rep.add("kmeans", shape + fmt::format(", {} threads (per call)", threads), all / (threads * 4), bytes, flops);
  }
}

}  // namespace topkv::bench
#endif  // TOPKV_HAVE_CUDA
