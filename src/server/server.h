// `topkv serve`: one model behind an OpenAI-compatible HTTP API
// (cpp-httplib). Routes: POST /v1/completions, POST /v1/chat/completions
// (plain, or "stream": true as server-sent events `data: {...}\n\n` ending
// `data: [DONE]`), GET /v1/models, GET /health, GET /metrics (Prometheus text).
//
// One sequence decodes at a time (one worker thread owns the session); the
// requests waiting for it form a bounded queue, and a request that finds it
// full is answered 429 with Retry-After. A streamed request whose client goes
// away is cancelled (the decode stops at its next step) and the worker takes
// the next one. Bad input is answered 4xx with an OpenAI-style error body
// (src/server/openai_api.h); an error while decoding answers 500; the server
// goes on either way.
//
// Named contexts: context packs loaded at start (--pack name=path). A request
// names one ("topkv_context": "name"), or its completion prompt starts with a
// pack's text and reuses it; the prompt (or the rest of it) is appended to the
// pack's context. Per request, "topkv_k" and "topkv_index" change the
// attention policy within what the pack allows (ContextPack::policy_for_run).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "offload/context_pack.h"
#include "offload/policy.h"
#include "src/model/sampler.h"
#include "src/session/session.h"

namespace topkv::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;               // 0: any free port (bound_port() says which)
  std::string model_name;        // what /v1/models lists
  int queue = 8;                 // requests waiting at most (beside the one decoding)
  size_t max_body = 1 << 20;     // request body bytes at most (413 beyond)
  int default_max_tokens = 128;  // a request without max_tokens
  int max_tokens_limit = 4096;   // a request asking for more is refused
  int chunk = 256;               // prefill chunk
  int timeout_s = 600;           // socket read/write and each request's whole run
  int threads = 0;               // HTTP threads (0: queue + 4, at least 8)
  bool verbose = true;           // one line per request on stderr
  SamplerParams sampling;        // defaults a request may change (temperature, top_k, top_p, seed)
  bool fixed_seed = false;       // sampling.seed holds for every request without a seed (else a random one each)
};

struct NamedPack {
  std::string name, path;
  std::unique_ptr<ContextPack> pack;
  std::vector<int32_t> tokens;  // the pack's context
  std::string text;             // its tokens decoded (prompt-prefix reuse)
};

class Server {
 public:
  // `session` holds the loaded model (Session::load) with a context of
  // `n_ctx` tokens; `policy` is the attention of requests without a pack.
  Server(Session& session, const OffloadPolicy& policy, std::vector<NamedPack> packs, int64_t n_ctx,
         const ServerOptions& opt);
  ~Server();
  // Binds (Error when it cannot) and returns the port.
  int bind();
  // Serves until stop(); starts the worker.
  void listen();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace topkv::server
