// CPU-only builds: no devices.
#ifndef TOPKV_HAVE_CUDA
#include "gpu/device.h"

namespace topkv {
int cuda_device_count() { return 0; }
std::string cuda_device_summary() { return "CUDA: not built (CPU-only build)"; }
}  // namespace topkv
#endif
