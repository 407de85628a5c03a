// Carrying an exception out of an OpenMP parallel region or a TBB task.
//
// An exception that leaves an OpenMP structured block ends the process in
// std::terminate (OpenMP 5.2, "Structured block": a throw must be caught in the
// same block by the same thread); TBB carries one, but only to where the
// parallel_for was called, cancelling the rest. So every body that can throw
// runs through ParallelErrors::run, which keeps the first exception (the
// remaining iterations skip their work), and the caller rethrows it after the
// region with rethrow():
//
//   ParallelErrors errors;
//   #pragma omp parallel for
//   for (int h = 0; h < n; ++h) errors.run([&] { work(h); });
//   errors.rethrow();
#pragma once
#include <atomic>
#include <exception>
#include <mutex>

namespace topkv {

class ParallelErrors {
 public:
  template <typename F>
  void run(F&& body) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      body();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      if (!first_) first_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  bool failed() const { return failed_.load(std::memory_order_relaxed); }
  // Throws the first exception caught, if any (call after the region).
  void rethrow() {
    if (first_) {
      std::exception_ptr e = first_;
      first_ = nullptr;
      failed_ = false;
      std::rethrow_exception(e);
    }
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mu_;
  std::exception_ptr first_;
};

}  // namespace topkv
