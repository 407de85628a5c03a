// OpenMP settings held for a scope: the team size the calling thread's
// parallel regions get, and how many nested levels may be active. Used by the
// index builds (Faiss's OpenMP loops) and by the layer that runs a build per
// KV head in parallel.
#pragma once

#include <omp.h>

namespace topkv {

// Sets the calling thread's OpenMP team size for the parallel regions it opens
// (Faiss's build and training) and restores it on scope exit. OpenMP keeps
// this setting per thread, so concurrent callers do not disturb each other.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n < 1 ? 1 : n); }
  ~ScopedOmpThreads() { omp_set_num_threads(saved_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_;
};

// At least `levels` active levels of OpenMP parallelism for a scope (0 keeps
// the setting): a parallel loop whose bodies run parallel loops of their own.
class ScopedOmpLevels {
 public:
  explicit ScopedOmpLevels(int levels) : saved_(omp_get_max_active_levels()) {
    if (levels > saved_) omp_set_max_active_levels(levels);
  }
  ~ScopedOmpLevels() { omp_set_max_active_levels(saved_); }
  ScopedOmpLevels(const ScopedOmpLevels&) = delete;
  ScopedOmpLevels& operator=(const ScopedOmpLevels&) = delete;

 private:
  int saved_;
};

}  // namespace topkv
