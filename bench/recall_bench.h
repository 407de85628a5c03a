// The ANN recall benchmark behind `topkv bench recall`: for every index
// backend (any registered KvIndex, by spec) and every point of its search
// parameter sweep, how well and how fast it finds the keys attention needs.
//
// Method (one KV head measured, the first of AttentionData::heads):
//  1. ground truth once: exact top-k, softmax normaliser and attention output
//     of every query head (bench/recall_metrics.h), multi-threaded;
//  2. per backend: build one index per KV head of the "layer" (build time and
//     memory() reported for the measured head);
//  3. per sweep point: search every decode step's G query heads at once on
//     one thread (SearchParams::n_threads = 1), timing each call (after a
//     short untimed warm-up), then grade each query head; then, when the layer
//     has more than one KV head, time searching all of them in parallel
//     (one index per head, tbb::parallel_for over heads) per decode step: the
//     latency a decode step's layer actually waits for.
// QPS counts search calls (each serves a whole GQA group) per second on one
// thread, as ann-benchmarks counts queries.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "bench/attention_data.h"
#include "index/kv_index.h"

namespace topkv {

// One --sweep: search parameter `param` of the backends named `backend`
// (empty = every backend) takes each of `values`.
struct SweepSpec {
  std::string backend, param;
  std::vector<std::string> values;  // canonical text of each value
};
// Parses "BACKEND.PARAM=VALUES" or "PARAM=VALUES". PARAM is one of k (alias
// budget), ef, nprobe, threshold, gqa; VALUES a list "16,32,64" or an integer
// range "16:512:x2" / "16:128:+16"; gqa takes "union,mean". Throws Error.
SweepSpec parse_sweep_spec(std::string_view text);
// Applies one parameter value to p (the value as parse_sweep_spec left it).
void apply_search_param(SearchParams& p, const std::string& param, const std::string& value);
// "k=32,ef=64" for the parameters that are swept or set.
std::string search_label(const SearchParams& p, const std::vector<std::string>& shown);
const char* gqa_name(GqaMode m);

struct RecallBenchConfig {
  std::vector<std::string> index_specs = {"flat"};
  std::vector<SweepSpec> sweeps;
  int k = 32;        // the k of recall@k (and the default search k)
  int threads = 0;   // ground truth, builds, the layer-parallel search; 0 = all cores
  bool progress = true;
  uint64_t seed = 1234;  // index builds
  // The blockwise k-means of centroid/multipole builds: "faiss" (the host
  // build's) or "lloyd" (LloydKMeans: the --build-on gpu engine's twin, whose
  // labels the GPU's equal; index/kmeans.h), to compare their indexes.
  std::string kmeans = "faiss";
};

struct Stat {
  double mean = 0, p5 = 0, p50 = 0, p99 = 0;
};
Stat summarize(const std::vector<double>& v);

struct RecallRow {
  std::string index;          // the spec as given, e.g. "hnswlib:M=16"
  std::string backend;        // "hnswlib"
  std::string build_params;   // canonical "M=16"
  std::string label;          // swept/set search parameters, e.g. "k=32,ef=64"
  SearchParams params;
  double build_seconds = 0;   // measured head
  MemoryReport memory;        // measured head
  int64_t n_keys = 0;
  Stat recall, mass_recall, output_error;  // over query heads
  double fraction_scored = 0;  // mean over searches
  double summaries_per_search = 0;  // centroids / page bounds / coarse nodes evaluated per search call
  double ids_per_search = 0;   // mean ids returned per search call (the GQA union)
  Stat latency_us;             // one search call, one thread
  double qps = 0;              // 1e6 / mean latency
  int layer_heads = 0;         // KV heads searched in parallel (0: not measured)
  Stat layer_latency_us;

  double bytes_per_key_structure() const { return n_keys ? (double)memory.structure_bytes / n_keys : 0; }
  double bytes_per_key_owned() const { return n_keys ? (double)memory.owned() / n_keys : 0; }
};

struct RecallBenchResult {
  RecallBenchConfig config;
  std::string source;  // AttentionData::source
  int64_t n_keys = 0;
  int head_dim = 0, group = 0, n_queries = 0, kv_heads = 0, threads = 0;
  std::string dtype;
  float scale = 0;
  double oracle_mass = 0;      // mean softmax mass of the exact top-k: the best mass recall at k
  double truth_seconds = 0;
  std::vector<RecallRow> rows;
};

// Throws Error on bad input (unknown backend or parameter, a sweep naming a
// backend not benchmarked, k < 1, empty data) before any long work.
RecallBenchResult run_recall_bench(const AttentionData& data, const RecallBenchConfig& cfg);

}  // namespace topkv
