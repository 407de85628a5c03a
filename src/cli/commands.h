// Each subcommand registers itself on the CLI11 app; main.cpp lists them.
#pragma once
#include <CLI/CLI.hpp>

namespace topkv::cli {

void register_info(CLI::App& app);
void register_bench(CLI::App& app);  // bench recall (and later bench decode)
void register_bench_recall(CLI::App& bench);  // bench/recall_cli.cpp

}  // namespace topkv::cli
