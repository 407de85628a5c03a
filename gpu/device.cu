#include <cuda_runtime.h>
#include <fmt/format.h>

#include "gpu/device.h"

namespace topkv {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

std::string cuda_device_summary() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return fmt::format("CUDA: built, no usable device ({})", cudaGetErrorString(e));
  }
  std::string s;
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp p{};
    cudaGetDeviceProperties(&p, i);
    s += fmt::format("CUDA device {}: {} (sm_{}{}, {} SMs, {:.1f} GiB)\n", i, p.name, p.major, p.minor,
                     p.multiProcessorCount, p.totalGlobalMem / 1073741824.0);
  }
  return s.empty() ? "CUDA: built, no device" : s.substr(0, s.size() - 1);
}

}  // namespace topkv
