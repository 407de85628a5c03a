// Little-endian binary files with a header (magic, format version) and a
// trailing checksum over everything before it, for saved indexes and other
// topkv files. A reader validates every length against the bytes that remain,
// so a truncated or foreign file is an Error, never an out-of-bounds read.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "src/common/error.h"

namespace topkv {

// 64-bit FNV-1a; cheap, catches truncation and bit rot (not an adversary).
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

class BinaryWriter {
 public:
  // Writes to `path + ".tmp"`; commit() appends the checksum and renames it to
  // `path`, so a crash never leaves a file that looks valid.
  BinaryWriter(std::string path, std::string_view magic8, uint32_t version);
  ~BinaryWriter();
  void bytes(const void* p, size_t n);
  template <typename T>
  void pod(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    bytes(&v, sizeof(T));
  }
  void str(std::string_view s);
  template <typename T>
  void vec(const std::vector<T>& v) {
    pod<uint64_t>(v.size());
    bytes(v.data(), v.size() * sizeof(T));
  }
  void commit();

 private:
  std::string path_, tmp_;
  std::FILE* f_ = nullptr;
  uint64_t hash_ = 0xcbf29ce484222325ull;
  bool committed_ = false;
};

class BinaryReader {
 public:
  // Reads the whole file, checks magic, version (<= max_version) and checksum.
  BinaryReader(const std::string& path, std::string_view magic8, uint32_t max_version,
               std::string_view what = "file");
  uint32_t version() const { return version_; }
  void bytes(void* p, size_t n);
  template <typename T>
  T pod() {
    static_assert(std::is_trivially_copyable_v<T>);
    T v;
    bytes(&v, sizeof(T));
    return v;
  }
  std::string str();
  template <typename T>
  std::vector<T> vec() {
    uint64_t n = pod<uint64_t>();
    need(n, sizeof(T));
    std::vector<T> v(n);
    bytes(v.data(), n * sizeof(T));
    return v;
  }
  size_t remaining() const { return end_ - pos_; }
  void expect_end() const;
  const std::string& path() const { return path_; }

 private:
  void need(uint64_t count, size_t elem) const;
  std::string path_, what_;
  std::vector<uint8_t> buf_;
  size_t pos_ = 0, end_ = 0;
  uint32_t version_ = 0;
};

}  // namespace topkv
