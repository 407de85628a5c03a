// topkv serve: the model behind an OpenAI-compatible HTTP API
// (src/server/server.h), with the generation flags of `topkv generate`.
#include <csignal>
#include <cstdio>
#include <filesystem>

#include "src/cli/cli_util.h"
#include "src/cli/commands.h"
#include "src/cli/policy_options.h"
#include "src/common/cli_files.h"
#include "src/common/error.h"
#include "src/common/progress.h"
#include "src/server/server.h"

namespace topkv::cli {
namespace {

struct ServeArgs {
  std::string model, weights = "quant", kv_type = "f32";
  BackendArgs where;
  std::vector<std::string> packs;
  server::ServerOptions opt;
  int64_t n_ctx = 0;
  bool seed_given = false, quiet = false;
};

server::Server* g_server = nullptr;  // SIGINT / SIGTERM stop it

void run_serve(ServeArgs& a, const PolicyArgs& pol, const CLI::App& cmd) {
  Progress::set_global_enabled(!a.quiet);
  TOPKV_CHECK(a.opt.queue >= 0, "--queue must be >= 0, got {}", a.opt.queue);
  TOPKV_CHECK(a.opt.chunk > 0, "--chunk must be positive, got {}", a.opt.chunk);
  TOPKV_CHECK(a.opt.port >= 0 && a.opt.port <= 65535, "--port must be 0..65535, got {}", a.opt.port);
  TOPKV_CHECK(a.opt.default_max_tokens >= 1 && a.opt.default_max_tokens <= a.opt.max_tokens_limit,
              "-n ({}) must be at least 1 and at most --max-tokens-limit ({})", a.opt.default_max_tokens,
              a.opt.max_tokens_limit);
  TOPKV_CHECK(a.opt.timeout_s >= 1, "--timeout must be at least 1 second");
  a.opt.fixed_seed = a.seed_given;  // else a random seed per request
  Sampler check_sampling(a.opt.sampling);
  const OffloadPolicy policy = pol.resolve(cmd);
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  Session session(file, session_options(a.where, !a.quiet));
  const Tokenizer& tok = session.tokenizer();
  const ModelConfig& cfg = session.config();

  // The named contexts, each checked against the model.
  std::vector<server::NamedPack> packs;
  int64_t longest_pack = 0;
  for (const std::string& spec : a.packs) {
    const size_t eq = spec.find('=');
    TOPKV_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < spec.size(), "--pack takes name=path, got '{}'", spec);
    server::NamedPack p;
    p.name = spec.substr(0, eq), p.path = spec.substr(eq + 1);
    for (const server::NamedPack& q : packs)
      TOPKV_CHECK(q.name != p.name, "--pack names '{}' twice", p.name);
    p.pack = std::make_unique<ContextPack>(p.path);
    p.pack->check_model(*file);
    p.tokens = p.pack->tokens();
    p.text = tok.decode(p.tokens);
    longest_pack = std::max(longest_pack, p.pack->n_tokens());
    packs.push_back(std::move(p));
  }
  const int64_t n_ctx = a.n_ctx > 0 ? a.n_ctx
                                    : std::max<int64_t>(std::min<int64_t>(cfg.n_ctx_train, 4096),
                                                        longest_pack + a.opt.max_tokens_limit);
  TOPKV_CHECK(longest_pack < n_ctx, "a context pack holds {} tokens, the context size is {}: raise -c", longest_pack,
              n_ctx);
  ModelOptions mo;
  mo.n_ctx = n_ctx;
  mo.max_chunk = a.opt.chunk;
  mo.kv_dtype = parse_dtype(a.kv_type);
  TOPKV_CHECK(mo.kv_dtype != DType::BF16, "--kv-type must be f32 or f16");
  mo.weights = parse_weight_mode(a.weights);
  check_weight_mode(mo.weights, session.cuda());
  // Every layer keeps its cache: a request without a pack prefills densely
  // into the same model (src/session/session.h, attach_runtime).
  check_memory_plan(*file, cfg, policy, mo, /*from_pack=*/false, a.quiet);
  session.load(mo);
  a.opt.model_name = std::filesystem::path(path).filename().string();
  a.opt.verbose = !a.quiet;
  server::Server srv(session, policy, std::move(packs), n_ctx, a.opt);
  const int port = srv.bind();
  fmt::print(stderr, "topkv serve: {} ({}), context {} tokens, on http://{}:{}/v1 (POST /v1/completions, "
             "/v1/chat/completions; GET /v1/models, /health, /metrics)\n", a.opt.model_name, session.backend().name(),
             n_ctx, a.opt.host, port);
  std::fflush(stderr);
  g_server = &srv;
  std::signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error on the socket, not a signal
  std::signal(SIGINT, [](int) { if (g_server) g_server->stop(); });
  std::signal(SIGTERM, [](int) { if (g_server) g_server->stop(); });
  srv.listen();
  g_server = nullptr;
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  auto* cmd = app.add_subcommand("serve", "Serve a GGUF model over an OpenAI-compatible HTTP API (completions, chat "
                                 "completions, streaming), with named context packs");
  cmd->add_option("-m,--model", a->model,
                  fmt::format("GGUF model file (default: {}, installed by scripts/fetch-model.sh)", kDefaultModel));
  cmd->add_option("--host", a->opt.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->opt.port, "Port to listen on (0: any free port; the line on stderr says which)")
      ->capture_default_str();
  cmd->add_option("--pack", a->packs, "A named context: name=path of a context pack (topkv index build), loaded and "
                  "verified at start; repeatable. A request names it with \"topkv_context\": \"name\", or its "
                  "completion prompt starts with the pack's text");
  cmd->add_option("-c,--ctx", a->n_ctx, "Context size in tokens, prompt and reply (default: min(model's trained "
                  "context, 4096), or the largest pack + --max-tokens-limit when larger)");
  cmd->add_option("-n,--n-predict", a->opt.default_max_tokens, "max_tokens of a request that does not say")
      ->capture_default_str();
  cmd->add_option("--max-tokens-limit", a->opt.max_tokens_limit, "Largest max_tokens a request may ask for")
      ->capture_default_str();
  cmd->add_option("--queue", a->opt.queue, "Requests that may wait while one decodes; more are answered 429 with "
                  "Retry-After")->capture_default_str();
  cmd->add_option("--max-body", a->opt.max_body, "Largest request body in bytes (413 beyond)")->capture_default_str();
  cmd->add_option("--timeout", a->opt.timeout_s, "Seconds a request may take in all (its decode is then stopped), "
                  "and the socket read/write timeout")->capture_default_str();
  cmd->add_option("--http-threads", a->opt.threads, "HTTP worker threads (0: --queue + 4, at least 8)");
  cmd->add_option("--chunk", a->opt.chunk, "Prompt tokens per prefill step")->capture_default_str();
  cmd->add_option("--temp", a->opt.sampling.temperature, "Default sampling temperature; 0 = greedy")
      ->capture_default_str();
  cmd->add_option("--top-k", a->opt.sampling.top_k, "Default top-k; 0 = all")->capture_default_str();
  cmd->add_option("--top-p", a->opt.sampling.top_p, "Default top-p; 1 = off")->capture_default_str();
  cmd->add_option_function<uint64_t>("--seed", [a](uint64_t s) { a->opt.sampling.seed = s, a->seed_given = true; },
                                     "Default seed (default: random per request; a request's \"seed\" wins)")
      ->check(seed_value());
  add_backend_options(cmd, a->where, "");
  cmd->add_option("--weights", a->weights, "quant, f32 (CPU) or f16 (CUDA), as generate takes it")
      ->check(CLI::IsMember({"quant", "f16", "f32"}))
      ->capture_default_str();
  cmd->add_option("--kv-type", a->kv_type, "KV cache element type: f32 or f16")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", a->quiet, "No progress, plan or per-request lines on stderr (errors still go there)");
  auto pol = std::make_shared<PolicyArgs>();
  add_policy_options(cmd, pol);
  cmd->callback([a, pol, cmd] { run_serve(*a, *pol, *cmd); });
}

}  // namespace topkv::cli
