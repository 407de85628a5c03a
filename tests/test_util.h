// Small helpers shared by the tests.
#pragma once
#include <unistd.h>

#include <atomic>
#include <filesystem>
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

}  // namespace topkv::test
