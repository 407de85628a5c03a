// Bounds on values a user gives that size the process itself.
#pragma once
#include <cstdint>

#include "src/common/error.h"

namespace topkv {

// OpenMP / TBB thread counts: past a few thousand, libgomp fails to create the
// threads (a SIGSEGV inside the runtime, not an error). No host topkv runs on
// has more cores than this.
inline constexpr int kMaxThreads = 4096;

// `n` threads from option `option` (0 = the runtime's default): Error when
// negative or above kMaxThreads.
inline void check_thread_count(int64_t n, const char* option) {
  TOPKV_CHECK(n >= 0 && n <= kMaxThreads, "{} must be in [0, {}] (0 = every core; got {})", option, kMaxThreads, n);
}

}  // namespace topkv
