// topkv generate: a GGUF model, a prompt (text, file or stdin), tokens
// streamed to stdout as they come, statistics on stderr and in --json.
// Attention is dense over the whole cache (--attn dense) or, with --attn topk,
// the retrieval layers decode from the offloaded runtime: host store + per-head
// index + sinks + window (offload/offload_runtime.h).
#include <omp.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "gpu/cuda_backend.h"
#include "gpu/cuda_sampler.h"
#include "gpu/device.h"
#include "offload/make_runtime.h"
#include "offload/memory_plan.h"
#include "offload/offload_runtime.h"
#include "src/cli/commands.h"
#include "src/cli/policy_options.h"
#include "src/common/error.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/model/model.h"
#include "src/model/sampler.h"
#include "src/model/tokenizer.h"

namespace topkv::cli {
namespace {

namespace fs = std::filesystem;
constexpr const char* kDefaultModel = ".models/gemma-3-270m-q4_k_m.gguf";  // scripts/fetch-model.sh

struct GenerateArgs {
  std::string model, prompt, prompt_file, json_path, weights = "quant", kv_type = "f32";
  std::string backend = "auto", gpu_mem_budget;
  int n_predict = 128, threads = 0, chunk = 256, top_k = 0;
  int64_t n_ctx = 0;
  float temp = 0.f, top_p = 1.f;
  uint64_t seed = 0;
  bool seed_given = false, chat = false, quiet = false;
};

// -m omitted: the fetch script's output, looked for under the working
// directory and then upwards from the executable (build/bin/topkv in a checkout).
std::string default_model_path() {
  std::vector<fs::path> roots{fs::current_path()};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path p = exe.parent_path(); !ec && !p.empty() && p != p.root_path(); p = p.parent_path()) roots.push_back(p);
  for (const auto& r : roots)
    if (fs::is_regular_file(r / kDefaultModel, ec)) return (r / kDefaultModel).string();
  fail("no model given (-m) and the default model {} was not found here or above the executable; run "
       "scripts/fetch-model.sh to install it, or pass -m model.gguf", kDefaultModel);
}

std::string read_prompt(const GenerateArgs& a) {
  TOPKV_CHECK(a.prompt.empty() || a.prompt_file.empty(), "give the prompt either as -p text or as -f file, not both");
  if (!a.prompt.empty()) return a.prompt;
  std::stringstream ss;
  if (!a.prompt_file.empty()) {
    std::ifstream in(a.prompt_file, std::ios::binary);
    TOPKV_CHECK(in, "cannot read the prompt file {}", a.prompt_file);
    ss << in.rdbuf();
  } else {
    TOPKV_CHECK(!isatty(STDIN_FILENO), "no prompt: give -p text, -f file, or pipe the prompt on stdin");
    ss << std::cin.rdbuf();
  }
  std::string text = ss.str();
  TOPKV_CHECK(!text.empty(), "the prompt is empty");
  return text;
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return (size_t)ru.ru_maxrss * 1024;  // Linux reports KiB
}

std::string mib(size_t b) { return fmt::format("{:.1f} MiB", (double)b / (1024.0 * 1024.0)); }

void write_json_atomic(const std::string& path, const nlohmann::json& j) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    TOPKV_CHECK(out, "cannot write {}", tmp);
    out << j.dump(2) << "\n";
    TOPKV_CHECK(out.good(), "writing {} failed", tmp);
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  TOPKV_CHECK(!ec, "cannot move {} to {}: {}", tmp, path, ec.message());
}

void run_generate(const GenerateArgs& a, const OffloadPolicy& policy) {
  if (a.quiet) Progress::set_global_enabled(false);
  const auto note = [&](const std::string& s) {
    if (!a.quiet) fmt::print(stderr, "{}\n", s);
  };
  TOPKV_CHECK(a.n_predict >= 0, "-n must be >= 0, got {}", a.n_predict);
  TOPKV_CHECK(a.chunk > 0, "--chunk must be positive, got {}", a.chunk);
  SamplerParams sp;
  sp.temperature = a.temp, sp.top_k = a.top_k, sp.top_p = a.top_p;
  sp.seed = a.seed_given ? a.seed : std::random_device{}();
  Sampler sampler(sp);  // checks the sampling options before the model loads
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  const ModelConfig cfg = read_model_config(*file);

  const std::string text = read_prompt(a);
  const std::vector<int32_t> prompt =
      a.chat ? tok.encode_chat(text) : tok.encode(text, tok.add_bos_default(), /*parse_special=*/false);
  TOPKV_CHECK(!prompt.empty(), "the prompt encodes to no tokens");

  int64_t n_ctx = a.n_ctx > 0 ? a.n_ctx : std::min<int64_t>(cfg.n_ctx_train, 4096);
  if (n_ctx > cfg.n_ctx_train)
    fmt::print(stderr, "topkv: warning: context {} exceeds the {} tokens the model was trained on; quality may "
               "degrade past it\n", n_ctx, cfg.n_ctx_train);
  TOPKV_CHECK((int64_t)prompt.size() <= n_ctx, "the prompt has {} tokens, more than the context size {}; raise it "
              "with -c (the model was trained on {})", prompt.size(), n_ctx, cfg.n_ctx_train);

  const bool cuda = a.backend == "cuda" || (a.backend == "auto" && cuda_device_count() > 0);
  std::unique_ptr<Backend> backend;
  if (cuda) {
    CudaBackendOptions co;
    if (!a.gpu_mem_budget.empty()) co.mem_budget = parse_size(a.gpu_mem_budget);
    backend = make_cuda_backend(co);
  } else {
    TOPKV_CHECK(a.gpu_mem_budget.empty(), "--gpu-mem-budget applies to the CUDA backend; this run uses the CPU "
                "(--backend {})", a.backend);
    backend = make_cpu_backend({a.threads});
  }
  ModelOptions mo;
  mo.n_ctx = n_ctx;
  mo.max_chunk = (int)std::min<int64_t>(a.chunk, (int64_t)prompt.size());
  mo.kv_dtype = parse_dtype(a.kv_type);
  TOPKV_CHECK(mo.kv_dtype != DType::BF16, "--kv-type must be f32 or f16");
  mo.weights = parse_weight_mode(a.weights);
  std::unique_ptr<OffloadRuntime> offload;
  if (policy.attn == AttnMode::TopK)
    offload = make_offload_runtime(*backend, cfg, policy, !a.quiet);  // the CUDA runtime on a CUDA backend
  {  // refuse a run that cannot fit before any work, with the numbers
    MemoryPlanInput mi;
    mi.cfg = &cfg, mi.policy = &policy, mi.context = n_ctx, mi.max_chunk = mo.max_chunk;
    mi.kv_dtype = mo.kv_dtype, mi.store_dtype = policy.store_dtype;
    mi.weight_bytes = (double)file->file_size();  // quant: the mapped file becomes resident
    if (mo.weights == WeightMode::F32) {         // f32: 4 bytes per parameter
      mi.weight_bytes = 0;
      for (const auto& t : file->tensors()) mi.weight_bytes += 4.0 * t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
    }
    MemoryPlan plan = plan_memory(mi);
    if (!a.quiet) fmt::print(stderr, "{}\n", plan.table());
    check_plan_fits(plan, host_memory_available());
  }
  Timer load_timer;
  Model model(file, *backend, mo);
  model.touch_weights();  // page the mapped weights in now, not inside the timed prefill
  const double load_s = load_timer.seconds();
  const char* other = mo.weights == WeightMode::Quant ? "f32" : "quant";
  note(fmt::format("topkv: {}", cfg.summary()));
  note(fmt::format("topkv: weights {} ({}; --weights {} would take {}), KV cache {} ({} positions, {}), "
                   "{} prompt tokens", a.weights, mib(model.weight_bytes()), other,
                   mib(model.weight_bytes_other_mode()), mib(model.kv_bytes()), n_ctx, a.kv_type, prompt.size()));

  // Prefill, with a bar for prompts longer than one chunk.
  Progress bar("prefill", (int64_t)prompt.size(), "tok", prompt.size() > (size_t)mo.max_chunk);
  Timer prefill_timer;
  std::vector<float> logits = model.prefill(prompt, mo.max_chunk, false, [&](int64_t done) { bar.set(done); });
  bar.finish();
  if (offload) {  // hand the retrieval layers' KV to the host stores and build their indexes
    offload->take_prefill(model);
    for (int il : offload->retrieval_layers()) model.release_kv(il);  // the runtime holds them now
    model.set_attention_override(offload.get());
    note(fmt::format("topkv: {}; {} keys indexed in {:.2f} s, host store + index {}", offload->describe(),
                     offload->stats().keys_indexed, offload->stats().build_s, mib(offload->host_bytes())));
  }
  const double prefill_s = prefill_timer.seconds();  // index build included
  if (cuda) note(fmt::format("topkv: GPU memory after prefill: {}", cuda_memory_use(*backend).describe()));

  // Each step: sample from the current logits, print, then (unless done)
  // run the sampled token to get the next logits. decode tok/s counts those
  // runs, sampling included.
  // On the GPU the decode logits stay on the device and are sampled there
  // (gpu/cuda_sampler.h): 4 x n_vocab bytes less to copy per token. The first
  // token comes from the prefill's host logits.
  std::unique_ptr<CudaSampler> gpu_sampler;
  if (cuda) gpu_sampler = std::make_unique<CudaSampler>(*backend, sp);
  const float* device_logits = nullptr;
  StreamDecoder out(tok);
  int n_gen = 0, n_decode = 0;
  std::string stop = "length";
  Timer decode_timer;
  while (n_gen < a.n_predict) {
    const int32_t id = device_logits ? gpu_sampler->sample(device_logits, cfg.n_vocab) : sampler.sample(logits);
    if (tok.is_eog(id)) {
      stop = "eog";
      break;
    }
    std::fputs(out.push(id).c_str(), stdout);
    std::fflush(stdout);
    if (++n_gen == a.n_predict) break;
    if (model.n_past() >= n_ctx) {
      stop = "context";
      break;
    }
    if (gpu_sampler)
      device_logits = model.decode_on_backend(id);
    else
      logits = model.decode(id);
    ++n_decode;
  }
  const double decode_s = decode_timer.seconds();
  std::fputs(out.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (stop == "context") note(fmt::format("topkv: stopped: the context ({} tokens) is full; raise -c", n_ctx));

  const double prefill_tps = prompt.size() / prefill_s, decode_tps = n_decode > 0 ? n_decode / decode_s : 0.0;
  if (offload && offload->stats().steps > 0) {
    const OffloadStats& st = offload->stats();
    note(fmt::format("topkv: top-k decode: {:.1f} keys retrieved + {:.1f} exact per layer and KV head per step; "
                     "{:.2f} ms search, {:.2f} ms offloaded attention per step", (double)st.retrieved / st.steps /
                     offload->retrieval_layers().size() / cfg.n_head_kv, (double)st.exact / st.steps /
                     offload->retrieval_layers().size() / cfg.n_head_kv, st.search_s * 1e3 / st.steps,
                     st.attend_s * 1e3 / st.steps));
  }
  if (offload && cuda && offload->stats().steps > 0) {
    const OffloadStats& st = offload->stats();
    note(fmt::format("topkv: per step: {:.3f} ms waiting for the GPU, {:.3f} ms copies, {:.3f} ms attention "
                     "kernels (device time)", st.wait_s * 1e3 / st.steps, st.transfer_s * 1e3 / st.steps,
                     st.gpu_s * 1e3 / st.steps));
  }
  if (cuda) note(fmt::format("topkv: GPU memory at the end: {}", cuda_memory_use(*backend).describe()));
  note(fmt::format("topkv: prompt {} tokens, prefill {:.2f} s ({:.1f} tok/s); generated {} tokens, decode {:.1f} "
                   "tok/s; stop: {}; peak RSS {}", prompt.size(), prefill_s, prefill_tps, n_gen, decode_tps, stop,
                   mib(peak_rss_bytes())));
  if (!a.json_path.empty()) {
    nlohmann::json j = {{"model", path},
                        {"arch", arch_name(cfg.arch)},
                        {"backend", backend->name()},
                        {"threads", omp_get_max_threads()},
                        {"weights", a.weights},
                        {"weight_bytes", model.weight_bytes()},
                        {"kv_type", a.kv_type},
                        {"kv_bytes", model.kv_bytes()},
                        {"n_ctx", n_ctx},
                        {"load_s", load_s},
                        {"prompt_tokens", prompt.size()},
                        {"prefill_s", prefill_s},
                        {"prefill_tok_per_s", prefill_tps},
                        {"generated_tokens", n_gen},
                        {"decode_tokens", n_decode},
                        {"decode_s", decode_s},
                        {"decode_tok_per_s", decode_tps},
                        {"stop", stop},
                        {"temperature", sp.temperature},
                        {"top_k", sp.top_k},
                        {"top_p", sp.top_p},
                        {"seed", sp.seed},
                        {"peak_rss_bytes", peak_rss_bytes()},
                        {"attn", attn_mode_name(policy.attn)}};
    if (cuda) {
      const CudaMemoryUse mu = cuda_memory_use(*backend);
      j["gpu_memory"] = {{"weights", mu.weights}, {"kv_cache", mu.kv_cache}, {"activations", mu.activations},
                         {"scratch", mu.scratch}, {"total", mu.total()}, {"budget", mu.budget}};
    }
    if (offload) {
      const OffloadStats& st = offload->stats();
      j["offload"] = {{"policy", nlohmann::json::parse(policy.to_json())},
                      {"retrieval_layers", offload->retrieval_layers()},
                      {"k_per_layer", offload->k_per_layer()},
                      {"keys_indexed", st.keys_indexed},
                      {"index_build_s", st.build_s},
                      {"host_bytes", offload->host_bytes()},
                      {"steps", st.steps},
                      {"retrieved_per_step", st.steps ? (double)st.retrieved / st.steps : 0.0},
                      {"exact_per_step", st.steps ? (double)st.exact / st.steps : 0.0},
                      {"search_ms_per_step", st.steps ? st.search_s * 1e3 / st.steps : 0.0},
                      {"attention_ms_per_step", st.steps ? st.attend_s * 1e3 / st.steps : 0.0},
                      {"gpu_wait_ms_per_step", st.steps ? st.wait_s * 1e3 / st.steps : 0.0},
                      {"gpu_copy_ms_per_step", st.steps ? st.transfer_s * 1e3 / st.steps : 0.0},
                      {"gpu_attention_ms_per_step", st.steps ? st.gpu_s * 1e3 / st.steps : 0.0}};
    }
    write_json_atomic(a.json_path, j);
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt with a GGUF model (llama, gemma3)");
  cmd->add_option("-m,--model", a->model,
                  fmt::format("GGUF model file (default: {}, installed by scripts/fetch-model.sh)", kDefaultModel));
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text");
  cmd->add_option("-f,--file", a->prompt_file, "Read the prompt from this file (stdin when neither -p nor -f)");
  cmd->add_option("-n,--n-predict", a->n_predict, "Tokens to generate at most (stops earlier at end-of-generation)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx", a->n_ctx,
                  "Context size in tokens: prompt + generated (default: min(model's trained context, 4096); "
                  "beyond the trained context is allowed with a warning)");
  cmd->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template as one user turn");
  cmd->add_option("--temp", a->temp, "Sampling temperature; 0 = greedy (argmax)")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Sample among the k most likely tokens; 0 = all")->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "Sample from the smallest set of tokens whose probability reaches p; 1 = off")
      ->capture_default_str();
  cmd->add_option_function<uint64_t>("--seed", [a](uint64_t s) { a->seed = s, a->seed_given = true; },
                                     "Random seed for sampling (default: random; the same seed repeats a run)");
  cmd->add_option("--threads", a->threads,
                  "CPU threads (default: OpenMP's, i.e. all cores or OMP_NUM_THREADS)");
  cmd->add_option("--weights", a->weights,
                  "quant: keep the file's quantised rows (mapped, smallest); f32: dequantise once at load "
                  "(about 4 bytes per parameter; the memory of both is printed)")
      ->check(CLI::IsMember({"quant", "f32"}))
      ->capture_default_str();
  cmd->add_option("--kv-type", a->kv_type, "KV cache element type: f32 or f16")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
  cmd->add_option("--chunk", a->chunk, "Prompt tokens per prefill step")->capture_default_str();
  cmd->add_option("--backend", a->backend,
                  "Where the model runs: cpu, cuda, or auto (cuda when a GPU is visible). With cuda and --attn "
                  "topk the retrieval layers' KV stays in pinned host memory and only sinks + window live on the GPU")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--gpu-mem-budget", a->gpu_mem_budget,
                  "Most GPU memory the run may hold, e.g. 16G or 1500M (weights, KV cache and window, buffers, "
                  "prefill scratch); the run stops with a breakdown rather than exceed it");
  cmd->add_option("--json", a->json_path,
                  "Write statistics here: prompt tokens, prefill and decode tok/s, peak RSS, memory");
  cmd->add_flag("-q,--quiet", a->quiet, "No progress bar or information on stderr (errors still go there)");
  auto pol = std::make_shared<PolicyArgs>();
  add_policy_options(cmd, pol);
  cmd->callback([a, pol, cmd] { run_generate(*a, pol->resolve(*cmd)); });
}

}  // namespace topkv::cli
