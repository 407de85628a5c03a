// What CUDA devices this process sees. Works in CPU-only builds (returns 0).
#pragma once
#include <string>

namespace topkv {

int cuda_device_count();          // 0 when built without CUDA or no device/driver
std::string cuda_device_summary();  // one line per device, or why there is none

}  // namespace topkv
