// Constructors of the registered KvIndex backends (one .cpp per backend).
// Each reads its build parameters from `params`; the factory then rejects any
// parameter the backend did not read.
#pragma once
#include <memory>

#include "index/kv_index.h"

namespace topkv {

std::unique_ptr<KvIndex> make_flat_index(const Params& params, const BuildOptions& opt);
std::unique_ptr<KvIndex> make_quest_index(const Params& params, const BuildOptions& opt);
std::unique_ptr<KvIndex> make_centroid_index(const Params& params, const BuildOptions& opt);
std::unique_ptr<KvIndex> make_multipole_index(const Params& params, const BuildOptions& opt);
std::unique_ptr<KvIndex> make_hnswlib_index(const Params& params, const BuildOptions& opt);
std::unique_ptr<KvIndex> make_faiss_hnsw_index(const Params& params, const BuildOptions& opt);
std::unique_ptr<KvIndex> make_faiss_ivf_index(const Params& params, const BuildOptions& opt);

}  // namespace topkv
