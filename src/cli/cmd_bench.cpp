// topkv bench: benchmarks. `bench recall` lives in bench/recall_cli.cpp;
// `bench decode` (bench/decode_bench.h) is here: its command line, the
// synthetic model it can make on the fly, and its output folder.
#include <unistd.h>

#include <filesystem>

#include "bench/decode_bench.h"
#include "bench/decode_report.h"
#include "src/cli/cli_util.h"
#include "src/cli/commands.h"
#include "src/cli/policy_options.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/progress.h"
#include "src/model/synth.h"
#include "src/common/cli_files.h"

namespace topkv::cli {

namespace {

namespace fs = std::filesystem;

struct DecodeArgs {
  std::string model, synth_preset, contexts = "8K,32K", modes = "dense,topk,host-dense", backend = "auto";
  std::string budget, fill = "synthetic", kv_type = "f16", weights = "quant", out_dir;
  std::vector<std::string> indexes;
  int steps = 16, warmup = 2, chunk = 512, q8_terms = 0;
  uint64_t seed = 1;
  bool beyond_trained = false, no_plot = false, quiet = false;
};

// A synthetic model written for this run and removed after it.
struct TempModel {
  fs::path dir;
  ~TempModel() {
    std::error_code ec;
    if (!dir.empty()) fs::remove_all(dir, ec);
  }
};

void run_decode(const DecodeArgs& a, const OffloadPolicy& policy) {
  if (a.quiet) Progress::set_global_enabled(false);
  TOPKV_CHECK(a.model.empty() != a.synth_preset.empty(), "give the model either as -m FILE or as --synth-preset "
              "NAME (one of: llama3-8b, gemma3-270m, tiny-llama, tiny-gemma3), not both and not neither");
  DecodeBenchConfig c;
  c.contexts = parse_count_list(a.contexts, /*min=*/0);  // 0: decode from an empty context (llama-bench -d 0)
  c.modes = parse_decode_modes(a.modes);
  c.indexes = a.indexes.empty() ? std::vector<std::string>{policy.index} : a.indexes;  // --config may name one
  c.policy = policy;
  c.backend = a.backend;
  c.gpu_mem_budget = a.budget.empty() ? 0 : parse_size(a.budget);
  c.q8_terms = a.q8_terms;
  TOPKV_CHECK(a.budget.empty() || c.gpu_mem_budget > 0, "--gpu-mem-budget must be positive (got '{}')", a.budget);
  c.steps = a.steps, c.warmup = a.warmup, c.chunk = a.chunk, c.seed = a.seed;
  c.fill = parse_context_fill(a.fill);
  c.kv_dtype = parse_dtype(a.kv_type);
  c.weights = parse_weight_mode(a.weights);
  c.beyond_trained = a.beyond_trained;
  c.progress = !a.quiet;
  if (!a.out_dir.empty()) {  // created when missing, before any long work (a bad path fails now)
    std::error_code ec;
    fs::create_directories(a.out_dir, ec);
    TOPKV_CHECK(fs::is_directory(a.out_dir), "--out-dir {}: cannot create that folder ({}); choose a writable one",
                a.out_dir, ec ? ec.message() : "a file of that name is in the way");
  }

  TempModel temp;
  if (!a.synth_preset.empty()) {
    SynthConfig s = synth_preset(a.synth_preset);
    // Its trained context covers the longest run: a synthetic model has no
    // real limit, and this keeps --beyond-trained for real models.
    int64_t longest = 0;
    for (int64_t n : c.contexts) longest = std::max(longest, n + c.warmup + c.steps);
    TOPKV_CHECK(longest <= INT32_MAX, "context {} is beyond what a GGUF context_length holds", longest);
    s.context = (int)std::max<int64_t>(s.context, longest);
    temp.dir = fs::temp_directory_path() / fmt::format("topkv_decode_{}", ::getpid());
    fs::create_directories(temp.dir);
    c.model_path = (temp.dir / (a.synth_preset + ".gguf")).string();
    if (!a.quiet) fmt::print(stderr, "topkv: writing synthetic model {} ({}) to {}\n", a.synth_preset,
                             format_bytes((double)synth_file_bytes(s)), c.model_path);
    synth_write(s, c.model_path, !a.quiet);
    c.model_label = "synthetic " + a.synth_preset;
  } else {
    c.model_path = a.model;
    c.model_label = fs::path(a.model).filename().string();
  }

  const DecodeBenchResult r = run_decode_bench(c);
  print_decode_table(r, stdout);
  if (a.out_dir.empty()) return;
  const fs::path dir(a.out_dir);
  write_decode_csv(r, (dir / "decode.csv").string());
  write_decode_json(r, (dir / "decode.json").string());
  if (a.no_plot) return;
  try {  // the numbers are written; a missing matplotlib costs only the picture
    plot_decode_png((dir / "decode.json").string(), (dir / "decode.png").string());
  } catch (const Error& e) {
    fmt::print(stderr, "topkv: warning: no decode.png: {} (--no-plot skips the plot)\n", e.what());
  }
}

void register_bench_decode(CLI::App& bench) {
  auto a = std::make_shared<DecodeArgs>();
  auto* cmd = bench.add_subcommand(
      "decode", "Decode speed at long contexts: tokens/s, p50/p99 per step and its split, for dense attention "
                "(all KV in the backend's memory), the offloaded top-k runtime and host-memory dense attention");
  cmd->footer(
      "Examples:\n"
      "  topkv bench decode -m .models/gemma-3-270m-q4_k_m.gguf --backend cpu --contexts 2K,8K --steps 8\n"
      "  topkv bench decode --synth-preset llama3-8b --contexts 128K,512K --gpu-mem-budget 24G --out-dir results\n"
      "--fill synthetic writes generated keys/values into the caches instead of prefilling (every output says so);\n"
      "--fill prefill prefills a passkey prompt of each length.");
  cmd->add_option("-m,--model", a->model, "GGUF model file");
  cmd->add_option("--synth-preset", a->synth_preset, "Synthesise this model geometry into a temporary file instead: "
                  "llama3-8b, gemma3-270m, tiny-llama, tiny-gemma3");
  cmd->add_option("--contexts", a->contexts, "Context lengths, comma-separated, K = 1024, M = 1024^2; 0 = decode from an empty context (dense rows only)")
      ->capture_default_str();
  cmd->add_option("--modes", a->modes, "dense (all KV in the backend's memory: GPU on --backend cuda), topk, "
                  "host-dense (exact attention over host memory on the CPU cores)")->capture_default_str();
  cmd->add_option("--backend", a->backend, "cpu, cuda, or auto (cuda when a device is there)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))->capture_default_str();
  cmd->add_option("--gpu-mem-budget", a->budget, "Backend memory the model may hold (weights + KV cache + scratch), "
                  "e.g. 24G; dense rows beyond it are skipped with the reason (default: no limit)");
  cmd->add_option("--steps", a->steps, "Timed decode steps per row")->capture_default_str();
  cmd->add_option("--warmup", a->warmup, "Untimed decode steps before them")->capture_default_str();
  cmd->add_option("--fill", a->fill, "synthetic: generated keys/values written into the caches; prefill: a real "
                  "prefill of a passkey prompt")->check(CLI::IsMember({"synthetic", "prefill"}))->capture_default_str();
  cmd->add_option("--kv-type", a->kv_type, "KV element type of the dense cache and the host-dense rows: f16 or f32")
      ->check(CLI::IsMember({"f16", "f32"}))->capture_default_str();
  add_q8_terms_option(cmd, a->q8_terms);
  cmd->add_option("--weights", a->weights, "How the backend holds the weights: quant (the file's quantised blocks; "
                  "on the GPU the decode runs on them), f16 (CUDA: dequantised to fp16 at load) or f32 (CPU: "
                  "dequantised to fp32 at load)")
      ->check(CLI::IsMember({"quant", "f16", "f32"}))->capture_default_str();
  cmd->add_option("--chunk", a->chunk, "Prefill chunk (--fill prefill)")->capture_default_str();
  cmd->add_option("--seed", a->seed, "Seed of the synthetic data and the passkey")->check(seed_value())->capture_default_str();
  cmd->add_flag("--beyond-trained", a->beyond_trained, "Allow contexts past the model's trained context (speed is "
                "measured; the text would be meaningless)");
  cmd->add_option("--out-dir", a->out_dir, "Write decode.csv, decode.json (bench/decode_schema.json) and decode.png here")->check(output_folder("--out-dir"));
  cmd->add_flag("--no-plot", a->no_plot, "No decode.png");
  cmd->add_flag("-q,--quiet", a->quiet, "No progress output on stderr");
  auto pol = std::make_shared<PolicyArgs>();
  add_policy_options(cmd, pol);  // --index (repeatable here: one topk row each), --k, --window, --sinks, ...
  cmd->callback([a, pol, cmd] {
    TOPKV_CHECK(cmd->count("--attn") == 0, "bench decode runs the attention of each --modes entry; drop --attn");
    if (cmd->count("--index")) a->indexes = pol->index_specs();  // the policy holds the first; each topk row sets its own
    run_decode(*a, pol->resolve(*cmd, cli_default_policy(), /*many_indexes=*/true));
  });
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks: ANN recall on attention data, decode speed");
  bench->require_subcommand(1);
  register_bench_recall(*bench);
  register_bench_decode(*bench);
}

}  // namespace topkv::cli
