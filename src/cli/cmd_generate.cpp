// topkv generate: a GGUF model, a prompt (text, file or stdin), tokens
// streamed to stdout as they come, statistics on stderr and in --json.
// Attention is dense over the whole cache (--attn dense) or, with --attn topk,
// the retrieval layers decode from the offloaded runtime: host store + per-head
// index + sinks + window (offload/offload_runtime.h). With --pack the context
// comes from a context pack (`topkv index build`, offload/context_pack.h)
// instead of a prefill, and the prompt, if any, is appended to it.
#include <omp.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <random>

#include "gpu/cuda_backend.h"
#include "offload/context_pack.h"
#include "offload/offload_runtime.h"
#include "src/cli/cli_util.h"
#include "src/cli/commands.h"
#include "src/cli/policy_options.h"
#include "src/common/error.h"
#include "src/common/host_memory.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/model/model.h"
#include "src/model/sampler.h"
#include "src/model/tokenizer.h"
#include "src/common/cli_files.h"
#include "src/common/file_io.h"
#include "src/session/session.h"

namespace topkv::cli {
namespace {

struct GenerateArgs {
  std::string model, prompt, json_path, pack, prompts_file, weights = "quant", kv_type = "f32";
  BackendArgs where;
  std::vector<std::string> prompt_files;
  int n_predict = 128, chunk = 256, top_k = 0;
  int64_t n_ctx = 0;
  float temp = 0.f, top_p = 1.f;
  bool ignore_eos = false;
  uint64_t seed = 0;
  bool seed_given = false, chat = false, quiet = false, measure_error = false;
};

// One prompt's run: its context work (prefill, index build or pack restore)
// and its answer.
struct Run {
  std::string question;
  int64_t prompt_tokens = 0;  // context included
  double prefill_s = 0;       // prefill + index build, or pack restore + prefill of the question
  double first_token_s = 0;   // context work + the first sample (+ opening and verifying the pack, first run)
  std::string stop = "length";
  int n_gen = 0, n_decode = 0;
  double decode_s = 0;
  double decode_tps() const { return n_decode > 0 ? n_decode / decode_s : 0.0; }
};

// --prompts: one question per line (empty lines skipped).
std::vector<std::string> read_questions(const std::string& path) {
  std::istringstream in(read_text_input(path, "questions file", 1ull << 30));
  std::vector<std::string> out;
  for (std::string line; std::getline(in, line);)
    if (line.find_first_not_of(" \t\r") != std::string::npos) out.push_back(line);
  TOPKV_CHECK(!out.empty(), "the questions file {} has no question (one per line)", path);
  return out;
}

void run_generate(const GenerateArgs& a, const PolicyArgs& pol, const CLI::App& cmd) {
  if (a.quiet) Progress::set_global_enabled(false);
  const auto note = [&](const std::string& s) {
    if (!a.quiet) fmt::print(stderr, "{}\n", s);
  };
  TOPKV_CHECK(a.n_predict >= 0, "-n must be >= 0, got {}", a.n_predict);
  TOPKV_CHECK(a.chunk > 0, "--chunk must be positive, got {}", a.chunk);
  TOPKV_CHECK(a.prompts_file.empty() || !a.pack.empty(), "--prompts needs --pack: each question starts again from "
              "the pack's context");
  TOPKV_CHECK(a.prompts_file.empty() || (a.prompt.empty() && a.prompt_files.empty()),
              "give the questions either with --prompts or as -p/-f, not both");
  // A pack fixes the context and the build-time policy (checked, with every
  // checksum, before any other work); the run may change the query-time part.
  std::unique_ptr<ContextPack> pack;
  Timer pack_timer;
  if (!a.pack.empty()) {
    TOPKV_CHECK(!a.chat, "--chat cannot wrap a prompt appended to a context pack (the chat turn would have to "
                "open before the pack's document); write the question as plain text");
    pack = std::make_unique<ContextPack>(a.pack);
  }
  const double pack_open_s = pack_timer.seconds();
  const OffloadPolicy policy = pack ? pack->policy_for_run(pol.resolve(cmd, pack->policy())) : pol.resolve(cmd);
  SamplerParams sp;
  sp.temperature = a.temp, sp.top_k = a.top_k, sp.top_p = a.top_p;
  sp.seed = a.seed_given ? a.seed : std::random_device{}();
  Sampler check_sampling(sp);  // checks the sampling options before the model loads
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  if (pack) pack->check_model(*file);
  Tokenizer read_tok = Tokenizer::from_gguf(*file);
  const Tokenizer& tok = read_tok;
  const ModelConfig cfg = read_model_config(*file);

  // The prompts: one (all of the context, or with a pack what follows the
  // pack's context: optional, no BOS) or, with --prompts, one per question.
  const std::vector<std::string> questions = !a.prompts_file.empty()
      ? read_questions(a.prompts_file)
      : std::vector<std::string>{read_input_text(a.prompt, a.prompt_files, /*required=*/!pack)};
  const int64_t n_pack = pack ? pack->n_tokens() : 0;
  std::vector<std::vector<int32_t>> prompts;
  size_t longest = 0;
  for (const std::string& q : questions) {
    prompts.push_back(pack ? (q.empty() ? std::vector<int32_t>{} : tok.encode(q, false, false))
                      : a.chat ? tok.encode_chat(q)
                               : tok.encode(q, tok.add_bos_default(), /*parse_special=*/false));
    TOPKV_CHECK(pack || !prompts.back().empty(), "the prompt encodes to no tokens");
    longest = std::max(longest, prompts.back().size());
  }
  const int64_t n_prompt_max = n_pack + (int64_t)longest;
  const int64_t n_ctx = a.n_ctx > 0 ? a.n_ctx
                        : pack      ? n_prompt_max + std::max(a.n_predict, 1)
                                    : std::min<int64_t>(cfg.n_ctx_train, 4096);
  if (n_ctx > cfg.n_ctx_train)
    fmt::print(stderr, "topkv: warning: context {} exceeds the {} tokens the model was trained on; quality may "
               "degrade past it\n", n_ctx, cfg.n_ctx_train);
  TOPKV_CHECK(n_prompt_max <= n_ctx, "the prompt has {} tokens{}, more than the context size {}; raise it with -c "
              "(the model was trained on {})", n_prompt_max, pack ? fmt::format(" ({} from the pack)", n_pack) : "",
              n_ctx, cfg.n_ctx_train);

  TOPKV_CHECK(!a.measure_error || policy.attn == AttnMode::TopK, "--measure-error compares top-k attention with "
              "exact attention; this run is dense (add --attn topk)");
  Session session(file, session_options(a.where, !a.quiet, a.measure_error), std::move(read_tok));
  const bool cuda = session.cuda();
  Backend& backend = session.backend();
  TOPKV_CHECK(cuda || cmd.count("--stage-rows") == 0, "--stage-rows applies to the CUDA backend (the host copies "
              "each step's retrieved rows to the GPU); the {} backend reads them in place: drop it", backend.name());
  ModelOptions mo;
  mo.n_ctx = n_ctx;
  mo.max_chunk = (int)std::clamp<int64_t>((int64_t)longest, 1, a.chunk);
  mo.kv_dtype = parse_dtype(a.kv_type);
  TOPKV_CHECK(mo.kv_dtype != DType::BF16, "--kv-type must be f32 or f16");
  mo.weights = parse_weight_mode(a.weights);
  check_weight_mode(mo.weights, cuda);
  const OffloadRuntime* planned = session.prepare_runtime(policy);  // the CUDA runtime on a CUDA backend
  // From a pack the top-k layers never attend densely: they get no cache at all.
  if (pack && planned) mo.override_layers = planned->retrieval_layers();
  place_prefill_kv(a.where, cuda, pack ? nullptr : planned, mo);
  if (pack && planned) mo.device_reserves = planned->device_reserves(n_ctx);  // its restore's tables and mirrors
  check_memory_plan(*file, cfg, policy, mo, /*from_pack=*/pack != nullptr, a.quiet, {}, planned);
  Timer load_timer;
  Model& model = session.load(mo);
  const double load_s = load_timer.seconds();
  if (const std::string s = describe_prefill_kv(model); !s.empty()) note(s);
  if (const int chosen = model.device_reserve_choice(); chosen > 0) {
    const std::string preferred = planned->device_table_choices()[0].name();
    note(fmt::format("topkv: device search tables as {} ({} on the GPU with the rest of the runtime): {}'s ({}) do "
                     "not fit beside the model (--device-table-type auto; raise --gpu-mem-budget for {})",
                     session.device_table_choice()->name(), format_bytes((double)mo.device_reserves[(size_t)chosen]),
                     preferred, format_bytes((double)mo.device_reserves[0]), preferred));
  }
  const nlohmann::json prefill_kv = prefill_kv_json(a.where, model);
  const char* other = weight_mode_name(backend.other_weight_mode(mo.weights));
  note(fmt::format("topkv: {}", cfg.summary()));
  note(fmt::format("topkv: weights {} ({}; --weights {} would take {}), KV cache {} ({} positions, {}), "
                   "{} prompt tokens", a.weights, mib(model.weight_bytes()), other,
                   mib(model.weight_bytes_other_mode()), mib(model.kv_bytes()), n_ctx, a.kv_type, n_prompt_max));
  if (pack) note(fmt::format("topkv: context pack {}: {} tokens, opened and verified in {:.2f} s", a.pack, n_pack,
                             pack_open_s));

  std::vector<Run> runs;
  DecodeParams dp;
  dp.sampling = sp, dp.n_predict = a.n_predict, dp.n_ctx = n_ctx, dp.ignore_eog = a.ignore_eos;
  for (size_t qi = 0; qi < prompts.size(); ++qi) {
    const std::vector<int32_t>& prompt = prompts[qi];
    Run r;
    r.question = questions[qi];
    r.prompt_tokens = n_pack + (int64_t)prompt.size();
    Timer since;
    std::vector<float> logits = session.start(policy, pack.get(), prompt, mo.max_chunk, /*release_kv=*/true);
    OffloadRuntime* offload = session.runtime();
    if (offload && pack && qi == 0)
      note(fmt::format("topkv: restored in {:.2f} s; {}; host store + index {}, of which {} used in place from "
                       "the pack", offload->stats().build_s, offload->describe(), mib(offload->host_bytes()),
                       mib(offload->in_place_bytes())));
    if (offload && !pack)
      note(fmt::format("topkv: {}; {} keys indexed in {:.2f} s after the prefill{}, host store + index {}",
                       offload->describe(), offload->stats().keys_indexed, offload->stats().build_s,
                       offload->on_device() ? fmt::format(" ({:.2f} s of it readying the layers: sinks, window and "
                                                          "search tables to the GPU)", offload->stats().ready_s)
                                            : std::string(),
                       mib(offload->host_bytes())));
    r.prefill_s = since.seconds();
    if (cuda && qi == 0) note(fmt::format("topkv: GPU memory after prefill: {}", cuda_memory_use(backend).describe()));
    if (prompts.size() > 1) {
      std::fprintf(stdout, "%s=== question %zu/%zu: %s\n", qi ? "\n" : "", qi + 1, prompts.size(), r.question.c_str());
      std::fflush(stdout);
    }
    StreamDecoder out(session.tokenizer());  // tokens printed as they come
    const DecodeResult d = session.decode(std::move(logits), dp, since, [&](int32_t id) {
      std::fputs(out.push(id).c_str(), stdout);
      std::fflush(stdout);
    });
    std::fputs(out.flush().c_str(), stdout);
    std::fputs("\n", stdout);
    std::fflush(stdout);
    r.stop = d.stop, r.n_gen = d.n_gen, r.n_decode = d.n_decode, r.decode_s = d.decode_s;
    r.first_token_s = d.first_token_s;
    if (qi == 0) r.first_token_s += pack_open_s;
    if (r.stop == "context") note(fmt::format("topkv: stopped: the context ({} tokens) is full; raise -c", n_ctx));
    if (prompts.size() > 1)
      note(fmt::format("topkv: question {}/{}: {} tokens, first token after {:.2f} s, {} tokens at {:.1f} tok/s; "
                       "stop: {}", qi + 1, prompts.size(), prompt.size(), r.first_token_s, r.n_gen, r.decode_tps(),
                       r.stop));
    runs.push_back(r);
  }
  OffloadRuntime* offload = session.runtime();

  const Run& last = runs.back();
  // With a pack, only the appended prompt is prefilled.
  const double prefill_tps = (double)(last.prompt_tokens - n_pack) / last.prefill_s;
  if (offload && offload->stats().steps > 0) {
    const OffloadStats& st = offload->stats();
    note(fmt::format("topkv: top-k decode: {:.1f} keys retrieved + {:.1f} exact per layer and KV head per step; "
                     "{:.2f} ms search, {:.2f} ms offloaded attention per step",
                     offload->per_head_step(st.retrieved), offload->per_head_step(st.exact),
                     st.search_s * 1e3 / st.steps, st.attend_s * 1e3 / st.steps));
  }
  if (offload && cuda && offload->stats().steps > 0) {
    const OffloadStats& st = offload->stats();
    note(fmt::format("topkv: per step: {:.3f} ms waiting for the GPU, {:.3f} ms copies, {:.3f} ms attention "
                     "kernels (device time)", st.wait_s * 1e3 / st.steps, st.transfer_s * 1e3 / st.steps,
                     st.gpu_s * 1e3 / st.steps));
  }
  if (cuda) note(fmt::format("topkv: GPU memory at the end: {}", cuda_memory_use(backend).describe()));
  std::vector<double> attn_err;
  if (offload && a.measure_error && offload->stats().steps > 0) {
    attn_err = offload->attention_rel_error();
    std::string per;
    for (size_t i = 0; i < attn_err.size(); ++i)
      per += fmt::format("{}{}:{:.4f}", i ? " " : "", offload->retrieval_layers()[i], attn_err[i]);
    note(fmt::format("topkv: attention error against exact attention over all {} tokens held, relative L2 over "
                     "{} steps, per layer: {}", offload->layer(offload->retrieval_layers()[0])->n_tokens(),
                     offload->stats().steps, per));
  }
  note(fmt::format("topkv: prompt {} tokens, prefill {:.2f} s ({:.1f} tok/s), first token after {:.2f} s; generated "
                   "{} tokens, decode {:.1f} tok/s; stop: {}; peak RSS {}", last.prompt_tokens, last.prefill_s,
                   prefill_tps, last.first_token_s, last.n_gen, last.decode_tps(), last.stop, mib(peak_rss_bytes())));
  if (!a.json_path.empty()) {
    nlohmann::json qs = nlohmann::json::array();
    for (const Run& r : runs)
      qs.push_back({{"question", a.prompts_file.empty() ? "" : r.question},  // not a whole document again
                    {"prompt_tokens", r.prompt_tokens},
                    {"prefill_s", r.prefill_s},
                    {"first_token_s", r.first_token_s},
                    {"generated_tokens", r.n_gen},
                    {"decode_tok_per_s", r.decode_tps()},
                    {"stop", r.stop}});
    nlohmann::json j = {{"model", path},
                        {"arch", arch_name(cfg.arch)},
                        {"backend", backend.name()},
                        {"threads", omp_get_max_threads()},
                        {"weights", a.weights},
                        {"weight_bytes", model.weight_bytes()},
                        {"kv_type", a.kv_type},
                        {"kv_bytes", model.kv_bytes()},
                        {"n_ctx", n_ctx},
                        {"load_s", load_s},
                        {"prompt_tokens", last.prompt_tokens},
                        {"prefill_s", last.prefill_s},
                        {"prefill_tok_per_s", prefill_tps},
                        {"first_token_s", last.first_token_s},
                        {"generated_tokens", last.n_gen},
                        {"decode_tokens", last.n_decode},
                        {"decode_s", last.decode_s},
                        {"decode_tok_per_s", last.decode_tps()},
                        {"stop", last.stop},
                        {"questions", qs},
                        {"temperature", sp.temperature},
                        {"top_k", sp.top_k},
                        {"top_p", sp.top_p},
                        {"seed", sp.seed},
                        {"peak_rss_bytes", peak_rss_bytes()},
                        {"prefill_kv", prefill_kv},
                        {"attn", attn_mode_name(policy.attn)}};
    if (pack) j["pack"] = {{"path", a.pack}, {"tokens", n_pack}, {"open_verify_s", pack_open_s}};
    if (cuda) {
      const CudaMemoryUse mu = cuda_memory_use(backend);
      j["gpu_memory"] = {{"weights", mu.weights}, {"kv_cache", mu.kv_cache}, {"activations", mu.activations},
                         {"scratch", mu.scratch}, {"total", mu.total()}, {"budget", mu.budget}};
    }
    if (offload) {
      const OffloadStats& st = offload->stats();
      // The tables on the device (null without a device search).
      const DeviceTableChoice* device_tables =
          offload->device_table_choices().empty() ? nullptr : &offload->device_tables();
      j["offload"] = {{"policy", nlohmann::json::parse(policy.to_json())},
                      {"device_table_type", device_tables ? nlohmann::json(dtype_name(device_tables->type))
                                                          : nlohmann::json()},
                      {"device_table_page_factor", device_tables ? nlohmann::json(device_tables->page_factor)
                                                                 : nlohmann::json()},
                      {"retrieval_layers", offload->retrieval_layers()},
                      {"k_per_layer", offload->k_per_layer()},
                      {"keys_indexed", st.keys_indexed},
                      {pack ? "pack_restore_s" : "index_build_s", st.build_s},
                      {"layers_ready_s", st.ready_s},
                      {"host_bytes", offload->host_bytes()},
                      {"steps", st.steps},
                      {"retrieved_per_step", st.steps ? (double)st.retrieved / st.steps : 0.0},
                      {"exact_per_step", st.steps ? (double)st.exact / st.steps : 0.0},
                      {"search_ms_per_step", st.steps ? st.search_s * 1e3 / st.steps : 0.0},
                      {"attention_ms_per_step", st.steps ? st.attend_s * 1e3 / st.steps : 0.0},
                      {"gpu_wait_ms_per_step", st.steps ? st.wait_s * 1e3 / st.steps : 0.0},
                      {"gpu_copy_ms_per_step", st.steps ? st.transfer_s * 1e3 / st.steps : 0.0},
                      {"gpu_attention_ms_per_step", st.steps ? st.gpu_s * 1e3 / st.steps : 0.0}};
      if (!attn_err.empty()) j["offload"]["attention_rel_error_per_layer"] = attn_err;
    }
    write_json_atomic(a.json_path, j);
  }
}

}  // namespace

void register_generate(CLI::App& app) {
  auto a = std::make_shared<GenerateArgs>();
  auto* cmd = app.add_subcommand("generate", "Generate text from a prompt with a GGUF model (llama, gemma3, qwen2)");
  cmd->add_option("-m,--model", a->model,
                  fmt::format("GGUF model file (default: {}, installed by scripts/fetch-model.sh)", kDefaultModel));
  cmd->add_option("-p,--prompt", a->prompt, "Prompt text");
  cmd->add_option("-f,--file", a->prompt_files, "Read the prompt from this file (repeatable: joined in order; stdin "
                  "when neither -p nor -f)");
  cmd->add_option("-n,--n-predict", a->n_predict, "Tokens to generate at most (stops earlier at end-of-generation)")
      ->capture_default_str();
  cmd->add_option("-c,--ctx", a->n_ctx,
                  "Context size in tokens: prompt + generated (default: min(model's trained context, 4096); with "
                  "--pack, the pack's tokens + prompt + -n; beyond the trained context is allowed with a warning)")->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  cmd->add_option("--pack", a->pack,
                  "Go on from a context pack (topkv index build) instead of prefilling: its document is the start "
                  "of the context, the prompt (-p/-f/stdin, optional) is appended. Every checksum is verified "
                  "first. The pack fixes --attn, sinks, window, dense layers, store type and head pattern; --index "
                  "picks one of the indexes built into it (another is refused, naming those); --k and the other "
                  "search options may change")
      ->check(CLI::ExistingFile);
  cmd->add_option("--prompts", a->prompts_file,
                  "With --pack: a file of questions, one per line; each starts again from the pack's context and "
                  "its answer is printed after a '=== question i/n' line, with its time to first token on stderr")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--ignore-eos", a->ignore_eos,
                "Go on past end-of-generation tokens (printed like any other) until -n or the context is full: "
                "for long runs and benchmarks");
  cmd->add_flag("--chat", a->chat, "Wrap the prompt in the model's chat template as one user turn");
  cmd->add_option("--temp", a->temp, "Sampling temperature; 0 = greedy (argmax)")->capture_default_str();
  cmd->add_option("--top-k", a->top_k, "Sample among the k most likely tokens; 0 = all")->capture_default_str();
  cmd->add_option("--top-p", a->top_p, "Sample from the smallest set of tokens whose probability reaches p; 1 = off")
      ->capture_default_str();
  cmd->add_option_function<uint64_t>("--seed", [a](uint64_t s) { a->seed = s, a->seed_given = true; },
                                     "Random seed for sampling (default: random; the same seed repeats a run)")
      ->check(seed_value());
  add_backend_options(cmd, a->where, ". With cuda and --attn topk the retrieval layers' KV stays in pinned host "
                      "memory and only sinks + window live on the GPU");
  cmd->add_option("--weights", a->weights,
                  "quant: keep the file's quantised rows (CPU: mapped; CUDA: the blocks on the GPU, decoded by the "
                  "quantised GEMV kernels; smallest); f32 (CPU): dequantise once at load (4 bytes per parameter); "
                  "f16 (CUDA): dequantise to fp16 at load (2 bytes per parameter). The memory of both is printed")
      ->check(CLI::IsMember({"quant", "f16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--kv-type", a->kv_type, "KV cache element type: f32 or f16")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
  cmd->add_option("--chunk", a->chunk, "Prompt tokens per prefill step")->capture_default_str();
  cmd->add_option("--json", a->json_path,
                  "Write statistics here: prompt tokens, prefill and decode tok/s, time to first token, peak RSS, "
                  "memory (with --prompts: of the last question at the top, of each under \"questions\")")->check(output_file("--json statistics"));
  cmd->add_flag("-q,--quiet", a->quiet, "No progress bar or information on stderr (errors still go there)");
  cmd->add_flag("--measure-error", a->measure_error, "Top-k: each decode step also computes exact attention over "
                "everything each retrieval layer holds (on the host cores: slow, for evaluation) and reports the "
                "relative L2 error of the served attention per layer (stderr and --json)");
  auto pol = std::make_shared<PolicyArgs>();
  add_policy_options(cmd, pol);
  cmd->callback([a, pol, cmd] { run_generate(*a, *pol, *cmd); });
}

}  // namespace topkv::cli
