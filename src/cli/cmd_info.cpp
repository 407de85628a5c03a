// topkv info: version, build, index backends, CUDA devices.
#include <fmt/format.h>

#include "gpu/device.h"
#include "index/kv_index.h"
#include "src/cli/commands.h"

namespace topkv::cli {

void register_info(CLI::App& app) {
  auto* cmd = app.add_subcommand("info", "Show the build, the index backends and the CUDA devices");
  cmd->callback([] {
    fmt::print("topkv {}\n{}\n\nindex backends:\n", TOPKV_VERSION, cuda_device_summary());
    for (auto& b : index_backends()) fmt::print("  {:<12} {}\n  {:<12} params: {}\n", b.name, b.description, "", b.params_help);
  });
}

}  // namespace topkv::cli
