// A progress bar on stderr for long work (prefill, index build, benchmarks).
// Redraws at most 10 times a second; on a non-terminal it prints a line every
// 10% instead, so logs stay readable. Thread-safe `add`.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace topkv {

class Progress {
 public:
  // `unit` names what is counted ("keys", "tokens"); a rate is shown per second.
  Progress(std::string label, int64_t total, std::string unit = "", bool enabled = true);
  ~Progress();
  void add(int64_t n = 1);
  void set(int64_t done);
  void finish();  // draws the final state and a newline (idempotent)
  static void set_global_enabled(bool on);  // --quiet turns every bar off

 private:
  void draw(bool force);
  std::string label_, unit_;
  int64_t total_;
  std::atomic<int64_t> done_{0};
  bool enabled_, tty_;
  std::atomic<bool> finished_{false};
  int last_decile_ = -1;
  int64_t last_printed_ = -1;
  std::chrono::steady_clock::time_point start_, last_draw_;
  std::mutex mu_;
};

}  // namespace topkv
