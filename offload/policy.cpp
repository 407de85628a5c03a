#include "offload/policy.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <numeric>

#include "src/common/error.h"
#include "src/common/file_io.h"
#include "src/common/options.h"

namespace topkv {

namespace {
constexpr Named<AttnMode> kAttnModes[] = {{AttnMode::Dense, "dense"}, {AttnMode::TopK, "topk"}};
constexpr Named<KSchedule> kKSchedules[] = {
    {KSchedule::Uniform, "uniform"}, {KSchedule::Linear, "linear"}, {KSchedule::Ends, "ends"}};
constexpr Named<SearchOn> kSearchOn[] = {{SearchOn::Auto, "auto"}, {SearchOn::Host, "host"}, {SearchOn::Gpu, "gpu"}};
constexpr Named<BuildOn> kBuildOn[] = {
    {BuildOn::Auto, "auto"}, {BuildOn::Host, "host"}, {BuildOn::Gpu, "gpu"}, {BuildOn::Lloyd, "lloyd"}};
}  // namespace

const char* attn_mode_name(AttnMode m) { return name_of(kAttnModes, m); }
AttnMode parse_attn_mode(const std::string& s) { return parse_named(kAttnModes, s, "attention mode"); }
std::vector<std::string> attn_mode_names() { return names_of(kAttnModes); }
const char* k_schedule_name(KSchedule s) { return s == KSchedule::Weights ? "weights" : name_of(kKSchedules, s); }
KSchedule parse_k_schedule(const std::string& s) { return parse_named(kKSchedules, s, "k schedule"); }
std::vector<std::string> k_schedule_names() { return names_of(kKSchedules); }

void set_k_schedule(OffloadPolicy& p, const std::string& spec) {
  static constexpr const char kWeights[] = "weights:";
  if (spec.rfind(kWeights, 0) != 0) {
    TOPKV_CHECK(spec != "weights", "k schedule 'weights' needs its weights: weights:w0/w1/... (one a retrieval "
                "layer, first to last)");
    try {
      p.k_schedule = parse_k_schedule(spec), p.k_weights.clear();
    } catch (const Error& e) {
      fail("{}, or weights:w0/w1/... (one weight a retrieval layer)", e.what());
    }
    return;
  }
  std::vector<double> w;
  std::string list = spec.substr(sizeof(kWeights) - 1);
  for (char& c : list)
    if (c == '/') c = ',';
  try {
    w = parse_double_list(list);
  } catch (const Error& e) {
    fail("k schedule '{}': {} (write weights:w0/w1/..., one positive number a retrieval layer)", spec, e.what());
  }
  TOPKV_CHECK(!w.empty(), "k schedule '{}' has no weights: write weights:w0/w1/..., one a retrieval layer", spec);
  for (double x : w)
    TOPKV_CHECK(std::isfinite(x) && x > 0, "k schedule '{}': every weight must be a positive number (got {})", spec, x);
  p.k_schedule = KSchedule::Weights, p.k_weights = std::move(w);
}

std::string k_schedule_spec(const OffloadPolicy& p) {
  if (p.k_schedule != KSchedule::Weights) return k_schedule_name(p.k_schedule);
  std::string out = "weights:";
  for (size_t i = 0; i < p.k_weights.size(); ++i) out += fmt::format("{}{}", i ? "/" : "", p.k_weights[i]);
  return out;
}

void set_device_table_spec(OffloadPolicy& p, const std::string& spec) {
  p.device_table_by_budget = spec == "auto";
  p.device_table_type = p.device_table_by_budget ? DType::F16 : parse_table_dtype(spec);
}

std::string device_table_spec(const OffloadPolicy& p) {
  return p.device_table_by_budget ? "auto" : dtype_name(p.device_table_type);
}

DType OffloadPolicy::store_dtype_of(int layer) const {
  const auto it = store_dtype_at.find(layer);
  return it == store_dtype_at.end() ? store_dtype : it->second;
}

void set_store_type_at(OffloadPolicy& p, const std::string& spec) {
  std::map<int, DType> at;
  if (!spec.empty())
    for (const std::string& item : split_list(spec)) {
      const size_t eq = item.find('=');
      int layer = -1;
      const char* end = item.data() + std::min(eq, item.size());
      const auto [ptr, ec] = std::from_chars(item.data(), end, layer);
      TOPKV_CHECK(eq != std::string::npos && ec == std::errc() && ptr == end && layer >= 0 && eq + 1 < item.size(),
                  "store types per layer are written LAYER=TYPE[,LAYER=TYPE...] with layers counted from 0, e.g. "
                  "0=f16 (got '{}' in '{}')", item, spec);
      TOPKV_CHECK(!at.count(layer), "--store-type-at names layer {} twice ('{}')", layer, spec);
      at[layer] = parse_store_dtype(item.substr(eq + 1));
    }
  p.store_dtype_at = std::move(at);
}

std::string store_type_at_spec(const OffloadPolicy& p) {
  std::string s;
  for (const auto& [layer, type] : p.store_dtype_at)
    s += fmt::format("{}{}={}", s.empty() ? "" : ",", layer, dtype_name(type));
  return s;
}

std::string DeviceTableChoice::name() const {
  return page_factor > 1 ? fmt::format("{}, pages x{}", dtype_name(type), page_factor) : dtype_name(type);
}

const char* search_on_name(SearchOn s) { return name_of(kSearchOn, s); }
SearchOn parse_search_on(const std::string& s) { return parse_named(kSearchOn, s, "search place"); }
std::vector<std::string> search_on_names() { return names_of(kSearchOn); }
const char* build_on_name(BuildOn b) { return name_of(kBuildOn, b); }
BuildOn parse_build_on(const std::string& s) { return parse_named(kBuildOn, s, "build place"); }
std::vector<std::string> build_on_names() { return names_of(kBuildOn); }

std::vector<int> offloaded_layers(const ModelConfig& cfg, int dense_layers) {
  std::vector<int> out;
  for (int il = 0; il < cfg.n_layer; ++il) {
    const LayerConfig& lc = cfg.layers[(size_t)il];
    if (!lc.sliding && lc.window == 0 && il >= dense_layers) out.push_back(il);
  }
  return out;
}

double store_bytes_per_position(const ModelConfig& cfg, const OffloadPolicy& p) {
  double bytes = 0;
  for (int il : offloaded_layers(cfg, p.dense_layers))
    bytes += 2.0 * cfg.n_head_kv * (double)dtype_bytes(p.store_dtype_of(il), (size_t)cfg.head_dim);
  return bytes;
}

std::vector<int64_t> k_per_layer(int64_t k_mean, int n_layers, KSchedule schedule,
                                 const std::vector<double>& weights) {
  TOPKV_CHECK(k_mean >= 1, "k must be at least 1 (got {})", k_mean);
  TOPKV_CHECK(schedule != KSchedule::Weights || (int64_t)weights.size() == n_layers,
              "the k schedule gives {} layer weights but the model has {} retrieval layers: give one weight a "
              "retrieval layer, first to last (the global-attention layers past --dense-layers)", weights.size(), n_layers);
  std::vector<int64_t> k((size_t)std::max(n_layers, 0), k_mean);
  if (schedule == KSchedule::Uniform || n_layers <= 1) return k;
  // k_l proportional to the layer's weight, sum = k_mean * L.
  std::vector<double> weight((size_t)n_layers);
  for (int l = 0; l < n_layers; ++l)
    weight[(size_t)l] = schedule == KSchedule::Weights ? weights[(size_t)l]
                        : schedule == KSchedule::Linear ? l + 1.0
                                                        : 1.0 + std::fabs(2.0 * l / (n_layers - 1) - 1.0);
  const double total = (double)k_mean * n_layers, denom = std::accumulate(weight.begin(), weight.end(), 0.0);
  std::vector<double> exact((size_t)n_layers);
  int64_t assigned = 0;
  for (int l = 0; l < n_layers; ++l) {
    exact[(size_t)l] = total * weight[(size_t)l] / denom;
    k[(size_t)l] = std::max<int64_t>(1, (int64_t)std::floor(exact[(size_t)l]));
    assigned += k[(size_t)l];
  }
  std::vector<int> order((size_t)n_layers);
  std::iota(order.begin(), order.end(), 0);
  // Hand the remainder to the layers furthest below their exact share (later
  // layers first on ties); this keeps a linear schedule non-decreasing even
  // where the floor of 1 token per layer lifted early layers above their share.
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    double da = exact[(size_t)a] - (double)k[(size_t)a], db = exact[(size_t)b] - (double)k[(size_t)b];
    return da > db || (da == db && a > b);
  });
  for (int i = 0; assigned < (int64_t)total && i < n_layers; ++i, ++assigned) ++k[(size_t)order[(size_t)i]];
  return k;
}

int64_t parse_store_cache(const std::string& s) {
  if (s == "auto") return -1;
  if (s == "off") return 0;
  try {
    return (int64_t)std::min<uint64_t>(parse_size(s), (uint64_t)INT64_MAX);
  } catch (const Error&) {
    fail("--store-cache '{}' is not auto, off or a size such as 16G", s);
  }
}

// The bounds every policy value is checked against, wherever it came from
// (options, --config, a pack's manifest). The sizes bound what one run can
// hold (a window or sinks past 2^30 tokens would overflow the memory plan's
// per-head sums long before any host has the memory).
namespace {
constexpr int64_t kMaxTokens = int64_t{1} << 30;
constexpr int kMaxEf = 1 << 24;
constexpr int kMaxLayers = 1 << 16;

void check_unit(double v, const char* name, bool allow_unset = false) {
  if (allow_unset && v == -1.0) return;
  TOPKV_CHECK(std::isfinite(v) && v >= 0 && v <= 1, "{} must be a number in [0, 1]{} (got {})", name,
              allow_unset ? " (or -1: not set)" : "", v);
}
}  // namespace

void OffloadPolicy::validate() const {
  TOPKV_CHECK(search.k >= 1 && search.k <= kMaxTokens, "--k must be at least 1 and at most {} (got {})", kMaxTokens,
              search.k);
  check_unit(k_fraction, "--k-fraction");
  TOPKV_CHECK(k_min >= 1 && k_min <= kMaxTokens, "--k-min must be at least 1 and at most {} (got {})", kMaxTokens,
              k_min);
  TOPKV_CHECK(k_max == 0 || (k_max >= k_min && k_max <= kMaxTokens), "--k-max must be 0 (no bound) or in [--k-min "
              "{}, {}] (got {})", k_min, kMaxTokens, k_max);
  TOPKV_CHECK(k_schedule != KSchedule::Weights || !k_weights.empty(), "k schedule 'weights' needs its weights: "
              "weights:w0/w1/... (one a retrieval layer, first to last)");
  TOPKV_CHECK(search.ef >= 0 && search.ef <= kMaxEf, "--ef must be in [0, {}] (0 = max(k, 64); got {})", kMaxEf,
              search.ef);
  TOPKV_CHECK(search.nprobe >= 0 && search.nprobe <= kMaxEf, "--nprobe must be in [0, {}] (0 = the index's "
              "default; got {})", kMaxEf, search.nprobe);
  // A cluster's estimated share of the attention is a probability.
  check_unit(search.threshold, "--threshold");
  TOPKV_CHECK(std::isfinite(search.rerank) && (search.rerank == 0.0 || (search.rerank >= 1.0 && search.rerank <= 1024.0)),
              "--rerank must be 0 (the index's own), 1 (off) or a factor up to 1024 (got {})", search.rerank);
  TOPKV_CHECK(search.gqa == GqaMode::Union || search.gqa == GqaMode::Mean, "internal: bad gqa mode");
  TOPKV_CHECK(dense_layers >= 0 && dense_layers <= kMaxLayers, "--dense-layers must be in [0, {}] (got {})",
              kMaxLayers, dense_layers);
  TOPKV_CHECK(sinks >= 0 && sinks <= kMaxTokens, "--sinks must be in [0, {}] (got {})", kMaxTokens, sinks);
  TOPKV_CHECK(window >= 1 && window <= kMaxTokens, "--window must be at least 1 token and at most {} (got {})", kMaxTokens,
              window);
  const auto store_type_ok = [](DType t) {
    return t == DType::F16 || t == DType::BF16 || t == DType::F8E4M3 || t == DType::Q8_0;
  };
  TOPKV_CHECK(store_type_ok(store_dtype), "the host KV store holds f16, bf16, f8 or q8_0 (got {})",
              dtype_name(store_dtype));
  for (const auto& [layer, type] : store_dtype_at)
    TOPKV_CHECK(layer >= 0 && layer < kMaxLayers && store_type_ok(type),
                "--store-type-at: layer {} must be in [0, {}) and its store f16, bf16, f8 or q8_0 (got {})", layer,
                kMaxLayers, dtype_name(type));
  TOPKV_CHECK(device_fold >= 1 && device_fold <= kMaxTokens, "--device-fold must be at least 1 row and at most {} (got {})",
              kMaxTokens, device_fold);
  TOPKV_CHECK(store_cache >= -1, "store_cache must be -1 (auto), 0 (off) or a size in bytes (got {})", store_cache);
  TOPKV_CHECK(std::isfinite(heads_threshold), "--heads-threshold must be a finite number (got {})",
              heads_threshold);
  check_unit(heads_sparsity, "--heads-sparsity", /*allow_unset=*/true);
  parse_spec(index);  // syntax
}

namespace {
// JSON numbers read exactly: an integer field takes an integer that fits
// (4294967297 is not 1, 2.9 is not 2), a real field any finite number.
template <typename Int>
Int json_int(const nlohmann::json& v, const std::string& key) {
  TOPKV_CHECK(v.is_number_integer(), "key '{}' has the wrong type: it must be an integer (got {})", key, v.dump());
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    TOPKV_CHECK(u <= (uint64_t)std::numeric_limits<Int>::max(), "key '{}' = {} is out of range (at most {})", key,
                u, std::numeric_limits<Int>::max());
    return (Int)u;
  }
  const int64_t i = v.get<int64_t>();
  TOPKV_CHECK(i >= (int64_t)std::numeric_limits<Int>::min() && i <= (int64_t)std::numeric_limits<Int>::max(),
              "key '{}' = {} is out of range [{}, {}]", key, i, std::numeric_limits<Int>::min(),
              std::numeric_limits<Int>::max());
  return (Int)i;
}

double json_real(const nlohmann::json& v, const std::string& key) {
  TOPKV_CHECK(v.is_number(), "key '{}' has the wrong type: it must be a number (got {})", key, v.dump());
  return v.get<double>();
}

std::string json_str(const nlohmann::json& v, const std::string& key) {
  TOPKV_CHECK(v.is_string(), "key '{}' has the wrong type: it must be a string (got {})", key, v.dump());
  return v.get<std::string>();
}

bool json_bool(const nlohmann::json& v, const std::string& key) {
  TOPKV_CHECK(v.is_boolean(), "key '{}' has the wrong type: it must be true or false (got {})", key, v.dump());
  return v.get<bool>();
}

GqaMode parse_gqa(const std::string& s) {
  if (s == "union") return GqaMode::Union;
  if (s == "mean") return GqaMode::Mean;
  fail("unknown gqa mode '{}': use union or mean", s);
}
}  // namespace

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
      if (key == "attn") attn = parse_attn_mode(json_str(v, key));
      else if (key == "index") index = json_str(v, key);
      else if (key == "k") search.k = json_int<int64_t>(v, key), k_fraction = j.contains("k_fraction") ? k_fraction : 0;
      else if (key == "k_fraction") {  // its bounds are the object's, if any (as --k-fraction's)
        k_fraction = json_real(v, key);
        if (!j.contains("k_min")) k_min = 1;
        if (!j.contains("k_max")) k_max = 0;
      }
      else if (key == "k_min") k_min = json_int<int64_t>(v, key);
      else if (key == "k_max") k_max = json_int<int64_t>(v, key);
      else if (key == "k_schedule") set_k_schedule(*this, json_str(v, key));
      else if (key == "ef") search.ef = json_int<int>(v, key);
      else if (key == "nprobe") search.nprobe = json_int<int>(v, key);
      else if (key == "threshold") search.threshold = json_real(v, key);
      else if (key == "rerank") search.rerank = json_real(v, key);
      else if (key == "gqa") search.gqa = parse_gqa(json_str(v, key));
      else if (key == "dense_layers") dense_layers = json_int<int>(v, key);
      else if (key == "sinks") sinks = json_int<int>(v, key);
      else if (key == "window") window = json_int<int>(v, key);
      else if (key == "store_type") store_dtype = parse_store_dtype(json_str(v, key));
      else if (key == "store_type_at") set_store_type_at(*this, json_str(v, key));
      else if (key == "stage_rows") stage_rows = json_bool(v, key);
      else if (key == "search_on") search_on = parse_search_on(json_str(v, key));
      else if (key == "device_table_type") set_device_table_spec(*this, json_str(v, key));
      else if (key == "build_on") build_on = parse_build_on(json_str(v, key));
      else if (key == "device_fold") device_fold = json_int<int>(v, key);
      else if (key == "sync_folds") sync_folds = json_bool(v, key);
      else if (key == "store_cache") store_cache = v.is_string() ? parse_store_cache(v.get<std::string>())
                                                                 : json_int<int64_t>(v, key);
      else if (key == "heads_file") heads_file = json_str(v, key);
      else if (key == "heads_threshold") heads_threshold = json_real(v, key);
      else if (key == "heads_sparsity") heads_sparsity = json_real(v, key);
      else fail("unknown key '{}' in the policy config", key);
    } catch (const Error& e) {
      fail("{}: {}", origin, e.what());
    } catch (const nlohmann::json::exception& e) {
      fail("{}: key '{}' has the wrong type: {}", origin, key, e.what());
    }
  }
  try {
    validate();
  } catch (const Error& e) {
    fail("{}: {}", origin, e.what());
  }
}

std::string k_spec(const OffloadPolicy& p) {
  if (p.k_fraction <= 0) return fmt::format("{}", p.search.k);
  std::string s = fmt::format("{:g}% of the context", 100 * p.k_fraction);
  if (p.k_min > 1 || p.k_max > 0)
    s += p.k_max > 0 ? fmt::format(" within [{}, {}]", p.k_min, p.k_max) : fmt::format(" (at least {})", p.k_min);
  return s;
}

int64_t OffloadPolicy::mean_k(int64_t n) const {
  if (k_fraction <= 0) return search.k;
  int64_t k = std::max(k_min, (int64_t)std::llround(k_fraction * (double)n));
  if (k_max > 0) k = std::min(k, k_max);
  return std::max<int64_t>(1, k);
}

void OffloadPolicy::apply_json_file(const std::string& path) {
  apply_json(read_text_input(path, "policy config", 1ull << 24), path);
}


std::string OffloadPolicy::to_json() const {
  nlohmann::json j = {{"attn", attn_mode_name(attn)},
                      {"index", index},
                      {"k", search.k},
                      {"k_fraction", k_fraction},
                      {"k_min", k_min},
                      {"k_max", k_max},
                      {"k_schedule", k_schedule_spec(*this)},
                      {"ef", search.ef},
                      {"nprobe", search.nprobe},
                      {"threshold", search.threshold},
                      {"rerank", search.rerank},
                      {"gqa", search.gqa == GqaMode::Mean ? "mean" : "union"},
                      {"dense_layers", dense_layers},
                      {"sinks", sinks},
                      {"window", window},
                      {"store_type", dtype_name(store_dtype)},
                      {"store_type_at", store_type_at_spec(*this)},
                      {"stage_rows", stage_rows},
                      {"search_on", search_on_name(search_on)},
                      {"device_table_type", device_table_spec(*this)},
                      {"build_on", build_on_name(build_on)},
                      {"device_fold", device_fold},
                      {"sync_folds", sync_folds},
                      {"store_cache", store_cache},
                      {"heads_file", heads_file},
                      {"heads_threshold", heads_threshold},
                      {"heads_sparsity", heads_sparsity}};
  return j.dump(2);
}

}  // namespace topkv
