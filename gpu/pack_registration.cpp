// CUDA builds only: the file is empty without CUDA.
#ifdef TOPKV_HAVE_CUDA
#include "gpu/pack_registration.h"

#include <cuda_runtime.h>

#include <map>
#include <mutex>

#include "offload/pack_file.h"

namespace topkv {

std::shared_ptr<const void> register_pack_mapping(const PackReader& r, std::string& why) {
  static std::mutex mu;
  static std::map<const void*, std::weak_ptr<const void>> live;
  void* base = const_cast<void*>(r.map_base());
  const size_t bytes = r.map_bytes();
  if (!base || bytes == 0) {
    why = "the pack is not memory-mapped";
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(mu);
  if (auto held = live[base].lock()) return held;
  int dev = 0, same_address = 0, read_only = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&same_address, cudaDevAttrCanUseHostPointerForRegisteredMem, dev);
  cudaDeviceGetAttribute(&read_only, cudaDevAttrHostRegisterReadOnlySupported, dev);
  if (!same_address || !read_only) {
    why = !same_address ? "the device cannot use registered host memory at its host address"
                        : "the device cannot register read-only host memory";
    return nullptr;
  }
  const cudaError_t e =
      cudaHostRegister(base, bytes, cudaHostRegisterMapped | cudaHostRegisterReadOnly | cudaHostRegisterPortable);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: the run goes on with copies
    why = std::string("cudaHostRegister: ") + cudaGetErrorString(e);
    return nullptr;
  }
  void* dev_ptr = nullptr;
  if (cudaHostGetDevicePointer(&dev_ptr, base, 0) != cudaSuccess || dev_ptr != base) {
    cudaGetLastError();
    cudaHostUnregister(base);
    why = "the device maps the registered pack at another address";
    return nullptr;
  }
  std::shared_ptr<const void> mapping = r.owner();
  std::shared_ptr<const void> reg(base, [mapping](const void* p) {
    cudaHostUnregister(const_cast<void*>(p));  // before `mapping` (captured) unmaps it
  });
  live[base] = reg;
  return reg;
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
