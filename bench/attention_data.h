// AttentionHead / AttentionData: the attention inputs a benchmark runs on, from
// either source (bench/synthetic.h or a KV dump, bench/kv_dump.h).
//
// One AttentionHead is one KV head of one layer: its keys and values in
// RowStores (the stores the runtime uses, so indexes read them in place) and
// the decode-step queries of its G query heads, post-RoPE, exactly as the
// model dots them with the keys. Query j of query head g is the row
// queries[(j * group + g) * dim]; the G rows of one decode step are contiguous,
// which is the layout KvIndex::search takes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "index/row_store.h"

namespace topkv {

struct AttentionHead {
  std::shared_ptr<RowStore> keys, values;  // n rows each
  std::vector<float> queries;              // [n_queries][group][dim] fp32
  int n_queries = 0;
  int group = 1;  // GQA: query heads served by this KV head

  int dim() const { return keys ? keys->dim() : 0; }
  int64_t n_keys() const { return keys ? keys->size() : 0; }
  // The G query vectors of decode step j (contiguous).
  const float* step_queries(int j) const { return queries.data() + (size_t)j * group * dim(); }
};

struct AttentionData {
  std::vector<AttentionHead> heads;  // KV heads of one layer (or the chosen subset)
  float scale = 0.f;                 // attention score scale: softmax(scale * q·k)
  std::string source;                // human-readable origin, e.g. "synthetic seed=1" or "dump.safetensors layer 3"
};

}  // namespace topkv
