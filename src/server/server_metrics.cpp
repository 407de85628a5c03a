#include "src/server/server_metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

namespace topkv::server {

void ServerMetrics::request_done(int status) {
  std::lock_guard lk(mu_);
  ++by_status_[status];
}

void ServerMetrics::generation(int64_t prompt_tokens, int64_t generated, int64_t prefilled, double prefill_s,
                               int64_t decoded, double decode_s) {
  std::lock_guard lk(mu_);
  prompt_tokens_ += prompt_tokens, generated_ += generated;
  prefilled_ += prefilled, prefill_s_ += prefill_s, decoded_ += decoded, decode_s_ += decode_s;
}

std::string ServerMetrics::text(int64_t queue_length, int running) const {
  std::lock_guard lk(mu_);
  std::string s;
  const auto metric = [&s](const char* name, const char* type, const char* help) {
    s += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  };
  metric("topkv_requests_total", "counter", "HTTP requests answered, by status code");
  for (auto [status, n] : by_status_) s += fmt::format("topkv_requests_total{{status=\"{}\"}} {}\n", status, n);
  metric("topkv_prompt_tokens_total", "counter", "Prompt tokens of decoded requests, a context pack's included");
  s += fmt::format("topkv_prompt_tokens_total {}\n", prompt_tokens_);
  metric("topkv_generated_tokens_total", "counter", "Tokens generated");
  s += fmt::format("topkv_generated_tokens_total {}\n", generated_);
  metric("topkv_prefill_tokens_per_second", "gauge", "Prefilled tokens per second of prefill (pack restores included), over all requests");
  s += fmt::format("topkv_prefill_tokens_per_second {:.3f}\n", prefill_s_ > 0 ? prefilled_ / prefill_s_ : 0.0);
  metric("topkv_decode_tokens_per_second", "gauge", "Decode steps per second of decoding, over all requests");
  s += fmt::format("topkv_decode_tokens_per_second {:.3f}\n", decode_s_ > 0 ? decoded_ / decode_s_ : 0.0);
  metric("topkv_queue_length", "gauge", "Requests waiting for the model");
  s += fmt::format("topkv_queue_length {}\n", queue_length);
  metric("topkv_requests_running", "gauge", "Requests decoding now (0 or 1)");
  s += fmt::format("topkv_requests_running {}\n", running);
  metric("topkv_resident_memory_bytes", "gauge", "Resident memory of the server process");
  s += fmt::format("topkv_resident_memory_bytes {}\n", resident_memory_bytes());
  return s;
}

size_t resident_memory_bytes() {
  std::ifstream in("/proc/self/statm");
  size_t pages_total = 0, pages_resident = 0;
  in >> pages_total >> pages_resident;
  return pages_resident * (size_t)sysconf(_SC_PAGESIZE);
}

}  // namespace topkv::server
