// Whole-model rows of `topkv bench gpu-ops` (bench/gpu_model_bench.cpp):
// prefill and the decode step of a GGUF model on the CUDA backend, the step
// timed op by op, replayed as a recorded step (CUDA graph), and replayed
// with the greedy pick made on the device (4 bytes back instead of the
// logits). Synthetic presets (src/model/synth.h) are written to a temporary
// file first, so the rows need no download.
#pragma once
#include <functional>
#include <string>

#include "src/model/backend.h"

namespace topkv::bench {

// Where rows go: add(group, case, microseconds, bytes, flops), note(group, case, text).
struct RowSink {
  std::function<void(const std::string&, const std::string&, double, double, double)> add;
  std::function<void(const std::string&, const std::string&, const std::string&)> note;
};

struct ModelBenchOptions {
  int prompt = 512;  // random prompt tokens prefilled first
  int decode = 64;   // timed steps per mode (median reported)
  WeightMode weights = WeightMode::Quant;  // how the device holds the matrices (--weights quant|f16)
  std::string synth_type = "f16";          // synthetic matrices: a GGML type name, or "preset" (its own type)
};

// One GGUF file; `label` prefixes its rows.
void bench_model_file(Backend& cuda, const std::string& path, const std::string& label, const ModelBenchOptions& o,
                      const RowSink& sink);

// Synthetic presets, comma-separated: "gemma3-270m", "llama3-8b@4" (the preset
// with its first 4 layers only: the full 32 would take minutes to write).
// Matrices are written as o.synth_type: F16 by default (random F16 rows are
// quick to write), "preset" keeps the preset's own type (llama3-8b: Q4_K,
// gemma3-270m: Q8_0), any GGML type name forces that one. "none" or ""
// runs nothing.
void bench_synth_models(Backend& cuda, const std::string& list, const ModelBenchOptions& o, const RowSink& sink);

}  // namespace topkv::bench
