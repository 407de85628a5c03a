// The past of a prefill ring (KvLayerCache::ring, src/model/backend.h): the
// positions before the chunk being prefilled, which the model's cache no
// longer holds and its source (the offload runtime's host stores,
// OffloadRuntime) serves run by run.
#pragma once
#include <cstdint>
#include <functional>

#include "src/common/dtype.h"

namespace topkv {

// One run of a layer's past as its source holds it: positions [pos, pos + n)
// of one KV head's keys (or values), n contiguous rows of head_dim elements of
// `dtype` in host memory (pinned memory copies to a device asynchronously).
struct KvPastRun {
  int64_t pos = 0, n = 0;
  const void* rows = nullptr;
  DType dtype = DType::F32;
};

// The past of prefill rings (KvLayerCache::ring): the offload runtime while it
// takes a prefill chunk by chunk (OffloadRuntime::begin_context ... absorb).
class KvPastSource {
 public:
  virtual ~KvPastSource() = default;
  // Positions [0, past_end(layer)) of the model layer can be read.
  virtual int64_t past_end(int layer) const = 0;
  // Calls f, in position order, for the runs that hold positions [begin, end)
  // of `kv_head`'s keys (values when `values`); end <= past_end(layer).
  virtual void past_runs(int layer, int kv_head, bool values, int64_t begin, int64_t end,
                         const std::function<void(const KvPastRun&)>& f) const = 0;
};

}  // namespace topkv
