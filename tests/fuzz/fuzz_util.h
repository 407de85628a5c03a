// Shared by the libFuzzer targets: the input as a real regular file (a memfd,
// rewritten in place for each input and opened through /proc/self/fd), so
// the readers' own open / fstat / mmap path is what is fuzzed.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "src/common/error.h"

namespace topkv::fuzz {

class MemFile {
 public:
  MemFile() {
    fd_ = ::memfd_create("topkv-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) std::abort();
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& write(const uint8_t* data, size_t n) {
    if (::ftruncate(fd_, 0) != 0 || (n && ::pwrite(fd_, data, n, 0) != (ssize_t)n)) std::abort();
    return path_;
  }

 private:
  int fd_ = -1;
  std::string path_;
};

}  // namespace topkv::fuzz

// Runs `body`; a topkv::Error is the expected answer to bad input, anything
// else escaping (std::exception included: a raw library error) is a finding.
#define TOPKV_FUZZ_BODY(body)                      \
  try {                                            \
    body;                                          \
  } catch (const ::topkv::Error&) {                \
  } catch (const std::exception& e) {              \
    std::fprintf(stderr, "not a topkv::Error: %s\n", e.what()); \
    std::abort();                                  \
  }
