// CLI11 validators for the files a command writes (and for --threads), so a path that cannot be
// written is refused when the options are parsed, before hours of work
// (check_output_path: the folder is created when missing and must be
// writable; the path must not be a folder). Header-only: the CLI and the
// benchmarks' commands include it; the core library does not link CLI11.
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "src/common/error.h"
#include "src/common/file_io.h"
#include "src/common/limits.h"

namespace topkv {

// `what` names the output in the message ("--json report").
inline CLI::Validator output_file(const std::string& what) {
  return CLI::Validator(
      [what](std::string& path) -> std::string {
        try {
          check_output_path(path, what);
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      "");
}

// A folder outputs go into: created when missing, must be writable.
inline CLI::Validator output_folder(const std::string& what) {
  return CLI::Validator(
      [what](std::string& dir) -> std::string {
        try {
          check_output_path(dir + "/.topkv-probe", what);
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      "");
}

// A seed: a whole number >= 0. Checked as text, because an unsigned option
// would take "-3" as 2^64 - 3 (found by the bad-input test of bench recall's
// --build-seed); CLI11 itself rejects a value past the option's type.
inline CLI::Validator seed_value() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos)
          return "a seed is a whole number >= 0 (got '" + v + "')";
        return {};
      },
      "UINT");
}

// --threads: 0 (every core) to kMaxThreads, checked when parsed.
inline CLI::Validator thread_count() {
  return CLI::Validator(
      [](std::string& v) -> std::string {
        try {
          size_t used = 0;
          const long long n = std::stoll(v, &used);
          if (used != v.size()) return "--threads must be a whole number (got '" + v + "')";
          check_thread_count(n, "--threads");
        } catch (const Error& e) {
          return e.what();
        } catch (const std::exception&) {
          return "--threads must be a whole number (got '" + v + "')";
        }
        return {};
      },
      "INT in [0, 4096]");
}

}  // namespace topkv
