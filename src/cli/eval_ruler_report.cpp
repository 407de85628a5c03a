#include <fmt/format.h>

#include <cmath>
#include <fstream>
#include <sstream>
#include <map>

#include "src/cli/cli_util.h"
#include "src/cli/eval_methods.h"
#include "src/cli/eval_ruler.h"
#include "src/common/error.h"
#include "src/common/file_io.h"

namespace topkv::cli {

namespace {

using nlohmann::json;

std::string length_label(int64_t L) { return L % 1024 == 0 ? fmt::format("{}K", L / 1024) : std::to_string(L); }

// A ratio that is null where the reference scored nothing.
json ratio(double x, double ref) { return ref > 0 ? json(x / ref) : json(nullptr); }

struct Acc {
  double score = 0, agreement = 0, kl = 0, kl_max = 0, decode_s = 0;
  int64_t n = 0, steps = 0;
  std::vector<double> err, mass;
  static void add_to(std::vector<double>& sum, const std::vector<double>& x) {
    sum.resize(std::max(sum.size(), x.size()), 0.0);
    for (size_t i = 0; i < x.size(); ++i) sum[i] += x[i];
  }
  void add(const RulerRow& r) {
    score += r.score, agreement += r.forced.agreement, kl += r.forced.kl_mean, kl_max = std::max(kl_max, r.forced.kl_max), ++n;
    steps += r.decode_steps, decode_s += r.decode_s;
    add_to(err, r.attn_err);
    add_to(mass, r.topk_mass);
  }
  double mean_score() const { return n ? score / n : 0.0; }
};

}  // namespace

double RulerRow::k_mean() const {
  double s = 0;
  for (int64_t k : k_per_layer) s += (double)k;
  return k_per_layer.empty() ? 0.0 : s / (double)k_per_layer.size();
}

double RulerRow::attn_err_mean() const {
  double s = 0;
  for (double e : attn_err) s += e;
  return attn_err.empty() ? 0.0 : s / (double)attn_err.size();
}

json ruler_summary(const RulerReport& r) {
  std::map<std::string, Acc> all;                                   // method
  std::map<std::pair<std::string, int64_t>, Acc> by_length;          // method, length
  std::map<std::tuple<std::string, std::string, int64_t>, Acc> cell;  // method, task, length
  for (const RulerRow& row : r.rows) {
    all[row.method].add(row);
    by_length[{row.method, row.length}].add(row);
    cell[{row.method, row.task, row.length}].add(row);
  }
  json methods = json::array();
  const Acc& dense = all["dense"];
  for (const std::string& m : r.methods) {
    const Acc& a = all[m];
    json per_length = json::array();
    for (int64_t L : r.lengths) {
      const Acc& b = by_length[{m, L}];
      per_length.push_back({{"length", L}, {"score", b.mean_score()},
                            {"ratio_to_dense", ratio(b.mean_score(), by_length[{"dense", L}].mean_score())}});
    }
    json per_task = json::array();
    for (const std::string& t : r.tasks) {
      json scores = json::array();
      for (int64_t L : r.lengths) scores.push_back(cell[{m, t, L}].mean_score());
      per_task.push_back({{"task", t}, {"score_per_length", scores}});
    }
    std::vector<double> err = a.err, mass = a.mass;
    for (double& e : err) e /= std::max<int64_t>(1, a.n);
    for (double& e : mass) e /= std::max<int64_t>(1, a.n);
    methods.push_back({{"method", m}, {"rows", a.n}, {"score", a.mean_score()},
                       {"ratio_to_dense", ratio(a.mean_score(), dense.mean_score())}, {"per_length", per_length},
                       {"per_task", per_task}, {"agreement", a.n ? a.agreement / a.n : 0.0},
                       {"kl_mean", a.n ? a.kl / a.n : 0.0}, {"kl_max", a.kl_max},
                       {"attention_rel_error_per_layer", err}, {"oracle_topk_mass_per_layer", mass},
                       {"decode_tok_per_s", a.decode_s > 0 ? a.steps / a.decode_s : 0.0}});
  }
  return methods;
}

void print_ruler_summary(const RulerReport& r, const json& summary) {
  size_t w = 6;
  for (const std::string& m : r.methods) w = std::max(w, m.size());
  std::string head = fmt::format("{:<{}}", "method", w);
  for (int64_t L : r.lengths) head += fmt::format(" {:>7}", length_label(L));
  fmt::print("\nRULER score (string_match_all x 100; {} tasks, mean over tasks and samples)\n", r.tasks.size());
  fmt::print("{} {:>7} {:>7} {:>7} {:>9} {:>9} {:>8} {:>9} {:>9}\n", head, "avg", "/dense", "agree", "KL mean",
             "KL max", "tok/s", "attn err", "top-k mass");
  for (const json& m : summary) {
    std::string line = fmt::format("{:<{}}", m["method"].get<std::string>(), w);
    for (const json& p : m["per_length"]) line += fmt::format(" {:>7.1f}", p["score"].get<double>());
    const json& q = m["ratio_to_dense"];
    // Means over the layers: the attention error, and the oracle top-k mass
    // (the share of exact attention sinks, window and the k best keys hold).
    const auto layer_mean = [&](const char* key) {
      double s = 0;
      for (const json& e : m[key]) s += e.get<double>();
      return m[key].empty() ? std::string("-") : fmt::format("{:.4f}", s / (double)m[key].size());
    };
    fmt::print("{} {:>7.1f} {:>7} {:>7.3f} {:>9.4f} {:>9.4f} {:>8.1f} {:>9} {:>10}\n", line, m["score"].get<double>(),
               q.is_null() ? std::string("-") : fmt::format("{:.3f}", q.get<double>()), m["agreement"].get<double>(),
               m["kl_mean"].get<double>(), m["kl_max"].get<double>(), m["decode_tok_per_s"].get<double>(),
               layer_mean("attention_rel_error_per_layer"), layer_mean("oracle_topk_mass_per_layer"));
  }
  fmt::print("\nper task (score per length{})\n", r.lengths.size() > 1 ? ", " + std::to_string(r.lengths.size()) +
             " columns each" : "");
  size_t tw = 4;
  for (const std::string& t : r.tasks) tw = std::max(tw, t.size());
  std::string th = fmt::format("{:<{}}", "method", w);
  for (const std::string& t : r.tasks) th += fmt::format(" {:>{}}", t, std::max<size_t>(tw, 7 * r.lengths.size()));
  fmt::print("{}\n", th);
  for (const json& m : summary) {
    std::string line = fmt::format("{:<{}}", m["method"].get<std::string>(), w);
    for (const json& t : m["per_task"]) {
      std::string cells;
      for (const json& s : t["score_per_length"]) cells += fmt::format("{}{:.0f}", cells.empty() ? "" : "/", s.get<double>());
      line += fmt::format(" {:>{}}", cells, std::max<size_t>(tw, 7 * r.lengths.size()));
    }
    fmt::print("{}\n", line);
  }
}

void write_ruler_csv(const RulerReport& r, const std::string& path) {
  std::ostringstream f;
  f << "task,length,prompt_tokens,sample,seed,method,index,k,dense_layers,k_schedule,k_tokens,rows_attended,score,"
       "agreement,kl_mean,kl_max,attn_err_mean,attn_err_per_layer,decode_tok_s,decode_steps,index_build_s,restore_s,"
       "answers,generated\n";
  for (const RulerRow& row : r.rows) {
    std::string errs, answers;
    for (double e : row.attn_err) errs += fmt::format("{}{:.5f}", errs.empty() ? "" : ";", e);
    for (const std::string& a : row.answers) answers += (answers.empty() ? "" : "|") + a;
    f << fmt::format("{},{},{},{},{},{},{},{},{},{},{:.1f},{:.1f},{:.2f},{:.4f},{:.6f},{:.6f},{:.5f},{},{:.2f},{},"
                     "{:.3f},{:.3f},{},{}\n", row.task, row.length, row.prompt_tokens, row.sample, row.seed, csv_field(row.method),
                     csv_field(row.index), csv_field(row.k), row.dense_layers, row.k_schedule, row.k_mean(),
                     row.rows_attended, row.score, row.forced.agreement, row.forced.kl_mean, row.forced.kl_max, row.attn_err_mean(), errs,
                     row.tok_per_s(), row.decode_steps, row.build_s, row.restore_s, csv_field(answers),
                     csv_field(row.generated));
  }
  write_file_atomic(path, f.str(), "--csv report");
}

void write_ruler_json(const RulerReport& r, const json& summary, const std::string& path) {
  json rows = json::array();
  for (const RulerRow& row : r.rows)
    rows.push_back({{"task", row.task}, {"length", row.length}, {"prompt_tokens", row.prompt_tokens},
                    {"sample", row.sample}, {"seed", row.seed}, {"method", row.method}, {"index", row.index},
                    {"k", row.k}, {"dense_layers", row.dense_layers}, {"k_schedule", row.k_schedule},
                    {"k_per_layer", row.k_per_layer}, {"k_tokens", row.k_mean()},
                    {"rows_attended", row.rows_attended}, {"score", row.score},
                    {"answers", row.answers}, {"generated", row.generated}, {"depths", row.depths},
                    {"agreement", row.forced.agreement}, {"kl_mean", row.forced.kl_mean},
                    {"kl_max", row.forced.kl_max}, {"flip_margin", row.forced.flip_margin_max},
                    {"first_flip_step", row.forced.first_flip_step},
                    {"first_flip_margin", row.forced.first_flip_margin},
                    {"attention_rel_error_per_layer", row.attn_err}, {"oracle_topk_mass_per_layer", row.topk_mass},
                    {"decode_steps", row.decode_steps},
                    {"decode_s", row.decode_s}, {"decode_tok_per_s", row.tok_per_s()}, {"index_build_s", row.build_s},
                    {"pack_write_s", row.write_s}, {"restore_s", row.restore_s}});
  const RulerTiming& t = r.timing;
  const json timing = {{"total_s", t.total_s},         {"prompt_generation_s", t.prompts_s},
                       {"dense_prefill_s", t.prefill_s}, {"dense_decode_s", t.dense_decode_s},
                       {"index_builds", t.builds},     {"index_build_s", t.build_s},
                       {"pack_write_s", t.write_s},     {"restore_s", t.restore_s},
                       {"method_decode_s", t.method_decode_s}, {"teacher_forced_s", t.forced_s}};
  json j = r.config;
  j["summary"] = summary;
  j["timing"] = timing;
  j["builds"] = r.builds;
  j["rows"] = rows;
  write_json_atomic(path, j);
}

}  // namespace topkv::cli
