// The run behind `topkv bench recall` (its command line:
// src/cli/cmd_bench_recall.cpp): data from --synthetic (bench/synthetic.h) or
// a KV dump (bench/kv_dump.h), the recall benchmark (bench/recall_bench.h)
// over the index specs and sweeps, then a table, CSV, JSON and a plot.
#pragma once
#include <string>
#include <vector>

#include "bench/synthetic.h"

namespace topkv {

struct RecallRunOptions {
  bool synthetic = false;
  std::string dump;
  int layer = -1, head = 0, heads = 1, queries = 0;
  int64_t skip_keys = 0;  // dump: the first keys left out (the runtime's exact sinks)
  std::string dtype;
  float scale = 0.f;
  SyntheticConfig syn;
  std::string save_dump;
  std::vector<std::string> indexes, sweeps;
  int k = 32, threads = 0;
  std::string kmeans = "faiss";  // centroid/multipole builds' k-means: faiss | lloyd (RecallBenchConfig::kmeans)
  uint64_t build_seed = 1234;     // RecallBenchConfig::seed
  std::string csv, json, png, png_metric = "recall";
  bool quiet = false;
  std::vector<std::string> synthetic_flags_given;  // synthetic-data options given (an Error with --dump)
};

// Checks the options (cheap checks first), loads or generates the data and
// runs the benchmark. Throws Error.
void run_recall(RecallRunOptions& a);

}  // namespace topkv
