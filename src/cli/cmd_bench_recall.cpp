// topkv bench recall: the command line of the recall benchmark; the run is
// bench/recall_run.h.
#include <memory>

#include "bench/recall_run.h"
#include "src/cli/commands.h"
#include "src/common/cli_files.h"

namespace topkv::cli {

void register_bench_recall(CLI::App& bench) {
  auto a = std::make_shared<RecallRunOptions>();
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
  auto syn_opts = std::make_shared<std::vector<CLI::Option*>>();

  // data
  cmd->add_flag("--synthetic", a->synthetic, "Generate synthetic attention data (bench/synthetic.h)");
  cmd->add_option("--dump", a->dump, "KV dump to read (safetensors, convention in bench/kv_dump.h)");
  cmd->add_option("--layer", a->layer, "Layer of the dump (default: its first)");
  cmd->add_option("--skip-keys", a->skip_keys,
                  "Dump: leave its first N keys out of the index and the ground truth, as the offloaded runtime does "
                  "with its attention sinks (attended exactly beside the index; --sinks, default 4). Without it a "
                  "far-field index (multipole) folds a sink into a cluster, which the runtime never does")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--head", a->head, "KV head of the dump whose recall is measured")->capture_default_str();
  cmd->add_option("--heads", a->heads,
                  "KV heads searched in parallel for the layer latency (synthetic: heads generated; dump: 0 = "
                  "every head of the layer). 1 = no layer measurement")
      ->capture_default_str();
  cmd->add_option("--queries", a->queries, "Decode steps (synthetic: generated, default 200; dump: the first N, 0 = all)");
  cmd->add_option("--dtype", a->dtype, "Key/value store type f32|f16|bf16 (default: f16 synthetic, the file's for a dump)");
  cmd->add_option("--scale", a->scale, "Attention score scale (default: 1/sqrt(head_dim) or the dump's)");
  cmd->add_option("--save-dump", a->save_dump, "Also write the synthetic data as a KV dump to this file");
  auto syn = [&, syn_opts](const char* name, auto& field, const char* help) {
    syn_opts->push_back(cmd->add_option(name, field, help)->capture_default_str()->group("Synthetic data"));
  };
  syn("--n-keys", s.n_keys, "Context length: keys per KV head");
  syn("--head-dim", s.head_dim, "Head dimension (even)");
  syn("--gqa-group", s.group, "Query heads per KV head (GQA group G)");
  syn("--seed", s.seed, "Random seed (same seed, same data)");
  syn_opts->back()->check(seed_value());
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
  cmd->add_option("--kmeans", a->kmeans, "k-means of centroid/multipole builds: faiss (the host build's) or lloyd "
                  "(the --build-on gpu engine's CPU twin, which labels as the GPU does)")
      ->check(CLI::IsMember({"faiss", "lloyd"}))->capture_default_str();
  cmd->add_option("--build-seed", a->build_seed, "Seed of the index builds (k-means starting rows, HNSW levels): "
                  "run several to tell a difference between builds from seed noise")->check(seed_value())->capture_default_str();
  cmd->add_option("--threads", a->threads,
                  "Threads for data, ground truth, builds and the layer-parallel search (0 = all cores)")->check(thread_count())
      ->capture_default_str();

  // output
  cmd->add_option("--csv", a->csv, "Write the results as CSV")->check(output_file("--csv report"));
  cmd->add_option("--json", a->json, "Write the results as JSON (schema: bench/recall_schema.json)")
      ->check(output_file("--json report"));
  cmd->add_option("--png", a->png, "Plot recall against QPS (scripts/plot_recall.py, needs matplotlib)")
      ->check(output_file("--png plot"));
  cmd->add_option("--png-metric", a->png_metric, "x axis of the plot: recall or mass")->capture_default_str();
  cmd->add_flag("--quiet", a->quiet, "No progress output on stderr");
  cmd->callback([a, syn_opts] {
    for (CLI::Option* o : *syn_opts)
      if (o->count() > 0) a->synthetic_flags_given.push_back(o->get_name());
    run_recall(*a);
  });
}

}  // namespace topkv::cli
