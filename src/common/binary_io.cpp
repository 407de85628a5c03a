#include "src/common/binary_io.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

namespace topkv {

uint64_t fnv1a64(const void* data, size_t n, uint64_t h) {
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

BinaryWriter::BinaryWriter(std::string path, std::string_view magic8, uint32_t version)
    : path_(std::move(path)) {
  file_ = std::make_unique<AtomicFile>(path_, "file");
  start(magic8, version);
}

BinaryWriter::BinaryWriter(std::vector<uint8_t>& sink, std::string_view magic8, uint32_t version)
    : path_("memory"), sink_(&sink) {
  start(magic8, version);
}

void BinaryWriter::start(std::string_view magic8, uint32_t version) {
  TOPKV_CHECK(magic8.size() == 8, "internal: magic must be 8 bytes");
  bytes(magic8.data(), 8);
  pod(version);
}

BinaryWriter::~BinaryWriter() = default;  // an uncommitted AtomicFile removes its temporary

void BinaryWriter::bytes(const void* p, size_t n) {
  if (n == 0) return;
  hash_ = fnv1a64(p, n, hash_);
  if (sink_) {
    TOPKV_CHECK(!committed_, "internal: write after commit");
    sink_->insert(sink_->end(), static_cast<const uint8_t*>(p), static_cast<const uint8_t*>(p) + n);
    return;
  }
  file_->write(p, n);
}

void BinaryWriter::str(std::string_view s) {
  pod<uint64_t>(s.size());
  bytes(s.data(), s.size());
}

void BinaryWriter::commit() {
  uint64_t h = hash_;
  if (sink_) {
    bytes(&h, 8);
    committed_ = true;
    return;
  }
  file_->write(&h, 8);
  file_->commit();
  committed_ = true;
}

BinaryReader::BinaryReader(const std::string& path, std::string_view magic8, uint32_t max_version,
                           std::string_view what)
    : path_(path), what_(what) {
  const std::string bytes = read_regular_file(path, what_, UINT64_MAX);
  owned_.assign(bytes.begin(), bytes.end());
  data_ = owned_.data();
  size_ = owned_.size();
  validate(magic8, max_version);
}

BinaryReader::BinaryReader(std::string name, const uint8_t* data, size_t n, std::string_view magic8,
                           uint32_t max_version, std::string_view what)
    : path_(std::move(name)), what_(what), data_(data), size_(n) {
  validate(magic8, max_version);
}

void BinaryReader::validate(std::string_view magic8, uint32_t max_version) {
  const std::string& path = path_;
  TOPKV_CHECK(size_ >= 8 + 4 + 8, "{} '{}' is too short ({} bytes) to be a topkv {}: truncated?", what_, path,
              size_, what_);
  TOPKV_CHECK(std::memcmp(data_, magic8.data(), 8) == 0, "'{}' is not a topkv {} (bad magic bytes): wrong file?",
              path, what_);
  std::memcpy(&version_, data_ + 8, 4);
  TOPKV_CHECK(version_ >= 1 && version_ <= max_version,
              "{} '{}' has format version {}, this topkv reads versions 1..{}: rebuild it or upgrade topkv",
              what_, path, version_, max_version);
  end_ = size_ - 8;
  uint64_t stored, actual = fnv1a64(data_, end_);
  std::memcpy(&stored, data_ + end_, 8);
  TOPKV_CHECK(stored == actual, "{} '{}' is corrupted or truncated (checksum mismatch): rebuild it", what_, path);
  pos_ = 12;
}

void BinaryReader::need(uint64_t count, size_t elem) const {
  TOPKV_CHECK(elem == 0 || count <= (end_ - pos_) / elem,
              "{} '{}' is malformed: a field claims {} items of {} bytes but {} bytes remain", what_, path_,
              count, elem, end_ - pos_);
}

void BinaryReader::bytes(void* p, size_t n) {
  need(n, 1);
  if (n) std::memcpy(p, data_ + pos_, n);
  pos_ += n;
}

std::string BinaryReader::str() {
  uint64_t n = pod<uint64_t>();
  need(n, 1);
  std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
  pos_ += n;
  return s;
}

void BinaryReader::expect_end() const {
  TOPKV_CHECK(pos_ == end_, "{} '{}' is malformed: {} unexpected bytes at the end", what_, path_, end_ - pos_);
}

}  // namespace topkv
