#include "src/server/server.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <random>
#include <thread>

#include "index/kv_index.h"
#include "src/common/error.h"
#include "src/server/client_socket.h"
#include "src/server/openai_api.h"
#include "src/server/server_jobs.h"
#include "src/server/server_metrics.h"

namespace topkv::server {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Server::Impl {
  Session& session;
  OffloadPolicy policy;
  std::vector<NamedPack> packs;
  int64_t n_ctx;
  ServerOptions opt;
  httplib::Server http;
  JobQueue queue;
  ServerMetrics metrics;
  std::atomic<int> running{0};
  std::atomic<uint64_t> next_id{1};
  std::thread worker;
  int port = -1;

  Impl(Session& s, const OffloadPolicy& p, std::vector<NamedPack> pk, int64_t n, const ServerOptions& o)
      : session(s), policy(p), packs(std::move(pk)), n_ctx(n), opt(o), queue((size_t)std::max(0, o.queue)) {}

  void reply_error(httplib::Response& res, const ApiError& e) {
    res.status = e.status;
    if (e.status == 429 || e.status == 503) res.set_header("Retry-After", "1");
    res.set_content(json_text(e.body()), "application/json");
  }

  // The job a parsed request asks for; ApiError on anything the server cannot do.
  std::shared_ptr<Job> make_job(const ParsedRequest& r) {
    const Tokenizer& tok = session.tokenizer();
    auto job = std::make_shared<Job>();
    job->chat = r.chat;
    std::string rest = r.prompt;
    if (!r.context.empty()) {
      for (const NamedPack& p : packs)
        if (p.name == r.context) job->pack = &p;
      if (!job->pack) {
        std::string names;
        for (const NamedPack& p : packs) names += (names.empty() ? "" : ", ") + p.name;
        throw ApiError{404, fmt::format("unknown context '{}'; this server holds: {}", r.context,
                                        names.empty() ? "none (start it with --pack name=path)" : names),
                       "invalid_request_error", "topkv_context", "context_not_found"};
      }
      if (!r.chat && rest.compare(0, job->pack->text.size(), job->pack->text) == 0)
        rest = rest.substr(job->pack->text.size());  // the prompt repeats the pack's text: not twice
    } else if (!r.chat) {  // a prompt that starts with a pack's text goes on from that pack
      for (const NamedPack& p : packs)
        if (!p.text.empty() && r.prompt.compare(0, p.text.size(), p.text) == 0 &&
            (!job->pack || p.text.size() > job->pack->text.size()))
          job->pack = &p;
      if (job->pack) rest = r.prompt.substr(job->pack->text.size());
    }
    try {
      if (r.chat) {
        job->prompt = tok.encode_chat_turns(r.messages);
        if (job->pack && !job->prompt.empty() && job->prompt.front() == tok.bos())
          job->prompt.erase(job->prompt.begin());  // the pack's context opened the sequence
      } else {
        job->prompt = job->pack ? (rest.empty() ? std::vector<int32_t>{} : tok.encode(rest, false, false))
                                : tok.encode(rest, tok.add_bos_default(), /*parse_special=*/false);
      }
    } catch (const Error& e) {
      throw ApiError{400, e.what(), "invalid_request_error", r.chat ? "messages" : "prompt", "invalid_prompt"};
    }
    if (!job->pack && job->prompt.empty())
      throw ApiError{400, "the prompt encodes to no tokens", "invalid_request_error", "prompt", "empty_prompt"};
    const int64_t n_pack = job->pack ? job->pack->pack->n_tokens() : 0;
    job->prompt_tokens = n_pack + (int64_t)job->prompt.size();
    if (job->prompt_tokens >= n_ctx)
      throw ApiError{400, fmt::format("the prompt has {} tokens{}; this server's context holds {} (prompt and "
                                      "reply): shorten it, or restart the server with a larger -c",
                                      job->prompt_tokens, n_pack ? fmt::format(" ({} from the context pack)", n_pack) : "",
                                      n_ctx),
                     "invalid_request_error", r.chat ? "messages" : "prompt", "context_length_exceeded"};
    // The attention policy: the server's, or the pack's within what it allows.
    OffloadPolicy p = job->pack ? job->pack->pack->policy() : policy;
    if (r.k || !r.index.empty()) {
      if (p.attn != AttnMode::TopK)
        throw ApiError{400, "topkv_k and topkv_index apply to top-k attention; this context decodes densely",
                       "invalid_request_error", r.k ? "topkv_k" : "topkv_index", "unsupported"};
      if (r.k) p.search.k = *r.k, p.k_fraction = 0;
      if (!r.index.empty()) p.index = r.index;
    }
    try {
      if (job->pack) p = job->pack->pack->policy_for_run(p);
      else if (!r.index.empty()) KvIndex::create(p.index);  // an unknown backend or parameter
    } catch (const Error& e) {
      throw ApiError{400, e.what(), "invalid_request_error", r.index.empty() ? "topkv_k" : "topkv_index",
                     "invalid_policy"};
    }
    job->policy = p;
    const int max_tokens = r.max_tokens.value_or(opt.default_max_tokens);
    if (max_tokens > opt.max_tokens_limit)
      throw ApiError{400, fmt::format("max_tokens {} is over this server's limit {} (--max-tokens-limit)",
                                      max_tokens, opt.max_tokens_limit),
                     "invalid_request_error", "max_tokens", "max_tokens_exceeded"};
    SamplerParams sp = opt.sampling;
    if (r.temperature) sp.temperature = *r.temperature;
    if (r.top_p) sp.top_p = *r.top_p;
    if (r.top_k) sp.top_k = *r.top_k;
    if (r.seed) sp.seed = *r.seed;
    else if (!opt.fixed_seed) sp.seed = std::random_device{}();
    try {
      Sampler check(sp);
    } catch (const Error& e) {
      throw ApiError{400, e.what(), "invalid_request_error", "temperature", "invalid_sampling"};
    }
    job->params.sampling = sp, job->params.n_predict = max_tokens, job->params.n_ctx = n_ctx;
    job->deadline = Clock::now() + std::chrono::seconds(opt.timeout_s);
    return job;
  }

  void run(Job& job) {
    if (job.cancel) {
      std::lock_guard lk(job.mu);
      job.done = true, job.stop = "cancelled";
      job.cv.notify_all();
      return;
    }
    ++running;
    try {
      Timer since;
      std::vector<float> logits = session.start(job.policy, job.pack ? job.pack->pack.get() : nullptr, job.prompt,
                                                opt.chunk, /*release_kv=*/false, &job.cancel);
      const double prefill_s = since.seconds();
      StreamDecoder out(session.tokenizer());
      const DecodeResult d = session.decode(std::move(logits), job.params, since, [&](int32_t id) {
        const std::string piece = out.push(id);
        if (Clock::now() > job.deadline) job.cancel = true;
        if (piece.empty()) return;
        std::lock_guard lk(job.mu);
        job.text += piece;
        job.cv.notify_all();
      }, &job.cancel);
      metrics.generation(job.prompt_tokens, d.n_gen, (int64_t)job.prompt.size() + (job.pack ? job.pack->pack->n_tokens() : 0),
                         prefill_s, d.n_decode, d.decode_s);
      if (opt.verbose)
        fmt::print(stderr, "topkv serve: {} prompt tokens{}, first token after {:.3f} s, {} tokens at {:.1f} tok/s, "
                   "stop: {}\n", job.prompt_tokens, job.pack ? " (context " + job.pack->name + ")" : "",
                   d.first_token_s, d.n_gen, d.decode_tps(), d.stop);
      std::lock_guard lk(job.mu);
      job.text += out.flush();
      job.stop = d.stop, job.n_gen = d.n_gen, job.first_token_s = d.first_token_s, job.done = true;
    } catch (const std::exception& e) {
      if (opt.verbose) fmt::print(stderr, "topkv serve: request failed: {}\n", e.what());
      std::lock_guard lk(job.mu);
      job.error = e.what(), job.done = true;
    }
    --running;
    job.cv.notify_all();
  }

  void worker_loop() {
    while (std::shared_ptr<Job> job = queue.pop()) run(*job);
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat) {
    std::shared_ptr<Job> job;
    ParsedRequest r;
    try {
      r = parse_request(req.body, chat);
      job = make_job(r);
      if (!queue.try_push(job))
        throw ApiError{429, fmt::format("the server is busy: {} requests are waiting (--queue); retry after a "
                                        "second", queue.waiting()), "rate_limit_error", "", "queue_full"};
    } catch (const ApiError& e) {
      return reply_error(res, e);
    }
    const std::string id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", next_id++);
    const int64_t created = (int64_t)std::time(nullptr);
    const std::string model = opt.model_name;
    if (!r.stream) {
      // Waits for the answer; a client that leaves meanwhile (its side of the
      // connection closed) or the deadline stops the decode at its next step.
      const int fd = find_connection(port, req.remote_addr, req.remote_port);
      std::unique_lock lk(job->mu);
      while (!job->cv.wait_for(lk, std::chrono::milliseconds(10), [&] { return job->done; }))
        if (Clock::now() > job->deadline + std::chrono::seconds(5) || (fd >= 0 && peer_closed(fd))) job->cancel = true;
      if (!job->error.empty())
        return reply_error(res, ApiError{500, "generation failed: " + job->error, "server_error", "", "internal"});
      res.set_content(json_text(completion_body(chat, id, created, model, job->text, finish_reason(job->stop),
                                                job->prompt_tokens, job->n_gen)),
                      "application/json");
      return;
    }
    auto sent = std::make_shared<size_t>(0);
    auto opened = std::make_shared<bool>(!chat);
    const bool usage = r.include_usage;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [job, sent, opened, chat, id, created, model, usage](size_t, httplib::DataSink& sink) -> bool {
          const auto event = [&](const json& j) {
            const std::string s = "data: " + json_text(j) + "\n\n";
            return sink.write(s.data(), s.size());
          };
          if (!*opened) {
            *opened = true;
            if (!event(stream_chunk(chat, id, created, model, "", "", /*role_only=*/true))) return job->cancel = true, false;
          }
          std::unique_lock lk(job->mu);
          job->cv.wait_for(lk, std::chrono::milliseconds(200), [&] { return job->done || job->text.size() > *sent; });
          const std::string piece = job->text.substr(*sent);
          *sent = job->text.size();
          const bool done = job->done;
          const std::string stop = job->stop, error = job->error;
          const int64_t prompt_tokens = job->prompt_tokens, n_gen = job->n_gen;
          lk.unlock();
          if (Clock::now() > job->deadline) job->cancel = true;
          if (!piece.empty() && !event(stream_chunk(chat, id, created, model, piece, "")))
            return job->cancel = true, false;  // the client went away: stop decoding
          if (!sink.is_writable()) return job->cancel = true, false;
          if (!done) return true;
          if (!error.empty()) {
            event(ApiError{500, "generation failed: " + error, "server_error", "", "internal"}.body());
          } else {
            event(stream_chunk(chat, id, created, model, "", finish_reason(stop)));
            if (usage) {
              json u = stream_chunk(chat, id, created, model, "", "");
              u["choices"] = json::array();
              u["usage"] = usage_json(prompt_tokens, n_gen);
              event(u);
            }
          }
          const std::string end = "data: [DONE]\n\n";
          sink.write(end.data(), end.size());
          sink.done();
          return true;
        },
        [job](bool success) {
          if (!success) job->cancel = true;
        });
  }

  void routes() {
    http.Post("/v1/completions", [this](const httplib::Request& q, httplib::Response& s) { completions(q, s, false); });
    http.Post("/v1/chat/completions", [this](const httplib::Request& q, httplib::Response& s) { completions(q, s, true); });
    http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& s) {
      json m = {{"id", opt.model_name}, {"object", "model"}, {"created", 0}, {"owned_by", "topkv"}};
      json contexts = json::array();
      for (const NamedPack& p : packs) contexts.push_back({{"name", p.name}, {"tokens", p.pack->n_tokens()}});
      m["topkv_contexts"] = contexts;
      s.set_content(json_text(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    http.Get("/health", [](const httplib::Request&, httplib::Response& s) {
      s.set_content(R"({"status":"ok"})", "application/json");
    });
    http.Get("/metrics", [this](const httplib::Request&, httplib::Response& s) {
      s.set_content(metrics.text((int64_t)queue.waiting(), running.load()), "text/plain; version=0.0.4");
    });
    http.set_exception_handler([](const httplib::Request&, httplib::Response& s, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      s.status = 500;
      s.set_content(json_text(ApiError{500, what, "server_error", "", "internal"}.body()), "application/json");
    });
    http.set_error_handler([](const httplib::Request& q, httplib::Response& s) {
      if (!s.body.empty()) return;
      const std::string message = s.status == 404   ? fmt::format("no route {} {}", q.method, q.path)
                                  : s.status == 413 ? "the request body is over this server's limit (--max-body)"
                                                    : fmt::format("HTTP {}", s.status);
      s.set_content(json_text(ApiError{s.status, message, "invalid_request_error", "", ""}.body()), "application/json");
    });
    http.set_logger([this](const httplib::Request&, const httplib::Response& s) { metrics.request_done(s.status); });
  }
};

Server::Server(Session& session, const OffloadPolicy& policy, std::vector<NamedPack> packs, int64_t n_ctx,
               const ServerOptions& opt)
    : impl_(std::make_unique<Impl>(session, policy, std::move(packs), n_ctx, opt)) {
  Impl& s = *impl_;
  const int threads = opt.threads > 0 ? opt.threads : std::max(8, opt.queue + 4);
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool((size_t)threads); };
  s.http.set_payload_max_length(opt.max_body);
  s.http.set_read_timeout(opt.timeout_s, 0);
  s.http.set_write_timeout(opt.timeout_s, 0);
  // No response compression. Debian's cpp-httplib compresses JSON with brotli
  // whenever a client accepts it, and the openai client (httpx) cannot decode
  // it with Debian's python3-brotli 1.0.9 (a TypeError in every call); the
  // bodies are small and mostly on loopback, so nothing is lost. httplib reads
  // Accept-Encoding from the request it owns (not a const object) when it
  // writes the response.
  s.http.set_pre_routing_handler([](const httplib::Request& req, httplib::Response&) {
    const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
    return httplib::Server::HandlerResponse::Unhandled;
  });
  s.routes();
}

Server::~Server() {
  stop();
  if (impl_->worker.joinable()) impl_->worker.join();
}

int Server::bind() {
  Impl& s = *impl_;
  s.port = s.opt.port == 0 ? s.http.bind_to_any_port(s.opt.host) : (s.http.bind_to_port(s.opt.host, s.opt.port) ? s.opt.port : -1);
  TOPKV_CHECK(s.port > 0, "cannot listen on {}:{} (in use, or not an address of this machine); pick another --host "
              "or --port (0: any free port)", s.opt.host, s.opt.port);
  widen_listen_backlog(s.port);
  return s.port;
}

void Server::listen() {
  Impl& s = *impl_;
  s.worker = std::thread([&s] { s.worker_loop(); });
  s.http.listen_after_bind();
}

void Server::stop() {
  impl_->queue.close();
  impl_->http.stop();
}

}  // namespace topkv::server
