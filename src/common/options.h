// Parsing of the small option languages the CLI uses:
//   backend specs   "hnswlib:M=32,efc=200"  -> name + key/value map
//   sweeps          "16,32,64" or "16:256:x2" (16 to 256, doubling)
//   sizes           "16G", "512M", "3.5GiB", "1024"
//   token counts    "8K", "128K", "1M", "1000" (K = 1024, M = 1024^2)
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace topkv {

// Key/value parameters with typed getters that reject bad values by name and
// remember which keys were read, so unknown keys can be reported.
class Params {
 public:
  Params() = default;
  explicit Params(std::string_view kv_list);  // "a=1,b=x"; throws Error on syntax
  bool has(const std::string& key) const { return kv_.count(key) != 0; }
  int64_t get_int(const std::string& key, int64_t def) const;
  double get_double(const std::string& key, double def) const;
  bool get_bool(const std::string& key, bool def) const;
  std::string get_str(const std::string& key, const std::string& def) const;
  void set(const std::string& key, const std::string& value) { kv_[key] = value; }
  const std::map<std::string, std::string>& map() const { return kv_; }
  std::string str() const;  // canonical "a=1,b=x"
  // Throws if a key was given that no getter asked for (typo protection).
  void check_all_used(std::string_view context) const;

 private:
  std::map<std::string, std::string> kv_;
  mutable std::set<std::string> used_;
};

struct Spec {
  std::string name;
  Params params;
};
Spec parse_spec(std::string_view spec);  // "name" or "name:k=v,..."
// The one spelling of a spec: "name" or "name:k=v,..." with keys sorted, so
// "quest: page=7" and "quest:page=7" compare equal.
std::string canonical_spec(std::string_view spec);

// "a, b,c" -> {"a", "b", "c"}: fields trimmed, empty ones kept (callers reject them by name).
std::vector<std::string> split_list(std::string_view s, char sep = ',');
std::vector<int64_t> parse_sweep(std::string_view s);
std::vector<double> parse_double_list(std::string_view s);
uint64_t parse_size(std::string_view s);       // bytes
// Tokens: a whole number >= min (1 unless said), "8K" = 8192, "1M" = 1048576.
int64_t parse_count(std::string_view s, int64_t min = 1);
std::vector<int64_t> parse_count_list(std::string_view s, int64_t min = 1);  // "8K,32K,1M"
std::string format_bytes(double bytes);        // "1.50 GiB"

// An enum's spellings, one table per enum, so that its parser and its name
// cannot drift apart: name_of(table, v), names_of(table) (for a CLI's
// check), and parse_named(table, s, what), which fails with "unknown <what>
// '<s>': use a, b or c".
template <class E> struct Named {
  E value;
  const char* name;
};
std::string list_choices(const std::vector<std::string>& names);  // "a, b or c"
[[noreturn]] void throw_unknown_name(const char* what, const std::string& s, const std::string& choices);
template <class E, size_t N> const char* name_of(const Named<E> (&table)[N], E v) {
  for (const Named<E>& n : table)
    if (n.value == v) return n.name;
  return "?";
}
template <class E, size_t N> std::vector<std::string> names_of(const Named<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const Named<E>& n : table) names.push_back(n.name);
  return names;
}
template <class E, size_t N> E parse_named(const Named<E> (&table)[N], const std::string& s, const char* what) {
  for (const Named<E>& n : table)
    if (s == n.name) return n.value;
  throw_unknown_name(what, s, list_choices(names_of(table)));
}

}  // namespace topkv
