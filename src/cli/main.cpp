// topkv: one executable, subcommands registered by src/cli/cmd_*.cpp.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <new>

#include "src/cli/commands.h"
#include "src/common/error.h"
#include "src/common/mapped_file.h"

namespace {

// OpenMP threads that spin while they wait (libgomp's default) starve each
// other when the cores are shared: measured on a loaded 2-core machine,
// decode ran 0.4 tok/s spinning and 14 tok/s sleeping. libgomp reads
// OMP_WAIT_POLICY once at load, so unless the user chose a policy the
// process re-executes itself with it set to passive (every subcommand: generate,
// eval, kv dump and the benchmarks all run OpenMP regions).
void ensure_passive_openmp_wait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY")) return;
  setenv("OMP_WAIT_POLICY", "passive", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: carry on spinning
}

}  // namespace

int main(int argc, char** argv) {
  ensure_passive_openmp_wait(argv);
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
  topkv::cli::register_index(app);
  topkv::cli::register_serve(app);
  try {
    app.parse(argc, argv);
    topkv::check_mapped_files_unchanged();  // a model or pack rewritten under the run: not a success
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const topkv::Error& e) {
    std::fprintf(stderr, "topkv: error: %s\n", e.what());
    return 1;
  } catch (const std::filesystem::filesystem_error& e) {  // a file that went away or cannot be read mid-run
    std::fprintf(stderr, "topkv: error: %s: %s\n", e.path1().c_str(), e.code().message().c_str());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "topkv: error: out of memory: the run needs more host memory than this process may take "
                 "(check `ulimit -v`, the container's memory limit and the sizes given); lower the context (-c), the "
                 "model or the benchmark sizes\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "topkv: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
