// The memory plan printed before prefill: what the chosen model, context and
// policy will hold in host memory (and, for the CUDA runtime, GPU memory),
// line by line, checked against what the machine has, so a run that cannot
// fit stops with the numbers instead of being killed half way.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "offload/policy.h"
#include "src/common/host_memory.h"
#include "src/model/model_config.h"

namespace topkv {

struct MemoryPlan {
  struct Line {
    std::string what;
    double host = 0, gpu = 0;  // bytes
  };
  std::vector<Line> lines;
  double host_total() const;
  double gpu_total() const;
  std::string table() const;  // aligned, one line each, totals last
};

struct MemoryPlanInput {
  const ModelConfig* cfg = nullptr;
  const OffloadPolicy* policy = nullptr;
  int64_t context = 0;        // tokens (prompt + generation)
  int max_chunk = 256;
  double weight_bytes = 0;    // as the model holds them (mapped file pages count: they become resident)
  DType kv_dtype = DType::F32;
  bool from_pack = false;     // context restored from a pack: top-k layers never fill the model's cache
  bool retrieval_rings = false;  // top-k layers prefill into rings of max_chunk (ModelOptions::host_kv_past)
  std::vector<std::string> extra_indexes;  // index build: more indexes per head beside policy->index
  std::vector<MemoryPlan::Line> device_lines;  // the offload runtime's GPU memory (OffloadRuntime::device_plan)
};

// Host: weights, the model's KV caches (full-context layers hold the whole
// context during prefill even under --attn topk: prefill is dense), the
// offloaded stores (K and V), the indexes (KvIndex::bytes_per_key_estimate)
// and the sinks + window. GPU: the offload runtime's lines as it gives them
// (device_lines); the model's own weights and caches on the GPU are counted
// by the backend when it loads them (--gpu-mem-budget), not here.
MemoryPlan plan_memory(const MemoryPlanInput& in);

// host_memory_available(): src/common/host_memory.h (MemAvailable, RLIMIT_AS, cgroup).

// Throws Error with the plan when the host total exceeds `available` (skipped
// when available is 0).
void check_plan_fits(const MemoryPlan& plan, double available);

}  // namespace topkv
