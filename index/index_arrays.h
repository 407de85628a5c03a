// Where an index's large arrays go when it is saved, and come from when it is
// loaded. A backend's save_impl / load_impl write and read their small fields
// through the BinaryWriter / BinaryReader and their large arrays (centroids,
// counts, member lists, page bounds) through these, in the same order:
//
//  - inline (IndexArrayWriter::inline_into / IndexArrayReader::inline_from):
//    each array is a length and its bytes in the same binary stream, exactly
//    what BinaryWriter::vec writes: a standalone index file, and the index
//    blobs of context packs of format 1;
//  - apart (offload/pack_file.h, PackArrayWriter / PackArrayReader): each
//    array is a tensor of its own in a context pack, aligned to its element
//    size, so a loaded index uses it in place (index/host_array.h).
//
// Backends whose library serialises itself (hnswlib, Faiss) write no arrays.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "index/host_array.h"
#include "src/common/binary_io.h"
#include "src/common/checksum.h"
#include "src/common/safetensors.h"

namespace topkv {

template <typename T>
constexpr StDType st_type_for();
template <>
constexpr StDType st_type_for<float>() { return StDType::F32; }
template <>
constexpr StDType st_type_for<int64_t>() { return StDType::I64; }
template <>
constexpr StDType st_type_for<int32_t>() { return StDType::I32; }

class IndexArrayWriter {
 public:
  virtual ~IndexArrayWriter() = default;
  static std::unique_ptr<IndexArrayWriter> inline_into(BinaryWriter& w);
  // Writes the concatenation of `parts` as array `name` of `shape`; the parts
  // must stay valid and unchanged until the writer's destination is written.
  virtual void put(const std::string& name, StDType type, std::vector<int64_t> shape,
                   std::vector<ByteSpan> parts) = 0;
  // The same for bytes the writer keeps.
  virtual void put_owned(const std::string& name, StDType type, std::vector<int64_t> shape,
                         std::vector<uint8_t> bytes) = 0;
  template <typename T>
  void put(const std::string& name, std::vector<int64_t> shape, std::vector<ByteSpan> parts) {
    put(name, st_type_for<T>(), std::move(shape), std::move(parts));
  }
  template <typename T>
  void put(const std::string& name, std::vector<int64_t> shape, const HostArray<T>& a) {
    put<T>(name, std::move(shape), {ByteSpan{a.data(), a.size() * sizeof(T)}});
  }
  template <typename T>
  void put_owned(const std::string& name, std::vector<int64_t> shape, const std::vector<T>& v) {
    std::vector<uint8_t> bytes(v.size() * sizeof(T));
    std::copy_n(reinterpret_cast<const uint8_t*>(v.data()), bytes.size(), bytes.data());
    put_owned(name, st_type_for<T>(), std::move(shape), std::move(bytes));
  }
};

class IndexArrayReader {
 public:
  virtual ~IndexArrayReader() = default;
  static std::unique_ptr<IndexArrayReader> inline_from(BinaryReader& r);
  // Array `name`, which must have `shape` (an Error naming the source and
  // the array otherwise): owned, or in place where the source allows it.
  template <typename T>
  HostArray<T> get(const std::string& name, const std::vector<int64_t>& shape) {
    std::vector<T> copy;
    Mapped m = get_raw(name, st_type_for<T>(), shape, [&copy](size_t count) {
      copy.resize(count);
      return static_cast<void*>(copy.data());
    });
    if (m.data) return HostArray<T>::mapped(static_cast<T*>(m.data), m.count, std::move(m.owner));
    return HostArray<T>(std::move(copy));
  }

 protected:
  struct Mapped {
    void* data = nullptr;  // in place, kept alive by owner; null when copied
    size_t count = 0;      // elements
    std::shared_ptr<void> owner;
  };
  // Either returns the array in place, or copies its `count` elements to
  // alloc(count) and returns an empty Mapped.
  virtual Mapped get_raw(const std::string& name, StDType type, const std::vector<int64_t>& shape,
                         const std::function<void*(size_t count)>& alloc) = 0;
};

}  // namespace topkv
