// The search on the device against its CPU twins: cuda::summary_search
// (scores, budget cut, gather, far rows) against gpu/summary_search_ref.h on
// the same tables, and GpuOffloadRuntime with --search-on gpu against the CPU
// OffloadRuntime step by step (same folds, level-1 lookups).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_kernels.h"
#include "gpu/device_search_tables.h"
#include "gpu/gpu_offload_runtime.h"
#include "index/kmeans.h"
#include "offload/partial_attention.h"
#include "gpu/summary_search_ref.h"
#include "offload/pack_file.h"
#include "src/session/make_runtime.h"
#include "tests/clustered_keys.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/gpu/offload_test_util.h"
#include "tests/test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

RowStore::ChunkAllocator pinned_alloc() {
  return [](size_t bytes) {
    void* p = nullptr;
    REQUIRE(cudaHostAlloc(&p, bytes, cudaHostAllocMapped) == cudaSuccess);
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFreeHost(q); });
  };
}

template <class T> std::vector<T> fetch(Backend& be, const void* dev, size_t n) {
  std::vector<T> out(n);
  cuda_be().synchronize();
  REQUIRE(cudaMemcpy(out.data(), dev, n * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  return out;
}

}  // namespace

TEST_CASE("summary_search matches its CPU twin: scores, cut, gathered rows, far rows", "[search]") {
  auto& be = cuda_be();
  OpSummary scores_sum("device search scores", 1e-5), far_sum("device search far rows", 1e-5);
  OpSummary scores16("device search scores, f16, bf16, f8 and i8 tables", 1e-3), row_sum("device rerank row scores", 1e-5);
  OpSummary dots_sum("device rerank dots for every query head", 1e-5);
  int selections = 0, mismatched = 0, spread_heads = 0, listed_heads = 0;
  int64_t dropped_rows = 0;  // far_dropped: candidates checked as far rows of their own
  double max_spread_term = 0;  // the largest far spread term checked (its logit less scale.x + ln N)
  // rerank R > 1: clusters until R*k tokens are candidates, each query head
  // keeps its k best rows (step 3b), rows read from an f16, f8 or q8_0 store.
  // cap_div > 1: row lists of row_cap / cap_div, so that the union of the query heads' cuts does
  // not fit and the gather stops at the first group that does not (in a tile after the first).
  struct Case { std::string index; DType table; int hd, kv, group, n; int64_t k; bool streaming; int rerank = 1;
                DType store = DType::F16; int cap_div = 1; };
  const std::vector<Case> cases = {
      {"multipole", DType::F32, 128, 1, 4, 4000, 256, false},  {"multipole", DType::F16, 256, 1, 4, 9000, 512, false},
      {"multipole", DType::F32, 64, 3, 12, 777, 40, true},     {"centroid:ratio=9", DType::F32, 64, 2, 1, 1301, 1, false},
      {"quest:page=4", DType::F32, 128, 2, 4, 1000, 100, false}, {"quest:page=16", DType::BF16, 256, 1, 8, 5003, 700, false},
      {"multipole", DType::F32, 128, 2, 4, 300, 100000, false},
      {"multipole:rerank_far=0", DType::F32, 128, 1, 4, 4000, 64, false, 4},
      {"multipole:rerank_far=0", DType::F16, 64, 3, 12, 777, 9, true, 8},
      {"centroid:ratio=9", DType::F32, 256, 2, 1, 1301, 1, false, 3},
      {"multipole", DType::F32, 128, 2, 6, 2501, 50, false, 4, DType::F8E4M3},
      {"multipole", DType::F32, 64, 1, 2, 300, 1000, false, 4},  // fewer rows than R*k: every row a candidate
      // the rows rerank drops from selected groups as far rows (rerank_far, multipole's default; with rerank=1
      // nothing is dropped; the two rerank_far=0 cases above drop them)
      {"multipole:rerank_far=1", DType::F32, 128, 2, 4, 4000, 64, false, 4},
      {"multipole:rerank_far=1,spread=0.5", DType::F16, 64, 3, 12, 777, 9, true, 8},
      {"multipole:rerank_far=1", DType::F32, 256, 1, 6, 2501, 50, false, 4, DType::F8E4M3},
      {"multipole", DType::F32, 64, 2, 7, 2501, 50, false, 4, DType::Q8_0},  // q8_0 rows: 34-byte blocks
      {"multipole:rerank_far=1", DType::F16, 128, 1, 6, 1999, 40, true, 3, DType::Q8_0},
      {"centroid:ratio=9", DType::F32, 256, 2, 1, 1301, 3, false, 3, DType::Q8_0},
      {"multipole:rerank_far=1", DType::BF16, 128, 1, 7, 1001, 1, false, 3},
      {"multipole:rerank_far=1", DType::F32, 128, 1, 4, 2000, 64, false},
      // the far rows' spread term (damped; the clip binding; 12 query heads: two grid.z chunks)
      {"multipole:spread=0.5", DType::F32, 128, 2, 4, 4000, 256, false, 4},
      {"multipole:spread=0.5,rerank=1", DType::F16, 256, 1, 4, 9000, 512, false},
      {"multipole:spread=4,spread_clip=1.5", DType::F32, 64, 3, 12, 777, 40, true, 4},
      // two levels: coarse pages (a partial last one), the list, then the cut at k
      {"quest:page=4,coarse_ratio=4", DType::F32, 128, 2, 4, 1000, 100, false},
      {"quest:page=16,coarse_ratio=16,expand=4", DType::F16, 128, 3, 4, 30001, 256, true},
      {"quest:page=5,coarse_ratio=3,expand=1", DType::BF16, 64, 1, 7, 2003, 37, false},
      {"quest:page=16,coarse_ratio=8", DType::F32, 256, 1, 12, 9000, 1000, false},
      {"quest:page=16,coarse_ratio=2,expand=1000", DType::F32, 64, 2, 2, 500, 100, false},  // everything listed
      // one level over 8,192 groups and more: the cut by a cluster of blocks (sm_90, kClusterCutMinGroups)
      {"quest:page=2", DType::F16, 64, 2, 4, 17001, 1500, false},
      {"quest:page=2", DType::I8, 128, 1, 7, 20001, 3000, false},
      {"quest:page=1", DType::F32, 64, 1, 2, 70001, 20000, false},
      // lists too short for the union: the gather's first group that does not fit, past 256 tiles too
      {"quest:page=2", DType::F16, 64, 2, 4, 17001, 1500, false, 1, DType::F16, 8},
      {"multipole", DType::F32, 128, 2, 4, 4000, 256, false, 1, DType::F16, 6},
      {"quest:page=1", DType::F32, 64, 1, 2, 70001, 20000, false, 1, DType::F16, 5},
      // far rows: a split of more groups than the far kernel stages at once (kFarStage)
      {"multipole", DType::F16, 64, 1, 4, 12001, 100, false},
      // f8 tables (E4M3: page bounds rounded outward, centroids and value means to nearest)
      {"quest:page=16,coarse_ratio=16,expand=4", DType::F8E4M3, 128, 3, 4, 30001, 256, true},
      {"quest:page=4", DType::F8E4M3, 64, 2, 4, 1000, 100, false},
      {"multipole:rerank_far=1", DType::F8E4M3, 128, 2, 4, 4000, 64, false, 4, DType::Q8_0},
      {"multipole:spread=0.5,rerank=1", DType::F8E4M3, 256, 1, 4, 9000, 512, false},
      {"centroid:ratio=9", DType::F8E4M3, 64, 2, 1, 1301, 3, false, 3},
      // i8 tables (a scale per dimension: src/common/table_codes.h), the same shapes
      {"quest:page=16,coarse_ratio=16,expand=4", DType::I8, 128, 3, 4, 30001, 256, true},
      {"quest:page=4", DType::I8, 64, 2, 4, 1000, 100, false},
      {"multipole:rerank_far=1", DType::I8, 128, 2, 4, 4000, 64, false, 4, DType::Q8_0},
      {"multipole:spread=0.5,rerank=1", DType::I8, 256, 1, 4, 9000, 512, false},
      {"centroid:ratio=9", DType::I8, 64, 2, 1, 1301, 3, false, 3},
  };
  for (const Case& c : cases) {
    CAPTURE(c.index, dtype_name(c.table), c.hd, c.kv, c.group, c.n, c.k, c.rerank, dtype_name(c.store), c.cap_div);
    OffloadedLayer::Config cfg;
    cfg.n_heads = c.kv * c.group, cfg.kv_heads = c.kv, cfg.head_dim = c.hd, cfg.sinks = 0, cfg.window = 1;
    cfg.store_dtype = c.store;
    cfg.k = c.k, cfg.index = c.index, cfg.store_alloc = pinned_alloc(), cfg.build.n_threads = 2;
    if (c.streaming) cfg.streaming.assign((size_t)c.kv, 0), cfg.streaming[1] = 1;
    OffloadedLayer L(cfg);
    topkv::testing::Clustered data(c.hd, 16, 5);
    std::vector<float> keys((size_t)c.n * c.kv * c.hd), values(keys.size());
    {
      auto kf = data.keys((int64_t)c.n * c.kv), vf = data.keys((int64_t)c.n * c.kv);
      keys = kf, values = vf;  // token-major [n][kv][hd]: rows of the generator in that order
    }
    L.prefill(keys.data(), values.data(), c.n);
    DeviceSearchTables tab;
    tab.upload(be, L, DeviceTableChoice{c.table, 1});
    const int G = c.group, nkv = c.kv, d = c.hd, max_n = tab.max_n();
    const int cap = std::max(1, tab.row_cap(c.k, G) / c.cap_div);
    const int64_t cand_k = c.rerank > 1 ? c.rerank * c.k : 0;
    const int cand_cap = cand_k ? tab.row_cap(cand_k, G) : 0;
    const auto q = data.queries(nkv * G);
    Buffer dq = upload(be, q);
    const bool far_dropped = tab.far_dropped() && cand_k > 0;
    Buffer ws = be.alloc(cuda::summary_search_workspace_bytes(nkv, G, max_n, cand_cap, far_dropped));
    Buffer lists = be.alloc(2 * (size_t)nkv * cap * sizeof(void*) + nkv * 4);
    const int far_splits = 5, parts = far_splits + 1;
    Buffer part = be.alloc((size_t)nkv * G * parts * (2 + d) * 4);
    float *pm, *pl, *po;
    cuda::carve_partials(part.mem.get(), (size_t)nkv * G * parts, pm, pl, po);
    cuda::SummarySearchArgs a;
    a.heads = tab.heads(), a.n_kv = nkv, a.group = G, a.head_dim = d, a.max_n = max_n;
    a.page_bounds = tab.page_bounds(), a.table_type = c.table, a.store_type = cfg.store_dtype;
    a.q = dq.f32(), a.k = cand_k ? cand_k : c.k, a.scale = 0.09f, a.workspace = ws.mem.get();
    a.spread = tab.spread(), a.spread_clip = tab.spread_clip();
    a.rerank_k = cand_k ? c.k : 0, a.cand_cap = cand_cap, a.far_dropped = far_dropped;
    a.coarse_k = tab.coarse_budget(c.k);
    auto* dl = lists.as<const void*>();
    a.k_rows = const_cast<const void**>(dl), a.v_rows = const_cast<const void**>(dl + (size_t)nkv * cap);
    a.counts = reinterpret_cast<int32_t*>(const_cast<void**>(dl + 2 * (size_t)nkv * cap)), a.cap = cap;
    a.far_splits = tab.far_field() ? far_splits : 0, a.part0 = 1, a.parts = parts;
    a.part_m = pm, a.part_l = pl, a.part_o = po;
    cuda::summary_search(a, be.stream());
    const auto dscores = fetch<float>(be, cuda::summary_scores(a), (size_t)nkv * G * max_n);
    const auto dsel = fetch<uint8_t>(be, cuda::summary_selected(a), (size_t)nkv * max_n);
    const auto dk = fetch<const void*>(be, a.k_rows, (size_t)nkv * cap);
    const auto dv = fetch<const void*>(be, a.v_rows, (size_t)nkv * cap);
    const auto dcount = fetch<int32_t>(be, a.counts, (size_t)nkv);
    const auto dlist = fetch<int32_t>(be, cuda::summary_listed(a), (size_t)nkv * max_n);
    const auto dlist_n = fetch<int32_t>(be, cuda::summary_listed_count(a), (size_t)nkv);
    std::vector<float> drows, ddots;
    std::vector<int32_t> dcand;
    std::vector<uint8_t> dlisted;
    if (cand_k) {
      drows = fetch<float>(be, cuda::summary_row_scores(a), (size_t)nkv * G * cand_cap);
      dcand = fetch<int32_t>(be, cuda::summary_candidate_counts(a), (size_t)nkv);
    }
    if (far_dropped) {
      ddots = fetch<float>(be, cuda::summary_row_dots(a), (size_t)nkv * G * cand_cap);
      dlisted = fetch<uint8_t>(be, cuda::summary_candidate_listed(a), (size_t)nkv * cand_cap);
    }
    const auto hm = fetch<float>(be, pm, (size_t)nkv * G * parts), hl = fetch<float>(be, pl, (size_t)nkv * G * parts);
    const auto ho = fetch<float>(be, po, (size_t)nkv * G * parts * d);
    for (int h = 0; h < nkv; ++h) {
      CAPTURE(h);
      SummaryTables t;
      const KvIndex* index = L.index(h);
      if (!index) {  // a streaming head: nothing gathered, no far rows
        CHECK(dcount[(size_t)h] == 0);
        continue;
      }
      REQUIRE(index->export_summaries(t));
      // The tables as the device holds them (page bounds rounded outward,
      // SummaryTables::encoded_rows; i8 with its scales), decoded as it does.
      t.rows = t.encoded_rows(c.table).decoded();
      for (std::vector<float>* v : {&t.value_means, &t.key_var})
        *v = encode_table(c.table, *v, d, {TableRounding::Nearest}, "").decoded();
      const int64_t n = t.size();
      // Scores: the twin's, from the same (rounded) tables.
      const auto want = summary_scores_reference(t, q.data() + (size_t)h * G * d, G);
      if (a.coarse_k > 0) {
        // Two levels: the list exactly the twin's expansion, the listed
        // groups' scores, then cut and gather over the list.
        const auto listed = summary_expand_reference(t, q.data() + (size_t)h * G * d, G, a.coarse_k);
        const size_t ln = listed.size();
        REQUIRE(dlist_n[(size_t)h] == (int32_t)ln);
        CHECK(std::equal(listed.begin(), listed.end(), dlist.begin() + (ptrdiff_t)h * max_n));
        std::vector<float> got(G * ln), want_l(G * ln);
        for (int g = 0; g < G; ++g)
          for (size_t j = 0; j < ln; ++j) {
            got[g * ln + j] = dscores[((size_t)h * G + g) * max_n + j];
            want_l[g * ln + j] = want[(size_t)g * n + listed[j]];
          }
        (c.table == DType::F32 ? scores_sum : scores16).check(rel_err(got, want_l));
        const SummarySelection sel = summary_select_reference(t, got, G, c.k, cap, &listed);
        for (size_t j = 0; j < ln; ++j) mismatched += sel.selected[j] != (char)dsel[(size_t)h * max_n + j];
        ++selections, ++listed_heads;
        REQUIRE(dcount[(size_t)h] == (int32_t)sel.rows.size());
        for (size_t r = 0; r < sel.rows.size(); ++r) {
          REQUIRE(dk[(size_t)h * cap + r] == L.key_store(h)->row(sel.rows[r]));
          REQUIRE(dv[(size_t)h * cap + r] == L.value_store(h)->row(sel.rows[r]));
        }
        // The union of the query heads' k is covered: each head's cut holds >= k tokens.
        CHECK(sel.rows.size() >= (size_t)std::min<int64_t>(c.k, t.covered));
        continue;
      }
      std::vector<float> got((size_t)G * n);
      for (int g = 0; g < G; ++g)
        std::copy_n(dscores.data() + ((size_t)h * G + g) * max_n, n, got.begin() + (ptrdiff_t)g * n);
      (c.table == DType::F32 ? scores_sum : scores16).check(rel_err(got, want));
      // Cut, union and gather: exactly the twin's on the device's scores.
      SummarySelection sel = summary_select_reference(t, got, G, cand_k ? cand_k : c.k, cand_k ? cand_cap : cap);
      const SummarySelection cands = sel;
      if (c.cap_div > 1) CHECK(cands.capped);  // each query head's cut alone holds more than cap
      // far_dropped: each candidate's q.k for every query head (exact, double).
      std::vector<double> dots;
      if (cand_k) {
        // Rerank: the candidates' exact scores against q.k of the store's
        // rows (-inf where the query head's cut did not take the group),
        // then the kept rows exactly the twin's on the device's scores.
        const int64_t nc = (int64_t)sel.rows.size();
        REQUIRE(dcand[(size_t)h] == (int32_t)nc);
        std::vector<float> rows_got((size_t)G * nc), rows_want, rows_dev;
        std::vector<float> key(d);
        std::vector<float> dots_got, dots_want;
        dots.resize((size_t)G * nc);
        for (int g = 0; g < G; ++g)
          for (int64_t r = 0; r < nc; ++r) {
            const float x = drows[((size_t)h * G + g) * cand_cap + r];
            rows_got[(size_t)g * nc + r] = x;
            const ScoreCut& gc = sel.cuts[(size_t)g];
            const bool in = gc.key(got[(size_t)g * n + sel.row_group[(size_t)r]]) >= gc.cut;
            CHECK((x == -INFINITY) == !in);
            L.key_store(h)->row_f32(sel.rows[(size_t)r], key.data());
            double dot = 0;
            for (int i = 0; i < d; ++i) dot += (double)q[((size_t)h * G + g) * d + i] * key[(size_t)i];
            dots[(size_t)g * nc + r] = dot;
            if (far_dropped)
              dots_got.push_back(ddots[((size_t)h * G + g) * cand_cap + r]), dots_want.push_back((float)dot);
            if (!in) continue;
            rows_want.push_back((float)dot), rows_dev.push_back(x);
          }
        row_sum.check(rel_err(rows_dev, rows_want));
        if (far_dropped) dots_sum.check(rel_err(dots_got, dots_want));
        sel = summary_rerank_reference(t, sel, got, rows_got, G, c.k, cap);
      }
      for (int64_t j = 0; j < n; ++j) mismatched += sel.selected[(size_t)j] != (char)dsel[(size_t)h * max_n + j];
      ++selections;
      REQUIRE(dcount[(size_t)h] == (int32_t)sel.rows.size());
      for (size_t r = 0; r < sel.rows.size(); ++r) {
        REQUIRE(dk[(size_t)h * cap + r] == L.key_store(h)->row(sel.rows[r]));
        REQUIRE(dv[(size_t)h * cap + r] == L.value_store(h)->row(sel.rows[r]));
      }
      if (!tab.far_field()) continue;
      // far_dropped: the rows of selected groups that the lists do not hold.
      std::vector<int64_t> dropped;
      if (far_dropped) {
        dropped = summary_dropped_reference(cands, sel);
        std::vector<int64_t> listed(sel.rows);
        std::sort(listed.begin(), listed.end());
        int listed_mismatch = 0;
        for (size_t r = 0; r < cands.rows.size(); ++r)
          listed_mismatch += (dlisted[(size_t)h * cand_cap + r] != 0) !=
                             std::binary_search(listed.begin(), listed.end(), cands.rows[r]);
        CHECK(listed_mismatch == 0);
        dropped_rows += (int64_t)dropped.size();
      }
      // Far rows: every unselected group, logit scale.x + ln N (+ the spread
      // term), value mean.
      if (!t.key_var.empty()) ++spread_heads;
      for (int g = 0; g < G; ++g) {
        AttnPartial ref(d), dev(d);
        std::vector<float> s, logw;
        std::vector<int32_t> idx;
        for (int64_t j = 0; j < n; ++j)
          if (!sel.selected[(size_t)j]) {
            const float x = got[(size_t)g * n + j];
            s.push_back(summary_far_logit_reference(t, j, q.data() + ((size_t)h * G + g) * d, x, a.scale));
            if (!t.key_var.empty())
              max_spread_term = std::max(max_spread_term,
                                         (double)s.back() - ((double)x * a.scale + std::log((double)t.counts[(size_t)j])));
            logw.push_back(0.f);  // ln N_j is in the logit
            idx.push_back((int32_t)j);
          }
        for (int64_t r : dropped) {  // one far row each: its exact logit, its group's mean value
          s.push_back((float)(dots[(size_t)g * cands.rows.size() + (size_t)r] * a.scale));
          logw.push_back(0.f);
          idx.push_back((int32_t)cands.row_group[(size_t)r]);
        }
        partial_add_gather(ref, s.data(), logw.data(), t.value_means.data(), idx.data(), (int64_t)idx.size());
        const size_t row = (size_t)h * G + g;
        for (int p = 1; p < parts; ++p) {
          AttnPartial one(d);
          one.m = hm[row * parts + p], one.l = hl[row * parts + p];
          std::copy_n(ho.data() + (row * parts + p) * d, d, one.o.begin());
          partial_merge(dev, one);
        }
        std::vector<float> want_o(d), got_o(d);
        partial_finish(ref, want_o.data());
        partial_finish(dev, got_o.data());
        far_sum.check(rel_err(got_o, want_o));
      }
    }
  }
  INFO(mismatched << " group selections of " << selections << " heads differ");
  CHECK(mismatched == 0);
  CHECK(spread_heads >= 5);  // the spread cases reached the far check
  CHECK(listed_heads >= 8);  // the two-level cases reached their check
  INFO(dropped_rows << " dropped rows checked as far rows");
  CHECK(dropped_rows > 1000);  // the far_dropped cases dropped rows, and the far check took them
  INFO("largest far spread term " << max_spread_term);
  CHECK(max_spread_term > 0.05);  // and their term is large enough to matter
}

namespace {

// The CPU runtime folding rows as the device search's runtime does.
// When the GPU runtime's k-means runs on the device (build_on_gpu) its
// indexes cluster with LloydKMeans, the GPU engine's twin.
class FoldingRuntime : public OffloadRuntime {
 public:
  FoldingRuntime(const ModelConfig& cfg, const OffloadPolicy& p, int fold) : OffloadRuntime(cfg, p, false), fold_(fold) {}
  OffloadedLayer::Config layer_config(int i) const override {
    auto c = OffloadRuntime::layer_config(i);
    c.fold_every = fold_;
    if (build_on_gpu(policy(), /*cuda=*/true)) c.build.kmeans = std::make_shared<LloydKMeans>();
    return c;
  }

 private:
  int fold_;
};

}  // namespace

TEST_CASE("GpuOffloadRuntime with the search on the device serves the CPU runtime's attention", "[search]") {
  auto& be = cuda_be();
  OpSummary sum("offloaded attention, device search vs CPU runtime", 1e-4);
  // k stays above the evicted rows not folded yet (the tail): the device
  // attends all of them exactly, the CPU only the k best (KvIndex::search).
  // stage: the store is not pinned; the searched rows go through the host's
  // staging buffer (GpuOffloadRuntime::stage_searched_rows).
  // rerank: the device's step 3b against the host index's rerank_rows.
  // gpu_build: the GPU runtime clusters with the GPU k-means (--build-on gpu), the CPU runtime with its twin.
  struct Case { std::string index; int hd, heads, kv, n, window, sinks, k, fold; bool stage = false; double rerank = 1;
                bool gpu_build = false; };
  const std::vector<Case> cases = {
      {"multipole", 128, 4, 1, 3000, 16, 4, 256, 1024}, {"multipole", 256, 8, 1, 2500, 8, 2, 300, 5},
      {"centroid", 64, 8, 2, 1200, 32, 4, 64, 40},      {"quest:page=4", 128, 8, 8, 700, 8, 0, 40, 7},
      {"multipole", 64, 4, 1, 10, 8, 4, 16, 3},  // the store starts empty: built at the first eviction
      {"multipole", 256, 8, 1, 2500, 8, 2, 300, 5, true}, {"quest:page=4", 128, 8, 8, 700, 8, 0, 40, 7, true},
      {"centroid", 64, 8, 2, 1200, 32, 4, 64, 40, true},
      {"multipole", 128, 4, 1, 3000, 16, 4, 256, 1024, false, 4}, {"centroid", 64, 8, 2, 1200, 32, 4, 64, 40, false, 3},
      {"multipole:rerank=2", 256, 8, 1, 2500, 8, 2, 100, 5, false, 0},  // the spec's own factor
      {"multipole:spread=0.5", 128, 4, 1, 3000, 16, 4, 256, 1024, false, 0},  // the far rows' spread term
      {"multipole:spread=4,spread_clip=1.5", 64, 8, 2, 1200, 32, 4, 64, 40, false, 0},
      // the rows rerank drops as far rows: the device's one by one, the host's one per cluster
      {"multipole:rerank_far=1", 128, 4, 1, 3000, 16, 4, 256, 1024, false, 0},
      {"multipole:rerank_far=1,spread=0.5", 64, 8, 2, 1200, 32, 4, 64, 40, false, 3},
      {"quest:page=4,coarse_ratio=4,expand=2", 128, 8, 8, 700, 8, 0, 40, 7},  // two levels
      {"quest:page=8,coarse_ratio=8", 64, 8, 2, 3000, 16, 4, 64, 40},
      {"multipole", 128, 4, 1, 3000, 16, 4, 256, 1024, false, 0, true},
      {"centroid", 64, 8, 2, 1200, 32, 4, 64, 40, false, 0, true},
  };
  for (const Case& c : cases) {
    CAPTURE(c.index, c.hd, c.heads, c.kv, c.n, c.fold, c.stage, c.rerank, c.gpu_build);
    const ModelConfig cfg = runtime_test_config(2, c.heads, c.kv, c.hd);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = c.index, pol.search.k = c.k, pol.sinks = c.sinks, pol.window = c.window;
    pol.search_on = SearchOn::Gpu, pol.device_table_type = DType::F32, pol.device_fold = c.fold;
    pol.stage_rows = c.stage, pol.search.rerank = c.rerank, pol.build_on = c.gpu_build ? BuildOn::Gpu : BuildOn::Host;
    pol.sync_folds = true;  // the CPU runtime folds on its step too: the same rows covered at every step
    FoldingRuntime ref(cfg, pol, c.fold);
    auto got = make_gpu_offload_runtime(be, cfg, pol, false);
    // k, v exactly representable in the f16 store: the device attends the
    // rows not yet folded from its fp32 ring, the CPU from the store.
    compare_offload_steps(ref, *got, cfg, c.n, 3 * c.window + 2 * std::min(c.fold, 50) + 5, /*f16_exact=*/true, sum);
  }
}

// A runtime restored from a context pack decodes like a CPU runtime restored
// from the same pack. By default the GPU runtime copies the pack's store into
// pinned memory (the kernels read rows there); registering the file mapping
// with the device instead (cudaHostRegister, read-only) hung in the driver on
// the H200 host (bench/results/gpu_h100_session4/), as reported for llama.cpp
// and vLLM, and the host has no pageable memory access
// (scripts/probes/pageable_store_probe.cu). With stage_rows the store is used
// in place from the mapping and the searched rows go through the staging buffer.
TEST_CASE("GpuOffloadRuntime restored from a pack decodes like the CPU restored from it", "[search]") {
  auto& be = cuda_be();
  OpSummary sum("from a pack: device search vs CPU runtime", 1e-4);
  TempDir td;
  for (const auto& [index, stage] : {std::pair{"multipole", false}, std::pair{"quest:page=16", false},
                                     std::pair{"multipole", true}, std::pair{"quest:page=16", true}}) {
    CAPTURE(index, stage);
    const ModelConfig cfg = runtime_test_config(1, 4, 2, 64);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = index, pol.search.k = 512, pol.sinks = 4, pol.window = 64;
    pol.search.rerank = 1;  // the plain lookup (rerank: the runtime case above)
    pol.search_on = SearchOn::Gpu, pol.device_table_type = DType::F32, pol.device_fold = 1000;  // no fold in 20 steps
    pol.sync_folds = true;
    pol.stage_rows = stage;
    const int64_t n = 2 * RowStore::kChunkRows + 777;  // whole chunks (the CPU maps them) and a tail
    std::mt19937 rng(19);
    const RandomContext ctx = random_context(cfg, n, /*f16_exact=*/true, rng);
    const std::string path = (td.dir / "p.tkv").string();
    {
      OffloadRuntime built(cfg, pol, false);
      built.take_context(n, ctx.reader());
      PackWriter w;
      built.save(w);
      w.write(path);
    }
    PackReader r(path);
    FoldingRuntime ref(cfg, pol, 1000);
    ref.take_pack(r);
    auto got = make_gpu_offload_runtime(be, cfg, pol, false);
    got->take_pack(r);
    for (int h = 0; h < cfg.n_head_kv; ++h) {
      const RowStore& ks = *got->layer(0)->key_store(h);
      CHECK(ref.layer(0)->key_store(h)->mapped_bytes() > 0);  // the CPU runtime reads the mapping in place
      // The GPU runtime's rows are pinned copies, or with stage_rows the mapping's.
      CHECK(ks.mapped_bytes() == (stage ? (size_t)ks.size() * ks.row_bytes() : 0));
    }
    compare_decode_steps(ref, *got, cfg, n, 20, /*f16_exact=*/true, sum, rng);
  }
}

// make_build_runtime on the CUDA backend: the host runtime that builds a
// pack (`index build`, eval's shared context) clusters with the device's
// k-means where the CUDA runtime would (--build-on auto), so a runtime
// restored from its pack attends as one that built its own indexes on the
// device. A pack whose k-means ran in Faiss on the host (--build-on host, what
// eval built on a GPU host before) attends differently: the check can fail.
TEST_CASE("A pack built on the CUDA backend holds the indexes the CUDA runtime builds", "[search]") {
  auto& be = cuda_be();
  TempDir td;
  for (const std::string index : {"multipole", "centroid"}) {
    CAPTURE(index);
    const ModelConfig cfg = runtime_test_config(2, 6, 2, 128);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = index, pol.search.k = 64, pol.sinks = 4, pol.window = 64;
    pol.search.rerank = 1;
    pol.search_on = SearchOn::Gpu, pol.device_table_type = DType::F32, pol.device_fold = 1000;  // no fold
    pol.sync_folds = true;
    const int64_t n = 2 * 8192 + 1237;  // two whole k-means blocks and a part
    std::mt19937 rng(23);
    const RandomContext ctx = random_context(cfg, n, /*f16_exact=*/true, rng);
    std::vector<std::unique_ptr<PackReader>> readers;  // outlive the runtimes restored from them
    auto restored = [&](BuildOn on) {
      OffloadPolicy b = pol;
      b.build_on = on;
      const std::string path = (td.dir / fmt::format("{}-{}.tkv", index, build_on_name(on))).string();
      {
        auto built = make_build_runtime(be, cfg, b, false);
        built->take_context(n, ctx.reader());
        PackWriter w;
        built->save(w);
        w.write(path);
      }
      readers.push_back(std::make_unique<PackReader>(path));
      auto rt = make_gpu_offload_runtime(be, cfg, pol, false);
      rt->take_pack(*readers.back());
      return rt;
    };
    auto direct = make_gpu_offload_runtime(be, cfg, pol, false);
    direct->take_context(n, ctx.reader());
    auto same = restored(BuildOn::Auto), faiss = restored(BuildOn::Host);
    // The same random steps through the three; the largest relative
    // difference from the direct runtime's output, over every layer and step.
    const int hd = cfg.head_dim;
    const size_t qn = (size_t)cfg.n_head * hd, kn = (size_t)cfg.n_head_kv * hd;
    Buffer dq = be.alloc(qn * 4), dk = be.alloc(kn * 4), dv = be.alloc(kn * 4), dout = be.alloc(qn * 4);
    double same_err = 0, faiss_err = 0;
    for (int step = 0; step < 12; ++step)
      for (int il = 0; il < cfg.n_layer; ++il) {
        const auto q = randn(qn, rng, 1.5f);
        std::vector<float> k = randn(kn, rng, 1.f, 0.3f), v = randn(kn, rng);
        round_through(DType::F16, k), round_through(DType::F16, v);
        be.from_host(q.data(), dq, 0, qn * 4), be.from_host(k.data(), dk, 0, kn * 4), be.from_host(v.data(), dv, 0, kn * 4);
        std::vector<std::vector<float>> outs;
        for (OffloadRuntime* rt : {direct.get(), same.get(), faiss.get()}) {
          rt->decode_attention_device(il, dq.f32(), dk.f32(), dv.f32(), n + step, 1.f / std::sqrt((float)hd), dout.f32());
          outs.push_back(download(be, dout, qn));
        }
        same_err = std::max(same_err, (double)rel_err(outs[1], outs[0]));
        faiss_err = std::max(faiss_err, (double)rel_err(outs[2], outs[0]));
      }
    CAPTURE(same_err, faiss_err);
    CHECK(same_err <= 1e-6);
    CHECK(faiss_err > 1e-3);
  }
}

// Folds on a host thread (the default): while a fold runs, the device keeps
// attending the rows its tables do not cover exactly, so when k covers every
// row the output is exact attention whatever the folds' timing. Against a CPU
// runtime that retrieves everything exactly (flat index, k above the context),
// over enough steps for many folds (device_fold 7..64) to start and land.
TEST_CASE("GpuOffloadRuntime folds on a host thread and stays exact while the folds run", "[search]") {
  auto& be = cuda_be();
  OpSummary sum("async folds, k covers all: device vs exact", 1e-4);
  // i8 tables: every fold stages the tables with new per-dimension scales.
  struct Case { std::string index; int hd, heads, kv, n, window, fold; DType table = DType::F32; };
  const std::vector<Case> cases = {{"multipole", 128, 4, 1, 600, 16, 7}, {"quest:page=4", 64, 8, 2, 900, 8, 13},
                                   {"centroid", 256, 8, 1, 400, 32, 64},
                                   {"multipole", 128, 4, 1, 600, 16, 7, DType::I8},
                                   {"quest:page=4,coarse_ratio=4", 64, 8, 2, 900, 8, 13, DType::I8}};
  for (const Case& c : cases) {
    CAPTURE(c.index, c.hd, c.heads, c.kv, c.n, c.fold, dtype_name(c.table));
    const ModelConfig cfg = runtime_test_config(2, c.heads, c.kv, c.hd);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.search.k = 1 << 20, pol.sinks = 4, pol.window = c.window;
    OffloadPolicy exact = pol;
    exact.index = "flat";
    pol.index = c.index, pol.search_on = SearchOn::Gpu, pol.device_table_type = c.table;
    pol.search.rerank = 1;  // the plain lookup (rerank: the runtime case above)
    pol.device_fold = c.fold;  // sync_folds stays off
    OffloadRuntime ref(cfg, exact, false);
    auto got = make_gpu_offload_runtime(be, cfg, pol, false);
    compare_offload_steps(ref, *got, cfg, c.n, 6 * c.fold + 20, /*f16_exact=*/true, sum);
  }
}

// A fold on the host thread lands at a fixed step, so the search sees the
// same rows whatever the host's timing: one runtime stepped back to back
// (its folds finish late) and one that idles between steps (they finish
// early) give the same outputs bit for bit, with k small enough that whether
// a row is in the tables or the ring changes the answer.
TEST_CASE("Async folds land at a fixed step: the same outputs however fast the host folds", "[search]") {
  auto& be = cuda_be();
  struct Case { std::string index; int hd, heads, kv, fold; DType table = DType::F16; };
  for (const Case& c : std::vector<Case>{{"multipole", 128, 8, 2, 64}, {"quest:page=4", 64, 4, 1, 37},
                                         {"multipole", 128, 8, 2, 64, DType::I8}}) {
    CAPTURE(c.index, c.hd, c.fold, dtype_name(c.table));
    const ModelConfig cfg = runtime_test_config(2, c.heads, c.kv, c.hd);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = c.index, pol.search.k = 16, pol.sinks = 4, pol.window = 16;
    pol.search.rerank = 1;  // the plain lookup (rerank: the runtime case above)
    pol.search_on = SearchOn::Gpu, pol.device_fold = c.fold;  // sync_folds stays off
    pol.device_table_type = c.table;
    pol.build_on = BuildOn::Host;  // Faiss, as the reference's
    const int64_t n = 3000;
    const int steps = 4 * c.fold + 10;  // three folds and more (one starts every device_fold steps)
    std::mt19937 rng(11);
    const RandomContext ctx = random_context(cfg, n, false, rng);
    const size_t qn = (size_t)cfg.n_head * c.hd, kn = (size_t)c.kv * c.hd;
    std::vector<std::vector<float>> q, k, v;
    for (int i = 0; i < steps * cfg.n_layer; ++i)
      q.push_back(randn(qn, rng, 1.5f)), k.push_back(randn(kn, rng, 1.f, 0.3f)), v.push_back(randn(kn, rng));
    Buffer dq = be.alloc(qn * 4), dk = be.alloc(kn * 4), dv = be.alloc(kn * 4), dout = be.alloc(qn * 4);
    std::vector<std::vector<float>> outs[2];
    for (int run = 0; run < 2; ++run) {
      auto rt = make_gpu_offload_runtime(be, cfg, pol, false);
      rt->take_context(n, ctx.reader());
      for (int step = 0; step < steps; ++step) {
        for (int il = 0; il < cfg.n_layer; ++il) {
          const size_t i = (size_t)step * cfg.n_layer + il;
          be.from_host(q[i].data(), dq, 0, qn * 4), be.from_host(k[i].data(), dk, 0, kn * 4);
          be.from_host(v[i].data(), dv, 0, kn * 4);
          rt->decode_attention_device(il, dq.f32(), dk.f32(), dv.f32(), n + step, 0.1f, dout.f32());
          outs[run].push_back(download(be, dout, qn));
        }
        if (run == 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));  // the fold thread finishes early
      }
    }
    for (size_t i = 0; i < outs[0].size(); ++i) {
      CAPTURE(i);
      REQUIRE(outs[1][i] == outs[0][i]);
    }
  }
}

// --store-cache changes where the device search reads a retrieved row (a GPU
// copy of its store chunk, or the pinned host store over PCIe), never which
// rows or their bytes: runtimes with the cache off, unlimited, and limited to
// part of one store give the same outputs bit for bit, step after step, while
// folds add rows the copies must follow. One case spans two store chunks.
TEST_CASE("The store cache serves the same attention as reading the host store", "[search]") {
  auto& be = cuda_be();
  // part: the limited cache's rows (one store's first chunk: its second is
  // read from the host; one grain: the first store only).
  struct Case { std::string index; int hd, heads, kv; int64_t n; int window, fold; int64_t part; DType store = DType::F16;
                std::string at = ""; };
  const std::vector<Case> cases = {{"quest", 128, 8, 2, 70000, 64, 300, RowStore::kChunkRows},
                                   {"multipole", 64, 4, 1, 3000, 16, 7, DeviceStoreCache::kGrain},
                                   {"centroid", 256, 8, 1, 1500, 32, 40, DeviceStoreCache::kGrain},
                                   {"multipole", 128, 8, 2, 2500, 16, 20, DeviceStoreCache::kGrain, DType::F8E4M3},
                                   {"quest", 64, 14, 2, 2500, 16, 20, DeviceStoreCache::kGrain, DType::Q8_0},
                                   // a store type per layer: the search reads each layer's rows at its type
                                   {"quest", 128, 8, 2, 2500, 16, 20, DeviceStoreCache::kGrain, DType::Q8_0, "1=f16"}};
  for (const Case& c : cases) {
    CAPTURE(c.index, c.hd, c.heads, c.kv, c.n, dtype_name(c.store), c.at);
    const ModelConfig cfg = runtime_test_config(2, c.heads, c.kv, c.hd);
    OffloadPolicy pol;
    pol.attn = AttnMode::TopK, pol.index = c.index, pol.search.k = 96, pol.sinks = 4, pol.window = c.window;
    pol.search.rerank = 1;  // the plain lookup (rerank: the runtime case above)
    pol.search_on = SearchOn::Gpu, pol.device_fold = c.fold, pol.sync_folds = true, pol.store_dtype = c.store;
    set_store_type_at(pol, c.at);
    const int64_t part_bytes = c.part * (int64_t)dtype_bytes(c.store, (size_t)c.hd);
    std::vector<std::unique_ptr<OffloadRuntime>> rts;
    for (int64_t limit : {int64_t(0), int64_t(-1), part_bytes}) {
      OffloadPolicy p = pol;
      p.store_cache = limit;
      rts.push_back(make_gpu_offload_runtime(be, cfg, p, false));
    }
    // With a store type per layer (types c.store and f16 only), a runtime of
    // each type alone: a layer attends as the one of its type, bit for bit.
    std::vector<std::unique_ptr<OffloadRuntime>> alone;
    if (!c.at.empty())
      for (DType t : {c.store, DType::F16}) {
        OffloadPolicy p = pol;
        p.store_dtype = t, p.store_dtype_at.clear();
        alone.push_back(make_gpu_offload_runtime(be, cfg, p, false));
      }
    std::mt19937 rng(3);
    const RandomContext ctx = random_context(cfg, c.n, false, rng);
    for (auto& rt : rts) rt->take_context(c.n, ctx.reader());
    for (auto& rt : alone) rt->take_context(c.n, ctx.reader());
    const size_t qn = (size_t)cfg.n_head * c.hd, kn = (size_t)c.kv * c.hd;
    Buffer dq = be.alloc(qn * 4), dk = be.alloc(kn * 4), dv = be.alloc(kn * 4), dout = be.alloc(qn * 4);
    const int steps = 2 * c.fold + 6;  // past the cache's start and through folds
    for (int step = 0; step < steps; ++step)
      for (int il = 0; il < cfg.n_layer; ++il) {
        CAPTURE(step, il);
        const auto q = randn(qn, rng, 1.5f), k = randn(kn, rng, 1.f, 0.3f), v = randn(kn, rng);
        be.from_host(q.data(), dq, 0, qn * 4), be.from_host(k.data(), dk, 0, kn * 4);
        be.from_host(v.data(), dv, 0, kn * 4);
        std::vector<std::vector<float>> outs;
        for (auto& rt : rts) {
          rt->decode_attention_device(il, dq.f32(), dk.f32(), dv.f32(), c.n + step, 0.1f, dout.f32());
          outs.push_back(download(be, dout, qn));
        }
        REQUIRE(outs[1] == outs[0]);
        REQUIRE(outs[2] == outs[0]);
        for (size_t a = 0; a < alone.size(); ++a) {
          alone[a]->decode_attention_device(il, dq.f32(), dk.f32(), dv.f32(), c.n + step, 0.1f, dout.f32());
          if ((a == 0 ? c.store : DType::F16) == pol.store_dtype_of(il)) REQUIRE(download(be, dout, qn) == outs[0]);
        }
      }
    const OffloadStats &off = rts[0]->stats(), &all = rts[1]->stats(), &part = rts[2]->stats();
    CHECK(off.device_store_bytes == 0);
    CHECK(all.device_store_bytes > 0);
    // Every indexed row's key and value (folds included) is on the device.
    CHECK(all.device_store_rows >= 2 * all.keys_indexed);
    CHECK(all.device_store_share == Approx(1.0));
    CHECK(part.device_store_share > 0.0);
    CHECK(part.device_store_share < 1.0);
    CHECK(off.device_store_share == 0.0);
    CHECK(part.device_store_bytes > 0);
    CHECK(part.device_store_bytes <= part_bytes);
    CHECK(part.device_store_rows < all.device_store_rows);
    CHECK(all.retrieved == off.retrieved);
  }
}
