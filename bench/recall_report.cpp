#include "bench/recall_report.h"

#include "bench/report_io.h"
#include "src/common/error.h"

namespace topkv {

namespace {

nlohmann::ordered_json stat_json(const Stat& s) {
  return {{"mean", s.mean}, {"p5", s.p5}, {"p50", s.p50}, {"p99", s.p99}};
}

std::string layer_cell(const RecallRow& r, double v) { return r.layer_heads ? fmt::format("{:.1f}", v) : "-"; }

}  // namespace

void print_recall_table(const RecallBenchResult& r, std::FILE* out) {
  fmt::print(out, "data: {}\n", r.source);
  fmt::print(out, "      {} keys x {} ({}), {} decode steps x {} query heads, {} KV head(s) in the layer, scale {:.5g}\n",
             r.n_keys, r.head_dim, r.dtype, r.n_queries, r.group, r.kv_heads, r.scale);
  fmt::print(out, "      exact top-{} holds {:.1f}% of the attention (mean); ground truth {:.2f} s on {} threads\n\n",
             r.config.k, 100 * r.oracle_mass, r.truth_seconds, r.threads);
  const int k = r.config.k;
  fmt::print(out,
             "{:<24} {:<22} {:>8} {:>7} {:>7} | {:>21} | {:>21} | {:>15} | {:>7} {:>7} | {:>8} {:>8} {:>9} | {:>9} {:>9}\n",
             "index", "search", "build s", "B/key", "+copy", fmt::format("recall@{} mean/p5/p50", k),
             "mass mean/p5/p50", "out err mean/p50", "scored", "ids", "p50 us", "p99 us", "QPS", "layer p50",
             "layer p99");
  for (auto& row : r.rows)
    fmt::print(out,
               "{:<24} {:<22} {:>8.2f} {:>7.1f} {:>7.1f} | {:>6.4f} {:>6.4f} {:>6.4f} | {:>6.4f} {:>6.4f} {:>6.4f} | "
               "{:>7.4f} {:>7.4f} | {:>7.3g} {:>7.1f} | {:>8.1f} {:>8.1f} {:>9.0f} | {:>9} {:>9}\n",
               row.index, row.label, row.build_seconds, row.bytes_per_key_structure(), row.bytes_per_key_owned(),
               row.recall.mean, row.recall.p5, row.recall.p50, row.mass_recall.mean, row.mass_recall.p5,
               row.mass_recall.p50, row.output_error.mean, row.output_error.p50, row.fraction_scored,
               row.ids_per_search, row.latency_us.p50, row.latency_us.p99, row.qps,
               layer_cell(row, row.layer_latency_us.p50), layer_cell(row, row.layer_latency_us.p99));
  std::fflush(out);
}

void write_recall_csv(const RecallBenchResult& r, const std::string& path) {
  std::string s =
      "index,backend,build_params,label,k,ef,nprobe,threshold,gqa,build_s,bytes_per_key_structure,"
      "bytes_per_key_owned,recall_mean,recall_p5,recall_p50,mass_mean,mass_p5,mass_p50,err_mean,err_p50,"
      "fraction_scored,summaries_per_search,ids_per_search,lat_mean_us,lat_p50_us,lat_p99_us,qps,layer_heads,layer_p50_us,"
      "layer_p99_us,n_keys,head_dim,group,n_queries,recall_k\n";
  for (auto& row : r.rows) {
    const auto& p = row.params;
    s += fmt::format("{},{},{},{},{},{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},"
                     "{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{},{},{},{},{},{},{},{}\n",
                     csv_field(row.index), csv_field(row.backend), csv_field(row.build_params), csv_field(row.label),
                     p.k, p.ef, p.nprobe, p.threshold, gqa_name(p.gqa), row.build_seconds,
                     row.bytes_per_key_structure(), row.bytes_per_key_owned(), row.recall.mean, row.recall.p5,
                     row.recall.p50, row.mass_recall.mean, row.mass_recall.p5, row.mass_recall.p50,
                     row.output_error.mean, row.output_error.p50, row.fraction_scored, row.summaries_per_search,
                     row.ids_per_search,
                     row.latency_us.mean, row.latency_us.p50, row.latency_us.p99, row.qps, row.layer_heads,
                     row.layer_heads ? fmt::format("{:.6g}", row.layer_latency_us.p50) : "",
                     row.layer_heads ? fmt::format("{:.6g}", row.layer_latency_us.p99) : "", r.n_keys, r.head_dim,
                     r.group, r.n_queries, r.config.k);
  }
  write_text_atomic(path, s);
}

nlohmann::ordered_json recall_json(const RecallBenchResult& r) {
  using json = nlohmann::ordered_json;
  json sweeps = json::array();
  for (auto& s : r.config.sweeps) sweeps.push_back({{"backend", s.backend}, {"param", s.param}, {"values", s.values}});
  json j = {
      {"schema", "topkv.bench_recall/1"},
      {"topkv_version", TOPKV_VERSION},
      {"config", {{"k", r.config.k}, {"threads", r.threads}, {"indexes", r.config.index_specs}, {"sweeps", sweeps}, {"kmeans", r.config.kmeans}, {"build_seed", r.config.seed}}},
      {"data",
       {{"source", r.source},
        {"n_keys", r.n_keys},
        {"head_dim", r.head_dim},
        {"group", r.group},
        {"n_queries", r.n_queries},
        {"kv_heads", r.kv_heads},
        {"dtype", r.dtype},
        {"scale", r.scale},
        {"oracle_mass_recall", r.oracle_mass},
        {"ground_truth_seconds", r.truth_seconds}}},
      {"results", json::array()}};
  for (auto& row : r.rows) {
    json build = json::object();
    const Params build_params(row.build_params);
    for (auto& [k, v] : build_params.map()) build[k] = v;
    json layer = nullptr;
    if (row.layer_heads) layer = {{"heads", row.layer_heads}, {"latency_us", stat_json(row.layer_latency_us)}};
    j["results"].push_back({
        {"index", row.index},
        {"backend", row.backend},
        {"build_params", build},
        {"label", row.label},
        {"search",
         {{"k", row.params.k},
          {"ef", row.params.ef},
          {"nprobe", row.params.nprobe},
          {"threshold", row.params.threshold},
          {"gqa", gqa_name(row.params.gqa)}}},
        {"build_seconds", row.build_seconds},
        {"memory",
         {{"structure_bytes", row.memory.structure_bytes},
          {"key_copy_bytes", row.memory.key_copy_bytes},
          {"shared_store_bytes", row.memory.shared_store_bytes},
          {"bytes_per_key_structure", row.bytes_per_key_structure()},
          {"bytes_per_key_owned", row.bytes_per_key_owned()},
          {"note", row.memory.note}}},
        {"recall", stat_json(row.recall)},
        {"mass_recall", stat_json(row.mass_recall)},
        {"output_error", stat_json(row.output_error)},
        {"fraction_scored", row.fraction_scored},
        {"summaries_per_search", row.summaries_per_search},
        {"ids_per_search", row.ids_per_search},
        {"latency_us", stat_json(row.latency_us)},
        {"qps", row.qps},
        {"layer", layer},
    });
  }
  return j;
}

void write_recall_json(const RecallBenchResult& r, const std::string& path) {
  write_text_atomic(path, recall_json(r).dump(2) + "\n");
}

void plot_recall_png(const std::string& json_path, const std::string& png_path, const std::string& metric) {
  TOPKV_CHECK(metric == "recall" || metric == "mass", "--png-metric is recall or mass, not '{}'", metric);
  run_plot_script("plot_recall.py", "TOPKV_PLOT_SCRIPT", {"--json", json_path, "--out", png_path, "--metric", metric},
                  json_path);
}

}  // namespace topkv
