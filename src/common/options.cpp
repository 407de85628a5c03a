#include "src/common/options.h"

#include <cmath>
#include <cstdlib>

#include "src/common/error.h"

namespace topkv {

static std::string trim(std::string_view s) {
  size_t a = s.find_first_not_of(" \t"), b = s.find_last_not_of(" \t");
  return a == std::string_view::npos ? std::string() : std::string(s.substr(a, b - a + 1));
}

static std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t p = s.find(sep, start);
    out.push_back(trim(s.substr(start, p == std::string_view::npos ? s.npos : p - start)));
    if (p == std::string_view::npos) break;
    start = p + 1;
  }
  return out;
}

Params::Params(std::string_view kv_list) {
  if (trim(kv_list).empty()) return;
  for (auto& item : split(kv_list, ',')) {
    size_t eq = item.find('=');
    TOPKV_CHECK(eq != std::string::npos && eq > 0 && eq + 1 < item.size(),
                "bad parameter '{}' in '{}': expected key=value", item, kv_list);
    kv_[trim(item.substr(0, eq))] = trim(item.substr(eq + 1));
  }
}

static bool parse_int(const std::string& v, int64_t& out) {
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno || end == v.c_str() || *end) return false;
  out = x;
  return true;
}

int64_t Params::get_int(const std::string& key, int64_t def) const {
  used_.insert(key);
  auto it = kv_.find(key);
  if (it == kv_.end()) return def;
  int64_t x;
  TOPKV_CHECK(parse_int(it->second, x), "parameter {}='{}' is not an integer", key, it->second);
  return x;
}

double Params::get_double(const std::string& key, double def) const {
  used_.insert(key);
  auto it = kv_.find(key);
  if (it == kv_.end()) return def;
  char* end = nullptr;
  double x = std::strtod(it->second.c_str(), &end);
  TOPKV_CHECK(end != it->second.c_str() && !*end && std::isfinite(x), "parameter {}='{}' is not a number",
              key, it->second);
  return x;
}

bool Params::get_bool(const std::string& key, bool def) const {
  used_.insert(key);
  auto it = kv_.find(key);
  if (it == kv_.end()) return def;
  const auto& v = it->second;
  if (v == "1" || v == "true" || v == "on" || v == "yes") return true;
  if (v == "0" || v == "false" || v == "off" || v == "no") return false;
  fail("parameter {}='{}' is not a boolean (use 1/0, true/false, on/off)", key, v);
}

std::string Params::get_str(const std::string& key, const std::string& def) const {
  used_.insert(key);
  auto it = kv_.find(key);
  return it == kv_.end() ? def : it->second;
}

std::string Params::str() const {
  std::string s;
  for (auto& [k, v] : kv_) s += (s.empty() ? "" : ",") + k + "=" + v;
  return s;
}

void Params::check_all_used(std::string_view context) const {
  for (auto& [k, v] : kv_) {
    if (used_.count(k)) continue;
    std::string known;
    for (auto& u : used_) known += (known.empty() ? "" : ", ") + u;
    fail("unknown parameter '{}' for {} (known: {})", k, context, known.empty() ? "none" : known);
  }
}

Spec parse_spec(std::string_view spec) {
  Spec s;
  size_t colon = spec.find(':');
  s.name = trim(spec.substr(0, colon));
  TOPKV_CHECK(!s.name.empty(), "empty name in '{}'", spec);
  if (colon != std::string_view::npos) s.params = Params(spec.substr(colon + 1));
  return s;
}

std::string canonical_spec(std::string_view spec) {
  const Spec s = parse_spec(spec);
  const std::string params = s.params.str();
  return params.empty() ? s.name : s.name + ":" + params;
}

std::vector<int64_t> parse_sweep(std::string_view s) {
  std::vector<int64_t> out;
  auto parts = split(s, ':');
  if (parts.size() == 3) {  // lo:hi:xF or lo:hi:+S
    int64_t lo, hi, step;
    TOPKV_CHECK(parse_int(parts[0], lo) && parse_int(parts[1], hi) && parts[2].size() > 1 &&
                    parse_int(parts[2].substr(1), step) && step > 0 && lo > 0 && hi >= lo &&
                    (parts[2][0] == 'x' || parts[2][0] == '+'),
                "bad sweep '{}': use a list '16,32,64' or a range 'lo:hi:x2' / 'lo:hi:+16'", s);
    TOPKV_CHECK(parts[2][0] == '+' || step >= 2, "bad sweep '{}': a multiplicative step must be >= 2", s);
    for (int64_t v = lo; v <= hi; v = parts[2][0] == 'x' ? v * step : v + step) out.push_back(v);
    return out;
  }
  for (auto& p : split(s, ',')) {
    int64_t v;
    TOPKV_CHECK(parse_int(p, v), "bad value '{}' in list '{}': expected integers", p, s);
    out.push_back(v);
  }
  return out;
}

std::vector<double> parse_double_list(std::string_view s) {
  std::vector<double> out;
  for (auto& p : split(s, ',')) {
    char* end = nullptr;
    double v = std::strtod(p.c_str(), &end);
    TOPKV_CHECK(!p.empty() && !*end && std::isfinite(v), "bad number '{}' in list '{}'", p, s);
    out.push_back(v);
  }
  return out;
}

uint64_t parse_size(std::string_view s0) {
  std::string s = trim(s0);
  char* end = nullptr;
  double x = std::strtod(s.c_str(), &end);
  TOPKV_CHECK(end != s.c_str() && x >= 0 && std::isfinite(x), "bad size '{}': use e.g. 16G, 512M, 1024", s0);
  std::string unit(end);
  for (auto& c : unit) c = (char)std::toupper((unsigned char)c);
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB") mult = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB") mult = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB") mult = 1024.0 * 1024 * 1024;
  else if (unit == "T" || unit == "TB" || unit == "TIB") mult = 1024.0 * 1024 * 1024 * 1024;
  else fail("bad size unit in '{}': use K, M, G or T", s0);
  return (uint64_t)(x * mult);
}

int64_t parse_count(std::string_view s0, int64_t min) {
  std::string s = trim(s0);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  TOPKV_CHECK(end != s.c_str() && std::isfinite(x), "bad token count '{}': use e.g. 8K, 128K, 1M or 4096", s0);
  std::string unit(end);
  for (auto& c : unit) c = (char)std::toupper((unsigned char)c);
  double mult = 1;
  if (unit == "K") mult = 1024.0;
  else if (unit == "M") mult = 1024.0 * 1024;
  else TOPKV_CHECK(unit.empty(), "bad token count unit in '{}': use K (1024) or M (1024^2)", s0);
  const double v = x * mult;
  TOPKV_CHECK(v >= (double)min && v == std::floor(v) && v < 9e15, "bad token count '{}': it must be a whole number "
              "of tokens, at least {}", s0, min);
  return (int64_t)v;
}

std::vector<int64_t> parse_count_list(std::string_view s, int64_t min) {
  std::vector<int64_t> out;
  for (const std::string& f : split(s, ',')) out.push_back(parse_count(f, min));
  return out;
}

std::vector<std::string> split_list(std::string_view s, char sep) { return split(s, sep); }

std::string format_bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) { b /= 1024; ++u; }
  return u == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.2f} {}", b, units[u]);
}

std::string list_choices(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i)
    out += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return out;
}

void throw_unknown_name(const char* what, const std::string& s, const std::string& choices) {
  fail("unknown {} '{}': use {}", what, s, choices);
}

}  // namespace topkv
