// The offloading-policy options shared by every command that decodes
// (generate, eval passkey, index build): --attn, --index, --k, ... and
// --config FILE (JSON, see offload/policy.h). Command-line flags win over the
// config file.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>

#include "offload/policy.h"

namespace topkv::cli {

struct PolicyArgs {
  OffloadPolicy policy;
  std::string config, attn, k_schedule, gqa, store_type;
  std::vector<std::string> indexes;  // --index, in the order given
  // Builds the policy: `base` (the defaults, or a context pack's policy),
  // then the config file's keys, then the flags given; the policy's index is
  // the first --index. Throws Error, also when --index is given more than
  // once unless `many_indexes` (index build: the others are extra indexes).
  OffloadPolicy resolve(const CLI::App& cmd, const OffloadPolicy& base = {}, bool many_indexes = false) const;
};

// Adds the options to `cmd` in an "Attention policy" group.
void add_policy_options(CLI::App* cmd, const std::shared_ptr<PolicyArgs>& a);

}  // namespace topkv::cli
