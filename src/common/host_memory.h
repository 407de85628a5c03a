// How much host memory this process may still take: the least of the
// machine's MemAvailable (/proc/meminfo), what the address-space limit
// (RLIMIT_AS, `ulimit -v`) leaves above the current virtual size, and what the
// cgroup's memory.max (v2) or memory.limit_in_bytes (v1) leaves above its
// current use. A run planned against MemAvailable alone is killed by a
// container's limit, or dies in std::bad_alloc under a ulimit.
#pragma once
#include <cstddef>
#include <string>

namespace topkv {

struct HostMemory {
  double available = 0;  // bytes; 0 when nothing could be read
  std::string bound;     // which limit gave it: "MemAvailable", "RLIMIT_AS", "cgroup memory.max"
};
HostMemory host_memory();
double host_memory_available();  // host_memory().available

// Error when `bytes` (what `what` will allocate) exceed what is available,
// naming the limit and saying what to lower (`hint`). Skipped when unknown.
void check_host_memory(double bytes, const std::string& what, const std::string& hint);

// The largest resident set this process has had so far (getrusage ru_maxrss).
size_t peak_rss_bytes();

}  // namespace topkv
