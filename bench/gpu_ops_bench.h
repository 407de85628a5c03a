// The run behind `topkv bench gpu-ops` (bench/gpu_ops_bench.cpp says what it
// times; its command line: src/cli/cmd_bench_gpu.cpp).
#pragma once
#include <string>

namespace topkv::bench {

struct GpuOpsArgs {
  int device = 0;
  int reps = 50;
  std::string out;
  std::string model;
  int prompt = 512, decode = 64;
  std::string synth = "gemma3-270m,llama3-8b@4";
  std::string synth_type = "f16";
  std::string weights = "quant";
  bool quick = false;
  bool model_only = false;
  std::string only;
};

// Times every group (or --only's) on CUDA device a.device. Error in a build
// without CUDA.
void run_gpu_ops(const GpuOpsArgs& a);

}  // namespace topkv::bench
