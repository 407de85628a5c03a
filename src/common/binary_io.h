// Little-endian binary files with a header (magic, format version) and a
// trailing checksum over everything before it, for saved indexes and other
// topkv files. A reader validates every length against the bytes that remain,
// so a truncated or foreign file is an Error, never an out-of-bounds read.
// The same bytes can also be written to and read from memory: a context pack
// (offload/context_pack.h) embeds each saved index as one such blob.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "src/common/error.h"
#include "src/common/file_io.h"

namespace topkv {

// 64-bit FNV-1a; cheap, catches truncation and bit rot (not an adversary).
uint64_t fnv1a64(const void* data, size_t n, uint64_t h = 0xcbf29ce484222325ull);

class BinaryWriter {
 public:
  // Writes through an AtomicFile (src/common/file_io.h); commit() appends the
  // checksum and renames it over `path`, so a crash never leaves a file that
  // looks valid.
  BinaryWriter(std::string path, std::string_view magic8, uint32_t version);
  // Appends to `sink` instead (it must outlive the writer); commit() appends
  // the checksum.
  BinaryWriter(std::vector<uint8_t>& sink, std::string_view magic8, uint32_t version);
  ~BinaryWriter();
  BinaryWriter(const BinaryWriter&) = delete;
  BinaryWriter& operator=(const BinaryWriter&) = delete;
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
  void start(std::string_view magic8, uint32_t version);
  std::string path_;
  std::unique_ptr<AtomicFile> file_;
  std::vector<uint8_t>* sink_ = nullptr;
  uint64_t hash_ = 0xcbf29ce484222325ull;
  bool committed_ = false;
};

class BinaryReader {
 public:
  // Reads the whole file, checks magic, version (<= max_version) and checksum.
  BinaryReader(const std::string& path, std::string_view magic8, uint32_t max_version,
               std::string_view what = "file");
  // The same checks on `n` bytes in memory (not copied: they must outlive the
  // reader); `name` stands for the path in messages.
  BinaryReader(std::string name, const uint8_t* data, size_t n, std::string_view magic8, uint32_t max_version,
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
  void validate(std::string_view magic8, uint32_t max_version);
  std::string path_, what_;
  std::vector<uint8_t> owned_;  // the file's bytes (file constructor)
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t pos_ = 0, end_ = 0;
  uint32_t version_ = 0;
};

}  // namespace topkv
