// KV dumps: the attention inputs of a real model, saved as one safetensors
// file (src/common/safetensors.h), for `topkv bench recall --dump`.
//
// The convention (version 1). For every dumped layer L:
//   layer{L}.keys     [kv_heads, n_keys, head_dim]     F32 | F16 | BF16
//   layer{L}.values   [kv_heads, n_keys, head_dim]     same type as the keys
//   layer{L}.queries  [n_queries, q_heads, head_dim]   F32 | F16 | BF16
// Keys and queries are post-RoPE, exactly what the model dots together; the
// queries are decode steps after the context (query j sits at position
// query_position0 + j, key i at key_position0 + i). GQA: q_heads is a
// multiple of kv_heads and query head h is served by KV head
// h / (q_heads / kv_heads) (llama.cpp / Hugging Face `repeat_kv` order).
// Metadata (all strings, as safetensors requires):
//   format = "topkv.kv_dump", format_version = "1"
//   model            the model's name
//   scale            attention score scale, softmax(scale * q·k); when
//                    absent, 1/sqrt(head_dim)
//   key_position0    position of key 0 (default "0"); per layer
//                    "layer{L}.key_position0" overrides it (sliding windows)
//   query_position0  position of decode query 0 (default: key_position0 + n_keys)
//   rope             "applied" (the convention) or "none" (a model without RoPE)
// A dump may hold any subset of layers. Readers ignore tensors and metadata
// they do not know, so a dump can carry more (e.g. token ids as I32/I64).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bench/attention_data.h"
#include "src/common/safetensors.h"

namespace topkv {

struct KvDumpLayerShape {
  int kv_heads = 0, q_heads = 0, head_dim = 0, n_queries = 0;
  int64_t n_keys = 0;
  StDType key_dtype = StDType::F16, query_dtype = StDType::F32;
  int group() const { return q_heads / kv_heads; }
};

class KvDumpReader {
 public:
  explicit KvDumpReader(const std::string& path);  // throws Error on a file that breaks the convention

  const std::string& path() const { return file_.path(); }
  std::string model() const { return file_.metadata_or("model", "unknown"); }
  std::vector<int> layers() const { return layers_; }  // ascending
  // Shapes of one layer's tensors, checked against each other.
  KvDumpLayerShape layer_shape(int layer) const;
  // softmax scale: the metadata's, else 1/sqrt(head_dim).
  float scale(int layer) const;
  int64_t key_position0(int layer) const;
  int64_t query_position0(int layer) const;

  // One KV head of one layer: its keys and values in new RowStores of
  // `dtype` (default: the file's type) and the queries of its G query heads
  // (the first `max_queries` decode steps; 0 = all). skip_keys: the first
  // rows are left out (the attention sinks, which the offloaded runtime
  // attends exactly beside its index).
  AttentionHead load_head(int layer, int kv_head, std::optional<DType> dtype = std::nullopt, int max_queries = 0,
                          int64_t skip_keys = 0) const;
  // Several KV heads of a layer, with the scale and a description filled in.
  AttentionData load(int layer, const std::vector<int>& kv_heads, std::optional<DType> dtype = std::nullopt,
                     int max_queries = 0, int64_t skip_keys = 0) const;

 private:
  SafetensorsReader file_;
  std::vector<int> layers_;
};

// Writes attention data as a dump: one entry per layer, every head of each
// layer's AttentionData (all with the same shapes). Keys and values keep their
// store's type; queries are written as F32.
class KvDumpWriter {
 public:
  explicit KvDumpWriter(std::string model) : model_(std::move(model)) {}
  // `data` must outlive write(); every layer must have the same scale.
  void add_layer(int layer, const AttentionData& data);
  void write(const std::string& path);

 private:
  std::string model_;
  std::vector<std::pair<int, const AttentionData*>> layers_;
  std::vector<std::vector<float>> query_buffers_;  // [n_queries][q_heads][dim] per layer
};

}  // namespace topkv
