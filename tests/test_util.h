// Small helpers shared by the tests.
#pragma once
#include <unistd.h>

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "src/common/dtype.h"
#include "src/model/attention_override.h"
#include "src/model/model_config.h"

namespace topkv::test {

// n normal draws of mean `mean` and deviation `sd`.
inline std::vector<float> randn(size_t n, std::mt19937& rng, float sd = 1.f, float mean = 0.f) {
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// A model geometry for the runtime tests: `layers` full-context layers (all
// retrieval layers), heads / kv_heads of head_dim; no weights.
inline ModelConfig runtime_test_config(int layers, int heads, int kv_heads, int head_dim) {
  ModelConfig cfg;
  cfg.n_layer = layers, cfg.n_head = heads, cfg.n_head_kv = kv_heads, cfg.head_dim = head_dim;
  cfg.layers.resize((size_t)layers);
  return cfg;
}

// Positions [t0, t0 + m) of a context held whole as [kv][n][d], as a
// KvReader gives them: [kv][m][d].
inline void slice_positions(const std::vector<float>& all, int64_t n, int d, int64_t t0, int64_t m,
                            std::vector<float>& out) {
  const size_t kv = all.size() / ((size_t)n * d), row = (size_t)d;
  out.resize(kv * (size_t)m * row);
  for (size_t h = 0; h < kv; ++h)
    std::copy_n(all.begin() + (ptrdiff_t)((h * n + t0) * row), (size_t)m * row,
                out.begin() + (ptrdiff_t)(h * m * row));
}

// A KvReader (src/model/attention_override.h) over whole contexts held per
// layer as [kv][n][d].
inline KvReader whole_context_reader(const std::vector<std::vector<float>>& ks,
                                   const std::vector<std::vector<float>>& vs, int64_t n, int d) {
  return [&ks, &vs, n, d](int il, int64_t t0, int64_t m, std::vector<float>& k, std::vector<float>& v) {
    slice_positions(ks[(size_t)il], n, d, t0, m, k);
    slice_positions(vs[(size_t)il], n, d, t0, m, v);
  };
}

// n_rows rows of d fp32 values as a host store of type t gives them back
// (row by row: a Q8_0 row is its own blocks).
inline std::vector<float> through_store(DType t, const float* rows, size_t n_rows, size_t d) {
  std::vector<uint8_t> buf(dtype_bytes(t, d));
  std::vector<float> out(n_rows * d);
  for (size_t r = 0; r < n_rows; ++r) {
    from_f32(t, rows + r * d, buf.data(), d);
    to_f32(t, buf.data(), out.data() + r * d, d);
  }
  return out;
}

// A fresh directory under the system temp dir, removed with everything in it
// when the object goes (unique per process and object, so parallel CTest
// runs of different test cases never share one).
struct TempDir {
  std::filesystem::path dir;
  explicit TempDir(const std::string& tag = "topkv_test") {
    static std::atomic<int> counter{0};
    dir = std::filesystem::temp_directory_path() /
          (tag + "_" + std::to_string(getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(dir);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

// The worst row's ||got - ref|| / ||ref|| over rows of `width` values;
// infinity when got holds a NaN or an infinity (an unwritten, poisoned
// element shows up this way) or the two differ in size.
inline double max_row_rel_err(const std::vector<float>& got, const std::vector<float>& ref, int width) {
  if (got.size() != ref.size() || width <= 0) return INFINITY;
  double worst = 0;
  for (size_t r = 0; r < ref.size() / (size_t)width; ++r) {
    double num = 0, den = 0;
    for (int d = 0; d < width; ++d) {
      const double x = ref[r * width + d], g = got[r * width + d];
      if (!std::isfinite(g)) return INFINITY;
      num += (g - x) * (g - x), den += x * x;
    }
    worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
  }
  return worst;
}

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}

// Runs the built `topkv` binary (TOPKV_BINARY_DIR/bin/topkv; tests depend on
// that target) with `args` through the shell; returns its exit code and output.
struct CliRun {
  int rc = -1;
  std::string out, err;
};
inline CliRun run_topkv(const std::string& args) {
  const std::string bin = std::string(TOPKV_BINARY_DIR) + "/bin/topkv";
  TempDir dir("topkv_cli");
  const std::string out = dir.file("stdout.txt"), err = dir.file("stderr.txt");
  const int status = std::system((bin + " " + args + " >" + out + " 2>" + err + " </dev/null").c_str());
  CliRun r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

// A tiny synthetic gemma3 model (`topkv model synth --preset tiny-gemma3`),
// written once per test process and shared by its test cases.
inline const std::string& tiny_gemma3_model() {
  static TempDir dir("topkv_tiny_gemma3");
  static const std::string path = [] {
    std::string p = dir.file("tiny-gemma3.gguf");
    CliRun r = run_topkv("model synth --preset tiny-gemma3 -q -o " + p);
    if (r.rc != 0) throw std::runtime_error("topkv model synth failed: " + r.err);
    return p;
  }();
  return path;
}

}  // namespace topkv::test
