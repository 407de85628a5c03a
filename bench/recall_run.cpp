// topkv bench recall's run (src/cli/cmd_bench_recall.cpp is its command line)
// of the recall benchmark (bench/recall_bench.h). Data from --synthetic (bench/synthetic.h) or a KV
// dump (bench/kv_dump.h); any registered index backends; sweeps of their
// search parameters; a table, CSV, JSON and a recall-vs-QPS plot.
#include "bench/recall_run.h"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "bench/kv_dump.h"
#include "bench/recall_bench.h"
#include "bench/recall_report.h"
#include "bench/synthetic.h"
#include "src/common/cli_files.h"
#include "src/common/error.h"
#include "src/common/host_memory.h"
#include "src/common/limits.h"
#include "src/common/progress.h"
#include "src/common/timer.h"

namespace topkv {

namespace {

// An output file's folder is created or checked before the long work starts.
void check_output_path(const std::string& path, const char* flag) {
  if (!path.empty()) topkv::check_output_path(path, std::string(flag) + " file");
}

// Synthetic data is sized by the options alone: plan it (keys and values in
// the store type, their fp32 copies while they are made, the indexes' own
// bytes per key) against the memory this process may take, before any of it
// is allocated.
void check_synthetic_fits(const SyntheticConfig& c, const std::vector<std::string>& specs) {
  const double rows = (double)c.n_keys * c.kv_heads, d = c.head_dim;
  double bytes = rows * d * (2.0 * dtype_size(c.dtype) + 2.0 * sizeof(float));
  bytes += (double)c.n_queries * c.group * c.kv_heads * d * sizeof(float);
  for (const std::string& spec : specs) bytes += rows * KvIndex::create(spec)->bytes_per_key_estimate(c.head_dim);
  check_host_memory(bytes, fmt::format("synthetic data of {} keys x {} KV heads (head_dim {}) and its indexes",
                                       c.n_keys, c.kv_heads, c.head_dim),
                    "lower --n-keys, --heads or --head-dim");
}

AttentionData load_data(RecallRunOptions& a) {
  std::optional<DType> dtype;
  if (!a.dtype.empty()) dtype = parse_dtype(a.dtype);
  if (a.synthetic) {
    SyntheticConfig c = a.syn;
    c.kv_heads = a.heads;
    if (a.queries > 0) c.n_queries = a.queries;
    if (dtype) c.dtype = *dtype;
    TOPKV_CHECK(a.heads >= 1, "--heads must be at least 1 for synthetic data (got {})", a.heads);
    Timer t;
    auto s = generate_synthetic(c, a.threads, !a.quiet);
    if (!a.quiet) std::fprintf(stderr, "synthetic data: %.2f s\n", t.seconds());
    return std::move(s.data);
  }
  KvDumpReader r(a.dump);
  const auto layers = r.layers();
  const int layer = a.layer >= 0 ? a.layer : layers.front();
  const int kvh = r.layer_shape(layer).kv_heads;
  TOPKV_CHECK(a.head >= 0 && a.head < kvh, "--head {}: layer {} of '{}' has KV heads 0..{}", a.head, layer, a.dump,
              kvh - 1);
  TOPKV_CHECK(a.heads >= 0, "--heads must be >= 0 (0 = every KV head of the layer)");
  const int n = a.heads == 0 ? kvh : std::min(a.heads, kvh);
  std::vector<int> heads;  // the measured head first, then the ones after it
  for (int i = 0; i < n; ++i) heads.push_back((a.head + i) % kvh);
  AttentionData d = r.load(layer, heads, dtype, a.queries, a.skip_keys);
  d.source += fmt::format(" head {}", a.head);
  return d;
}

}  // namespace

void run_recall(RecallRunOptions& a) {
  // Cheap checks first: nothing long starts on input that cannot work.
  TOPKV_CHECK(a.synthetic != !a.dump.empty(), "give exactly one data source: --synthetic or --dump FILE");
  if (!a.synthetic) {
    for (const std::string& flag : a.synthetic_flags_given)
      fail("{} shapes synthetic data: it needs --synthetic, not --dump", flag);
    TOPKV_CHECK(a.save_dump.empty(), "--save-dump writes synthetic data: it needs --synthetic");
  } else {
    TOPKV_CHECK(a.layer < 0, "--layer selects a layer of a --dump file");
    TOPKV_CHECK(a.skip_keys == 0, "--skip-keys leaves keys of a --dump file out (synthetic data: --sinks shapes its "
                "sink keys)");
    a.syn.validate();
  }
  TOPKV_CHECK(a.k >= 1, "--k must be at least 1 (got {})", a.k);
  check_thread_count(a.threads, "--threads");
  TOPKV_CHECK(a.queries >= 0, "--queries must be >= 0");
  TOPKV_CHECK(a.scale >= 0, "--scale must be positive (0 = the data's own)");
  if (!a.dtype.empty()) parse_dtype(a.dtype);
  TOPKV_CHECK(a.png_metric == "recall" || a.png_metric == "mass", "--png-metric is recall or mass, not '{}'",
              a.png_metric);
  check_output_path(a.csv, "--csv");
  check_output_path(a.json, "--json");
  check_output_path(a.png, "--png");
  check_output_path(a.save_dump, "--save-dump");
  if (a.quiet) Progress::set_global_enabled(false);

  RecallBenchConfig cfg;
  if (!a.indexes.empty()) cfg.index_specs = a.indexes;
  for (auto& s : a.sweeps) cfg.sweeps.push_back(parse_sweep_spec(s));
  cfg.k = a.k;
  cfg.threads = a.threads;
  cfg.progress = !a.quiet;
  TOPKV_CHECK(a.kmeans == "faiss" || a.kmeans == "lloyd", "--kmeans '{}': use faiss or lloyd", a.kmeans);
  cfg.kmeans = a.kmeans;
  cfg.seed = a.build_seed;
  for (auto& spec : cfg.index_specs) KvIndex::create(spec);  // unknown backend or parameter
  if (a.synthetic) {
    SyntheticConfig c = a.syn;
    c.kv_heads = a.heads;
    if (a.queries > 0) c.n_queries = a.queries;
    check_synthetic_fits(c, cfg.index_specs);
  }
  if (!a.dump.empty()) KvDumpReader probe(a.dump);           // missing or malformed file

  AttentionData data = load_data(a);
  if (a.scale > 0) data.scale = a.scale;
  if (!a.save_dump.empty()) {
    KvDumpWriter w("synthetic");
    w.add_layer(0, data);
    w.write(a.save_dump);
    if (!a.quiet) std::fprintf(stderr, "wrote %s\n", a.save_dump.c_str());
  }

  RecallBenchResult res = run_recall_bench(data, cfg);
  print_recall_table(res, stdout);
  if (!a.csv.empty()) write_recall_csv(res, a.csv);
  if (!a.json.empty()) write_recall_json(res, a.json);
  if (!a.png.empty()) {
    std::string json = a.json;
    if (json.empty()) {  // the plot reads JSON: a private temporary one
      json = (std::filesystem::temp_directory_path() / fmt::format("topkv_recall_{}.json", ::getpid())).string();
      write_recall_json(res, json);
    }
    try {
      plot_recall_png(json, a.png, a.png_metric);
    } catch (...) {
      if (a.json.empty()) std::remove(json.c_str());
      throw;
    }
    if (a.json.empty()) std::remove(json.c_str());
  }
}

}  // namespace topkv
