// Backend memory a Model will hold, estimated before it is built, so that the
// decode benchmark can skip a row that cannot fit --gpu-mem-budget (with the
// numbers) instead of uploading weights first and failing half way.
//
// Weights as the backend prepares them: the CUDA backend keeps every matrix
// as fp16/bf16 (2 bytes an element) and 1-row weights as fp32
// (gpu/cuda_backend.h); the CPU backend with quantised weights keeps the
// file's rows. Caches and scratch as Model plans them. The CUDA backend's own
// work space (cuBLAS, attention partials) is not included: its ledger still
// enforces the budget exactly when the model is built.
#pragma once
#include <string>

#include "src/model/gguf.h"
#include "src/model/model.h"

namespace topkv {

struct ModelMemory {
  double weights = 0, kv = 0, scratch = 0;  // bytes
  double total() const { return weights + kv + scratch; }
  std::string describe() const;  // "weights 1.20 GiB + KV cache 4.00 GiB + scratch 12.00 MiB"
};

ModelMemory estimate_model_memory(const GgufFile& file, const ModelConfig& cfg, const ModelOptions& opt, bool cuda);

}  // namespace topkv
