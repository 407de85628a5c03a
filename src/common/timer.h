// Wall-clock timing helpers and order statistics used by the benchmarks.
#pragma once
#include <algorithm>
#include <chrono>
#include <vector>

namespace topkv {

class Timer {
 public:
  Timer() : t0_(std::chrono::steady_clock::now()) {}
  void reset() { t0_ = std::chrono::steady_clock::now(); }
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  double ms() const { return seconds() * 1e3; }
  double us() const { return seconds() * 1e6; }

 private:
  std::chrono::steady_clock::time_point t0_;
};

// p-th percentile (0..100) by linear interpolation; the input is copied.
inline double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  double pos = p / 100.0 * (double)(v.size() - 1);
  size_t lo = (size_t)pos, hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - (double)lo);
}

inline double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / (double)v.size();
}

}  // namespace topkv
