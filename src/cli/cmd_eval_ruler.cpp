// topkv eval ruler: the RULER synthetic tasks (src/eval/ruler_tasks.h) with
// dense decoding and with each top-k method, on the CPU or the CUDA backend.
//
// For every (length, task, sample) it builds the prompt, prefills it once
// densely and decodes the dense answer and reference (as eval passkey,
// cmd_eval.cpp); every method then decodes from the same context, each index
// built once per prompt and reused for every k and schedule through a
// temporary context pack (src/eval/shared_context.h): a free greedy run
// (its answer, scored as RULER scores it) and a run teacher-forced on the
// dense tokens (agreement, KL, attention error per retrieval layer).
#include <sstream>
#include <fmt/format.h>
#include <omp.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "offload/offload_runtime.h"
#include "src/cli/cli_util.h"
#include "src/cli/eval_methods.h"
#include "src/cli/eval_ruler.h"
#include "src/cli/policy_options.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/eval/fidelity_runs.h"
#include "src/eval/ruler_score.h"
#include "src/eval/ruler_tasks.h"
#include "src/eval/ruler_words.h"
#include "src/eval/shared_context.h"
#include "src/model/tokenizer.h"
#include "src/common/cli_files.h"
#include "src/common/file_io.h"

namespace topkv::cli {
namespace {

struct RulerArgs {
  std::string model, tasks, lengths = "4K", csv, json, png, tmp_dir, save_prompts, kv_type = "f32";
  BackendArgs where;
  MethodArgs methods{{"multipole"}, {"1%", "2%", "5%"}, {}, {}};
  int samples = 1, answer_tokens = 0, agreement_tokens = 64, error_steps = -1, chunk = 256;
  uint64_t seed = 1;
  bool chat = false, quiet = false;
  int answer_of(RulerTask t) const { return answer_tokens > 0 ? answer_tokens : ruler_answer_tokens(t); }
  // Tokens the dense reference decodes for a task: its answer and the teacher-forced steps.
  int reference_of(RulerTask t) const { return std::max(answer_of(t), agreement_tokens); }
};

struct Prompt {
  RulerTask task;
  int64_t length;  // RULER's: the prompt has length - answer tokens
  int sample;
  uint64_t seed;
  RulerSample s;
};

std::vector<RulerTask> parse_tasks(const std::string& list) {
  if (list.empty()) return all_ruler_tasks();
  std::vector<RulerTask> out;
  for (const std::string& name : split_list(list)) out.push_back(parse_ruler_task(name));
  return out;
}

// Every prompt, before any model work (a length too short for a task fails here).
std::vector<Prompt> make_prompts(const RulerArgs& a, const std::vector<RulerTask>& tasks,
                                 const std::vector<int64_t>& lengths, const RulerFormat& format) {
  std::vector<Prompt> out;
  for (int64_t L : lengths)
    for (RulerTask task : tasks)
      for (int sample = 0; sample < a.samples; ++sample) {
        const uint64_t seed = ruler::mix_seed(ruler::mix_seed(ruler::mix_seed(a.seed, (uint64_t)task), (uint64_t)L),
                                              (uint64_t)sample);
        out.push_back({task, L, sample, seed, build_ruler_sample(task, format, L - a.answer_of(task), seed)});
      }
  return out;
}

// --save-prompts: one JSON object per line, the prompt as the model sees it.
void save_prompts(const std::string& path, const std::vector<Prompt>& prompts, const Tokenizer& tok) {
  std::ostringstream f;
  for (const Prompt& p : prompts)
    f << nlohmann::json({{"task", ruler_task_name(p.task)}, {"length", p.length}, {"sample", p.sample},
                         {"seed", p.seed}, {"prompt_tokens", p.s.tokens.size()}, {"answers", p.s.answers},
                         {"depths", p.s.depths}, {"prompt", tok.decode(p.s.tokens, /*render_special=*/true)}})
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  write_file_atomic(path, f.str(), "--save-prompts file");
}

// What the runs of every prompt share.
struct Session {
  const RulerArgs& a;
  const GgufFile& file;
  const Tokenizer& tok;
  Backend& backend;
  Model& model;
  std::string tmp_dir;
  RulerReport& rep;
  std::map<std::string, std::map<int64_t, std::vector<double>>> k_tokens;  // method -> length -> k means
};

// A method on the prompt's shared context: its own answer, then teacher-forced on the dense tokens.
RulerRow run_method(Session& ss, SharedContext& ctx, const EvalMethod& m, const RulerRow& proto, const Prompt& p,
                    const std::vector<float>& first, const DenseReference& ref) {
  RulerTiming& time = ss.rep.timing;
  const SharedContext::Build& b = ctx.prepare(ss.backend, m.policy);
  RulerRow row = proto;
  row.method = m.name, row.index = m.index, row.k = m.k, row.dense_layers = m.policy.dense_layers;
  row.k_schedule = k_schedule_spec(m.policy);
  row.build_s = b.build_s, row.write_s = b.write_s;
  double restore_s = 0, restore2_s = 0;
  {
    auto rt = ctx.attach(ss.backend, m.policy, /*measure_error=*/false, &restore_s);
    const GreedyRun run = greedy_run(ss.model, first, ss.a.answer_of(p.task), &ss.tok);
    ctx.detach();
    row.k_per_layer = rt->k_per_layer();
    row.rows_attended = rt->per_head_step(rt->stats().retrieved);
    row.generated = ss.tok.decode(run.ids);
    row.decode_steps = run.decode_steps, row.decode_s = run.decode_s;
    time.method_decode_s += run.decode_s;
  }
  {
    const int error_steps = ss.a.error_steps < 0 ? ss.a.agreement_tokens : ss.a.error_steps;
    auto rt = ctx.attach(ss.backend, m.policy, /*measure_error=*/error_steps > 0, &restore2_s);
    Timer t;
    row.forced = teacher_forced_run(ss.model, first, ref, ss.a.agreement_tokens, [&](int step) {
      if (step == error_steps) rt->set_measure_error(false);  // decode steps 0 .. error_steps - 1 measured
    });
    time.forced_s += t.seconds();
    ctx.detach();
    if (error_steps > 0) row.attn_err = rt->attention_rel_error(), row.topk_mass = rt->oracle_topk_mass();
  }
  row.restore_s = (restore_s + restore2_s) / 2;
  time.restore_s += restore_s + restore2_s;
  row.score = 100.0 * string_match_all(row.generated, p.s.answers);
  ss.k_tokens[m.name][p.length].push_back(row.k_mean());
  return row;
}

// One prompt: the dense prefill all methods share, the dense answer and reference, then every method.
void run_prompt(Session& ss, const Prompt& p, const std::vector<EvalMethod>& methods) {
  RulerTiming& time = ss.rep.timing;
  RulerRow proto;
  proto.task = ruler_task_name(p.task), proto.length = p.length, proto.prompt_tokens = (int64_t)p.s.tokens.size();
  proto.sample = p.sample, proto.seed = p.seed, proto.answers = p.s.answers, proto.depths = p.s.depths;
  ss.model.reset();
  Timer tf;
  const std::vector<float> first = ss.model.prefill(p.s.tokens, ss.a.chunk);
  time.prefill_s += tf.seconds();
  const DenseReference ref = decode_reference(ss.model, first, ss.a.reference_of(p.task), ss.a.agreement_tokens);
  time.dense_decode_s += ref.decode_s;
  RulerRow dense = proto;
  dense.method = "dense";
  dense.generated = ss.tok.decode(answer_tokens(ref.ids, ss.a.answer_of(p.task), ss.tok));
  dense.score = 100.0 * string_match_all(dense.generated, p.s.answers);
  dense.decode_steps = ref.decode_steps, dense.decode_s = ref.decode_s;
  ss.rep.rows.push_back(dense);
  SharedContext ctx(ss.file, ss.model, p.s.tokens, first, ss.tmp_dir);
  for (const EvalMethod& m : methods) {
    const int before = ctx.builds();
    RulerRow row = run_method(ss, ctx, m, proto, p, first, ref);
    if (ctx.builds() != before) {  // its index was built for it (methods sharing a build follow)
      const SharedContext::Build& b = ctx.current();
      ++time.builds, time.build_s += b.build_s, time.write_s += b.write_s;
      ss.rep.builds.push_back({{"task", proto.task}, {"length", p.length}, {"sample", p.sample}, {"build", b.key},
                               {"index_build_s", b.build_s}, {"pack_write_s", b.write_s},
                               {"pack_bytes", b.pack_bytes}, {"keys_indexed", b.keys_indexed}});
    }
    ss.rep.rows.push_back(std::move(row));
  }
}

void run_ruler(const RulerArgs& a, const OffloadPolicy& base) {
  if (a.quiet) Progress::set_global_enabled(false);
  Timer total;
  TOPKV_CHECK(a.samples >= 1, "--samples must be at least 1, got {}", a.samples);
  TOPKV_CHECK(a.answer_tokens >= 0 && a.agreement_tokens >= 1, "--answer-tokens must be >= 0 (0: RULER's per "
              "task) and --agreement-tokens >= 1");
  TOPKV_CHECK(a.chunk >= 1, "--chunk must be positive, got {}", a.chunk);
  TOPKV_CHECK(a.png.empty() || !a.json.empty(), "--png needs --json (scripts/plot_ruler.py reads it)");
  const std::vector<RulerTask> tasks = parse_tasks(a.tasks);
  const std::vector<int64_t> lengths = parse_count_list(a.lengths);
  const std::vector<EvalMethod> methods = make_eval_methods(a.methods, base);
  int longest_answer = 0;
  for (RulerTask t : tasks) longest_answer = std::max(longest_answer, a.answer_of(t));
  for (int64_t L : lengths)
    TOPKV_CHECK(L > longest_answer, "--lengths {} leaves no room for a prompt: RULER's length counts the answer's "
                "{} tokens too", L, longest_answer);
  const std::string tmp_dir = a.tmp_dir.empty() ? std::filesystem::temp_directory_path().string() : a.tmp_dir;
  TOPKV_CHECK(std::filesystem::is_directory(tmp_dir), "--tmp-dir {} is not a directory", tmp_dir);

  const std::string model_path = a.model.empty() ? default_model_path() : a.model;
  std::shared_ptr<const GgufFile> file = GgufFile::open(model_path);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  const ModelConfig cfg = read_model_config(*file);
  for (const EvalMethod& m : methods) OffloadRuntime(cfg, m.policy, false);  // e.g. too many dense layers: now
  bool sliding = false;
  for (const LayerConfig& l : cfg.layers) sliding = sliding || l.window > 0;
  const int decode_len = std::max(longest_answer, a.agreement_tokens);  // the most a run decodes past a prompt
  TOPKV_CHECK(!sliding || decode_len < a.chunk, "this model has sliding-window layers, whose ring takes back at most "
              "--chunk - 1 positions after each method's run; the answer and agreement tokens ({}) need --chunk {} "
              "or more", decode_len, decode_len + 1);
  bool cuda = false;
  std::unique_ptr<Backend> backend = make_backend(a.where, cuda);
  RulerReport rep;
  Timer tp;
  const std::vector<Prompt> prompts = make_prompts(a, tasks, lengths, RulerFormat{&tok, a.chat});
  rep.timing.prompts_s = tp.seconds();
  if (!a.save_prompts.empty()) save_prompts(a.save_prompts, prompts, tok);

  int64_t positions = 0;  // the dense reference decodes reference_of - 1 tokens past its prompt
  for (const Prompt& p : prompts) positions = std::max(positions, (int64_t)p.s.tokens.size() + a.reference_of(p.task));
  ModelOptions mo;
  mo.n_ctx = positions;
  mo.max_chunk = a.chunk;
  mo.kv_dtype = parse_dtype(a.kv_type);
  Model model(file, *backend, mo);
  model.touch_weights();
  if (mo.n_ctx - 1 > cfg.n_ctx_train)
    fmt::print(stderr, "topkv: warning: prompts and decoding reach {} tokens, past the {} the model was trained on "
               "(--lengths, --agreement-tokens)\n", mo.n_ctx - 1, cfg.n_ctx_train);
  if (!a.quiet)
    fmt::print(stderr, "eval ruler: {} tasks x {} lengths x {} samples; dense + {} methods; {} backend; {}\n",
               tasks.size(), lengths.size(), a.samples, methods.size(), backend->name(), cfg.summary());

  for (RulerTask t : tasks) rep.tasks.push_back(ruler_task_name(t));
  rep.lengths = lengths;
  rep.methods.push_back("dense");
  for (const EvalMethod& m : methods) rep.methods.push_back(m.name);
  Session ss{a, *file, tok, *backend, model, tmp_dir, rep, {}};

  // The configuration, enough to run it again; `prompts_done` of `prompts` in the rows.
  const auto configure = [&](size_t done) {
    nlohmann::json jm = nlohmann::json::array();
    for (const EvalMethod& m : methods) {
      nlohmann::json per_length = nlohmann::json::object();
      for (auto& [L, ks] : ss.k_tokens[m.name]) per_length[std::to_string(L)] = mean(ks);
      // rerank: the factor the search runs (a label like "topk:multipole@2%"
      // means rerank 4 since session 11, the plain lookup before).
      jm.push_back({{"name", m.name}, {"index", m.policy.index}, {"k", m.k}, {"dense_layers", m.policy.dense_layers},
                    {"rerank", KvIndex::create(m.policy.index)->rerank_of(m.policy.search)},
                    {"k_schedule", k_schedule_spec(m.policy)},
                    {"policy", nlohmann::json::parse(m.policy.to_json())}, {"k_tokens_per_length", per_length}});
    }
    nlohmann::json answer_tokens_json = nlohmann::json::object();
    for (RulerTask t : tasks) answer_tokens_json[ruler_task_name(t)] = a.answer_of(t);
    rep.config = {{"command", "eval ruler"}, {"model", a.model.empty() ? std::string(kDefaultModel) : a.model},
                  {"model_content_hash", fmt::format("{:016x}", file->content_hash())}, {"arch", arch_name(cfg.arch)},
                  {"model_summary", cfg.summary()}, {"backend", backend->name()}, {"threads", omp_get_max_threads()},
                  {"tasks", rep.tasks}, {"lengths", lengths}, {"samples", a.samples}, {"seed", a.seed},
                  {"chat", a.chat}, {"answer_tokens", answer_tokens_json}, {"agreement_tokens", a.agreement_tokens},
                  {"error_steps", a.error_steps < 0 ? a.agreement_tokens : a.error_steps},
                  {"chunk", a.chunk}, {"kv_type", a.kv_type}, {"policy", nlohmann::json::parse(base.to_json())},
                  {"methods", jm}, {"prompts", prompts.size()}, {"prompts_done", done},
                  {"complete", done == prompts.size()}};
  };
  // The CSV and JSON are written again after every prompt, so that a run cut short (a timeout, a kill) still
  // leaves the rows it finished; "complete" in the JSON says whether it ran to the end.
  const auto write_outputs = [&](size_t done) {
    if (a.csv.empty() && a.json.empty()) return;
    configure(done);
    if (!a.csv.empty()) write_ruler_csv(rep, a.csv);
    if (!a.json.empty()) write_ruler_json(rep, ruler_summary(rep), a.json);
  };
  Progress bar("ruler", (int64_t)prompts.size(), "prompts");
  for (size_t i = 0; i < prompts.size(); ++i) {
    run_prompt(ss, prompts[i], methods);
    rep.timing.total_s = total.seconds();
    if (i + 1 < prompts.size()) write_outputs(i + 1);
    bar.add(1);
  }
  bar.finish();
  RulerTiming& time = rep.timing;
  time.total_s = total.seconds();
  configure(prompts.size());
  const nlohmann::json summary = ruler_summary(rep);
  print_ruler_summary(rep, summary);
  if (!a.quiet)
    fmt::print(stderr, "eval ruler: {:.1f} s in all: prompts {:.1f} s, dense prefill {:.1f} s and decode {:.1f} s; "
               "{} index builds {:.1f} s, pack writes {:.1f} s, restores {:.1f} s; method decodes {:.1f} s, "
               "teacher-forced {:.1f} s\n", time.total_s, time.prompts_s, time.prefill_s, time.dense_decode_s,
               time.builds, time.build_s, time.write_s, time.restore_s, time.method_decode_s, time.forced_s);
  if (!a.csv.empty()) write_ruler_csv(rep, a.csv);
  if (!a.json.empty()) write_ruler_json(rep, summary, a.json);
  if (!a.png.empty()) {
    const std::string cmd = fmt::format("/usr/bin/python3 scripts/plot_ruler.py '{}' '{}'", a.json, a.png);
    TOPKV_CHECK(std::system(cmd.c_str()) == 0, "plotting failed: {} (needs python3-matplotlib; run from the "
                "repository root)", cmd);
  }
}

}  // namespace

void register_eval_ruler(CLI::App& eval) {
  auto a = std::make_shared<RulerArgs>();
  auto pol = std::make_shared<PolicyArgs>();
  auto* cmd = eval.add_subcommand("ruler", "RULER's synthetic long-context tasks (needles, variable tracking, common "
                                  "and frequent words): score per task and length for dense and each top-k method, "
                                  "its ratio to dense, greedy agreement and next-token KL against dense, attention "
                                  "error, decode tok/s");
  std::string names;
  for (RulerTask t : all_ruler_tasks()) names += (names.empty() ? "" : ",") + std::string(ruler_task_name(t));
  cmd->add_option("-m,--model", a->model,
                  fmt::format("GGUF model file (default: {}, installed by scripts/fetch-model.sh)", kDefaultModel));
  cmd->add_option("--tasks", a->tasks, "Comma list of tasks (default: all): " + names + ". RULER's QA tasks (qa_1 "
                  "SQuAD, qa_2 HotpotQA) need datasets topkv does not have and are left out");
  cmd->add_option("--lengths", a->lengths, "Sequence lengths as RULER counts them: the prompt plus the answer's "
                  "tokens (e.g. 4K,8K,16K)")->capture_default_str();
  cmd->add_option("--samples", a->samples, "Prompts per task and length")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of every prompt (each gets its own from it, the task, length and "
                  "sample)")->check(seed_value())->capture_default_str();
  cmd->add_option("--answer-tokens", a->answer_tokens, "Tokens generated per answer, for every task (0: RULER's: "
                  "128 niah, 30 vt, 120 cwe, 50 fwe); generation stops early at end of generation")
      ->capture_default_str();
  cmd->add_option("--agreement-tokens", a->agreement_tokens, "Teacher-forced steps on the dense tokens for greedy "
                  "agreement, next-token KL and attention error")->capture_default_str();
  cmd->add_option("--error-steps", a->error_steps, "Teacher-forced decode steps whose attention error is measured "
                  "(exact attention over every held key per retrieval layer on the host: the slow part at long "
                  "contexts), with the oracle top-k mass (the share of that attention sinks, window and the k "
                  "best keys hold; the table shows its mean, the JSON each layer); default: all of them, 0: none")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("--chat", a->chat, "Put each prompt in the model's chat template as one user turn (instruct models "
                "answer better so); the answer prefix starts the reply");
  add_method_options(cmd, a->methods);
  add_backend_options(cmd, a->where, ". With cuda the model and the dense runs are on the GPU and each method "
                      "decodes with the CUDA offload runtime", /*prefill_options=*/false);
  cmd->add_option("--kv-type", a->kv_type, "The model's KV cache type (the dense runs): f32 or f16")
      ->check(CLI::IsMember({"f32", "f16"}))->capture_default_str();
  cmd->add_option("--chunk", a->chunk, "Prefill chunk (on models with sliding-window layers it must exceed the "
                  "answer and agreement tokens)")->capture_default_str();
  cmd->add_option("--tmp-dir", a->tmp_dir, "Where each prompt's index builds go as a temporary context pack, one at "
                  "a time (default: the system's temp directory; at 32K on a 1.5B model about 1 GiB)");
  cmd->add_option("--save-prompts", a->save_prompts, "Write every prompt here (JSON lines: task, length, sample, "
                  "seed, answers, needle depths, the prompt as the model sees it)")->check(output_file("--save-prompts file"));
  cmd->add_option("--csv", a->csv, "One row per (task, length, sample, method); written again after every prompt")
      ->check(output_file("--csv report"));
  cmd->add_option("--json", a->json, "The configuration, the summary, timings, the index builds and every row; "
                  "written again after every prompt (\"complete\": false until the last), so a run cut short keeps "
                  "what it finished")->check(output_file("--json report"));
  cmd->add_option("--png", a->png, "Score per task and length, one line per method (scripts/plot_ruler.py; needs "
                  "--json)")->check(output_file("--png plot"));
  cmd->add_flag("-q,--quiet", a->quiet, "No progress bar or information on stderr (the summary still goes to stdout)");
  add_policy_options(cmd, pol);
  cmd->callback([a, pol, cmd] {
    OffloadPolicy p = pol->resolve(*cmd);
    check_no_single_method(*cmd, "eval ruler");
    run_ruler(*a, p);
  });
}

}  // namespace topkv::cli
