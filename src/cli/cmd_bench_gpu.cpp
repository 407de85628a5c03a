// topkv bench gpu-ops: the command line; the run is bench/gpu_ops_bench.h.
#include <memory>

#include "bench/gpu_ops_bench.h"
#include "src/cli/commands.h"
#include "src/common/cli_files.h"

namespace topkv::cli {

void register_bench_gpu(CLI::App& app) {
  auto* bench = app.get_subcommand("bench");
  auto a = std::make_shared<bench::GpuOpsArgs>();
  auto* cmd = bench->add_subcommand(
      "gpu-ops", "Time the CUDA backend's kernels (GEMV/GEMM, attention, norms, sampling) at real model shapes "
                 "against the measured copy bandwidth; optionally a whole GGUF model's prefill and decode");
  cmd->add_option("--device", a->device, "CUDA device ordinal (default 0)");
  cmd->add_option("--reps", a->reps, "Timed runs per case; the median is reported (default 50)");
  cmd->add_option("--out", a->out, "Also write one JSON object per row to this file")->check(output_file("--out file"));
  cmd->add_option("--model", a->model, "A GGUF model to time end to end (prefill, then greedy decode)");
  cmd->add_option("--synth", a->synth,
                  "Synthetic presets to time end to end, comma-separated; PRESET@N keeps N layers; 'none' skips "
                  "(default gemma3-270m,llama3-8b@4)");
  cmd->add_option("--synth-type", a->synth_type, "Weight type of the synthetic presets' matrices: a GGML type "
                  "(f16, q8_0, q4_k, ...) or 'preset' for the preset's own (llama3-8b: Q4_K, gemma3-270m: Q8_0)")
      ->capture_default_str();
  cmd->add_option("--weights", a->weights, "Model rows: quant keeps the file's quantised blocks on the device "
                  "(decode on the MMVQ kernels), f16 dequantises them to fp16 at load")
      ->check(CLI::IsMember({"quant", "f16"}))
      ->capture_default_str();
  cmd->add_option("--prompt", a->prompt, "Model: prompt tokens, random ids (default 512)");
  cmd->add_option("--decode", a->decode, "Model: decode steps (default 64)");
  cmd->add_flag("--quick", a->quick, "Fewer shapes and smaller buffers (a smoke run)");
  cmd->add_flag("--model-only", a->model_only, "Time only the --model, none of the kernels");
  cmd->add_option("--only", a->only,
                  "Time one group only: 'prefill' (prefill attention, fp32 kernel vs tensor cores), 'search' (the "
                  "device search's steps, and one-level shapes' cut, gather and far rows alone; after the copy "
                  "row), 'quant' (products on quantised weights: MMVQ, grouped launches, dequantised prefill; after "
                  "the copy row), 'attention' (decode attention, the v2 and v3 kernels side by side; after the copy "
                  "row), 'kmeans' (the --build-on gpu k-means on one block of a multipole build), 'bounds' (quest's page "
                  "bounds of one 8B KV head at 512K: the --build-on gpu engine and the host on one thread) or 'rows' (the "
                  "retrieved rows' attention per host store type, f16 / f8 / q8_0: rows over PCIe scattered, in "
                  "pages of 16 back to back and off alignment, and on the device; after the copy row)")
      ->check(CLI::IsMember({"prefill", "search", "quant", "attention", "kmeans", "bounds", "rows"}));
  cmd->callback([a] { bench::run_gpu_ops(*a); });
}

}  // namespace topkv::cli
