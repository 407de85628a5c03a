// Errors: every failure a user can cause is a topkv::Error whose message says
// what was wrong and what to do. The CLI prints it and exits non-zero.
#pragma once
#include <fmt/format.h>
#include <stdexcept>
#include <string>

namespace topkv {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] inline void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace topkv

// TOPKV_CHECK(cond, "fmt {}", args...): throws topkv::Error with the message.
#define TOPKV_CHECK(cond, ...)                 \
  do {                                         \
    if (!(cond)) ::topkv::fail(__VA_ARGS__);   \
  } while (0)
