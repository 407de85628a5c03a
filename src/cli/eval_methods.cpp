#include "src/cli/eval_methods.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "src/cli/policy_options.h"
#include "src/common/error.h"
#include "src/common/options.h"

namespace topkv::cli {

void add_method_options(CLI::App* cmd, MethodArgs& a) {
  cmd->add_option("--methods-index", a.indexes, "Index backends to evaluate (repeat, or a comma list whose specs "
                  "may carry parameters: multipole,multipole:levels=2,coarse_ratio=64)")
      ->capture_default_str();
  cmd->add_option("--methods-k", a.ks, "k values: a number of tokens, or a percentage of the prompt like 1%")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--methods-dense-layers", a.dense_layers, "Dense first layers per method, e.g. 0,2 (default: "
                  "--dense-layers)")->delimiter(',');
  cmd->add_option("--methods-k-schedule", a.schedules, "k schedules per method: uniform, linear, ends, "
                  "weights:w0/w1/... (default: --k-schedule)")->delimiter(',');
}

std::vector<EvalMethod> make_eval_methods(const MethodArgs& a, const OffloadPolicy& base) {
  std::vector<std::string> specs;
  for (const std::string& value : a.indexes)
    for (std::string& spec : split_index_specs(value)) specs.push_back(std::move(spec));
  TOPKV_CHECK(!specs.empty() && !a.ks.empty(), "give at least one --methods-index and one --methods-k");
  for (const std::string& spec : specs) KvIndex::create(spec);  // a bad spec fails before any prefill
  std::vector<int> dense_layers;
  for (const std::string& d : a.dense_layers) {
    char* end = nullptr;
    const long v = std::strtol(d.c_str(), &end, 10);
    TOPKV_CHECK(!d.empty() && *end == '\0' && v >= 0 && v < (1 << 20), "--methods-dense-layers '{}' is not a layer "
                "count (0, 1, 2, ...)", d);
    dense_layers.push_back((int)v);
  }
  if (dense_layers.empty()) dense_layers.push_back(base.dense_layers);
  std::vector<std::string> schedules;
  for (const std::string& s : a.schedules) {
    OffloadPolicy check;
    set_k_schedule(check, s);  // a bad schedule fails before any prefill
    schedules.push_back(s);
  }
  if (schedules.empty()) schedules.push_back(k_schedule_spec(base));

  std::vector<EvalMethod> out;
  for (const std::string& idx : specs)
    for (int dl : dense_layers)
      for (const std::string& k : a.ks)
        for (const std::string& sched : schedules) {
          EvalMethod m{fmt::format("topk:{}@{}", idx, k), idx, k, base};
          if (dl != 0) m.name += fmt::format("/dl{}", dl);
          if (sched != "uniform") m.name += "/" + sched;
          OffloadPolicy& p = m.policy;
          p.attn = AttnMode::TopK, p.index = idx, p.dense_layers = dl;
          set_k_schedule(p, sched);
          // Search-time parameters of the spec (rerank on a backend that
          // reranks) move into the policy's SearchParams, so "multipole" and
          // "multipole:rerank=4" share one build and one temporary pack
          // (eval/shared_context.h).
          p.index = KvIndex::split_search_params(idx, p.search);
          if (!k.empty() && k.back() == '%') {
            const std::vector<double> pct = parse_double_list(k.substr(0, k.size() - 1));
            TOPKV_CHECK(pct.size() == 1 && pct[0] > 0 && pct[0] <= 100, "--methods-k {} must be a percentage in "
                        "(0%, 100%]", k);
            p.k_fraction = pct[0] / 100.0, p.k_min = 1, p.k_max = 0;  // that share exactly, as named
          } else {
            p.search.k = parse_count(k);
            p.k_fraction = 0;
          }
          p.validate();
          // A method given twice (--methods-k 2% --methods-k 2%,5%) runs once: its name says all it is.
          const auto same = [&](const EvalMethod& o) { return o.name == m.name; };
          if (std::none_of(out.begin(), out.end(), same)) out.push_back(std::move(m));
        }
  return out;
}

void check_no_single_method(const CLI::App& cmd, const char* command) {
  TOPKV_CHECK(cmd.count("--index") == 0 && cmd.count("--k") == 0 && cmd.count("--k-fraction") == 0,
              "{} takes its methods from --methods-index and --methods-k, not --index/--k/--k-fraction", command);
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n\r") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace topkv::cli
