// What the device build engines share (gpu/gpu_kmeans.cpp, gpu/gpu_page_bounds.cpp):
// a stream of their own, beside the prefill's, on which the calls from the
// index build threads take turns (lock()), and work buffers that grow to the
// largest call, taken from the backend's budget under one name (the memory
// plan's line). CUDA builds only.
#pragma once
#include <cuda_runtime.h>

#include <mutex>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"

namespace topkv::cuda {

class BuildEngineStream {
 public:
  BuildEngineStream(CudaBackend& be, const char* what) : be_(&be), what_(what) {
    TOPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  ~BuildEngineStream() {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
  BuildEngineStream(const BuildEngineStream&) = delete;
  BuildEngineStream& operator=(const BuildEngineStream&) = delete;

  cudaStream_t get() const { return stream_; }
  // One call at a time: the buffers and the stream's order are the caller's until it returns.
  std::unique_lock<std::mutex> lock() const { return std::unique_lock<std::mutex>(mu_); }
  void sync() const { TOPKV_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  // `b` at least `bytes` long: replaced when shorter, after the stream's
  // queued work (which may still read the old buffer). Under lock().
  Buffer& grow(Buffer& b, size_t bytes) const {
    if (b.bytes < bytes) {
      sync();
      b = Buffer{};
      b = be_->alloc(bytes, MemKind::Scratch, what_);
    }
    return b;
  }

 private:
  CudaBackend* be_;
  const char* what_;
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
};

}  // namespace topkv::cuda
