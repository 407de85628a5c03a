// `topkv bench gpu-ops --only search` (and a group of the full run): the
// device search (cuda::summary_search) at the shapes of the million-token
// runs, each step timed cumulatively (score; + cut; + gather; + far), so the
// rows say what each step costs; one-level shapes then time the cut, the
// gather and the far rows alone (their GB/s against the copy row). Tables
// are random (every group 16 keys, no ties); the gathered pointers are
// written but not read here, except by the
// rerank rows (step 3b, R = 4: the candidates' keys are read, from a random
// device copy of the store, as the store cache serves them), and spread rows
// (the far rows' spread term: a variance table as large as the value means).
// Two-level quest rows (quest:coarse_ratio=C) score a random coarse table
// of n/C rows first; each query head's coarse cut then lists its own
// coarse pages (random tables: the union is as large as it can be). Tables
// are f16 (the default); the Llama-8B 512K shapes run again with f8 and i8
// tables (--device-table-type), each encoded as the runtime does (encode_table).
#ifdef TOPKV_HAVE_CUDA
#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/gpu_bench_util.h"
#include "gpu/cuda_kernels.h"
#include "src/common/dtype.h"
#include "src/common/table_codes.h"

namespace topkv::bench {

namespace {

struct Shape {
  std::string name;
  int n_kv, group, hd, n;
  int64_t k;
  bool pages, far;
  int coarse = 0;       // two levels: pages per coarse page (0: one level)
  double expand = 8.0;  // the coarse cut covers expand*k tokens a query head
  DType table = DType::F16;  // --device-table-type
};

// One shape: rerank 1 (fake row pointers) or R > 1 (a device buffer of
// random keys the pointers address, one per 65,536-row chunk).
void bench_shape(CudaBackend& be, EventTimer& tm, Report& rep, int reps, const Shape& s, std::mt19937& rng,
                 void* fake_rows, int R, bool spread = false);

}  // namespace

void bench_device_search(CudaBackend& be, EventTimer& tm, Report& rep, int reps) {
  const Shape shapes[] = {
      {"gemma270m 1M multipole k=1024", 1, 4, 256, 65536, 1024, false, true},
      {"gemma270m 1M multipole k=256", 1, 4, 256, 65536, 256, false, true},
      {"llama8b 512K/layer multipole k=256", 8, 4, 128, 32768, 256, false, true},
      {"llama8b 512K/layer quest:page=16 k=256", 8, 4, 128, 32768, 256, true, false},
      {"llama8b 512K/layer quest:page=16,coarse_ratio=16 k=256", 8, 4, 128, 32768, 256, true, false, 16},
      {"llama8b 512K/layer quest:page=16,coarse_ratio=16,expand=16 k=256", 8, 4, 128, 32768, 256, true, false, 16,
       16.0},
      {"llama8b 1M/layer quest:page=16 k=256", 8, 4, 128, 65536, 256, true, false},
      {"llama8b 1M/layer quest:page=16,coarse_ratio=16 k=256", 8, 4, 128, 65536, 256, true, false, 16},
      {"gemma270m 1M quest:page=16 k=1024", 1, 4, 256, 65536, 1024, true, false},
      {"gemma270m 1M quest:page=16,coarse_ratio=16 k=1024", 1, 4, 256, 65536, 1024, true, false, 16},
  };
  std::mt19937 rng(7);
  void* fake_rows = nullptr;  // every chunk pointer: the pointers are written, never read here
  TOPKV_CUDA_CHECK(cudaHostAlloc(&fake_rows, 4096, cudaHostAllocMapped));
  for (const Shape& s : shapes) bench_shape(be, tm, rep, reps, s, rng, fake_rows, 1);
  // 8-bit tables (half the bytes of the rows, coarse rows and value means)
  // at the Llama-8B 512K layer, one level and two.
  for (DType t : {DType::F8E4M3, DType::I8})
    for (Shape s : shapes)
      if (s.name.rfind("llama8b 512K/layer", 0) == 0 && s.expand == 8.0) {
        s.table = t, s.name += fmt::format(" {} tables", dtype_name(t));
        bench_shape(be, tm, rep, reps, s, rng, fake_rows, 1);
      }
  // Rerank (the default of one-level multipole): candidates at 4k, their keys
  // scored, 4k rows a query head's budget before the cut to k.
  for (const Shape& s : shapes)
    if (!s.pages) bench_shape(be, tm, rep, reps, s, rng, nullptr, 4);
  // The far rows' spread term (multipole:spread=0.5) on top of the default.
  for (const Shape& s : shapes)
    if (s.far) bench_shape(be, tm, rep, reps, s, rng, nullptr, 4, true);
  cudaFreeHost(fake_rows);
}


namespace {

void bench_shape(CudaBackend& be, EventTimer& tm, Report& rep, int reps, const Shape& s, std::mt19937& rng,
                 void* fake_rows, int R, bool spread) {
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
  if (R > 1) {  // the rows the rerank reads: every KV head's store is the same random device buffer
    keep.push_back(random_device(be, DType::F16, (chunks.size() << cuda::kStoreChunkShift) * s.hd, rng(), 1.f));
    const size_t chunk_bytes = ((size_t)1 << cuda::kStoreChunkShift) * s.hd * 2;
    for (size_t c = 0; c < chunks.size(); ++c) chunks[c] = static_cast<const uint8_t*>(keep.back().mem.get()) + c * chunk_bytes;
  }
  auto put = [&](const void* p, size_t bytes) {
    Buffer b = be.alloc(bytes);
    be.from_host(p, b, 0, bytes);
    keep.push_back(b);
    return b.mem.get();
  };
  // A table at the shape's type as the device search holds it
  // (encode_table: i8 with its scales, into *scale); rows of `row_len`
  // elements of N(0, sd), or |N(0, sd)| (variances).
  auto table = [&](size_t rows, int row_len, float sd, bool abs, const float** scale) -> const void* {
    std::normal_distribution<float> nd(0.f, sd);
    std::vector<float> x(rows * row_len);
    for (float& v : x) v = abs ? std::abs(nd(rng)) : nd(rng);
    const TableCodes c = row_len == s.hd ? encode_table(s.table, x, s.hd, {TableRounding::Nearest}, "a table element")
                                         : encode_table(s.table, x, s.hd, {TableRounding::Up, TableRounding::Down},
                                                        "a page bound");
    if (!c.scale.empty()) *scale = static_cast<const float*>(put(c.scale.data(), c.scale.size() * 4));
    return put(c.codes.data(), c.codes.size());
  };
  for (auto& h : heads) {
    h.rows = table((size_t)s.n, len, 1.f, false, &h.rows_scale);
    if (s.far) h.value_means = table((size_t)s.n, s.hd, 1.f, false, &h.value_means_scale);
    if (spread) h.key_var = table((size_t)s.n, s.hd, 0.1f, true, &h.key_var_scale);
    h.counts = static_cast<const int32_t*>(put(counts.data(), counts.size() * 4));
    if (!s.pages) {
      h.offsets = static_cast<const int32_t*>(put(offsets.data(), offsets.size() * 4));
      h.members = static_cast<const int32_t*>(put(members.data(), members.size() * 4));
    }
    h.k_chunks = h.v_chunks = static_cast<const uint8_t* const*>(put(chunks.data(), chunks.size() * sizeof(void*)));
    h.n = s.n, h.page = rows_per;
    if (s.coarse > 0) {
      h.coarse_n = (s.n + s.coarse - 1) / s.coarse, h.coarse_ratio = s.coarse;
      h.coarse_rows = table((size_t)h.coarse_n, len, 1.f, false, &h.coarse_rows_scale);
      std::vector<int32_t> cc((size_t)h.coarse_n);
      for (int c = 0; c < h.coarse_n; ++c) cc[(size_t)c] = rows_per * std::min(s.coarse, s.n - c * s.coarse);
      h.coarse_counts = static_cast<const int32_t*>(put(cc.data(), cc.size() * 4));
    }
  }
  cuda::SummarySearchArgs a;
  a.heads = static_cast<const cuda::SummaryHead*>(put(heads.data(), heads.size() * sizeof(cuda::SummaryHead)));
  a.n_kv = s.n_kv, a.group = s.group, a.head_dim = s.hd, a.max_n = s.n, a.page_bounds = s.pages;
  a.table_type = s.table, a.store_type = DType::F16;
  keep.push_back(random_device(be, DType::F32, (size_t)s.n_kv * s.group * s.hd, rng(), 1.f, SIZE_MAX));
  a.q = keep.back().f32();
  a.k = R * s.k, a.scale = 1.f / std::sqrt((float)s.hd);
  if (s.coarse > 0) a.coarse_k = (int64_t)(s.expand * (double)s.k);
  if (spread) a.spread = 0.5f, a.spread_clip = 4.f;
  a.cap = (int)std::min<int64_t>(keys, (s.k + rows_per) * s.group);  // DeviceSearchTables::row_cap
  if (R > 1) a.rerank_k = s.k, a.cand_cap = (int)std::min<int64_t>(keys, (R * s.k + rows_per) * s.group);
  Buffer ws = be.alloc(cuda::summary_search_workspace_bytes(s.n_kv, s.group, s.n, a.cand_cap));
  a.workspace = ws.mem.get();
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
  const char* names[] = {"score", "+ cut", R > 1 ? "+ gather + rerank" : "+ gather", "+ far (all)"};
  const std::string name = fmt::format("{}{}{}", s.name, R > 1 ? fmt::format(" rerank={}", R) : "",
                                       spread ? " spread=0.5" : "");
  // Two levels read the coarse rows and the listed pages' (as measured below).
  std::vector<int32_t> listed((size_t)s.n_kv);
  if (s.coarse > 0) {
    a.phases = A::kSearchScore;
    cuda::summary_search(a, be.stream());
    TOPKV_CUDA_CHECK(cudaMemcpy(listed.data(), cuda::summary_listed_count(a), listed.size() * 4, cudaMemcpyDeviceToHost));
  }
  const double es = (double)dtype_size(s.table);
  const double table_bytes =
      s.coarse > 0 ? ((double)s.n_kv * ((s.n + s.coarse - 1) / s.coarse) +
                      (double)std::accumulate(listed.begin(), listed.end(), int64_t{0})) * len * es
                   : (double)s.n_kv * s.n * len * es;
  for (int i = 0; i < (s.far ? 4 : 3); ++i) {
    a.phases = steps[i];
    const double us = tm.median_us(reps, [&] { cuda::summary_search(a, be.stream()); });
    // + the far rows' value means (and variances); + at most cand_cap candidate keys a KV head (rerank)
    const double bytes = table_bytes + (i == 3 ? (spread ? 2.0 : 1.0) * s.n_kv * s.n * s.hd * es : 0.0) +
                         (i >= 2 ? (double)s.n_kv * a.cand_cap * s.hd * 2 : 0.0);
    rep.add("search", fmt::format("{} {}", name, names[i]), us, bytes, 0);
  }
  // One level: the cut, the gather and the far rows each alone, over the work
  // space the full search above left (its scores, cuts and selection), so
  // each kernel's GB/s and share of the copy stand on their own row. Bytes:
  // what the step must read once, the scores [n_kv][group][n] f32, and for
  // the far rows also the value means (and variances).
  if (s.coarse == 0) {
    const double score_bytes = (double)s.n_kv * s.group * s.n * 4;
    const double means = (spread ? 2.0 : 1.0) * s.n_kv * s.n * s.hd * es;  // value means (and variances)
    const std::pair<unsigned, const char*> alone[] = {
        {A::kSearchCut, "cut alone"}, {A::kSearchGather, R > 1 ? "gather + rerank alone" : "gather alone"},
        {A::kSearchFar, "far alone"}};
    for (const auto& [phase, what] : alone) {
      if (phase == A::kSearchFar && !s.far) continue;
      a.phases = phase;
      const double us = tm.median_us(reps, [&] { cuda::summary_search(a, be.stream()); });
      const double bytes = score_bytes + (phase == A::kSearchFar ? means : 0.0);
      rep.add("search", fmt::format("{} {}", name, what), us, bytes, 0);
    }
  }
  std::vector<int32_t> got((size_t)s.n_kv);
  TOPKV_CUDA_CHECK(cudaMemcpy(got.data(), a.counts, got.size() * 4, cudaMemcpyDeviceToHost));
  rep.note("search", name, fmt::format("rows gathered for KV head 0: {} (cap {}){}", got[0], a.cap,
                                       s.coarse > 0 ? fmt::format("; pages listed: {}", listed[0]) : ""));
}

}  // namespace

}  // namespace topkv::bench
#endif  // TOPKV_HAVE_CUDA
