// Each subcommand registers itself on the CLI11 app; main.cpp lists them.
#pragma once
#include <CLI/CLI.hpp>

namespace topkv::cli {

void register_info(CLI::App& app);
void register_bench(CLI::App& app);  // bench recall (and later bench decode)
void register_bench_gpu(CLI::App& app);  // bench gpu-ops (bench/gpu_ops_bench.cpp); after register_bench
void register_model(CLI::App& app);  // model synth, model info
void register_tokenize(CLI::App& app);
void register_generate(CLI::App& app);  // generate: prompt in, tokens out (src/cli/cmd_generate.cpp)
void register_eval(CLI::App& app);      // eval passkey (src/cli/cmd_eval.cpp)
void register_kv(CLI::App& app);        // kv dump (src/cli/cmd_kv.cpp)
void register_index(CLI::App& app);     // index build, index info: context packs (src/cli/cmd_index.cpp)
void register_bench_recall(CLI::App& bench);  // bench/recall_cli.cpp

}  // namespace topkv::cli
