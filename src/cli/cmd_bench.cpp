// topkv bench: benchmarks. `bench recall` lives in bench/recall_cli.cpp.
#include "src/cli/commands.h"

namespace topkv::cli {

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks: ANN recall on attention data");
  bench->require_subcommand(1);
  register_bench_recall(*bench);
}

}  // namespace topkv::cli
