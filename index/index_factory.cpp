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
      {{"hnswlib",
        "hnswlib 0.6.2 HNSW graph over inner product (own fp32 key copy); ef per search call",
        "M=16 (links per node; 2M on level 0), efc=200 (build candidate list)"},
       make_hnswlib_index},
      {{"faiss-hnsw",
        "Faiss IndexHNSWFlat over inner product (own fp32 key copy); ef per search call",
        "M=16 (links per node; 2M on level 0), efc=200 (build candidate list)"},
       make_faiss_hnsw_index},
      {{"faiss-ivf",
        "Faiss inverted file over inner product: k-means lists, flat or fp16 codes (own key copy); nprobe per call",
        "nlist=0 (lists; 0 = 4*sqrt(n), >= 39 keys per list; clipped to n), nprobe=32 (default lists probed), "
        "codec=flat|fp16, max_train=0 (k-means sample; 0 = 256*nlist)"},
       make_faiss_ivf_index},
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
