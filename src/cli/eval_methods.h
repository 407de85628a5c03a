// What `topkv eval passkey` and `topkv eval ruler` share on the command line:
// the top-k methods to compare with dense decoding (the cross product of
// --methods-index, --methods-k, --methods-dense-layers, --methods-k-schedule
// over the policy options), and small output helpers.
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "offload/policy.h"

namespace topkv::cli {

struct MethodArgs {
  std::vector<std::string> indexes, ks, dense_layers, schedules;
};
// Adds the four options; `indexes` and `ks` hold their defaults.
void add_method_options(CLI::App* cmd, MethodArgs& a);

struct EvalMethod {
  std::string name;   // "topk:quest@2%", with "/dl2" for dense layers and "/linear" for the schedule
  std::string index;  // the spec as given
  std::string k;      // as given: "64" or "2%"
  OffloadPolicy policy;
};
// The cross product over `base` (the policy options). Methods that share a
// build (index spec, dense layers) are adjacent (eval/shared_context.h).
// Throws Error on a bad spec, k (0, over 100%, not a number), dense-layer
// count or schedule, before any model work.
std::vector<EvalMethod> make_eval_methods(const MethodArgs& a, const OffloadPolicy& base);

// Refuses --index and --k (the methods come from --methods-*).
void check_no_single_method(const CLI::App& cmd, const char* command);

// A CSV field: quoted (with quotes doubled) when it holds a comma, a quote or a line break.
std::string csv_field(const std::string& s);

void register_eval_ruler(CLI::App& eval);  // src/cli/cmd_eval_ruler.cpp

}  // namespace topkv::cli
