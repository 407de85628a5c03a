#include "bench/decode_memory.h"

#include <fmt/format.h>

#include "src/common/options.h"

namespace topkv {

std::string ModelMemory::describe() const {
  return fmt::format("weights {} + KV cache {} + scratch {}", format_bytes(weights), format_bytes(kv),
                     format_bytes(scratch));
}

ModelMemory estimate_model_memory(const GgufFile& file, const ModelConfig& cfg, const ModelOptions& opt, bool cuda) {
  ModelMemory m;
  for (const GgufTensor& t : file.tensors()) {
    const double elements = (double)t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
    if (cuda) m.weights += elements * (t.ne[1] > 1 ? 2.0 : 4.0);
    else m.weights += opt.weights == WeightMode::Quant ? (double)t.nbytes : elements * 4.0;
  }
  for (int il = 0; il < cfg.n_layer; ++il)
    m.kv += 2.0 * (double)Model::planned_kv_capacity(cfg, opt, il) * cfg.n_head_kv * cfg.head_dim *
            dtype_size(opt.kv_dtype);
  m.scratch = (double)Model::planned_scratch_bytes(cfg, opt);
  return m;
}

}  // namespace topkv
