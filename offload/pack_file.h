// The container of a context pack (offload/context_pack.h): a safetensors
// file (src/common/safetensors.h), so a pack is memory-mapped on load, its
// arrays are readable by numpy / PyTorch, and the reader's checks of every
// shape and offset apply. topkv adds two metadata entries:
//
//   "topkv.context_pack"  one JSON document: what the pack holds (layout in
//                         offload/context_pack.h)
//   "topkv.checksums"     JSON {tensor name: 16 hex digits}: FNV-1a 64 of the
//                         tensor's bytes, so bit rot in a pack copied between
//                         machines is found
//
// Tensors are written in decreasing element size (I32/F32, then F16/BF16,
// then U8 blobs), so each starts aligned to its element size. Small tensors
// are checked against their checksum when read; bulk ones (host stores,
// whole-context model KV) are used straight from the mapping, unread until a
// search touches them, and checked only by verify_all (`topkv index info
// --verify`); the indexes built on them also check a sampled fingerprint of
// the keys (RowStore::fingerprint).
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "src/common/safetensors.h"

namespace topkv {

class PackWriter {
 public:
  using Span = SafetensorsWriter::Span;
  // A tensor whose bytes (the concatenation of `parts`) stay valid until
  // write(): a store's chunks, a layer's sinks.
  void add(const std::string& name, StDType dtype, std::vector<int64_t> shape, std::vector<Span> parts);
  // A tensor the writer keeps (converted or serialised data).
  void add_owned(const std::string& name, StDType dtype, std::vector<int64_t> shape, std::vector<uint8_t> bytes);
  void add_owned(const std::string& name, StDType dtype, std::vector<int64_t> shape, const std::vector<float>& v);
  nlohmann::json& meta() { return meta_; }  // the "topkv.context_pack" document
  // Checksums every tensor, then writes `path` atomically (path.tmp, rename).
  void write(const std::string& path) const;
  uint64_t bytes() const;  // of the tensors added so far

 private:
  struct Entry {
    std::string name;
    StDType dtype;
    std::vector<int64_t> shape;
    std::vector<Span> parts;
  };
  std::vector<Entry> entries_;
  std::deque<std::vector<uint8_t>> owned_;  // deque: adding never moves what spans point at
  nlohmann::json meta_ = nlohmann::json::object();
};

class PackReader {
 public:
  // Maps and validates the container; reads the metadata. Throws Error
  // naming the file when it is not a topkv context pack.
  explicit PackReader(const std::string& path);

  const std::string& path() const { return path_; }
  const nlohmann::json& meta() const { return meta_; }
  bool has(const std::string& name) const { return st_->find(name) != nullptr; }
  const std::vector<TensorInfo>& tensors() const { return st_->tensors(); }
  // The tensor `name` after checking its type and shape (an Error naming the
  // tensor says what the pack holds instead). Not bulk: its checksum is
  // checked now.
  const uint8_t* tensor(const std::string& name, StDType dtype, const std::vector<int64_t>& shape,
                        bool bulk = false) const;
  // A verified 1-D U8 tensor of any length (a serialised index): data, bytes.
  std::pair<const uint8_t*, size_t> blob(const std::string& name) const;
  // Keeps the mapping alive for as long as a row store uses it in place.
  std::shared_ptr<const void> owner() const { return st_; }
  // Checks every tensor against its checksum; Error naming the first bad one.
  // Returns the bytes checked.
  uint64_t verify_all(bool progress) const;
  uint64_t file_bytes() const;

 private:
  void verify(const TensorInfo& t) const;
  std::string path_;
  std::shared_ptr<SafetensorsReader> st_;
  nlohmann::json meta_;
  std::map<std::string, uint64_t> checksums_;
};

}  // namespace topkv
