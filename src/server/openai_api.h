// The OpenAI-compatible request and response bodies of `topkv serve`
// (src/server/server.h): POST /v1/completions and /v1/chat/completions, plain
// or streamed as server-sent events. Field names and shapes follow the
// OpenAI API reference (Completions, Chat Completions); topkv adds
//   "topkv_context": "name"   go on from the context pack loaded as `name`
//                             (--pack name=path); the prompt is appended to it
//   "topkv_k": n              top-k: keys attended per layer and KV head
//   "topkv_index": "spec"     top-k from a pack: one of the indexes built into it
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "src/model/tokenizer.h"

namespace topkv::server {

// A request the server refuses: HTTP status and an OpenAI-style error body.
struct ApiError {
  int status = 400;
  std::string message, type = "invalid_request_error", param, code;
  nlohmann::json body() const;
};

// What a request asks for, its JSON checked (types, ranges); the prompt is
// not yet tokenized.
struct ParsedRequest {
  bool chat = false, stream = false;
  std::string prompt;               // completions
  std::vector<ChatTurn> messages;   // chat
  std::optional<int> max_tokens;
  std::optional<float> temperature, top_p;  // absent: the server's defaults
  std::optional<int> top_k;
  std::optional<uint64_t> seed;
  std::string context;              // topkv_context
  std::optional<int64_t> k;         // topkv_k
  std::string index;                // topkv_index
  bool include_usage = false;       // stream_options.include_usage
};
// Parses a body; throws ApiError (never anything else) on bad input.
ParsedRequest parse_request(const std::string& body, bool chat);

// OpenAI's finish_reason for a decode's stop (src/session/session.h).
std::string finish_reason(const std::string& stop);

// Response bodies. `id`: "cmpl-…" / "chatcmpl-…"; `created`: unix seconds.
nlohmann::json completion_body(bool chat, const std::string& id, int64_t created, const std::string& model,
                               const std::string& text, const std::string& finish, int64_t prompt_tokens,
                               int64_t completion_tokens);
// One streamed chunk: `text` (or, for chat, `role_only` the first chunk with
// the assistant role), `finish` empty until the last.
nlohmann::json stream_chunk(bool chat, const std::string& id, int64_t created, const std::string& model,
                            const std::string& text, const std::string& finish, bool role_only = false);
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);

// A body as text. Bytes that are not UTF-8 (generated text cut inside a
// character, or an error message quoting the request's bad bytes) become
// U+FFFD instead of throwing, as a strict dump would.
std::string json_text(const nlohmann::json& j);

}  // namespace topkv::server
