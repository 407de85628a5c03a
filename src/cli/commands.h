// Each subcommand registers itself on the CLI11 app; main.cpp lists them.
#pragma once
#include <CLI/CLI.hpp>

namespace topkv::cli {

void register_info(CLI::App& app);
void register_bench(CLI::App& app);  // bench recall (and later bench decode)
void register_bench_gpu(CLI::App& app);  // bench gpu-ops (src/cli/cmd_bench_gpu.cpp; run: bench/gpu_ops_bench.h); after register_bench
void register_model(CLI::App& app);  // model synth, model info
void register_tokenize(CLI::App& app);
void register_generate(CLI::App& app);  // generate: prompt in, tokens out (src/cli/cmd_generate.cpp)
void register_eval(CLI::App& app);      // eval passkey (src/cli/cmd_eval.cpp)
void register_kv(CLI::App& app);        // kv dump (src/cli/cmd_kv.cpp)
void register_index(CLI::App& app);     // index build, index info: context packs (src/cli/cmd_index.cpp)
void register_serve(CLI::App& app);     // serve: the OpenAI-compatible HTTP server (src/cli/cmd_serve.cpp)
void register_bench_recall(CLI::App& bench);  // src/cli/cmd_bench_recall.cpp (run: bench/recall_run.h)

}  // namespace topkv::cli
