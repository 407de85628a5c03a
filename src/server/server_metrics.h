// Counters of `topkv serve` for GET /metrics, in Prometheus' text format
// (version 0.0.4): requests by HTTP status, prompt and generated tokens,
// prefill and decode speed, the queue, resident memory. Thread-safe.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

namespace topkv::server {

class ServerMetrics {
 public:
  void request_done(int status);
  // One decoded request: `prefilled` tokens in `prefill_s`, `decoded` model steps in `decode_s`.
  void generation(int64_t prompt_tokens, int64_t generated, int64_t prefilled, double prefill_s, int64_t decoded,
                  double decode_s);
  std::string text(int64_t queue_length, int running) const;

 private:
  mutable std::mutex mu_;
  std::map<int, uint64_t> by_status_;
  int64_t prompt_tokens_ = 0, generated_ = 0, prefilled_ = 0, decoded_ = 0;
  double prefill_s_ = 0, decode_s_ = 0;
};

size_t resident_memory_bytes();  // /proc/self/statm

}  // namespace topkv::server
