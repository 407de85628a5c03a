// topkv eval passkey: long-context retrieval fidelity of top-k decoding
// against dense decoding on the same model (DESIGN.md, "Testing").
//
// For every (length, depth, trial) it builds a passkey / needle prompt,
// prefills it once (dense), decodes the answer densely, then for every method
// (index backend x k x dense layers x k schedule) decodes again from the same
// context, each index built once (src/eval/shared_context.h): once greedily on
// its own (pass / fail) and once teacher-forced on the dense tokens
// (greedy-token agreement, next-token KL divergence against dense,
// attention-output error per retrieval layer; src/eval/fidelity_runs.h).
// `topkv eval ruler` (cmd_eval_ruler.cpp) runs the RULER tasks the same way.
#include <sstream>
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "offload/offload_runtime.h"
#include "src/cli/cli_util.h"
#include "src/cli/commands.h"
#include "src/cli/eval_methods.h"
#include "src/cli/policy_options.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/eval/fidelity_runs.h"
#include "src/eval/passkey_prompt.h"
#include "src/eval/shared_context.h"
#include "src/model/model.h"
#include "src/model/tokenizer.h"
#include "src/common/cli_files.h"
#include "src/common/file_io.h"
#include "src/session/backend_choice.h"

namespace topkv::cli {
namespace {

struct EvalArgs {
  std::string model, task = "passkey", lengths = "2048,4096,8192",
              depths = "0,0.25,0.5,0.75,1", csv, json, png;
  MethodArgs methods{{"flat"}, {"64"}, {}, {}};
  int trials = 1, answer_tokens = 8, threads = 0, chunk = 256;
  uint64_t seed = 1;
};

struct Row {
  std::string method, answer, text;
  int64_t length, needle_token;
  double depth, agreement, kl;
  int trial;
  bool passed;
  std::vector<double> attn_err;
  double decode_ms;
};

void run_eval(const EvalArgs& a, const OffloadPolicy& base) {
  TOPKV_CHECK(a.trials >= 1 && a.answer_tokens >= 1, "--trials and --answer-tokens must be at least 1");
  const RetrievalTask task = parse_retrieval_task(a.task);
  const auto lengths = parse_sweep(a.lengths);
  const auto depths = parse_double_list(a.depths);
  const auto methods = make_eval_methods(a.methods, base);
  const std::string model_path = a.model.empty() ? default_model_path() : a.model;
  std::shared_ptr<const GgufFile> file = GgufFile::open(model_path);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  const ModelConfig cfg = read_model_config(*file);
  for (const EvalMethod& m : methods) OffloadRuntime(cfg, m.policy, false);  // e.g. too many dense layers: now
  const int64_t max_len = *std::max_element(lengths.begin(), lengths.end());
  BackendSpec where;  // eval passkey runs on the CPU (eval ruler takes --backend)
  where.name = "cpu", where.threads = a.threads;
  bool cuda = false;
  std::unique_ptr<Backend> backend = open_backend(where, cuda);
  ModelOptions mo;
  mo.n_ctx = max_len + a.answer_tokens + 1;
  mo.max_chunk = a.chunk;
  TOPKV_CHECK(a.answer_tokens < a.chunk, "--answer-tokens must be below --chunk (the ring slack a rewind needs)");
  Model model(file, *backend, mo);
  model.touch_weights();
  fmt::print(stderr, "eval {}: {} lengths x {} depths x {} trials; dense + {} methods; {}\n", a.task, lengths.size(),
             depths.size(), a.trials, methods.size(), cfg.summary());

  std::mt19937_64 rng(a.seed);
  std::vector<Row> rows;
  Progress bar("eval", (int64_t)(lengths.size() * depths.size() * a.trials), "prompts");
  for (int64_t len : lengths)
    for (double depth : depths)
      for (int trial = 0; trial < a.trials; ++trial) {
        RetrievalPrompt pr = build_retrieval_prompt(tok, task, len, depth, rng);
        const int64_t n = (int64_t)pr.tokens.size();
        model.reset();
        const std::vector<float> first = model.prefill(pr.tokens, a.chunk);
        // Dense: greedy answer, keeping each step's distribution.
        const DenseReference ref = decode_reference(model, first, a.answer_tokens, a.answer_tokens);
        const double dense_ms = ref.decode_s * 1e3 / std::max(1, ref.decode_steps);
        const std::string dense_text = tok.decode(ref.ids);
        rows.push_back({"dense", pr.answer, dense_text, n, pr.needle_token, depth, 1.0, 0.0, trial,
                        answer_found(dense_text, pr.answer), {}, dense_ms});
        SharedContext ctx(*file, model, pr.tokens, first, std::filesystem::temp_directory_path().string());
        for (const EvalMethod& m : methods) {
          ctx.prepare(*backend, m.policy);
          // Free greedy run: pass / fail.
          auto rt = ctx.attach(*backend, m.policy, /*measure_error=*/false);
          const GreedyRun run = greedy_run(model, first, a.answer_tokens, nullptr);
          ctx.detach();
          // Teacher-forced on the dense tokens: agreement, KL, attention error.
          rt = ctx.attach(*backend, m.policy, /*measure_error=*/true);
          const ForcedRun forced = teacher_forced_run(model, first, ref, a.answer_tokens);
          ctx.detach();
          const std::string text = tok.decode(run.ids);
          rows.push_back({m.name, pr.answer, text, n, pr.needle_token, depth, forced.agreement, forced.kl_mean, trial,
                          answer_found(text, pr.answer), rt->attention_rel_error(),
                          run.decode_s * 1e3 / std::max(1, run.decode_steps)});
        }
        bar.add(1);
      }
  bar.finish();

  // Summary: per method, pass rate and means.
  std::vector<std::string> names{"dense"};
  for (const EvalMethod& m : methods) names.push_back(m.name);
  nlohmann::json summary = nlohmann::json::array();
  fmt::print("{:<28} {:>6} {:>10} {:>10} {:>12} {:>10}  attention error per layer\n", "method", "pass", "agreement",
             "KL", "decode ms", "runs");
  for (auto& name : names) {
    int runs = 0, passed = 0;
    double agree = 0, kls = 0, ms = 0;
    std::vector<double> err;
    for (auto& r : rows) {
      if (r.method != name) continue;
      ++runs, passed += r.passed, agree += r.agreement, kls += r.kl, ms += r.decode_ms;
      err.resize(r.attn_err.size(), 0.0);
      for (size_t i = 0; i < r.attn_err.size(); ++i) err[i] += r.attn_err[i];
    }
    for (auto& e : err) e /= std::max(1, runs);
    std::string errs;
    for (double e : err) errs += fmt::format("{:.3f} ", e);
    fmt::print("{:<28} {:>5.0f}% {:>10.3f} {:>10.4f} {:>12.1f} {:>10}  {}\n", name, 100.0 * passed / runs,
               agree / runs, kls / runs, ms / runs, runs, errs);
    summary.push_back({{"method", name}, {"runs", runs}, {"pass_rate", (double)passed / runs},
                       {"agreement", agree / runs}, {"kl", kls / runs}, {"decode_ms", ms / runs},
                       {"attention_rel_error_per_layer", err}});
  }
  if (!a.csv.empty()) {
    std::ostringstream f;
    f << "method,length,depth,trial,needle_token,answer,passed,agreement,kl,decode_ms,attn_err_mean,generated\n";
    for (auto& r : rows) {
      double e = 0;
      for (double x : r.attn_err) e += x / r.attn_err.size();
      std::string g = r.text;
      for (auto& c : g)
        if (c == '"' || c == '\n' || c == ',') c = ' ';
      f << fmt::format("{},{},{},{},{},{},{},{:.4f},{:.6f},{:.2f},{:.5f},\"{}\"\n", r.method, r.length, r.depth,
                       r.trial, r.needle_token, r.answer, (int)r.passed, r.agreement, r.kl, r.decode_ms, e, g);
    }
    write_file_atomic(a.csv, f.str(), "--csv report");
  }
  if (!a.json.empty()) {
    nlohmann::json j = {{"task", a.task}, {"model", model_path}, {"model_summary", cfg.summary()},
                        {"lengths", lengths}, {"depths", depths}, {"trials", a.trials},
                        {"answer_tokens", a.answer_tokens}, {"policy", nlohmann::json::parse(base.to_json())},
                        {"summary", summary}};
    write_file_atomic(a.json, j.dump(2) + "\n", "--json report");
  }
  if (!a.png.empty()) {
    TOPKV_CHECK(!a.csv.empty(), "--png needs --csv (the plot reads it)");
    const std::string cmd = fmt::format("/usr/bin/python3 scripts/plot_passkey.py '{}' '{}' --title 'topkv eval {}'",
                                        a.csv, a.png, a.task);
    TOPKV_CHECK(std::system(cmd.c_str()) == 0, "plotting failed: {} (needs python3-matplotlib; run from the "
                "repository root)", cmd);
  }
}

}  // namespace

void register_eval(CLI::App& app) {
  auto* eval = app.add_subcommand("eval", "Fidelity of top-k decoding against dense decoding");
  eval->require_subcommand(1);
  auto a = std::make_shared<EvalArgs>();
  auto pol = std::make_shared<PolicyArgs>();
  auto* cmd = eval->add_subcommand("passkey", "Passkey / needle-in-a-haystack retrieval: pass rate per length and "
                                   "depth, greedy-token agreement and next-token KL against dense, attention error");
  cmd->add_option("-m,--model", a->model,
                  fmt::format("GGUF model file (default: {}, installed by scripts/fetch-model.sh)", kDefaultModel));
  cmd->add_option("--task", a->task, "passkey or needle")->check(CLI::IsMember({"passkey", "needle"}))
      ->capture_default_str();
  cmd->add_option("--lengths", a->lengths, "Prompt lengths in tokens (list or lo:hi:x2)")->capture_default_str();
  cmd->add_option("--depths", a->depths, "Needle depths as fractions of the filler")->capture_default_str();
  cmd->add_option("--trials", a->trials, "Prompts (random keys) per length and depth")->capture_default_str();
  add_method_options(cmd, a->methods);
  cmd->add_option("--answer-tokens", a->answer_tokens, "Tokens decoded per answer")->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0 = OpenMP default)")->check(thread_count());
  cmd->add_option("--chunk", a->chunk, "Prefill chunk")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed for keys and needles")->check(seed_value())->capture_default_str();
  cmd->add_option("--csv", a->csv, "One row per (method, prompt)")->check(output_file("--csv report"));
  cmd->add_option("--json", a->json, "Summary per method")->check(output_file("--json report"));
  cmd->add_option("--png", a->png, "Depth x length heat map (scripts/plot_passkey.py; needs --csv)")->check(output_file("--png plot"));
  add_policy_options(cmd, pol);
  cmd->callback([a, pol, cmd] {
    OffloadPolicy p = pol->resolve(*cmd);
    check_no_single_method(*cmd, "eval passkey");
    run_eval(*a, p);
  });
  register_eval_ruler(*eval);
}

}  // namespace topkv::cli
