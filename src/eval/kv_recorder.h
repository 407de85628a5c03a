// KvRecorder: serves the chosen layers' decode attention exactly (dense, over
// the prompt's keys and the generated ones) while recording what a KV dump
// holds (bench/kv_dump.h): the prompt's post-RoPE keys and values per KV head
// and every decode step's queries. `topkv kv dump` runs a model with it.
#pragma once
#include <vector>

#include "bench/attention_data.h"
#include "src/model/attention_override.h"
#include "src/model/model_config.h"

namespace topkv {

class KvRecorder final : public AttentionOverride {
 public:
  // layers: the model layers to record (full-context layers only).
  KvRecorder(const ModelConfig& cfg, std::vector<int> layers, DType store_dtype);

  bool overrides(int layer) const override;
  void take_prefill(const Model& model) override;
  void decode_attention(int layer, const float* q, const float* k, const float* v, int64_t pos, float scale,
                        float* out) override;

  const std::vector<int>& layers() const { return layers_; }
  // The recorded data of layers()[i]: every KV head, with queries.
  const AttentionData& data(size_t i) const { return data_[i]; }
  int64_t prompt_tokens() const { return n_prompt_; }

 private:
  ModelConfig cfg_;
  std::vector<int> layers_;
  DType dtype_;
  int64_t n_prompt_ = 0;
  std::vector<AttentionData> data_;                     // per recorded layer
  std::vector<std::vector<std::vector<float>>> gen_k_, gen_v_;  // [layer][kv head] generated rows
};

}  // namespace topkv
