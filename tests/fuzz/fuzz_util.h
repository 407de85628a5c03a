// Shared by the libFuzzer targets.
#pragma once
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "src/common/error.h"

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
