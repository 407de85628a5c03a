// topkv generate: a GGUF model, a prompt (text, file or stdin), tokens
// streamed to stdout as they come, statistics on stderr and in --json.
// Attention is dense over the whole cache (--attn dense) or, with --attn topk,
// the retrieval layers decode from the offloaded runtime: host store + per-head
// index + sinks + window (offload/offload_runtime.h). With --pack the context
// comes from a context pack (`topkv index build`, offload/context_pack.h)
// instead of a prefill, and the prompt, if any, is appended to it.
#include <omp.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "offload/context_pack.h"
#include "offload/offload_runtime.h"
#include "src/cli/cli_util.h"
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

struct GenerateArgs {
  std::string model, prompt, prompt_file, json_path, pack, weights = "quant", kv_type = "f32";
  int n_predict = 128, threads = 0, chunk = 256, top_k = 0;
  int64_t n_ctx = 0;
  float temp = 0.f, top_p = 1.f;
  uint64_t seed = 0;
  bool seed_given = false, chat = false, quiet = false;
};

void run_generate(const GenerateArgs& a, const PolicyArgs& pol, const CLI::App& cmd) {
  if (a.quiet) Progress::set_global_enabled(false);
  const auto note = [&](const std::string& s) {
    if (!a.quiet) fmt::print(stderr, "{}\n", s);
  };
  TOPKV_CHECK(a.n_predict >= 0, "-n must be >= 0, got {}", a.n_predict);
  TOPKV_CHECK(a.chunk > 0, "--chunk must be positive, got {}", a.chunk);
  // A pack fixes the context and the build-time policy; the run may change
  // the query-time part (k, ef, ...).
  std::unique_ptr<ContextPack> pack;
  if (!a.pack.empty()) {
    TOPKV_CHECK(!a.chat, "--chat cannot wrap a prompt appended to a context pack (the chat turn would have to "
                "open before the pack's document); write the question as plain text");
    pack = std::make_unique<ContextPack>(a.pack);
  }
  const OffloadPolicy policy = pack ? pack->policy_for_run(pol.resolve(cmd, pack->policy())) : pol.resolve(cmd);
  SamplerParams sp;
  sp.temperature = a.temp, sp.top_k = a.top_k, sp.top_p = a.top_p;
  sp.seed = a.seed_given ? a.seed : std::random_device{}();
  Sampler sampler(sp);  // checks the sampling options before the model loads
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  if (pack) pack->check_model(*file);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  const ModelConfig cfg = read_model_config(*file);

  // The prompt: all of it, or with a pack what follows the pack's context
  // (optional, no BOS: it continues the document).
  const std::string text = read_input_text(a.prompt, a.prompt_file, /*required=*/!pack);
  const int64_t n_pack = pack ? pack->n_tokens() : 0;
  const std::vector<int32_t> prompt = pack ? (text.empty() ? std::vector<int32_t>{} : tok.encode(text, false, false))
                                      : a.chat ? tok.encode_chat(text)
                                               : tok.encode(text, tok.add_bos_default(), /*parse_special=*/false);
  TOPKV_CHECK(pack || !prompt.empty(), "the prompt encodes to no tokens");
  const int64_t n_prompt = n_pack + (int64_t)prompt.size();

  int64_t n_ctx = a.n_ctx > 0 ? a.n_ctx
                  : pack      ? n_prompt + std::max(a.n_predict, 1)
                              : std::min<int64_t>(cfg.n_ctx_train, 4096);
  if (n_ctx > cfg.n_ctx_train)
    fmt::print(stderr, "topkv: warning: context {} exceeds the {} tokens the model was trained on; quality may "
               "degrade past it\n", n_ctx, cfg.n_ctx_train);
  TOPKV_CHECK(n_prompt <= n_ctx, "the prompt has {} tokens{}, more than the context size {}; raise it with -c (the "
              "model was trained on {})", n_prompt, pack ? fmt::format(" ({} from the pack)", n_pack) : "", n_ctx,
              cfg.n_ctx_train);

  auto backend = make_cpu_backend({a.threads});
  ModelOptions mo;
  mo.n_ctx = n_ctx;
  mo.max_chunk = (int)std::clamp<int64_t>((int64_t)prompt.size(), 1, a.chunk);
  mo.kv_dtype = parse_dtype(a.kv_type);
  TOPKV_CHECK(mo.kv_dtype != DType::BF16, "--kv-type must be f32 or f16");
  mo.weights = parse_weight_mode(a.weights);
  std::unique_ptr<OffloadRuntime> offload;
  if (policy.attn == AttnMode::TopK) offload = std::make_unique<OffloadRuntime>(cfg, policy, !a.quiet);
  check_memory_plan(*file, cfg, policy, mo, /*from_pack=*/pack != nullptr, a.quiet);
  Timer load_timer;
  Model model(file, *backend, mo);
  model.touch_weights();  // page the mapped weights in now, not inside the timed prefill
  const double load_s = load_timer.seconds();
  const char* other = mo.weights == WeightMode::Quant ? "f32" : "quant";
  note(fmt::format("topkv: {}", cfg.summary()));
  note(fmt::format("topkv: weights {} ({}; --weights {} would take {}), KV cache {} ({} positions, {}), "
                   "{} prompt tokens", a.weights, mib(model.weight_bytes()), other,
                   mib(model.weight_bytes_other_mode()), mib(model.kv_bytes()), n_ctx, a.kv_type, n_prompt));

  Timer prefill_timer;
  std::vector<float> logits;
  if (pack) {  // the pack's context, then the prompt on top of it
    logits = pack->restore(model, *offload);
    note(fmt::format("topkv: context pack {}: {} tokens restored in {:.2f} s; {}; host store + index {}", a.pack,
                     n_pack, offload->stats().build_s, offload->describe(), mib(offload->host_bytes())));
  }
  if (!prompt.empty()) {  // with a bar for prompts longer than one chunk
    Progress bar("prefill", (int64_t)prompt.size(), "tok", prompt.size() > (size_t)mo.max_chunk);
    logits = model.prefill(prompt, mo.max_chunk, false, [&](int64_t done) { bar.set(done); });
    bar.finish();
  }
  if (offload && !pack) {  // hand the retrieval layers' KV to the host stores and build their indexes
    offload->take_prefill(model);
    model.set_attention_override(offload.get());
    note(fmt::format("topkv: {}; {} keys indexed in {:.2f} s, host store + index {}", offload->describe(),
                     offload->stats().keys_indexed, offload->stats().build_s, mib(offload->host_bytes())));
  }
  const double prefill_s = prefill_timer.seconds();  // index build (or pack restore) included

  // Each step: sample from the current logits, print, then (unless done)
  // run the sampled token to get the next logits. decode tok/s counts those
  // runs, sampling included.
  StreamDecoder out(tok);
  int n_gen = 0, n_decode = 0;
  std::string stop = "length";
  Timer decode_timer;
  while (n_gen < a.n_predict) {
    const int32_t id = sampler.sample(logits);
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
    logits = model.decode(id);
    ++n_decode;
  }
  const double decode_s = decode_timer.seconds();
  std::fputs(out.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  if (stop == "context") note(fmt::format("topkv: stopped: the context ({} tokens) is full; raise -c", n_ctx));

  // With a pack, only the appended prompt is prefilled.
  const double prefill_tps = prompt.size() / prefill_s, decode_tps = n_decode > 0 ? n_decode / decode_s : 0.0;
  if (offload && offload->stats().steps > 0) {
    const OffloadStats& st = offload->stats();
    note(fmt::format("topkv: top-k decode: {:.1f} keys retrieved + {:.1f} exact per layer and KV head per step; "
                     "{:.2f} ms search, {:.2f} ms offloaded attention per step", (double)st.retrieved / st.steps /
                     offload->retrieval_layers().size() / cfg.n_head_kv, (double)st.exact / st.steps /
                     offload->retrieval_layers().size() / cfg.n_head_kv, st.search_s * 1e3 / st.steps,
                     st.attend_s * 1e3 / st.steps));
  }
  note(fmt::format("topkv: prompt {} tokens, prefill {:.2f} s ({:.1f} tok/s); generated {} tokens, decode {:.1f} "
                   "tok/s; stop: {}; peak RSS {}", n_prompt, prefill_s, prefill_tps, n_gen, decode_tps, stop,
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
                        {"prompt_tokens", n_prompt},
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
    if (pack) j["pack"] = {{"path", a.pack}, {"tokens", n_pack}, {"restore_s", offload->stats().build_s}};
    if (offload) {
      const OffloadStats& st = offload->stats();
      j["offload"] = {{"policy", nlohmann::json::parse(policy.to_json())},
                      {"retrieval_layers", offload->retrieval_layers()},
                      {"k_per_layer", offload->k_per_layer()},
                      {"keys_indexed", st.keys_indexed},
                      {pack ? "pack_restore_s" : "index_build_s", st.build_s},
                      {"host_bytes", offload->host_bytes()},
                      {"steps", st.steps},
                      {"retrieved_per_step", st.steps ? (double)st.retrieved / st.steps : 0.0},
                      {"exact_per_step", st.steps ? (double)st.exact / st.steps : 0.0},
                      {"search_ms_per_step", st.steps ? st.search_s * 1e3 / st.steps : 0.0},
                      {"attention_ms_per_step", st.steps ? st.attend_s * 1e3 / st.steps : 0.0}};
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
                  "Context size in tokens: prompt + generated (default: min(model's trained context, 4096); with "
                  "--pack, the pack's tokens + prompt + -n; beyond the trained context is allowed with a warning)");
  cmd->add_option("--pack", a->pack,
                  "Go on from a context pack (topkv index build) instead of prefilling: its document is the start "
                  "of the context, the prompt (-p/-f/stdin, optional) is appended; the pack fixes the index, "
                  "sinks, window, dense layers, store type and head pattern, --k and the other search options may "
                  "change")
      ->check(CLI::ExistingFile);
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
  cmd->add_option("--json", a->json_path,
                  "Write statistics here: prompt tokens, prefill and decode tok/s, peak RSS, memory");
  cmd->add_flag("-q,--quiet", a->quiet, "No progress bar or information on stderr (errors still go there)");
  auto pol = std::make_shared<PolicyArgs>();
  add_policy_options(cmd, pol);
  cmd->callback([a, pol, cmd] { run_generate(*a, *pol, *cmd); });
}

}  // namespace topkv::cli
