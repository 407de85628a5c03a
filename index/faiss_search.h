// Per-call search paths for Faiss 1.7.3 inner-product indexes, for the case
// topkv has: one (or a few) query vectors per call, many calls, many indexes,
// and concurrent callers with different settings.
//
// Why not Index::search:
// - IndexHNSW::search opens an OpenMP region over all cores for a single query
//   and gives each thread a fresh VisitedTable of ntotal bytes, so every call
//   costs O(ntotal) memory traffic (and, on a busy host, OpenMP barrier spins)
//   before any distance is computed. Here one thread-local VisitedTable is
//   reused across calls (VisitedTable::advance() makes clearing O(1)), and the
//   search runs on the calling thread.
// - Faiss 1.7.3's HNSW::search sizes its candidate queue from the member
//   hnsw.efSearch and reads SearchParametersHNSW::efSearch only for a stopping
//   test, so a per-call ef does not reach the search (measured: same distance
//   count for ef 16/64/256). Setting the member is a race between concurrent
//   searches. faiss_hnsw_search() runs HNSW::search's algorithm (greedy descent
//   over the upper levels, bounded best-first search on level 0, the
//   check_relative_distance stop) over the index's own graph with the call's ef.
//   With ef == hnsw.efSearch it returns exactly what IndexHNSW::search returns
//   (tests/test_index_ann.cpp checks this).
// - IndexIVF::search with nq = 1 runs the coarse quantizer through OpenMP
//   regions too; faiss_ivf_search() assigns the query to its nprobe nearest
//   centroids itself and calls IndexIVF::search_preassigned, which scans the
//   lists on the calling thread (parallel_mode 0).
#pragma once
#include <faiss/IndexHNSW.h>
#include <faiss/IndexIVF.h>

#include <cstdint>
#include <vector>

namespace topkv {

struct FaissSearchCounts {
  int64_t keys_scored = 0;       // distances to stored vectors
  int64_t summaries_scored = 0;  // distances to coarse centroids (IVF)
};

// k best (largest inner product first) of one query over an IndexHNSW built
// with METRIC_INNER_PRODUCT: ids[i] / scores[i] = q·x (as Faiss computes it).
// Fewer than k come back when the graph holds fewer reachable vectors.
void faiss_hnsw_search(const faiss::IndexHNSW& index, const float* q, int k, int ef, std::vector<int64_t>& ids,
                       std::vector<float>& scores, FaissSearchCounts& counts);

// k best of each of nq queries over an inner-product IndexIVF probing nprobe
// lists (clipped to [1, nlist]): labels/scores are nq x k, -1 where a query
// found fewer than k vectors.
void faiss_ivf_search(const faiss::IndexIVF& index, const float* q, int nq, int k, int nprobe, int64_t* labels,
                      float* scores, FaissSearchCounts& counts);

}  // namespace topkv
