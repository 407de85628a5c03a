// Helpers of the CUDA backend tests: random data, device round trips with
// poisoned outputs, norm-wise relative error, and the one-line-per-op summary
// (lines starting "SUMMARY", collected into a table by scripts/gpu-check.sh).
#pragma once
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gpu/cuda_backend.h"
#include "gpu/cuda_backend_impl.h"
#include "src/model/backend.h"
#include "tests/test_util.h"  // randn

namespace topkv::test {

// One CUDA backend for the whole test binary (creating cuBLAS per test is slow).
inline Backend& gpu() {
  static std::unique_ptr<Backend> be = make_cuda_backend();
  return *be;
}

// The same backend as the CUDA class: its stream, scratch and the kernel-level calls.
inline cuda::CudaBackend& cuda_be() { return dynamic_cast<cuda::CudaBackend&>(gpu()); }

// ||got - ref|| / ||ref|| in double; infinity when got has a NaN/inf where
// ref is finite (an unwritten, poisoned element shows up this way).
inline double rel_err(const std::vector<float>& got, const std::vector<float>& ref) {
  REQUIRE(got.size() == ref.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    if (!std::isfinite(got[i]) && std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    const double d = (double)got[i] - ref[i];
    num += d * d, den += (double)ref[i] * ref[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline Buffer upload(Backend& be, const std::vector<float>& v) {
  Buffer b = be.alloc(v.size() * sizeof(float));
  be.from_host(v.data(), b, 0, v.size() * sizeof(float));
  return b;
}
inline std::vector<float> download(Backend& be, const Buffer& b, size_t n) {
  std::vector<float> v(n);
  be.to_host(b, 0, v.data(), n * sizeof(float));
  return v;
}
// A device buffer of n floats, every one NaN: what an op does not write stays NaN.
inline Buffer poisoned(Backend& be, size_t n) {
  return upload(be, std::vector<float>(n, std::numeric_limits<float>::quiet_NaN()));
}

// The worst error of one op over a sweep, printed as one SUMMARY line when
// the test case ends (whether or not it passed).
class OpSummary {
 public:
  OpSummary(std::string op, double tol) : op_(std::move(op)), tol_(tol) {}
  ~OpSummary() {
    std::printf("SUMMARY %-34s cases %5d   max rel err %.3e   tol %.1e   %s\n", op_.c_str(), cases_, max_, tol_,
                max_ <= tol_ ? "ok" : "FAIL");
    std::fflush(stdout);
  }
  // Records one case and checks it against the tolerance.
  void check(double err) {
    ++cases_;
    if (!(err <= max_)) max_ = err;  // NaN sticks
    CHECK(err <= tol_);
  }
  double tol() const { return tol_; }

 private:
  std::string op_;
  double tol_, max_ = 0;
  int cases_ = 0;
};

}  // namespace topkv::test
