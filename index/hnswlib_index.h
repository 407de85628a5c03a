// Moving graphs between the 'hnswlib' backend and hnswlib's own files
// (HierarchicalNSW::saveIndex / loadIndex, hnswlib 0.6.2 layout): a graph built
// by hnswlib elsewhere (e.g. its Python bindings, labels = row ids) can be
// searched by topkv, and ours can be inspected with hnswlib's tools. The tests
// also use them to check that topkv's embedded graph is byte-for-byte
// hnswlib's layout.
//
// hnswlib's headers may be included by index/hnswlib_index.cpp only (they
// define non-inline functions); these declarations need none of its types.
#pragma once
#include <memory>
#include <string>

#include "index/kv_index.h"

namespace topkv {

// Writes the graph of an 'hnswlib' index with hnswlib's saveIndex(). Error for
// other backends or an index without keys.
void export_hnswlib_graph(const KvIndex& index, const std::string& path);

// Reads a saveIndex() file with hnswlib's loadIndex() and attaches it to
// `keys` (rows [0, graph size) must be the vectors it was built on, labelled
// by row id) as an 'hnswlib' index with build parameters `params` ("M=16,...",
// M must match the file's).
std::unique_ptr<KvIndex> import_hnswlib_graph(const std::string& path, std::shared_ptr<const RowStore> keys,
                                              const std::string& params = "", const BuildOptions& opt = {});

}  // namespace topkv
