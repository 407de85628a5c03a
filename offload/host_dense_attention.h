// HostDenseAttention: the llama.cpp `--no-kv-offload` baseline. The KV of
// every offloaded layer (offloaded_layers(): full-context layers from
// `dense_layers` on, the same layers the top-k runtime takes) lives in host
// memory, fp16 or fp32 rows per KV head, growing by one row per decode step,
// and each step computes EXACT attention over all of it on the CPU cores.
//
// One step of one layer is split over KV heads AND key blocks (split-K): each
// task scans one block of one KV head once for all the query heads of its GQA
// group and returns one partial (m, l, o) per query head
// (offload/partial_attention.h); the blocks of a head merge with the exact
// log-sum-exp merge. So the keys are read once per step, by every core at
// once, which is what bounds this baseline: host memory bandwidth.
//
// It takes its context like OffloadRuntime (take_prefill after a real
// prefill, take_context from any KvReader), so every fill path serves both.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "index/row_store.h"
#include "offload/offload_runtime.h"
#include "src/model/attention_override.h"
#include "src/model/model_config.h"

namespace topkv {

class HostDenseAttention : public AttentionOverride {
 public:
  // dtype: element type of the host rows (f16 as llama.cpp keeps its cache, or
  // f32). Throws Error when the model has no layer to serve.
  HostDenseAttention(const ModelConfig& cfg, int dense_layers, DType dtype, bool progress = true);

  bool overrides(int layer) const override;
  void take_prefill(const Model& model) override;
  void take_context(int64_t n, const KvReader& read);
  void decode_attention(int layer, const float* q, const float* k, const float* v, int64_t pos, float scale,
                        float* out) override;

  const std::vector<int>& layers() const { return layers_; }
  // steps, attend_s (the whole host attention), build_s (take_context); the
  // search and GPU fields stay 0: nothing is searched, nothing is on a GPU.
  const OffloadStats& stats() const { return stats_; }
  size_t host_bytes() const;  // the rows held (K and V)
  int64_t n_tokens(int layer) const;
  std::string describe() const;

  // Keys per split-K block: at least kMinBlock, and enough blocks that every
  // core has a few tasks (blocks_per_head is public for the tests).
  static constexpr int64_t kMinBlock = 2048;
  static int64_t blocks_per_head(int64_t n_keys, int kv_heads, int threads);

 private:
  struct Head {
    std::unique_ptr<RowStore> k, v;
  };
  ModelConfig cfg_;
  DType dtype_;
  bool progress_;
  std::vector<int> layers_;              // model layer ids
  std::vector<int> slot_;                // model layer -> index into heads_ (-1: not served)
  std::vector<std::vector<Head>> heads_; // [slot][kv head]
  OffloadStats stats_;
};

}  // namespace topkv
