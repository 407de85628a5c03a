#include "index/faiss_search.h"

#include <faiss/IndexFlat.h>
#include <faiss/impl/AuxIndexStructures.h>
#include <faiss/impl/DistanceComputer.h>
#include <faiss/utils/Heap.h>

#include <algorithm>
#include <memory>

#include "index/topk_collector.h"
#include "src/common/error.h"
#include "src/common/vec_math.h"

namespace topkv {

namespace {

using storage_idx_t = faiss::HNSW::storage_idx_t;
using idx_t = faiss::Index::idx_t;

// HNSW minimises a distance; for inner product it searches on -q·x, as
// IndexHNSW does internally. Counts the evaluations for stats.
struct NegatedIp final : faiss::DistanceComputer {
  explicit NegatedIp(faiss::DistanceComputer* ip) : ip(ip) {}
  void set_query(const float* x) override { ip->set_query(x); }
  float operator()(idx_t i) override {
    ++count;
    return -(*ip)(i);
  }
  float symmetric_dis(idx_t i, idx_t j) override { return -ip->symmetric_dis(i, j); }
  std::unique_ptr<faiss::DistanceComputer> ip;
  int64_t count = 0;
};

// One visited table per thread, reused by every search of every index on that
// thread: advance() invalidates all marks in O(1) (a memset every 249 calls).
// Advancing before use (HNSW::search advances after) keeps a search that was
// cut short by an exception from leaving marks the next one would see.
faiss::VisitedTable& thread_visited_table(size_t ntotal) {
  thread_local faiss::VisitedTable vt(0);
  if (vt.visited.size() < ntotal) vt.visited.resize(ntotal, 0);  // new slots never equal visno >= 1
  vt.advance();
  return vt;
}

// Faiss's greedy_update_nearest: walk to the nearest neighbour on `level`
// until no neighbour is closer.
void greedy_update_nearest(const faiss::HNSW& hnsw, faiss::DistanceComputer& dis, int level,
                           storage_idx_t& nearest, float& d_nearest) {
  for (;;) {
    storage_idx_t prev = nearest;
    size_t begin, end;
    hnsw.neighbor_range(nearest, level, &begin, &end);
    for (size_t i = begin; i < end; ++i) {
      storage_idx_t v = hnsw.neighbors[i];
      if (v < 0) break;
      float d = dis(v);
      if (d < d_nearest) {
        nearest = v;
        d_nearest = d;
      }
    }
    if (nearest == prev) return;
  }
}

// Faiss's search_from_candidates on level 0 (no id selector), with the
// candidate queue and the stopping test sized by the call's ef. D/I is a
// max-heap of the k best (smallest distance) found so far, nres entries.
int search_level0(const faiss::HNSW& hnsw, faiss::DistanceComputer& dis, int k, idx_t* I, float* D,
                  faiss::HNSW::MinimaxHeap& candidates, faiss::VisitedTable& vt, int ef) {
  int nres = 0;
  for (int i = 0; i < candidates.size(); ++i) {
    idx_t v1 = candidates.ids[(size_t)i];
    float d = candidates.dis[(size_t)i];
    if (nres < k)
      faiss::maxheap_push(++nres, D, I, d, v1);
    else if (d < D[0])
      faiss::maxheap_replace_top(nres, D, I, d, v1);
    vt.set((int)v1);
  }
  int nstep = 0;
  while (candidates.size() > 0) {
    float d0 = 0;
    int v0 = candidates.pop_min(&d0);
    // Faiss's "tricky stopping condition": ef already-queued candidates are
    // closer than the one just taken.
    if (hnsw.check_relative_distance && candidates.count_below(d0) >= ef) break;
    size_t begin, end;
    hnsw.neighbor_range(v0, 0, &begin, &end);
    for (size_t j = begin; j < end; ++j) {
      int v1 = hnsw.neighbors[j];
      if (v1 < 0) break;
      if (vt.get(v1)) continue;
      vt.set(v1);
      float d = dis(v1);
      if (nres < k)
        faiss::maxheap_push(++nres, D, I, d, (idx_t)v1);
      else if (d < D[0])
        faiss::maxheap_replace_top(nres, D, I, d, (idx_t)v1);
      candidates.push(v1, d);
    }
    if (!hnsw.check_relative_distance && ++nstep > ef) break;
  }
  return nres;
}

}  // namespace

void faiss_hnsw_search(const faiss::IndexHNSW& index, const float* q, int k, int ef, std::vector<int64_t>& ids,
                       std::vector<float>& scores, FaissSearchCounts& counts) {
  TOPKV_CHECK(index.metric_type == faiss::METRIC_INNER_PRODUCT, "faiss_hnsw_search needs an inner-product index");
  const faiss::HNSW& hnsw = index.hnsw;
  ids.clear();
  scores.clear();
  if (hnsw.entry_point < 0 || k < 1) return;
  NegatedIp dis(index.storage->get_distance_computer());
  dis.set_query(q);
  faiss::VisitedTable& vt = thread_visited_table((size_t)index.ntotal);

  storage_idx_t nearest = hnsw.entry_point;
  float d_nearest = dis(nearest);
  for (int level = hnsw.max_level; level >= 1; --level) greedy_update_nearest(hnsw, dis, level, nearest, d_nearest);

  const int queue = std::max(ef, k);
  faiss::HNSW::MinimaxHeap candidates(queue);
  candidates.push(nearest, d_nearest);
  std::vector<idx_t> I((size_t)k);
  std::vector<float> D((size_t)k);
  int nres = search_level0(hnsw, dis, k, I.data(), D.data(), candidates, vt, ef);

  faiss::maxheap_reorder(nres, D.data(), I.data());  // nearest (largest q·x) first
  for (int i = 0; i < nres; ++i) {
    ids.push_back(I[(size_t)i]);
    scores.push_back(-D[(size_t)i]);
  }
  counts.keys_scored += dis.count;
}

void faiss_ivf_search(const faiss::IndexIVF& index, const float* q, int nq, int k, int nprobe, int64_t* labels,
                      float* scores, FaissSearchCounts& counts) {
  TOPKV_CHECK(index.metric_type == faiss::METRIC_INNER_PRODUCT, "faiss_ivf_search needs an inner-product index");
  auto* coarse = dynamic_cast<const faiss::IndexFlat*>(index.quantizer);
  TOPKV_CHECK(coarse && coarse->metric_type == faiss::METRIC_INNER_PRODUCT,
              "faiss_ivf_search needs an IndexFlatIP coarse quantizer");
  const int64_t nlist = (int64_t)index.nlist;
  const int64_t probe = std::clamp<int64_t>(nprobe, 1, nlist);
  const size_t d = (size_t)index.d;

  // Coarse assignment: q·centroid for every list, the nprobe best, per query.
  std::vector<float> cs((size_t)nlist * (size_t)nq);
  dot_rows_multi(DType::F32, coarse->get_xb(), (size_t)nlist, d, q, (size_t)nq, cs.data());
  std::vector<idx_t> assign((size_t)nq * (size_t)probe, -1);
  std::vector<float> assign_score((size_t)nq * (size_t)probe, 0.f);
  for (int g = 0; g < nq; ++g) {
    TopKCollector top(probe);
    for (int64_t j = 0; j < nlist; ++j) top.push(cs[(size_t)j * (size_t)nq + (size_t)g], j);
    auto best = top.take_sorted();
    for (size_t t = 0; t < best.size(); ++t) {
      assign[(size_t)g * (size_t)probe + t] = best[t].second;
      assign_score[(size_t)g * (size_t)probe + t] = best[t].first;
    }
  }
  counts.summaries_scored += nlist * nq;

  faiss::SearchParametersIVF sp;
  sp.nprobe = (size_t)probe;
  faiss::IndexIVFStats stats;
  static_assert(sizeof(idx_t) == sizeof(int64_t));
  // parallel_mode 0 keeps search_preassigned on this thread; store_pairs off.
  index.search_preassigned(nq, q, k, assign.data(), assign_score.data(), scores, reinterpret_cast<idx_t*>(labels),
                           false, &sp, &stats);
  counts.keys_scored += (int64_t)stats.ndis;
}

}  // namespace topkv
