// Main of GPU test executables: exits 77 (CTest "Skipped") without a device.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>
#include <cstdio>

#include "gpu/device.h"

int main(int argc, char** argv) {
  if (topkv::cuda_device_count() == 0) {
    std::printf("skipped: no CUDA device (%s)\n", topkv::cuda_device_summary().c_str());
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
