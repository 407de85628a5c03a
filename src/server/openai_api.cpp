#include "src/server/openai_api.h"

#include <fmt/format.h>

namespace topkv::server {

namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message, const std::string& code = "") {
  throw ApiError{400, message, "invalid_request_error", param, code};
}

// j[key] when present and not null, checked to be of the kind `want` names.
const json* field(const json& j, const char* key, json::value_t want, const char* kind) {
  const auto it = j.find(key);
  if (it == j.end() || it->is_null()) return nullptr;
  const bool ok = want == json::value_t::number_float ? it->is_number()
                  : want == json::value_t::number_integer ? it->is_number_integer()
                                                         : it->type() == want;
  if (!ok) bad(key, fmt::format("'{}' must be {}, got {}", key, kind, it->type_name()), "invalid_type");
  return &*it;
}

double number(const json& j, const char* key, double lo, double hi, double dflt) {
  const json* v = field(j, key, json::value_t::number_float, "a number");
  if (!v) return dflt;
  const double x = v->get<double>();
  if (!(x >= lo && x <= hi)) bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x), "out_of_range");
  return x;
}

int64_t integer(const json& j, const char* key, int64_t lo, int64_t hi) {
  const json* v = field(j, key, json::value_t::number_integer, "an integer");
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > (uint64_t)INT64_MAX ? INT64_MAX : v->get<int64_t>();
  if (x < lo || x > hi) bad(key, fmt::format("'{}' must be in [{}, {}], got {}", key, lo, hi, x), "out_of_range");
  return x;
}

}  // namespace

json ApiError::body() const {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

ParsedRequest parse_request(const std::string& body, bool chat) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number past a double (4e4444)
    bad("", fmt::format("the body is not valid JSON: {}", e.what()), "invalid_json");
  }
  if (!j.is_object()) bad("", "the body must be a JSON object", "invalid_json");
  ParsedRequest r;
  r.chat = chat;
  if (chat) {
    const json* m = field(j, "messages", json::value_t::array, "an array of messages");
    if (!m || m->empty()) bad("messages", "'messages' must be a non-empty array", "missing_messages");
    for (const json& e : *m) {
      if (!e.is_object()) bad("messages", "each message must be an object with 'role' and 'content'");
      const json* role = field(e, "role", json::value_t::string, "a string");
      const json* content = field(e, "content", json::value_t::string, "a string");
      if (!role || !content) bad("messages", "each message needs a string 'role' and a string 'content'");
      const std::string rs = role->get<std::string>();
      if (rs != "system" && rs != "user" && rs != "assistant")
        bad("messages", fmt::format("unknown role '{}': use system, user or assistant", rs), "invalid_role");
      r.messages.push_back({rs, content->get<std::string>()});
    }
  } else {
    const auto it = j.find("prompt");
    if (it == j.end() || it->is_null()) bad("prompt", "'prompt' is required", "missing_prompt");
    if (it->is_array() && it->size() == 1 && (*it)[0].is_string()) {
      r.prompt = (*it)[0].get<std::string>();
    } else if (it->is_string()) {
      r.prompt = it->get<std::string>();
    } else {
      bad("prompt", "'prompt' must be a string (or an array of one string)", "invalid_type");
    }
  }
  if (const json* s = field(j, "stream", json::value_t::boolean, "a boolean")) r.stream = s->get<bool>();
  if (const json* so = field(j, "stream_options", json::value_t::object, "an object"))
    if (const json* u = field(*so, "include_usage", json::value_t::boolean, "a boolean")) r.include_usage = u->get<bool>();
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (field(j, key, json::value_t::number_integer, "an integer")) r.max_tokens = (int)integer(j, key, 0, 1 << 30);
  if (field(j, "temperature", json::value_t::number_float, "a number"))
    r.temperature = (float)number(j, "temperature", 0.0, 2.0, 0.0);
  if (field(j, "top_p", json::value_t::number_float, "a number")) {
    r.top_p = (float)number(j, "top_p", 0.0, 1.0, 1.0);
    if (*r.top_p <= 0.f) bad("top_p", "'top_p' must be above 0", "out_of_range");
  }
  if (field(j, "top_k", json::value_t::number_integer, "an integer")) r.top_k = (int)integer(j, "top_k", 0, 1 << 30);
  if (field(j, "seed", json::value_t::number_integer, "an integer")) r.seed = (uint64_t)integer(j, "seed", 0, INT64_MAX);
  if (const json* n = field(j, "n", json::value_t::number_integer, "an integer"); n && n->get<int64_t>() != 1)
    bad("n", "only n = 1 is supported (one sequence decodes at a time)", "unsupported");
  if (const json* c = field(j, "topkv_context", json::value_t::string, "a string")) r.context = c->get<std::string>();
  if (field(j, "topkv_k", json::value_t::number_integer, "an integer")) r.k = integer(j, "topkv_k", 1, INT64_MAX);
  if (const json* x = field(j, "topkv_index", json::value_t::string, "a string")) r.index = x->get<std::string>();
  field(j, "model", json::value_t::string, "a string");  // any name: the server holds one model
  return r;
}

std::string finish_reason(const std::string& stop) { return stop == "eog" ? "stop" : "length"; }

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

json completion_body(bool chat, const std::string& id, int64_t created, const std::string& model,
                     const std::string& text, const std::string& finish, int64_t prompt_tokens,
                     int64_t completion_tokens) {
  json choice = chat ? json{{"index", 0}, {"message", {{"role", "assistant"}, {"content", text}}},
                            {"logprobs", nullptr}, {"finish_reason", finish}}
                     : json{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}};
  return {{"id", id},
          {"object", chat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", usage_json(prompt_tokens, completion_tokens)}};
}

json stream_chunk(bool chat, const std::string& id, int64_t created, const std::string& model,
                  const std::string& text, const std::string& finish, bool role_only) {
  const json fin = finish.empty() ? json(nullptr) : json(finish);
  json choice;
  if (chat) {
    json delta = json::object();
    if (role_only) delta["role"] = "assistant";
    else if (!text.empty()) delta["content"] = text;
    choice = {{"index", 0}, {"delta", delta}, {"logprobs", nullptr}, {"finish_reason", fin}};
  } else {
    choice = {{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", fin}};
  }
  return {{"id", id},
          {"object", chat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})}};
}

std::string json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace topkv::server
