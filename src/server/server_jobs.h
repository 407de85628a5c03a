// The requests of `topkv serve` as jobs for its one worker thread, and the
// bounded queue between the HTTP threads and that worker (src/server/server.h).
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "offload/policy.h"
#include "src/server/server.h"

namespace topkv::server {

struct Job {
  bool chat = false;
  const NamedPack* pack = nullptr;
  OffloadPolicy policy;
  std::vector<int32_t> prompt;  // appended to the pack's context, or the whole context
  int64_t prompt_tokens = 0;    // the pack's included
  DecodeParams params;
  std::chrono::steady_clock::time_point deadline;
  std::atomic<bool> cancel{false};  // the client went away, or the deadline passed

  // Filled by the worker under `mu`; `cv` wakes the HTTP thread waiting on it.
  std::mutex mu;
  std::condition_variable cv;
  std::string text;  // generated so far
  bool done = false;
  std::string stop, error;
  int n_gen = 0;
  double first_token_s = 0;
};

// At most `capacity` jobs wait; pop blocks until one comes or close().
class JobQueue {
 public:
  explicit JobQueue(size_t capacity) : capacity_(capacity) {}
  bool try_push(std::shared_ptr<Job> job);  // false: full
  std::shared_ptr<Job> pop();               // null once closed
  void close();
  size_t waiting() const;

 private:
  size_t capacity_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> q_;
  bool closed_ = false;
};

}  // namespace topkv::server
