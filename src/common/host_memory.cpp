#include "src/common/host_memory.h"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "src/common/error.h"
#include "src/common/options.h"

namespace topkv {

namespace {

double meminfo_available() {
  std::ifstream f("/proc/meminfo");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream ss(line.substr(13));
    double kib = 0;
    ss >> kib;
    return kib * 1024.0;
  }
  return 0;
}

// RLIMIT_AS less the current virtual size; -1 when unlimited.
double address_space_left() {
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return -1;
  std::ifstream f("/proc/self/statm");
  double pages = 0;
  f >> pages;
  const double used = pages * (double)::sysconf(_SC_PAGESIZE);
  return std::max(0.0, (double)rl.rlim_cur - used);
}

double read_number(const std::string& path, bool& ok) {
  std::ifstream f(path);
  std::string s;
  ok = false;
  if (!(f >> s) || s == "max") return 0;
  try {
    const double v = std::stod(s);
    ok = true;
    return v;
  } catch (const std::exception&) {
    return 0;
  }
}

// The cgroup's limit less its use; -1 when there is none.
double cgroup_left() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  while (std::getline(f, line)) {
    bool ok_max = false, ok_cur = false;
    if (line.rfind("0::", 0) == 0) {  // v2: one unified hierarchy
      const std::string dir = "/sys/fs/cgroup" + line.substr(3);
      const double max = read_number(dir + "/memory.max", ok_max), cur = read_number(dir + "/memory.current", ok_cur);
      if (ok_max) return std::max(0.0, max - (ok_cur ? cur : 0.0));
    } else if (line.find(":memory:") != std::string::npos) {  // v1
      const std::string dir = "/sys/fs/cgroup/memory" + line.substr(line.find(":memory:") + 8);
      const double max = read_number(dir + "/memory.limit_in_bytes", ok_max);
      const double cur = read_number(dir + "/memory.usage_in_bytes", ok_cur);
      if (ok_max && max < 1e18) return std::max(0.0, max - (ok_cur ? cur : 0.0));  // v1 "no limit" is ~2^63
    }
  }
  return -1;
}

}  // namespace

HostMemory host_memory() {
  HostMemory m{meminfo_available(), "MemAvailable"};
  const auto tighter = [&m](double left, const char* name) {
    if (left >= 0 && (m.available <= 0 || left < m.available)) m = {left, name};
  };
  tighter(address_space_left(), "the address-space limit (RLIMIT_AS, ulimit -v)");
  tighter(cgroup_left(), "the cgroup's memory limit");
  return m;
}

double host_memory_available() { return host_memory().available; }

void check_host_memory(double bytes, const std::string& what, const std::string& hint) {
  const HostMemory m = host_memory();
  if (m.available <= 0 && m.bound == "MemAvailable") return;  // unknown
  TOPKV_CHECK(bytes <= m.available, "{} needs about {} of host memory but {} is available (bound by {}): {}", what,
              format_bytes(bytes), format_bytes(m.available), m.bound, hint);
}

size_t peak_rss_bytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return (size_t)ru.ru_maxrss * 1024;  // Linux reports KiB
}

}  // namespace topkv
