// The CUDA backend's entry points on machines (or builds) without CUDA: a
// clear Error, never a crash; a CPU backend is never taken for a CUDA one.
#include <catch2/catch.hpp>

#include "gpu/cuda_backend.h"
#include "gpu/cuda_sampler.h"
#include "gpu/device.h"
#include "src/common/error.h"

using namespace topkv;

TEST_CASE("without a device or without CUDA, make_cuda_backend says why") {
  if (cuda_device_count() > 0) {
    WARN("a CUDA device is present; the no-device path is not exercised here (" << cuda_device_summary() << ")");
    return;
  }
#ifdef TOPKV_HAVE_CUDA
  REQUIRE_THROWS_WITH(make_cuda_backend(), Catch::Contains("CUDA device"));
#else
  REQUIRE_THROWS_WITH(make_cuda_backend(), Catch::Contains("built without CUDA"));
#endif
}

TEST_CASE("a CPU backend is not a CUDA backend") {
  auto cpu = make_cpu_backend();
  REQUIRE_FALSE(is_cuda_backend(*cpu));
  REQUIRE_THROWS_WITH(cuda_memory_use(*cpu), Catch::Contains("not a CUDA backend"));
  REQUIRE_THROWS_WITH(CudaSampler(*cpu, SamplerParams{}), Catch::Contains("not a CUDA backend"));
  REQUIRE_THROWS_AS(cuda_argmax(*cpu, nullptr, 4), Error);
  CudaMemoryUse u;
  u.weights = 3 << 20, u.kv_cache = 1 << 10, u.budget = 8 << 20;
  REQUIRE(u.total() == (3 << 20) + (1 << 10));
  REQUIRE(u.describe() == "weights 3.00 MiB, kv cache 1.00 KiB, activations 0 B, scratch 0 B (total 3.00 MiB of a "
                          "8.00 MiB budget)");
}
