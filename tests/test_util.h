// Small helpers shared by the tests.
#pragma once
#include <unistd.h>

#include <sys/wait.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <stdexcept>
#include <string>

namespace topkv::test {

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
