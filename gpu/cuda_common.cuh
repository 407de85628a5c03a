// Device helpers shared by the kernel files: element conversions for the
// row types (fp32, fp16, bf16; the host store's f8 and q8_0), warp
// reductions, launch sizing.
// Included by .cu files only.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "gpu/cuda_check.h"
#include "src/common/dtype.h"

namespace topkv::cuda {

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
// E4M3 store rows (--store-type f8): decoded exactly, as the host's table does.
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) { return static_cast<float>(x); }

// Tag for host store rows of q8_0 blocks (--store-type q8_0; layout in
// src/common/dtype.h: per 32 elements an f16 scale d then 32 int8 codes,
// x = d * q, 34 bytes). Blocks are 34 bytes, so a scale is 2-byte aligned.
struct Q8Row {};
__device__ __forceinline__ float q8_0_scale(const uint8_t* block) {
  return __half2float(*reinterpret_cast<const __half*>(block));
}
// Element i of a run of q8_0 blocks at p, as the host's to_f32 gives it.
__device__ __forceinline__ float q8_0_at(const void* p, int64_t i) {
  const uint8_t* block = static_cast<const uint8_t*>(p) + i / (int64_t)kQ8Block * (int64_t)kQ8BlockBytes;
  return q8_0_scale(block) * (float)(int8_t)block[2 + i % (int64_t)kQ8Block];
}
// Element i of a run of store type E (an element type or Q8Row) at p, in fp32.
template <class E> __device__ __forceinline__ float elem_at(const void* p, int64_t i) {
  if constexpr (std::is_same_v<E, Q8Row>) return q8_0_at(p, i);
  else return to_float(static_cast<const E*>(p)[i]);
}

// Round to nearest even, as the host conversions of src/common/dtype.h.
template <class E> __device__ __forceinline__ E from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// Loads 16 bytes (4 fp32 or 8 16-bit values) at p (16-byte aligned) into
// fp32. The weight / cache streams go through these.
template <class E> struct Vec16;
template <> struct Vec16<float> {
  static constexpr int n = 4;
  __device__ __forceinline__ static void load(const float* p, float* out) {
    const float4 v = *reinterpret_cast<const float4*>(p);
    out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
  }
};
template <> struct Vec16<__half> {
  static constexpr int n = 8;
  __device__ __forceinline__ static void load(const __half* p, float* out) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    unpack(v, out);
  }
  __device__ __forceinline__ static void unpack(const uint4& v, float* out) {
    const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
  }
};
template <> struct Vec16<__nv_bfloat16> {
  static constexpr int n = 8;
  __device__ __forceinline__ static void load(const __nv_bfloat16* p, float* out) {
    const uint4 v = *reinterpret_cast<const uint4*>(p);
    unpack(v, out);
  }
  __device__ __forceinline__ static void unpack(const uint4& v, float* out) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __bfloat1622float2(h[i]);
      out[2 * i] = f.x, out[2 * i + 1] = f.y;
    }
  }
};

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Calls f(E{}) with E the device element type of `t`.
template <class F> void with_elem_type(DType t, F&& f) {
  switch (t) {
    case DType::F32: f(float{}); return;
    case DType::F16: f(__half{}); return;
    case DType::BF16: f(__nv_bfloat16{}); return;
  }
  fail("unknown element type code {}", (int)t);
}

// Calls f(E{}) with E an element type or __nv_fp8_e4m3: the types that both
// summary tables and host stores take.
template <class F> void with_elem_or_f8_type(DType t, F&& f) {
  if (t == DType::F8E4M3) f(__nv_fp8_e4m3{});
  else with_elem_type(t, f);
}

// Calls f(E{}) with E the device type of a summary table's elements
// (--device-table-type): those above, or int8_t (i8 codes; their scales
// are SummaryHead's, applied by LaneScale, gpu/partial_block.cuh).
template <class F> void with_table_type(DType t, F&& f) {
  if (t == DType::I8) f(int8_t{});
  else with_elem_or_f8_type(t, f);
}

// Calls f(E{}) with E the device type of a host store's rows: an element
// type, __nv_fp8_e4m3 (--store-type f8) or Q8Row (--store-type q8_0).
template <class F> void with_store_type(DType t, F&& f) {
  if (t == DType::Q8_0) f(Q8Row{});
  else with_elem_or_f8_type(t, f);
}

// Blocks for a grid-stride loop over n items: enough to fill the device
// several times over, never more than needed.
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 16384) {
  int64_t b = (n + threads - 1) / threads;
  if (b < 1) b = 1;
  if (b > max_blocks) b = max_blocks;
  return (unsigned)b;
}

// A device's SM count and compute capability (major), asked of the driver
// once per device: launch choices made on every decode step (the search's
// cut, the MMVQ grid) read them here.
struct DeviceShape {
  int sms, major;
};
inline DeviceShape device_shape(int dev) {
  static std::atomic<int> sms[64], major[64];  // static storage: zero-initialised; 0 = not asked yet
  if (dev >= 0 && dev < 64) {
    const int n = sms[dev].load(std::memory_order_acquire);  // set last: major is there once it is
    if (n > 0) return {n, major[dev].load(std::memory_order_relaxed)};
  }
  DeviceShape d{0, 0};
  TOPKV_CUDA_CHECK(cudaDeviceGetAttribute(&d.sms, cudaDevAttrMultiProcessorCount, dev));
  TOPKV_CUDA_CHECK(cudaDeviceGetAttribute(&d.major, cudaDevAttrComputeCapabilityMajor, dev));
  if (dev >= 0 && dev < 64)
    major[dev].store(d.major, std::memory_order_relaxed), sms[dev].store(d.sms, std::memory_order_release);
  return d;
}
inline DeviceShape current_device_shape() {
  int dev = 0;
  TOPKV_CUDA_CHECK(cudaGetDevice(&dev));
  return device_shape(dev);
}

// Programmatic dependent launch (sm_90 on; CUDA programming guide,
// "Programmatic Dependent Launch and Synchronization"): a chain of small
// dependent kernels (the device search's score, cut, expand, gather: ~10 us
// each at the Llama-8B 512K layer) lets each kernel's blocks be scheduled as
// the previous kernel's blocks exit instead of after its completion is
// signalled. A kernel launched this way must call grid_dependency_wait()
// before it touches global memory the previous kernel writes or reads; on
// older devices, or with TOPKV_PDL=0 in the environment (to time the chain
// without it, or to rule the overlap out when a result looks wrong), it is
// launched as usual and the wait does nothing.
__device__ __forceinline__ void grid_dependency_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}
inline bool dependent_launch_enabled() {  // TOPKV_PDL, read once a process
  static const bool on = [] {
    const char* env = std::getenv("TOPKV_PDL");
    return !(env && std::strcmp(env, "0") == 0);
  }();
  return on;
}

// How a kernel goes out through cudaLaunchKernelEx: dependent (the launch
// above, where the device has it) and/or as thread block clusters of
// `cluster` blocks along x (sm_90: the search's cluster cut).
struct LaunchHow {
  bool dependent = false;
  unsigned cluster = 1;
};
template <class... Params, class... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, LaunchHow how,
                   Args&&... args) {
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (how.dependent && dependent_launch_enabled() && current_device_shape().major >= 9) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (how.cluster > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n++].val.clusterDim = {how.cluster, 1, 1};
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.stream = stream, cfg.attrs = attrs, cfg.numAttrs = n;
  TOPKV_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
template <class... Params, class... Args>
void launch_dependent(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream, Args&&... args) {
  launch_kernel(kernel, grid, block, stream, LaunchHow{true, 1}, std::forward<Args>(args)...);
}

}  // namespace topkv::cuda
