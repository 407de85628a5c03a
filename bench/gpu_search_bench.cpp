// `topkv bench gpu-ops --only search` (and a group of the full run): the
// device search (cuda::summary_search) at the shapes of the million-token
// runs, each step timed cumulatively (score; + cut; + gather; + far), so the
// rows say what each step costs. Tables are random (every group 16 keys, no
// ties); the gathered pointers are written but not read here.
#ifdef TOPKV_HAVE_CUDA
#include <fmt/format.h>

#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_bench_util.h"
#include "gpu/cuda_kernels.h"

namespace topkv::bench {

void bench_device_search(CudaBackend& be, EventTimer& tm, Report& rep, int reps) {
  struct Shape {
    std::string name;
    int n_kv, group, hd, n;
    int64_t k;
    bool pages, far;
  };
  const Shape shapes[] = {
      {"gemma270m 1M multipole k=1024", 1, 4, 256, 65536, 1024, false, true},
      {"gemma270m 1M multipole k=256", 1, 4, 256, 65536, 256, false, true},
      {"llama8b 512K/layer multipole k=256", 8, 4, 128, 32768, 256, false, true},
      {"llama8b 512K/layer quest:page=16 k=256", 8, 4, 128, 32768, 256, true, false},
  };
  std::mt19937 rng(7);
  void* fake_rows = nullptr;  // every chunk pointer: the pointers are written, never read here
  TOPKV_CUDA_CHECK(cudaHostAlloc(&fake_rows, 4096, cudaHostAllocMapped));
  for (const Shape& s : shapes) {
    const int rows_per = 16, len = s.pages ? 2 * s.hd : s.hd;
    const int64_t keys = (int64_t)s.n * rows_per;
    std::vector<cuda::SummaryHead> heads((size_t)s.n_kv);
    std::vector<Buffer> keep;
    std::vector<int32_t> counts((size_t)s.n, rows_per), offsets((size_t)s.n + 1);
    for (int j = 0; j <= s.n; ++j) offsets[(size_t)j] = j * rows_per;
    std::vector<int32_t> members((size_t)keys);
    std::iota(members.begin(), members.end(), 0);
    std::shuffle(members.begin(), members.end(), rng);
    std::vector<const uint8_t*> chunks((size_t)((keys >> cuda::kStoreChunkShift) + 1),
                                       static_cast<const uint8_t*>(fake_rows));
    auto put = [&](const void* p, size_t bytes) {
      Buffer b = be.alloc(bytes);
      be.from_host(p, b, 0, bytes);
      keep.push_back(b);
      return b.mem.get();
    };
    for (auto& h : heads) {
      keep.push_back(random_device(be, DType::F16, (size_t)s.n * len, rng(), 1.f, SIZE_MAX));
      h.rows = keep.back().mem.get();
      if (s.far) {
        keep.push_back(random_device(be, DType::F16, (size_t)s.n * s.hd, rng(), 1.f, SIZE_MAX));
        h.value_means = keep.back().mem.get();
      }
      h.counts = static_cast<const int32_t*>(put(counts.data(), counts.size() * 4));
      if (!s.pages) {
        h.offsets = static_cast<const int32_t*>(put(offsets.data(), offsets.size() * 4));
        h.members = static_cast<const int32_t*>(put(members.data(), members.size() * 4));
      }
      h.k_chunks = h.v_chunks = static_cast<const uint8_t* const*>(put(chunks.data(), chunks.size() * sizeof(void*)));
      h.n = s.n, h.page = rows_per;
    }
    cuda::SummarySearchArgs a;
    a.heads = static_cast<const cuda::SummaryHead*>(put(heads.data(), heads.size() * sizeof(cuda::SummaryHead)));
    a.n_kv = s.n_kv, a.group = s.group, a.head_dim = s.hd, a.max_n = s.n, a.page_bounds = s.pages;
    a.table_type = DType::F16, a.store_type = DType::F16;
    keep.push_back(random_device(be, DType::F32, (size_t)s.n_kv * s.group * s.hd, rng(), 1.f, SIZE_MAX));
    a.q = keep.back().f32();
    a.k = s.k, a.scale = 1.f / std::sqrt((float)s.hd);
    Buffer ws = be.alloc(cuda::summary_search_workspace_bytes(s.n_kv, s.group, s.n));
    a.workspace = ws.mem.get();
    a.cap = (int)std::min<int64_t>(keys, (s.k + rows_per) * s.group);
    Buffer lists = be.alloc(2 * (size_t)s.n_kv * a.cap * sizeof(void*) + (size_t)s.n_kv * 4);
    a.k_rows = lists.as<const void*>(), a.v_rows = a.k_rows + (size_t)s.n_kv * a.cap;
    a.counts = reinterpret_cast<int32_t*>(const_cast<void**>(a.v_rows + (size_t)s.n_kv * a.cap));
    a.far_splits = s.far ? std::min(512, (s.n + 127) / 128) : 0, a.part0 = 0, a.parts = a.far_splits;
    Buffer parts = be.alloc((size_t)s.n_kv * s.group * std::max(1, a.parts) * (2 + s.hd) * 4);
    cuda::carve_partials(parts.mem.get(), (size_t)s.n_kv * s.group * a.parts, a.part_m, a.part_l, a.part_o);
    using A = cuda::SummarySearchArgs;
    const unsigned steps[] = {A::kSearchScore, A::kSearchScore | A::kSearchCut,
                              A::kSearchScore | A::kSearchCut | A::kSearchGather,
                              A::kSearchScore | A::kSearchCut | A::kSearchGather | A::kSearchFar};
    const char* names[] = {"score", "+ cut", "+ gather", "+ far (all)"};
    const double table_bytes = (double)s.n_kv * s.n * len * 2;
    for (int i = 0; i < (s.far ? 4 : 3); ++i) {
      a.phases = steps[i];
      const double us = tm.median_us(reps, [&] { cuda::summary_search(a, be.stream()); });
      const double bytes = table_bytes + (i == 3 ? (double)s.n_kv * s.n * s.hd * 2 : 0.0);
      rep.add("search", fmt::format("{} {}", s.name, names[i]), us, bytes, 0);
    }
    std::vector<int32_t> got((size_t)s.n_kv);
    TOPKV_CUDA_CHECK(cudaMemcpy(got.data(), a.counts, got.size() * 4, cudaMemcpyDeviceToHost));
    rep.note("search", s.name, fmt::format("rows gathered for KV head 0: {} (cap {})", got[0], a.cap));
  }
  cudaFreeHost(fake_rows);
}

}  // namespace topkv::bench
#endif  // TOPKV_HAVE_CUDA
