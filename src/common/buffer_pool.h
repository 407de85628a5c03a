// BufferPool: buffers from an expensive allocator, kept when released so
// that the next request of the same size takes one back instead of
// allocating again. The CUDA runtime's host stores are pinned, device-mapped
// chunks (pinned_chunk_allocator, gpu/gpu_offload_runtime.cpp): cudaHostAlloc pins every page of a 16 MiB
// chunk when it is made, which costs far more than the rows a short context
// writes into it, and an evaluation restores a fresh runtime from a context
// pack for every method and run (src/eval/shared_context.h).
//
// A buffer is a shared_ptr whose deleter hands it back; the pool's state
// lives as long as its last buffer. At most `max_free_bytes` wait for reuse;
// a buffer released past that is freed at once. When the allocator fails, the
// waiting buffers are freed and it is asked once more. Contents are not
// cleared: a buffer taken back holds what its last owner wrote.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

namespace topkv {

class BufferPool {
 public:
  using Alloc = std::function<void*(size_t bytes)>;  // throws when it cannot
  using Free = std::function<void(void*)>;          // must not throw

  BufferPool(Alloc alloc, Free free, size_t max_free_bytes)
      : s_(std::make_shared<State>(std::move(alloc), std::move(free), max_free_bytes)) {}

  std::shared_ptr<uint8_t> get(size_t bytes) {
    void* p = s_->take(bytes);
    std::shared_ptr<State> s = s_;
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(p), [s, bytes](uint8_t* q) { s->give_back(q, bytes); });
  }

  size_t free_bytes() const {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->free_bytes;
  }
  // Frees every buffer waiting for reuse.
  void trim() { s_->trim(); }

 private:
  struct State {
    State(Alloc a, Free f, size_t cap) : alloc(std::move(a)), free(std::move(f)), max_free(cap) {}
    ~State() { trim(); }

    void* take(size_t bytes) {
      {
        std::lock_guard<std::mutex> lock(mu);
        auto it = waiting.find(bytes);
        if (it != waiting.end() && !it->second.empty()) {
          void* p = it->second.back();
          it->second.pop_back();
          free_bytes -= bytes;
          return p;
        }
      }
      try {
        return alloc(bytes);
      } catch (...) {
        if (!trim()) throw;  // nothing was waiting: the failure stands
      }
      return alloc(bytes);  // once more with the waiting buffers freed
    }
    void give_back(void* p, size_t bytes) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (free_bytes + bytes <= max_free) {
          waiting[bytes].push_back(p);
          free_bytes += bytes;
          return;
        }
      }
      free(p);
    }
    bool trim() {  // true when something was freed
      std::map<size_t, std::vector<void*>> out;
      {
        std::lock_guard<std::mutex> lock(mu);
        out.swap(waiting);
        free_bytes = 0;
      }
      bool any = false;
      for (auto& [bytes, ps] : out)
        for (void* p : ps) free(p), any = true;
      return any;
    }

    Alloc alloc;
    Free free;
    const size_t max_free;
    mutable std::mutex mu;
    std::map<size_t, std::vector<void*>> waiting;  // by size
    size_t free_bytes = 0;
  };
  std::shared_ptr<State> s_;
};

}  // namespace topkv
