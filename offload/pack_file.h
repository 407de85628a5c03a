// The container of a context pack (offload/context_pack.h): a safetensors
// file (src/common/safetensors.h), so a pack is memory-mapped on load, its
// arrays are readable by numpy / PyTorch, and the reader's checks of every
// shape and offset apply. topkv adds two metadata entries:
//
//   "topkv.context_pack"  one JSON document: the manifest (offload/context_pack.h)
//   "topkv.checksums"     JSON {tensor name: 16 hex digits}: checksum64
//                         (src/common/checksum.h) of the tensor's bytes, and
//                         under "topkv.context_pack" of the manifest, so a
//                         truncated or bit-rotten pack is found (the manifest
//                         is checked on open, the tensors by verify_all)
//
// SafetensorsWriter lays tensors out in decreasing element size, so each
// starts aligned to its element size. The file is
// written to a temporary name beside the pack, synced and renamed
// (SafetensorsWriter), so a crash or a full disk never leaves a pack that
// looks valid.
#pragma once
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "index/index_arrays.h"
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
  // Writes `path` atomically (path.tmp, rename) with every tensor's checksum
  // (taken when it was added) and the manifest's.
  void write(const std::string& path) const;

 private:
  SafetensorsWriter tensors_;
  nlohmann::json checksums_ = nlohmann::json::object();  // tensor name -> hex checksum64
  std::deque<std::vector<uint8_t>> owned_;  // deque: adding never moves what spans point at
  nlohmann::json meta_ = nlohmann::json::object();
};

class PackReader {
 public:
  // Maps and validates the container; reads the metadata. Throws Error
  // naming the file when it is not a topkv context pack.
  explicit PackReader(const std::string& path);
  // The same checks over a pack's bytes in memory (not copied: they must
  // outlive the reader; SafetensorsReader's reader over memory); `name`
  // stands for the path in messages. Used by the fuzzer (tests/fuzz/fuzz_pack).
  PackReader(const uint8_t* data, size_t size, const std::string& name);

  const std::string& path() const { return path_; }
  const nlohmann::json& meta() const { return meta_; }
  bool has(const std::string& name) const { return st_->find(name) != nullptr; }
  const std::vector<TensorInfo>& tensors() const { return st_->tensors(); }
  // The tensor `name` in the mapping, after checking its type and shape (an
  // Error naming the tensor says what the pack holds instead).
  const uint8_t* tensor(const std::string& name, StDType dtype, const std::vector<int64_t>& shape) const;
  // A 1-D U8 tensor of any length (a serialised index): data, bytes.
  std::pair<const uint8_t*, size_t> blob(const std::string& name) const;
  // Keeps the mapping alive for as long as a row store uses it in place.
  std::shared_ptr<const void> owner() const { return st_; }
  // The tensor `name` (type and shape checked as by tensor()) in a fresh
  // private, writable mapping: used in place, copy-on-write
  // (SafetensorsReader::map_copy_on_write).
  SafetensorsReader::CowView tensor_copy_on_write(const std::string& name, StDType dtype,
                                                  const std::vector<int64_t>& shape) const;
  // Its bytes from `from` on, with room for `capacity` (a row store's last chunk).
  SafetensorsReader::CowView tensor_copy_on_write(const std::string& name, StDType dtype,
                                                  const std::vector<int64_t>& shape, uint64_t from,
                                                  uint64_t capacity) const;
  // Checks every tensor against its checksum (all of them, in parallel: a
  // pack is read whole once); Error naming the first bad one. Returns the
  // bytes checked.
  uint64_t verify_all(bool progress) const;
  uint64_t file_bytes() const;  // as opened

 private:
  void read_metadata();  // after st_ is set

  std::string path_;
  std::shared_ptr<SafetensorsReader> st_;
  nlohmann::json meta_;
  std::map<std::string, uint64_t> checksums_;
};

// An index's arrays as tensors "<prefix><array>" of a pack (index/index_arrays.h).
class PackArrayWriter final : public IndexArrayWriter {
 public:
  PackArrayWriter(PackWriter& w, std::string prefix) : w_(w), prefix_(std::move(prefix)) {}
  void put(const std::string& name, StDType type, std::vector<int64_t> shape, std::vector<ByteSpan> parts) override;
  void put_owned(const std::string& name, StDType type, std::vector<int64_t> shape,
                 std::vector<uint8_t> bytes) override;

 private:
  PackWriter& w_;
  std::string prefix_;
};

// ... and read back in place, each in its own copy-on-write mapping.
class PackArrayReader final : public IndexArrayReader {
 public:
  PackArrayReader(const PackReader& r, std::string prefix) : r_(r), prefix_(std::move(prefix)) {}

 protected:
  Mapped get_raw(const std::string& name, StDType type, const std::vector<int64_t>& shape,
                 const std::function<void*(size_t)>& alloc) override;

 private:
  const PackReader& r_;
  std::string prefix_;
};

}  // namespace topkv
