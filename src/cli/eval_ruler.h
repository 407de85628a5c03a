// `topkv eval ruler`: its result rows and their reports (cmd_eval_ruler.cpp
// runs the prompts, eval_ruler_report.cpp prints and writes the results).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "src/eval/fidelity_runs.h"

namespace topkv::cli {

// One (task, length, sample, method).
struct RulerRow {
  std::string task, method;          // method "dense" or an EvalMethod's name
  std::string index, k, k_schedule;  // empty for dense
  int64_t length = 0;                // RULER's sequence length: prompt + the answer's tokens
  int64_t prompt_tokens = 0;
  int sample = 0;
  uint64_t seed = 0;                 // the prompt's own seed
  int dense_layers = 0;
  std::vector<int64_t> k_per_layer;  // tokens, per retrieval layer
  // Store rows attended per KV head, retrieval layer and step of the free run
  // (OffloadStats::retrieved): with GQA union the union of the query heads'
  // picks (<= group x k), under --threshold what the threshold kept, plus
  // the store rows not folded into the index yet (attended exactly). With the
  // device search the last step's counts arrive with the next step, so this
  // is low by at most 1 / decode_steps.
  double rows_attended = 0;
  double score = 0;                  // string_match_all x 100
  std::vector<std::string> answers;
  std::string generated;
  std::vector<double> depths;
  // Teacher-forced against dense: agreement, KL, flip margins (dense's own
  // row: identical to itself).
  ForcedRun forced{.agreement = 1};
  std::vector<double> attn_err;      // per retrieval layer (teacher-forced steps)
  std::vector<double> topk_mass;     // per retrieval layer, the same steps: OffloadRuntime::oracle_topk_mass()
  int decode_steps = 0;              // of the free run (dense: of the reference)
  double decode_s = 0;
  double build_s = 0, write_s = 0, restore_s = 0;  // the method's index build and pack (shared by its build group)
  double tok_per_s() const { return decode_steps > 0 ? decode_steps / decode_s : 0.0; }
  double k_mean() const;
  double attn_err_mean() const;
};

struct RulerTiming {
  double total_s = 0, prompts_s = 0, prefill_s = 0, dense_decode_s = 0, build_s = 0, write_s = 0, restore_s = 0,
         method_decode_s = 0, forced_s = 0;
  int builds = 0;
};

struct RulerReport {
  nlohmann::json config;             // what reproduces the run
  std::vector<std::string> tasks, methods;  // methods: "dense" first
  std::vector<int64_t> lengths;
  std::vector<RulerRow> rows;
  nlohmann::json builds = nlohmann::json::array();  // one entry per pack built
  RulerTiming timing;
};

// Per method: score per length and overall, ratio to dense, agreement, KL,
// attention error, decode tok/s; per task and method: the score per length.
nlohmann::json ruler_summary(const RulerReport& r);
// The summary as two tables on stdout.
void print_ruler_summary(const RulerReport& r, const nlohmann::json& summary);
void write_ruler_csv(const RulerReport& r, const std::string& path);
void write_ruler_json(const RulerReport& r, const nlohmann::json& summary, const std::string& path);

}  // namespace topkv::cli
