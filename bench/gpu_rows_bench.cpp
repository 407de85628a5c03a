// `topkv bench gpu-ops --only rows` (and a group of the full run): the
// row-list attention kernel (cuda::row_list_attention, the retrieved rows'
// part of an offloaded decode step) at the Llama-3-8B decode shape — 8 KV
// heads, 4 query heads each, head_dim 128, 1024 rows a KV head (k = 256 for
// each of 4 query heads, no overlap) and the runtime's split of a row list
// (kIdsRowsPerSplit rows a block) — for each host store type (f16, f8,
// q8_0), with the rows
//   pinned   in pinned, device-mapped host memory read in place over PCIe
//            (what the store cache does not hold), scattered over 1 GiB;
//   device   in device memory (rows the store cache holds), scattered over 1 GiB;
// and two pinned cases off alignment: q8_0 rows 2 bytes off (read a lane at a
// time, not in one unit load per lane: what the unit load buys) and f8 rows 64
// bytes off, so that each 128-byte row spans two 128-byte lines as a 136-byte
// q8_0 row does (whether the lines a row touches or its bytes set the PCIe cost);
// and pinned rows in pages of 16 back to back (Quest's page=16, as the decode
// lists them), where the kernel reads q8_0 rows by whole lines (Q8Run).
// Bytes are the rows' K and V as stored: the row type's cost where it is
// paid, on the bus. One layer a call; a 32-layer step is 32 of them.
#ifdef TOPKV_HAVE_CUDA
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_bench_util.h"
#include "gpu/cuda_kernels.h"
#include "gpu/gpu_offload_runtime_impl.h"

namespace topkv::bench {

void bench_row_attention(CudaBackend& be, EventTimer& tm, Report& rep, int reps) {
  constexpr int nkv = 8, group = 4, hd = 128, rows = 1024;
  constexpr size_t pool_bytes = size_t{1} << 30;
  void* pinned = nullptr;
  TOPKV_CUDA_CHECK(cudaHostAlloc(&pinned, pool_bytes, cudaHostAllocMapped));
  std::unique_ptr<void, decltype(&cudaFreeHost)> pinned_owner(pinned, &cudaFreeHost);
  Buffer device_pool = be.alloc(pool_bytes);
  Buffer q = random_device(be, DType::F32, (size_t)nkv * group * hd, 3, 1.f);
  // The runtime's split of a row list over blocks.
  const int parts = gpu_offload::splits_for(rows, gpu_offload::kIdsRowsPerSplit, gpu_offload::kMaxIdsSplits);
  Buffer part = be.alloc((size_t)nkv * group * parts * (2 + hd) * sizeof(float));
  Buffer lists = be.alloc(2 * (size_t)nkv * rows * sizeof(void*)), counts = be.alloc(nkv * sizeof(int32_t));
  const std::vector<int32_t> cnt(nkv, rows);
  be.from_host(cnt.data(), counts, 0, cnt.size() * sizeof(int32_t));
  for (DType t : {DType::F16, DType::F8E4M3, DType::Q8_0}) {
    const size_t row_bytes = dtype_bytes(t, hd), pool_rows = pool_bytes / row_bytes;
    {  // the pools: random rows of type t (a block of 4096 rows, repeated)
      std::mt19937 rng(5);
      std::normal_distribution<float> nd(0.f, 1.f);
      std::vector<float> f((size_t)4096 * hd);
      for (auto& x : f) x = nd(rng);
      std::vector<uint8_t> block(dtype_bytes(t, f.size()));
      from_f32(t, f.data(), block.data(), f.size());
      auto* p = static_cast<uint8_t*>(pinned);
      for (size_t done = 0; done < pool_rows * row_bytes; done += block.size())
        std::memcpy(p + done, block.data(), std::min(block.size(), pool_rows * row_bytes - done));
      be.from_host(pinned, device_pool, 0, pool_rows * row_bytes);
    }
    // variant 2: pinned, off alignment by `skew` bytes (above); f16 has no such case.
    const size_t skew = t == DType::Q8_0 ? 2 : t == DType::F8E4M3 ? 64 : 0;
    constexpr size_t kPage = 16;
    for (const int variant : {0, 1, 2, 3}) {
      if (variant == 2 && skew == 0) continue;
      const bool on_device = variant == 1;
      const uint8_t* base =
          on_device ? device_pool.as<uint8_t>() : static_cast<const uint8_t*>(pinned) + (variant == 2 ? skew : 0);
      std::mt19937_64 rng(9);
      std::vector<const void*> ptrs(2 * (size_t)nkv * rows);
      if (variant == 3) {  // pages of kPage rows back to back, K and V pages apart
        for (size_t i = 0; i < ptrs.size(); i += kPage) {
          const size_t page = rng() % (pool_rows / kPage - 1);
          for (size_t j = 0; j < kPage && i + j < ptrs.size(); ++j) ptrs[i + j] = base + (page * kPage + j) * row_bytes;
        }
      } else {
        for (auto& p : ptrs) p = base + (rng() % (pool_rows - 1)) * row_bytes;
      }
      be.from_host(ptrs.data(), lists, 0, ptrs.size() * sizeof(void*));
      cuda::RowListArgs a;
      a.q = q.f32(), a.row_type = t, a.n_kv = nkv, a.group = group, a.head_dim = hd, a.scale = 0.088f;
      a.k_rows = lists.as<const void*>(), a.v_rows = lists.as<const void*>() + (size_t)nkv * rows;
      a.counts = counts.as<int32_t>(), a.max_rows = rows, a.n_splits = parts, a.part0 = 0, a.parts = parts;
      cuda::carve_partials(part.mem.get(), (size_t)nkv * group * parts, a.part_m, a.part_l, a.part_o);
      const double us = tm.median_us(reps, [&] { cuda::row_list_attention(a, be.stream()); });
      const double bytes = 2.0 * nkv * rows * row_bytes;
      rep.add("rows", fmt::format("llama8b layer, {} rows x {} KV heads, {} {}", rows, nkv, dtype_name(t),
                                  variant == 1 ? "device"
                                  : variant == 2 ? fmt::format("pinned, {} B off", skew)
                                  : variant == 3 ? fmt::format("pinned, pages of {}", kPage)
                                                 : std::string("pinned")),
              us, bytes, 4.0 * nkv * group * rows * hd);
    }
  }
}

}  // namespace topkv::bench
#endif  // TOPKV_HAVE_CUDA
