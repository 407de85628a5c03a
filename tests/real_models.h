// The real models the tests use when they are installed (scripts/fetch-model.sh
// NAME puts them under .models/; an environment variable points elsewhere). A
// test without its model WARNs and returns, so CI without the download passes.
#pragma once
#include <catch2/catch.hpp>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace topkv::test {

struct RealModel {
  const char* fetch_name;  // scripts/fetch-model.sh NAME
  const char* file;        // under .models/
  const char* env;         // overrides the path
};
inline constexpr RealModel kGemma270m{"gemma3-270m", "gemma-3-270m-q4_k_m.gguf", "TOPKV_MODEL"};
inline constexpr RealModel kQwen05{"qwen2.5-coder-0.5b", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
                                   "TOPKV_QWEN05_MODEL"};
inline constexpr RealModel kQwen15{"qwen2.5-coder-1.5b", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
                                   "TOPKV_QWEN15_MODEL"};

// The model's file, or "" after a WARN that says how to install it. The
// tests that call it run the real model's forward pass. TOPKV_TEST_REAL_FORWARD=0
// skips them (with a WARN): the sanitizer run in scripts/test.sh sets it, as
// under ASan they took ~3x their release time (the 0.5B's cached forward
// 188 s against 57 s) to run code the synthetic models' tests run there
// too; the release run checks them against the golden data. The GGUF and
// tokenizer tests on the real files do not call this and still run.
inline std::string real_model_path(const RealModel& m) {
  if (const char* run = std::getenv("TOPKV_TEST_REAL_FORWARD"); run && std::string(run) == "0") {
    WARN("skipped: TOPKV_TEST_REAL_FORWARD=0 (real models' forward passes are left to the release run)");
    return "";
  }
  const char* env = std::getenv(m.env);
  const std::string path = env ? env : std::string(TOPKV_SOURCE_DIR) + "/.models/" + m.file;
  if (std::filesystem::exists(path)) return path;
  WARN("skipped: no model at " << path << " (run scripts/fetch-model.sh " << m.fetch_name << " or set " << m.env
                               << ")");
  return "";
}

}  // namespace topkv::test
