// Backend memory a Model will hold, estimated before it is built, so that the
// decode benchmark can skip a row that cannot fit --gpu-mem-budget (with the
// numbers) instead of uploading weights first and failing half way.
//
// Weights as the backend prepares them (gpu/cuda_backend.h): the CUDA
// backend with --weights quant keeps a quantised matrix's blocks (the file's
// bytes) and reserves a dequantisation scratch for its prefill (the largest
// such matrix in fp16, at most 256 MiB, counted under scratch); other
// matrices, and every one with --weights f16, as fp16/bf16 (2 bytes an
// element); 1-row weights as fp32. The CPU backend keeps the file's rows
// (quant) or 4 bytes an element (f32). Caches and scratch as Model plans
// them. The CUDA backend's other work space (cuBLAS, attention partials) is
// not included: its ledger still enforces the budget exactly when the model
// is built.
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
