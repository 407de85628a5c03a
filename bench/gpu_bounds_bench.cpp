// `topkv bench gpu-ops --only bounds` (and a group of the full run): Quest's
// page bounds of one KV head of the Llama-3-8B geometry at 512K tokens
// (524,288 keys, head_dim 128, pages of 16, a pinned q8_0 store: the CUDA
// runtime's), built the two ways a build can: the GPU engine
// (gpu/gpu_page_bounds.h, --build-on gpu|auto), and the host twin on one
// thread (what one of the build's threads spends; page_bounds_reference).
// Wall time of one call as the build sees it; the bytes are the store rows
// read (for the engine: over the bus).
#ifdef TOPKV_HAVE_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <random>
#include <vector>

#include "bench/gpu_bench_util.h"
#include "gpu/gpu_offload_runtime_impl.h"  // gpu_offload::pinned_chunk_allocator
#include "gpu/gpu_page_bounds.h"

namespace topkv::bench {

void bench_page_bounds(CudaBackend& be, Report& rep, int reps) {
  const auto engine = make_gpu_page_bounds(be);
  const int d = 128;
  const int64_t n = 524288, page = 16, pages = n / page;
  for (DType t : {DType::Q8_0, DType::F16}) {
    RowStore keys(d, t, gpu_offload::pinned_chunk_allocator());
    {
      std::mt19937 rng(3);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> x((size_t)65536 * d);
      for (auto& v : x) v = nd(rng);
      for (int64_t at = 0; at < n; at += 65536) keys.append_f32(x.data(), 65536);
    }
    std::vector<float> out((size_t)pages * 2 * d);
    const double bytes = (double)n * keys.row_bytes();
    const std::string shape = fmt::format("{} keys x {} {} pages of {}", n, d, dtype_name(t), page);
    rep.add("bounds", shape + ", GPU engine (pinned rows over the bus)",
            wall_median_us(std::max(reps / 5, 5), [&] { engine->bound_pages(keys, page, 0, pages, n, out.data()); }),
            bytes, 0);
    rep.add("bounds", shape + ", host twin, one thread",
            wall_median_us(3, [&] { page_bounds_reference(keys, page, 0, pages, n, out.data(), 1); }), bytes, 0);
  }
}

}  // namespace topkv::bench
#endif  // TOPKV_HAVE_CUDA
