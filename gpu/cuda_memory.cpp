#include <fmt/format.h>

#include "gpu/cuda_backend.h"
#include "src/common/options.h"

namespace topkv {

std::string CudaMemoryUse::describe() const {
  std::string s = fmt::format("weights {}, kv cache {}, activations {}, scratch {} (total {}", format_bytes(weights),
                              format_bytes(kv_cache), format_bytes(activations), format_bytes(scratch),
                              format_bytes(total()));
  s += budget ? fmt::format(" of a {} budget)", format_bytes(budget)) : ")";
  return s;
}

}  // namespace topkv

#ifdef TOPKV_HAVE_CUDA
#include "gpu/cuda_check.h"
#include "gpu/cuda_memory.h"

namespace topkv::cuda {

const char* mem_kind_name(MemKind k) {
  switch (k) {
    case MemKind::Weights: return "weights";
    case MemKind::KvCache: return "kv cache";
    case MemKind::Activations: return "activations";
    case MemKind::Scratch: return "scratch";
  }
  return "?";
}

CudaMemoryUse DeviceMemory::Ledger::use_locked() const {
  CudaMemoryUse u;
  u.weights = held[0], u.kv_cache = held[1], u.activations = held[2], u.scratch = held[3];
  u.budget = budget;
  return u;
}

CudaMemoryUse DeviceMemory::use() const {
  std::lock_guard<std::mutex> lock(ledger_->mu);
  return ledger_->use_locked();
}

bool DeviceMemory::owns(const void* p, MemKind kind) const {
  std::lock_guard<std::mutex> lock(ledger_->mu);
  const auto it = ledger_->live.find(p);
  return it != ledger_->live.end() && it->second == kind;
}

std::shared_ptr<void> DeviceMemory::alloc(size_t bytes, MemKind kind, std::string_view what) {
  const size_t rounded = std::max<size_t>(256, (bytes + 255) / 256 * 256);
  const int k = (int)kind;
  {  // reserve under the budget first, so concurrent allocations cannot both pass
    std::lock_guard<std::mutex> lock(ledger_->mu);
    const CudaMemoryUse u = ledger_->use_locked();
    if (ledger_->budget && u.total() + rounded > ledger_->budget)
      fail("GPU memory budget exceeded: {} ({}) needs {} but the backend holds {}. Lower the context or the "
           "prefill chunk, use an f16 KV cache, or raise --gpu-mem-budget",
           what, mem_kind_name(kind), format_bytes((double)rounded), u.describe());
    ledger_->held[k] += rounded;
  }
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, rounded);
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear it: out-of-memory is not sticky
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    std::lock_guard<std::mutex> lock(ledger_->mu);
    ledger_->held[k] -= rounded;
    fail("cudaMalloc of {} for {} ({}) failed: {}. The device has {} free of {}; this backend holds {}", 
         format_bytes((double)rounded), what, mem_kind_name(kind), cudaGetErrorString(e), format_bytes((double)free_b),
         format_bytes((double)total_b), ledger_->use_locked().describe());
  }
  {
    std::lock_guard<std::mutex> lock(ledger_->mu);
    ledger_->live[p] = kind;
  }
  std::shared_ptr<Ledger> ledger = ledger_;
  return std::shared_ptr<void>(p, [ledger, rounded, k](void* q) {
    cudaFree(q);  // a deleter cannot throw; an error here would be a fault reported elsewhere
    std::lock_guard<std::mutex> lock(ledger->mu);
    ledger->held[k] -= rounded;
    ledger->live.erase(q);
  });
}

}  // namespace topkv::cuda
#endif  // TOPKV_HAVE_CUDA
