// topkv bench recall: the command line of the recall benchmark
// (bench/recall_bench.h). Data from --synthetic (bench/synthetic.h) or a KV
// dump (bench/kv_dump.h); any registered index backends; sweeps of their
// search parameters; a table, CSV, JSON and a recall-vs-QPS plot.
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <memory>

#include "src/common/host_memory.h"
#include "src/common/limits.h"
#include "bench/kv_dump.h"
#include "bench/recall_bench.h"
#include "bench/recall_report.h"
#include "bench/synthetic.h"
#include "src/cli/commands.h"
#include "src/common/error.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/common/cli_files.h"

namespace topkv::cli {

namespace {

struct RecallArgs {
  bool synthetic = false;
  std::string dump;
  int layer = -1, head = 0, heads = 1, queries = 0;
  std::string dtype;
  float scale = 0.f;
  SyntheticConfig syn;
  std::string save_dump;
  std::vector<std::string> indexes, sweeps;
  int k = 32, threads = 0;
  std::string csv, json, png, png_metric = "recall";
  bool quiet = false;
  std::vector<CLI::Option*> synthetic_options;
};

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

AttentionData load_data(RecallArgs& a) {
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
  AttentionData d = r.load(layer, heads, dtype, a.queries);
  d.source += fmt::format(" head {}", a.head);
  return d;
}

void run(RecallArgs& a) {
  // Cheap checks first: nothing long starts on input that cannot work.
  TOPKV_CHECK(a.synthetic != !a.dump.empty(), "give exactly one data source: --synthetic or --dump FILE");
  if (!a.synthetic) {
    for (auto* o : a.synthetic_options)
      TOPKV_CHECK(o->count() == 0, "{} shapes synthetic data: it needs --synthetic, not --dump", o->get_name());
    TOPKV_CHECK(a.save_dump.empty(), "--save-dump writes synthetic data: it needs --synthetic");
  } else {
    TOPKV_CHECK(a.layer < 0, "--layer selects a layer of a --dump file");
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

}  // namespace

void register_bench_recall(CLI::App& bench) {
  auto a = std::make_shared<RecallArgs>();
  auto* cmd = bench.add_subcommand(
      "recall",
      "ANN recall of index backends on attention data: recall@k, attention-mass recall, attention-output error, "
      "keys scored, build time, memory, latency per search and per layer (heads in parallel)");
  cmd->footer(
      "Examples:\n"
      "  topkv bench recall --synthetic --n-keys 100000 --queries 200 --index flat\n"
      "  topkv bench recall --synthetic --index flat --index hnswlib:M=16 --sweep hnswlib.ef=16:256:x2 --png r.png\n"
      "  topkv bench recall --dump kv.safetensors --layer 12 --head 3 --heads 0 --index quest:page=16 "
      "--sweep quest.k=256,1024,4096 --json r.json\n"
      "Each search call serves one decode step's GQA group on one thread; QPS counts calls per second.");
  auto& s = a->syn;

  // data
  cmd->add_flag("--synthetic", a->synthetic, "Generate synthetic attention data (bench/synthetic.h)");
  cmd->add_option("--dump", a->dump, "KV dump to read (safetensors, convention in bench/kv_dump.h)");
  cmd->add_option("--layer", a->layer, "Layer of the dump (default: its first)");
  cmd->add_option("--head", a->head, "KV head of the dump whose recall is measured")->capture_default_str();
  cmd->add_option("--heads", a->heads,
                  "KV heads searched in parallel for the layer latency (synthetic: heads generated; dump: 0 = "
                  "every head of the layer). 1 = no layer measurement")
      ->capture_default_str();
  cmd->add_option("--queries", a->queries, "Decode steps (synthetic: generated, default 200; dump: the first N, 0 = all)");
  cmd->add_option("--dtype", a->dtype, "Key/value store type f32|f16|bf16 (default: f16 synthetic, the file's for a dump)");
  cmd->add_option("--scale", a->scale, "Attention score scale (default: 1/sqrt(head_dim) or the dump's)");
  cmd->add_option("--save-dump", a->save_dump, "Also write the synthetic data as a KV dump to this file");
  auto syn = [&](const char* name, auto& field, const char* help) {
    a->synthetic_options.push_back(cmd->add_option(name, field, help)->capture_default_str()->group("Synthetic data"));
  };
  syn("--n-keys", s.n_keys, "Context length: keys per KV head");
  syn("--head-dim", s.head_dim, "Head dimension (even)");
  syn("--gqa-group", s.group, "Query heads per KV head (GQA group G)");
  syn("--seed", s.seed, "Random seed (same seed, same data)");
  syn("--key-offset", s.key_offset, "Shared key offset, |o|/sqrt(d), on the low-frequency RoPE pairs");
  syn("--dim-spread", s.dim_spread, "Largest/smallest per-dimension std of the keys");
  syn("--topic-len", s.topic_len, "Correlation length (tokens) of the drifting topic; 0 = none");
  syn("--topic-weight", s.topic_weight, "Share of key/value variance carried by the topic");
  syn("--rope-base", s.rope_base, "RoPE base (NeoX pairing); 0 = no RoPE");
  syn("--query-shift", s.query_shift, "Out-of-distribution query mean, |m|/sqrt(d); 0 = none");
  syn("--query-noise", s.query_noise, "Std of the queries' random logits");
  syn("--recency", s.recency, "Logit bonus of the newest keys (needs --key-offset > 0)");
  syn("--sinks", s.n_sinks, "Sink keys at the first positions");
  syn("--sink-norm", s.sink_norm, "Extra norm of sink keys, /sqrt(d)");
  syn("--sink-frac", s.sink_frac, "Share of query heads that attend to the sinks");
  syn("--sink-mass", s.sink_mass, "About the attention share the sinks then get");
  syn("--retrieval-frac", s.retrieval_frac, "Share of query heads that retrieve far keys");
  syn("--retrieval-targets", s.retrieval_targets, "Far keys per retrieving query head");
  syn("--retrieval-mass", s.retrieval_mass, "About the attention share the far keys then get");

  // backends
  cmd->add_option("--index", a->indexes,
                  "Index backend spec, repeatable, e.g. flat, hnswlib:M=16, quest:page=16 (default: flat; "
                  "`topkv info` lists backends)");
  cmd->add_option("--sweep", a->sweeps,
                  "Search parameter sweep BACKEND.PARAM=VALUES (or PARAM=VALUES for every backend), repeatable; "
                  "PARAM: k (alias budget), ef, nprobe, threshold, gqa; VALUES: 16,32,64 or 16:512:x2 or "
                  "16:128:+16; gqa: union,mean");
  cmd->add_option("--k", a->k, "The k of recall@k (and the search k unless swept)")->capture_default_str();
  cmd->add_option("--threads", a->threads,
                  "Threads for data, ground truth, builds and the layer-parallel search (0 = all cores)")->check(thread_count())
      ->capture_default_str();

  // output
  cmd->add_option("--csv", a->csv, "Write the results as CSV")->check(output_file("--csv report"));
  cmd->add_option("--json", a->json, "Write the results as JSON (schema: bench/recall_schema.json)")->check(output_file("--json report"));
  cmd->add_option("--png", a->png, "Plot recall against QPS (scripts/plot_recall.py, needs matplotlib)")->check(output_file("--png plot"));
  cmd->add_option("--png-metric", a->png_metric, "x axis of the plot: recall or mass")->capture_default_str();
  cmd->add_flag("--quiet", a->quiet, "No progress output on stderr");
  cmd->callback([a] { run(*a); });
}

}  // namespace topkv::cli
