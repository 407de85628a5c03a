// Device memory of a CUDA backend: every cudaMalloc goes through here, is
// counted by what it is for, may be refused against a budget
// (--gpu-mem-budget) with an Error listing what is held, and is freed (and
// uncounted) when its last shared owner lets go. CUDA builds only.
#pragma once
#include <cstddef>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>

#include "gpu/cuda_backend.h"

namespace topkv::cuda {

enum class MemKind : int { Weights = 0, KvCache = 1, Activations = 2, Scratch = 3 };
const char* mem_kind_name(MemKind k);

class DeviceMemory {
 public:
  explicit DeviceMemory(size_t budget) : ledger_(std::make_shared<Ledger>()) { ledger_->budget = budget; }

  // `bytes` of device memory (rounded up to 256; at least 256), `what` names
  // it in errors. Throws Error past the budget or when the device is full.
  std::shared_ptr<void> alloc(size_t bytes, MemKind kind, std::string_view what);
  // Whether p is the start of a live allocation of that kind (weights and
  // caches handed to ops are checked this way: a host pointer would fault).
  bool owns(const void* p, MemKind kind) const;
  CudaMemoryUse use() const;

 private:
  struct Ledger {
    mutable std::mutex mu;
    size_t held[4] = {0, 0, 0, 0};
    size_t budget = 0;
    std::unordered_map<const void*, MemKind> live;
    CudaMemoryUse use_locked() const;
  };
  std::shared_ptr<Ledger> ledger_;  // shared with the deleters, which may outlive the backend
};

}  // namespace topkv::cuda
