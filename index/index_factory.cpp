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
      {{"quest",
        "Quest pages: element-wise min/max of each page of consecutive keys; takes the pages with the largest "
        "q.k upper bound until k tokens (token budget, not top-k)",
        "page=16 (keys per page), coarse_ratio=0 (C >= 2: two levels, every C pages bounded again; each query "
        "head scores the coarse pages first and only the pages of those holding its best expand*k tokens; "
        "the device search's choice past ~256K), expand=8 (coarse_ratio > 0). Budget only: SearchParams "
        "threshold is not used"},
       make_quest_index},
      {{"centroid",
        "Squeezed Attention: k-means clusters of keys (Faiss, cosine); keeps clusters by q.centroid until k "
        "tokens, or those whose estimated softmax share >= threshold; levels=2 adds a coarse lookup",
        "ratio=20 (keys per centroid), iters=10 (k-means iterations), block=8192 (keys per k-means block, "
        "0 = one k-means over all keys), max_train=65536 (keys sampled per k-means), levels=1|2 (2 = hierarchical), coarse_ratio=5 (fine centroids per coarse one; levels=2), "
        "expand=4 (levels=2: expand the best coarse clusters until they hold expand*k keys, or those with "
        "share >= threshold/expand), rerank=4 (levels=1; R > 1: clusters until R*k tokens, then each head's k "
        "best of their rows by exact q.k; 1 = off, the only choice with levels=2)"},
       make_centroid_index},
      {{"multipole",
        "Multipole Attention: centroid clusters plus mean values; clusters not kept come back as far-field "
        "terms (N_j, q.C_j, mean value) for the attention merge (with rerank=1 no token is dropped; with the "
        "default rerank a kept cluster's rows outside the heads' k best are far rows too)",
        "ratio=16 (keys per centroid), iters=10, block=8192, max_train=65536, levels=1|2, coarse_ratio=5, expand=4, "
        "rerank=4 (as centroid; clusters with no row kept are far), spread=0 (a > 0: far rows' mass raised by min(a s^2/2 q^2.var, ln spread_clip) for their keys' "
        "spread), spread_clip=4, rerank_far=1 (the rows rerank drops are one more far row per cluster with their "
        "exact mass; 0: they are dropped), far_mass=estimate|oracle (oracle, for evaluation: every far row's "
        "exact mass, a dense pass on the host); needs the value store"},
       make_multipole_index},
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
