#include "offload/policy.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <numeric>
#include <sstream>

#include "src/common/error.h"

namespace topkv {

const char* attn_mode_name(AttnMode m) { return m == AttnMode::Dense ? "dense" : "topk"; }

AttnMode parse_attn_mode(const std::string& s) {
  if (s == "dense") return AttnMode::Dense;
  if (s == "topk") return AttnMode::TopK;
  fail("unknown attention mode '{}': use dense or topk", s);
}

KSchedule parse_k_schedule(const std::string& s) {
  if (s == "uniform") return KSchedule::Uniform;
  if (s == "linear") return KSchedule::Linear;
  fail("unknown k schedule '{}': use uniform or linear", s);
}

std::vector<int> offloaded_layers(const ModelConfig& cfg, int dense_layers) {
  std::vector<int> out;
  for (int il = 0; il < cfg.n_layer; ++il) {
    const LayerConfig& lc = cfg.layers[(size_t)il];
    if (!lc.sliding && lc.window == 0 && il >= dense_layers) out.push_back(il);
  }
  return out;
}

std::vector<int64_t> k_per_layer(int64_t k_mean, int n_layers, KSchedule schedule) {
  TOPKV_CHECK(k_mean >= 1, "k must be at least 1 (got {})", k_mean);
  std::vector<int64_t> k((size_t)std::max(n_layers, 0), k_mean);
  if (schedule == KSchedule::Uniform || n_layers <= 1) return k;
  // Linear: k_l proportional to (l + 1), sum = k_mean * L.
  const double total = (double)k_mean * n_layers, denom = n_layers * (n_layers + 1) / 2.0;
  std::vector<double> exact((size_t)n_layers);
  int64_t assigned = 0;
  for (int l = 0; l < n_layers; ++l) {
    exact[(size_t)l] = total * (l + 1) / denom;
    k[(size_t)l] = std::max<int64_t>(1, (int64_t)std::floor(exact[(size_t)l]));
    assigned += k[(size_t)l];
  }
  std::vector<int> order((size_t)n_layers);
  std::iota(order.begin(), order.end(), 0);
  // Hand the remainder to the layers furthest below their exact share (later
  // layers first on ties); this keeps k non-decreasing even where the floor of
  // 1 token per layer lifted early layers above their share.
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    double da = exact[(size_t)a] - (double)k[(size_t)a], db = exact[(size_t)b] - (double)k[(size_t)b];
    return da > db || (da == db && a > b);
  });
  for (int i = 0; assigned < (int64_t)total && i < n_layers; ++i, ++assigned) ++k[(size_t)order[(size_t)i]];
  return k;
}

const char* search_on_name(SearchOn s) {
  switch (s) {
    case SearchOn::Auto: return "auto";
    case SearchOn::Host: return "host";
    case SearchOn::Gpu: return "gpu";
  }
  return "?";
}

SearchOn parse_search_on(const std::string& s) {
  if (s == "auto") return SearchOn::Auto;
  if (s == "host") return SearchOn::Host;
  if (s == "gpu") return SearchOn::Gpu;
  fail("unknown search place '{}': use auto, host or gpu", s);
}

void OffloadPolicy::validate() const {
  TOPKV_CHECK(search.k >= 1, "--k must be at least 1 (got {})", search.k);
  TOPKV_CHECK(k_fraction >= 0 && k_fraction <= 1, "--k-fraction must be in [0, 1] (got {})", k_fraction);
  TOPKV_CHECK(dense_layers >= 0, "--dense-layers must be >= 0 (got {})", dense_layers);
  TOPKV_CHECK(sinks >= 0, "--sinks must be >= 0 (got {})", sinks);
  TOPKV_CHECK(window >= 1, "--window must be at least 1 token (got {})", window);
  TOPKV_CHECK(store_dtype == DType::F16 || store_dtype == DType::BF16,
              "the host KV store holds f16 or bf16 (got {})", dtype_name(store_dtype));
  TOPKV_CHECK(device_fold >= 1, "--device-fold must be at least 1 row (got {})", device_fold);
  TOPKV_CHECK(heads_sparsity <= 1, "--heads-sparsity must be in [0, 1] (got {})", heads_sparsity);
  parse_spec(index);  // syntax
}

void OffloadPolicy::apply_json(const std::string& text, const std::string& origin) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const std::exception& e) {
    fail("{}: not valid JSON: {}", origin, e.what());
  }
  TOPKV_CHECK(j.is_object(), "{}: the policy config must be a JSON object", origin);
  for (auto& [key, v] : j.items()) {
    try {
      if (key == "attn") attn = parse_attn_mode(v.get<std::string>());
      else if (key == "index") index = v.get<std::string>();
      else if (key == "k") search.k = v.get<int64_t>();
      else if (key == "k_fraction") k_fraction = v.get<double>();
      else if (key == "k_schedule") k_schedule = parse_k_schedule(v.get<std::string>());
      else if (key == "ef") search.ef = v.get<int>();
      else if (key == "nprobe") search.nprobe = v.get<int>();
      else if (key == "threshold") search.threshold = v.get<double>();
      else if (key == "gqa") search.gqa = v.get<std::string>() == "mean" ? GqaMode::Mean : GqaMode::Union;
      else if (key == "dense_layers") dense_layers = v.get<int>();
      else if (key == "sinks") sinks = v.get<int>();
      else if (key == "window") window = v.get<int>();
      else if (key == "store_type") store_dtype = parse_dtype(v.get<std::string>());
      else if (key == "stage_rows") stage_rows = v.get<bool>();
      else if (key == "search_on") search_on = parse_search_on(v.get<std::string>());
      else if (key == "device_table_type") device_table_type = parse_dtype(v.get<std::string>());
      else if (key == "device_fold") device_fold = v.get<int>();
      else if (key == "sync_folds") sync_folds = v.get<bool>();
      else if (key == "heads_file") heads_file = v.get<std::string>();
      else if (key == "heads_threshold") heads_threshold = v.get<double>();
      else if (key == "heads_sparsity") heads_sparsity = v.get<double>();
      else fail("{}: unknown key '{}' in the policy config", origin, key);
    } catch (const nlohmann::json::exception& e) {
      fail("{}: key '{}' has the wrong type: {}", origin, key, e.what());
    }
  }
  validate();
}

void OffloadPolicy::apply_json_file(const std::string& path) {
  std::ifstream f(path);
  TOPKV_CHECK(f, "cannot open policy config '{}'", path);
  std::stringstream ss;
  ss << f.rdbuf();
  apply_json(ss.str(), path);
}


std::string OffloadPolicy::to_json() const {
  nlohmann::json j = {{"attn", attn_mode_name(attn)},
                      {"index", index},
                      {"k", search.k},
                      {"k_fraction", k_fraction},
                      {"k_schedule", k_schedule == KSchedule::Uniform ? "uniform" : "linear"},
                      {"ef", search.ef},
                      {"nprobe", search.nprobe},
                      {"threshold", search.threshold},
                      {"gqa", search.gqa == GqaMode::Mean ? "mean" : "union"},
                      {"dense_layers", dense_layers},
                      {"sinks", sinks},
                      {"window", window},
                      {"store_type", dtype_name(store_dtype)},
                      {"stage_rows", stage_rows},
                      {"search_on", search_on_name(search_on)},
                      {"device_table_type", dtype_name(device_table_type)},
                      {"device_fold", device_fold},
                      {"sync_folds", sync_folds},
                      {"heads_file", heads_file},
                      {"heads_threshold", heads_threshold},
                      {"heads_sparsity", heads_sparsity}};
  return j.dump(2);
}

}  // namespace topkv
