#include "index/index_arrays.h"

#include <fmt/format.h>

#include "src/common/error.h"

namespace topkv {

namespace {

// A length and the bytes, as BinaryWriter::vec writes them.
class InlineArrayWriter final : public IndexArrayWriter {
 public:
  explicit InlineArrayWriter(BinaryWriter& w) : w_(w) {}
  void put(const std::string& name, StDType type, std::vector<int64_t> shape, std::vector<ByteSpan> parts) override {
    uint64_t bytes = 0;
    for (const ByteSpan& p : parts) bytes += p.bytes;
    TOPKV_CHECK(bytes == (uint64_t)shape_numel(shape) * st_dtype_size(type), "internal: array '{}' of {} bytes for {} "
                "{} elements", name, bytes, shape_numel(shape), st_dtype_name(type));
    w_.pod<uint64_t>((uint64_t)shape_numel(shape));
    for (const ByteSpan& p : parts) w_.bytes(p.data, p.bytes);
  }
  void put_owned(const std::string& name, StDType type, std::vector<int64_t> shape,
                 std::vector<uint8_t> bytes) override {
    put(name, type, std::move(shape), {ByteSpan{bytes.data(), bytes.size()}});
  }

 private:
  BinaryWriter& w_;
};

class InlineArrayReader final : public IndexArrayReader {
 public:
  explicit InlineArrayReader(BinaryReader& r) : r_(r) {}

 protected:
  Mapped get_raw(const std::string& name, StDType type, const std::vector<int64_t>& shape,
                 const std::function<void*(size_t)>& alloc) override {
    const uint64_t n = r_.pod<uint64_t>();
    TOPKV_CHECK(n == (uint64_t)shape_numel(shape), "index '{}' is malformed: its array '{}' holds {} elements, its header "
                "implies {}", r_.path(), name, n, shape_numel(shape));
    const size_t bytes = (size_t)n * st_dtype_size(type);
    TOPKV_CHECK(bytes <= r_.remaining(), "index '{}' is truncated: array '{}' needs {} bytes, {} remain", r_.path(),
                name, bytes, r_.remaining());
    r_.bytes(alloc((size_t)n), bytes);
    return {};
  }

 private:
  BinaryReader& r_;
};

}  // namespace

std::unique_ptr<IndexArrayWriter> IndexArrayWriter::inline_into(BinaryWriter& w) {
  return std::make_unique<InlineArrayWriter>(w);
}

std::unique_ptr<IndexArrayReader> IndexArrayReader::inline_from(BinaryReader& r) {
  return std::make_unique<InlineArrayReader>(r);
}

}  // namespace topkv
