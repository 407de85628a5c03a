#include "bench/decode_memory.h"

#include <fmt/format.h>

#include <algorithm>

#include "src/common/options.h"

namespace topkv {

std::string ModelMemory::describe() const {
  return fmt::format("weights {} + KV cache {} + scratch {}", format_bytes(weights), format_bytes(kv),
                     format_bytes(scratch));
}

ModelMemory estimate_model_memory(const GgufFile& file, const ModelConfig& cfg, const ModelOptions& opt, bool cuda) {
  ModelMemory m;
  constexpr double kDequantScratchMax = 256.0 * 1024 * 1024;  // CudaBackend::kDequantScratchMax
  double dequant_scratch = 0;
  for (const GgufTensor& t : file.tensors()) {
    const double elements = (double)t.nelements();
    const bool quantised = t.type != GgmlType::F32 && t.type != GgmlType::F16 && t.type != GgmlType::BF16;
    if (!cuda) {
      m.weights += opt.weights == WeightMode::Quant ? (double)t.nbytes : elements * 4.0;
    } else if (t.nrows() == 1) {
      m.weights += elements * 4.0;
    } else if (opt.weights == WeightMode::Quant && quantised) {
      m.weights += (double)t.nbytes;
      dequant_scratch = std::max(dequant_scratch, std::min(elements * 2.0, kDequantScratchMax));
    } else {
      m.weights += elements * 2.0;
    }
  }
  for (int il = 0; il < cfg.n_layer; ++il)
    m.kv += 2.0 * (double)Model::planned_kv_capacity(cfg, opt, il) * cfg.n_head_kv * cfg.head_dim *
            dtype_size(opt.kv_dtype);
  m.scratch = (double)Model::planned_scratch_bytes(cfg, opt) + dequant_scratch;
  return m;
}

}  // namespace topkv
