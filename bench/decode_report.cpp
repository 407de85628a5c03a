#include "bench/decode_report.h"

#include <fmt/format.h>

#include "bench/report_io.h"
#include "src/common/options.h"

namespace topkv {

namespace {

using json = nlohmann::ordered_json;

std::string label(const DecodeRow& row) { return row.index.empty() ? row.mode : row.mode + " " + row.index; }

std::string opt_cell(const std::optional<size_t>& v) { return v ? std::to_string(*v) : ""; }

json opt_json(const std::optional<size_t>& v) { return v ? json(*v) : json(nullptr); }

}  // namespace

void print_decode_table(const DecodeBenchResult& r, std::FILE* out) {
  const DecodeBenchConfig& c = r.config;
  std::string layers;
  for (int il : r.offloaded_layers) {  // (not "a" + to_string(il): GCC 12 warns of a -Wrestrict overlap there)
    if (!layers.empty()) layers += ' ';
    layers += std::to_string(il);
  }
  fmt::print(out, "\nmodel: {} ({}, {} layers, {} KV heads x {}; layers topk/host-dense take: {})\n", c.model_label,
             r.arch, r.n_layer, r.n_head_kv, r.head_dim, layers);
  fmt::print(out, "backend {}, {} threads; context fill: {}{}; {} timed steps after {} warmup; KV {}{}{}\n",
             r.backend_name, r.threads, context_fill_name(c.fill),
             c.fill == ContextFill::Synthetic ? " (generated keys/values, not a prefill)" : " (passkey prompt)",
             c.steps, c.warmup, dtype_name(c.kv_dtype),
             c.gpu_mem_budget ? ", budget " + format_bytes((double)c.gpu_mem_budget) : "",
             c.q8_terms ? fmt::format(", --q8-terms {}", c.q8_terms) : "");
  fmt::print(out, "{:>8} {:<22} {:>5} {:>9} {:>8} {:>8} | {:>7} {:>7} {:>7} {:>6} {:>6} {:>6} | {:>10} {:>10} {:>6} "
             "{:>8} {:>8} {:>9}\n", "context", "mode", "k", "tok/s", "p50 ms", "p99 ms", "model", "h-attn", "search",
             "gpu", "xfer", "wait", "KV backend", "KV host", "cached", "fill s", "build s", "peak RSS");
  for (const DecodeRow& row : r.rows) {
    if (!row.skipped.empty()) {
      fmt::print(out, "{:>8} {:<22} skipped: {}\n", row.context, label(row), row.skipped);
      continue;
    }
    fmt::print(out,
               "{:>8} {:<22} {:>5} {:>9.2f} {:>8.2f} {:>8.2f} | {:>7.2f} {:>7.2f} {:>7.2f} {:>6.2f} {:>6.2f} {:>6.2f} | "
               "{:>10} {:>10} {:>6} {:>8.2f} {:>8.2f} {:>9}\n",
               row.context_tokens, label(row), row.k ? std::to_string(row.k) : "-", row.tok_s, row.step_ms_p50,
               row.step_ms_p99, row.model_ms, row.host_attn_ms, row.search_ms, row.gpu_ms, row.transfer_ms,
               row.wait_ms, format_bytes((double)row.kv_backend_bytes), format_bytes((double)row.kv_host_bytes),
               row.store_cache_bytes ? fmt::format("{:.0f}%", 100 * row.store_cached_share) : "-", row.fill_s,
               row.build_s, format_bytes((double)row.peak_rss_bytes));
  }
  fmt::print(out, "(ms per step: model = the step less the override's host time, so on the GPU it also holds the "
                  "device work the step waits for at its end; h-attn = the override's host work "
                  "besides search; xfer = host<->GPU copies; cached = share of the store's rows the device search "
                  "reads from GPU memory, --store-cache; peak RSS = the process's largest resident set so far)\n");
  std::fflush(out);
}

void write_decode_csv(const DecodeBenchResult& r, const std::string& path) {
  std::string s =
      "model,backend,fill,context,context_tokens,mode,index,k,skipped,steps,tok_s,step_ms_p50,step_ms_p99,"
      "step_ms_mean,attn_ms,search_ms,gpu_ms,transfer_ms,wait_ms,host_attn_ms,model_ms,kv_backend_bytes,"
      "kv_host_bytes,gpu_weights_bytes,gpu_kv_cache_bytes,gpu_activations_bytes,gpu_scratch_bytes,load_s,fill_s,"
      "build_s,keys_indexed,launches_per_step,store_cache_bytes,store_cached_share,peak_rss_bytes,read_s,"
      "device_table_type,device_table_page_factor\n";
  for (const DecodeRow& row : r.rows)
    s += fmt::format("{},{},{},{},{},{},{},{},{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},"
                     "{:.6g},{:.6g},{},{},{},{},{},{},{:.6g},{:.6g},{:.6g},{},{},{},{:.4g},{},{:.6g},{},{}\n",
                     csv_field(r.config.model_label), r.backend_name, context_fill_name(r.config.fill), row.context,
                     row.context_tokens, row.mode, csv_field(row.index), row.k, csv_field(row.skipped), row.steps,
                     row.tok_s, row.step_ms_p50, row.step_ms_p99, row.step_ms_mean, row.attn_ms, row.search_ms,
                     row.gpu_ms, row.transfer_ms, row.wait_ms, row.host_attn_ms, row.model_ms, row.kv_backend_bytes,
                     row.kv_host_bytes, opt_cell(row.gpu_weights), opt_cell(row.gpu_kv_cache),
                     opt_cell(row.gpu_activations), opt_cell(row.gpu_scratch), row.load_s, row.fill_s, row.build_s,
                     row.keys_indexed, row.launches_per_step ? fmt::format("{:.1f}", *row.launches_per_step) : "",
                     row.store_cache_bytes, row.store_cached_share, row.peak_rss_bytes, row.read_s, row.device_table_type,
                     row.device_table_page_factor);
  write_text_atomic(path, s);
}

json decode_json(const DecodeBenchResult& r) {
  const DecodeBenchConfig& c = r.config;
  json modes = json::array();
  for (DecodeMode m : c.modes) modes.push_back(decode_mode_name(m));
  json j = {
      {"schema", "topkv.bench_decode/1"},
      {"topkv_version", TOPKV_VERSION},
      {"fill", context_fill_name(c.fill)},
      {"config",
       {{"model", c.model_label},
        {"model_path", c.model_path},
        {"backend", c.backend},
        {"gpu_mem_budget", c.gpu_mem_budget},
        {"contexts", c.contexts},
        {"modes", modes},
        {"indexes", c.indexes},
        {"steps", c.steps},
        {"warmup", c.warmup},
        {"kv_type", dtype_name(c.kv_dtype)},
        {"chunk", c.chunk},
        {"seed", c.seed},
        {"beyond_trained", c.beyond_trained},
        {"policy", json::parse(c.policy.to_json())}}},
      {"model",
       {{"arch", r.arch},
        {"n_layer", r.n_layer},
        {"n_head", r.n_head},
        {"n_head_kv", r.n_head_kv},
        {"head_dim", r.head_dim},
        {"n_ctx_train", r.n_ctx_train},
        {"offloaded_layers", r.offloaded_layers}}},
      {"machine", {{"backend", r.backend_name}, {"backend_note", r.backend_note}, {"threads", r.threads}}},
      {"results", json::array()}};
  for (const DecodeRow& row : r.rows) {
    json gpu = nullptr;
    if (row.gpu_weights)
      gpu = {{"weights", opt_json(row.gpu_weights)}, {"kv_cache", opt_json(row.gpu_kv_cache)},
             {"activations", opt_json(row.gpu_activations)}, {"scratch", opt_json(row.gpu_scratch)}};
    j["results"].push_back({
        {"context", row.context},
        {"context_tokens", row.context_tokens},
        {"fill", context_fill_name(c.fill)},
        {"mode", row.mode},
        {"index", row.index},
        {"backend", r.backend_name},
        {"k", row.k},
        {"skipped", row.skipped.empty() ? json(nullptr) : json(row.skipped)},
        {"steps", row.steps},
        {"tok_s", row.tok_s},
        {"step_ms", {{"p50", row.step_ms_p50}, {"p99", row.step_ms_p99}, {"mean", row.step_ms_mean}}},
        {"split_ms",
         {{"attn", row.attn_ms},
          {"search", row.search_ms},
          {"gpu", row.gpu_ms},
          {"transfer", row.transfer_ms},
          {"wait", row.wait_ms},
          {"host_attn", row.host_attn_ms},
          {"model", row.model_ms}}},
        {"memory",
         {{"kv_backend_bytes", row.kv_backend_bytes},
          {"kv_host_bytes", row.kv_host_bytes},
          {"gpu", gpu},
          {"store_cache_bytes", row.store_cache_bytes},
          {"store_cached_share", row.store_cached_share},
          {"device_table_type", row.device_table_type},
          {"device_table_page_factor", row.device_table_page_factor},
          {"peak_rss_bytes", row.peak_rss_bytes}}},
        {"load_s", row.load_s},
        {"fill_s", row.fill_s},
        {"build_s", row.build_s},
        {"read_s", row.read_s},
        {"keys_indexed", row.keys_indexed},
        {"launches_per_step", row.launches_per_step ? json(*row.launches_per_step) : json(nullptr)},
    });
  }
  return j;
}

void write_decode_json(const DecodeBenchResult& r, const std::string& path) {
  write_text_atomic(path, decode_json(r).dump(2) + "\n");
}

void plot_decode_png(const std::string& json_path, const std::string& png_path) {
  run_plot_script("plot_decode.py", "TOPKV_PLOT_DECODE_SCRIPT", {"--json", json_path, "--out", png_path}, json_path);
}

}  // namespace topkv
