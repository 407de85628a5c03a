// The offloading-policy options shared by every command that decodes
// (generate, eval passkey, index build): --attn, --index, --k, ... and
// --config FILE (JSON, see offload/policy.h). Command-line flags win over the
// config file.
#pragma once
#include <CLI/CLI.hpp>
#include <memory>

#include "offload/policy.h"

namespace topkv::cli {

// The defaults a run starts from when no context pack gives its own: the
// policy's, with k following the context (kDefaultKFraction within
// [kDefaultKMin, kDefaultKMax], offload/policy.h says why).
OffloadPolicy cli_default_policy();

struct PolicyArgs {
  OffloadPolicy policy;
  std::string config, attn, k_schedule, gqa, store_type, store_type_at, search_on, build_on, device_table_type, store_cache;
  std::vector<std::string> indexes;  // --index values, in the order given
  // Every index spec those name (split_index_specs of each), in order.
  std::vector<std::string> index_specs() const;
  // Builds the policy: `base` (the defaults, or a context pack's policy),
  // then the config file's keys, then the flags given; the policy's index is
  // the first spec. Throws Error, also when --index names several unless
  // `many_indexes` (index build: extra indexes; bench decode: one row each).
  OffloadPolicy resolve(const CLI::App& cmd, const OffloadPolicy& base = cli_default_policy(),
                        bool many_indexes = false) const;
};

// Several index specs in one flag value, "multipole,hnswlib:M=32,efc=200,quest":
// a comma starts a new spec unless what follows is a parameter of the current
// one (has '=' and no ':'). Throws Error on an empty spec.
std::vector<std::string> split_index_specs(const std::string& list);

// Adds the options to `cmd` in an "Attention policy" group.
void add_policy_options(CLI::App* cmd, const std::shared_ptr<PolicyArgs>& a);

}  // namespace topkv::cli
