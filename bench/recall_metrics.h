// How well a search served one query head, measured against exact attention.
//
//  * recall@k: share of the exact top-k (by q·k) that the search returned.
//    Ties: every key scoring above the k-th best must be returned, and the
//    slots left may be filled by any key whose exact score ties the k-th
//    (within a relative tolerance): with duplicate or near-equal keys any of
//    them is a correct answer. Returning more than k ids (a GQA union, a
//    token budget) never scores above 1.
//  * attention-mass recall: share of the exact softmax mass,
//    softmax(scale · q·k) over all keys, held by the returned keys. This is
//    what attention actually loses (the top-k paper measures it as the share
//    of the attention the chosen keys cover).
//  * output error: ||o - o_exact|| / ||o_exact||, where o is attention over the
//    returned keys only, plus, for multipole backends, one weighted row per far
//    cluster (score scale · q·C_j + ln N_j, value V̄_j; DESIGN.md "Multipole",
//    merged exactly by offload/partial_attention.h).
//  * fraction scored: keys the backend dotted with a query while searching,
//    over n · nq (1.0 for an exact scan).
//
// Every score is recomputed from the key store: a backend's own scores are
// never trusted for grading.
#pragma once
#include <cstdint>
#include <vector>

#include "bench/attention_data.h"
#include "index/kv_index.h"

namespace topkv {

// Exact attention facts of one query head (computed once per benchmark).
struct QueryTruth {
  std::vector<int64_t> topk_ids;   // the min(k, n) best keys by q·k, best first (ties: lower id first)
  std::vector<float> topk_scores;  // their raw scores q·k
  double log_z = 0;                // ln sum_i exp(scale · q·k_i) over every key
  std::vector<float> output;       // exact attention output (value_dim)
  double topk_mass = 0;            // softmax mass of the exact top-k: the best mass recall at k
};

// Straight from the definitions, one query, single-threaded: the reference.
QueryTruth exact_truth_reference(const float* q, const RowStore& keys, const RowStore& values, float scale, int k);

// Every query head of `head`: result [j * group + g]. One pass over the keys
// per decode step serves its G query heads; steps run in parallel.
std::vector<QueryTruth> exact_truth(const AttentionHead& head, float scale, int k, int n_threads = 0,
                                    bool progress = false);

struct QueryMetrics {
  double recall = 0;        // recall@k, ties counted
  double mass_recall = 0;   // share of the exact softmax mass the returned keys hold
  double output_error = 0;  // relative L2 error of the attention output
};

// Relative tolerance for ties at the k-th score (of max(|best score|, 1)).
inline constexpr double kTieTolerance = 1e-4;

// Metrics of query head g of result `r` (a search over the G queries of one
// decode step; `q` is query head g's vector).
QueryMetrics evaluate_query(const SearchResult& r, int g, const float* q, const QueryTruth& truth,
                            const RowStore& keys, const RowStore& values, float scale, int k);

// (keys_scored + tail_scanned) / (n_keys · nq).
double fraction_scored(const SearchResult& r, int64_t n_keys);

}  // namespace topkv
