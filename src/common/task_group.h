// TaskGroup: tasks run on other threads while the caller goes on (the index
// build overlapped with the prefill), then waited for; parallel_for_blocks:
// a loop over blocks of a range on `threads` threads (hnswlib's parallel
// inserts). oneTBB's task_group and parallel_for in an arena, except under
// ThreadSanitizer, where the tasks and the loop's workers are std::threads.
//
// Why: Debian's libtbb is not instrumented, so TSan cannot see the orderings
// task_group::run and wait provide (everything before run() happens before
// the task; the task happens before wait() returns). It reports the task's
// first reads of what the caller wrote, and libtbb's reuse of a finished
// task's memory, as races. std::thread's start and join give the same two
// orderings, and TSan sees them; so under TSan the group checks our use of
// those guarantees (what the tasks share with the caller and each other),
// not libtbb. Annotating the hand-offs instead (__tsan_release/acquire) left
// libtbb's own accesses to recycled task objects unordered.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define TOPKV_TASKS_ON_THREADS 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TOPKV_TASKS_ON_THREADS 1
#endif
#endif

#include <algorithm>
#include <cstdint>

#ifdef TOPKV_TASKS_ON_THREADS
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>
#else
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <tbb/task_group.h>
#endif

namespace topkv {

class TaskGroup {
 public:
  TaskGroup() = default;
  TaskGroup(const TaskGroup&) = delete;
  TaskGroup& operator=(const TaskGroup&) = delete;
  ~TaskGroup() { wait(); }

  // How many threads a group's tasks can run on at once (TBB's arena: every
  // core, whatever a caller's own thread share is).
  static int concurrency() {
#ifdef TOPKV_TASKS_ON_THREADS
    const unsigned h = std::thread::hardware_concurrency();
    return h ? (int)h : 1;
#else
    return tbb::this_task_arena::max_concurrency();
#endif
  }

  // f must not throw (catch inside it and hand the error over).
  template <class F> void run(F&& f) {
#ifdef TOPKV_TASKS_ON_THREADS
    threads_.emplace_back(std::forward<F>(f));
#else
    tasks_.run(std::forward<F>(f));
#endif
  }

  void wait() {
#ifdef TOPKV_TASKS_ON_THREADS
    for (std::thread& t : threads_) t.join();
    threads_.clear();
#else
    tasks_.wait();
#endif
  }

 private:
#ifdef TOPKV_TASKS_ON_THREADS
  std::vector<std::thread> threads_;
#else
  tbb::task_group tasks_;
#endif
};

// body(lo, hi) for blocks [lo, hi) of about `grain` rows covering [from, to),
// on at most `threads` threads, returning when all are done. An exception
// from body stops the blocks not started and is rethrown here.
template <class F> void parallel_for_blocks(int64_t from, int64_t to, int64_t grain, int threads, F&& body) {
  if (from >= to) return;
  grain = std::max<int64_t>(1, grain);
#ifdef TOPKV_TASKS_ON_THREADS
  std::atomic<int64_t> next{from};
  std::exception_ptr error;
  std::mutex error_mu;
  std::vector<std::thread> workers;
  for (int t = 0; t < std::max(1, threads); ++t)
    workers.emplace_back([&] {
      try {
        for (int64_t lo; (lo = next.fetch_add(grain)) < to;) body(lo, std::min(to, lo + grain));
      } catch (...) {
        next = to;
        std::lock_guard<std::mutex> lk(error_mu);
        if (!error) error = std::current_exception();
      }
    });
  for (std::thread& w : workers) w.join();
  if (error) std::rethrow_exception(error);
#else
  tbb::task_arena arena(std::max(1, threads));
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<int64_t>(from, to, (size_t)grain),
                      [&](const tbb::blocked_range<int64_t>& r) { body(r.begin(), r.end()); });
  });
#endif
}

}  // namespace topkv
