// topkv: one executable, subcommands registered by src/cli/cmd_*.cpp.
#include <cstdio>

#include "src/cli/commands.h"
#include "src/common/error.h"

int main(int argc, char** argv) {
  CLI::App app{"topkv: million-token LLM generation on one GPU, with the KV cache in host memory behind "
               "per-head vector indexes"};
  app.set_version_flag("--version", std::string("topkv ") + TOPKV_VERSION);
  app.require_subcommand(1);
  topkv::cli::register_info(app);
  topkv::cli::register_bench(app);
  topkv::cli::register_bench_gpu(app);
  topkv::cli::register_model(app);
  topkv::cli::register_tokenize(app);
  topkv::cli::register_generate(app);
  topkv::cli::register_eval(app);
  topkv::cli::register_kv(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const topkv::Error& e) {
    std::fprintf(stderr, "topkv: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "topkv: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
