// The registry of KvIndex backends: the names the command line accepts.
#include <functional>

#include "index/backends.h"
#include "src/common/error.h"

namespace topkv {

namespace {
struct Entry {
  BackendInfo info;
  std::function<std::unique_ptr<KvIndex>(const Params&, const BuildOptions&)> make;
};

const std::vector<Entry>& registry() {
  static const std::vector<Entry> r = {
      {{"flat", "exact maximum inner product over every key (multi-threaded scan); the oracle", "(none)"},
       make_flat_index},
  };
  return r;
}
}  // namespace

const std::vector<BackendInfo>& index_backends() {
  static const std::vector<BackendInfo> v = [] {
    std::vector<BackendInfo> out;
    for (auto& e : registry()) out.push_back(e.info);
    return out;
  }();
  return v;
}

std::unique_ptr<KvIndex> KvIndex::create(const Spec& spec, const BuildOptions& opt) {
  for (auto& e : registry()) {
    if (e.info.name != spec.name) continue;
    auto idx = e.make(spec.params, opt);
    spec.params.check_all_used(fmt::format("index backend '{}'", spec.name));
    return idx;
  }
  std::string names;
  for (auto& e : registry()) names += (names.empty() ? "" : ", ") + e.info.name;
  fail("unknown index backend '{}' (available: {})", spec.name, names);
}

}  // namespace topkv
