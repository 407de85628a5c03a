#include "offload/pack_file.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/common/checksum.h"
#include "src/common/error.h"
#include "src/common/progress.h"

namespace topkv {

namespace {

constexpr char kMetaKey[] = "topkv.context_pack";
// The fuzzers' build (tests/fuzz, TOPKV_FUZZ_SKIP_CHECKSUMS) computes every
// checksum but does not compare it, so mutated packs reach the structure
// checks behind it instead of all stopping at the first mismatch.
#ifdef TOPKV_FUZZ_SKIP_CHECKSUMS
constexpr bool kCompareChecksums = false;
#else
constexpr bool kCompareChecksums = true;
#endif
bool sums_match(uint64_t stored, uint64_t actual) { return !kCompareChecksums || stored == actual; }
constexpr char kChecksumKey[] = "topkv.checksums";

uint64_t checksum(const std::vector<PackWriter::Span>& parts) {
  std::vector<ByteSpan> spans;
  for (auto& p : parts) spans.push_back({p.data, p.bytes});
  return checksum64(spans);
}

std::string hex(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace

void PackWriter::add(const std::string& name, StDType dtype, std::vector<int64_t> shape, std::vector<Span> parts) {
  const std::string sum = hex(checksum(parts));  // in parallel over its blocks
  tensors_.add(name, dtype, std::move(shape), std::move(parts));  // refuses a name added twice
  checksums_[name] = sum;
}

void PackWriter::add_owned(const std::string& name, StDType dtype, std::vector<int64_t> shape,
                           std::vector<uint8_t> bytes) {
  owned_.push_back(std::move(bytes));
  add(name, dtype, std::move(shape), {Span{owned_.back().data(), owned_.back().size()}});
}

void PackWriter::add_owned(const std::string& name, StDType dtype, std::vector<int64_t> shape,
                           const std::vector<float>& v) {
  TOPKV_CHECK(dtype == StDType::F32, "internal: fp32 data for a {} tensor", st_dtype_name(dtype));
  std::vector<uint8_t> bytes(v.size() * sizeof(float));
  if (!v.empty()) std::memcpy(bytes.data(), v.data(), bytes.size());
  add_owned(name, dtype, std::move(shape), std::move(bytes));
}

void PackWriter::write(const std::string& path) const {
  SafetensorsWriter w = tensors_;  // spans only: a cheap copy, so write() stays const
  nlohmann::json sums = checksums_;
  const std::string meta = meta_.dump();
  sums[kMetaKey] = hex(checksum64(meta.data(), meta.size()));  // the manifest is checked like a tensor
  w.set_metadata(kMetaKey, meta);
  w.set_metadata(kChecksumKey, sums.dump());
  w.write(path);
}

PackReader::PackReader(const std::string& path) : path_(path) {
  st_ = std::make_shared<SafetensorsReader>(path, "context pack");
  read_metadata();
}

PackReader::PackReader(const uint8_t* data, size_t size, const std::string& name) : path_(name) {
  st_ = std::make_shared<SafetensorsReader>(data, size, name);
  read_metadata();
}

void PackReader::read_metadata() {
  const std::string& path = path_;
  const std::string meta = st_->metadata_or(kMetaKey, ""), sums = st_->metadata_or(kChecksumKey, "");
  TOPKV_CHECK(!meta.empty() && !sums.empty(), "'{}' is a safetensors file but not a topkv context pack (no '{}' "
              "metadata): build one with `topkv index build`", path, kMetaKey);
  try {
    const nlohmann::json sum_json = nlohmann::json::parse(sums);
    for (auto& [name, h] : sum_json.items()) checksums_[name] = std::stoull(h.get<std::string>(), nullptr, 16);
    TOPKV_CHECK(checksums_.count(kMetaKey) && sums_match(checksums_.at(kMetaKey), checksum64(meta.data(), meta.size())),
                "context pack '{}' is corrupted: its manifest does not match its checksum (copy it again, or rebuild "
                "it with `topkv index build`)", path);
    meta_ = nlohmann::json::parse(meta);
  } catch (const nlohmann::json::exception& e) {
    fail("context pack '{}' has unreadable metadata ({}): rebuild it with `topkv index build`", path, e.what());
  } catch (const std::logic_error& e) {  // std::stoull on a checksum that is not hex
    fail("context pack '{}' has an unreadable checksum ({}): rebuild it with `topkv index build`", path, e.what());
  }
  TOPKV_CHECK(meta_.is_object(), "context pack '{}': the '{}' metadata is not a JSON object", path, kMetaKey);
  for (const TensorInfo& t : st_->tensors())
    TOPKV_CHECK(checksums_.count(t.name), "context pack '{}' has no checksum for tensor '{}': not written by "
                "topkv, or its metadata was edited", path, t.name);
}

uint64_t PackReader::file_bytes() const { return st_->file_bytes(); }

SafetensorsReader::CowView PackReader::tensor_copy_on_write(const std::string& name, StDType dtype,
                                                           const std::vector<int64_t>& shape) const {
  tensor(name, dtype, shape);  // the checks
  return st_->map_copy_on_write(*st_->find(name));
}

SafetensorsReader::CowView PackReader::tensor_copy_on_write(const std::string& name, StDType dtype,
                                                           const std::vector<int64_t>& shape, uint64_t from,
                                                           uint64_t capacity) const {
  tensor(name, dtype, shape);
  return st_->map_copy_on_write(*st_->find(name), from, capacity);
}

const uint8_t* PackReader::tensor(const std::string& name, StDType dtype, const std::vector<int64_t>& shape) const {
  const TensorInfo* t = st_->find(name);
  TOPKV_CHECK(t, "context pack '{}' has no tensor '{}': the file is incomplete or from another topkv version",
              path_, name);
  if (t->dtype == dtype && t->shape == shape) return st_->data(*t);
  TensorInfo want;
  want.shape = shape;
  fail("context pack '{}': tensor '{}' is {} {}, expected {} {}", path_, name, st_dtype_name(t->dtype),
       t->shape_str(), st_dtype_name(dtype), want.shape_str());
}

std::pair<const uint8_t*, size_t> PackReader::blob(const std::string& name) const {
  const TensorInfo* t = st_->find(name);
  TOPKV_CHECK(t && t->dtype == StDType::U8 && t->shape.size() == 1, "context pack '{}' has no U8 tensor '{}': the "
              "file is incomplete or from another topkv version", path_, name);
  return {st_->data(*t), (size_t)t->nbytes()};
}

uint64_t PackReader::verify_all(bool progress) const {
  uint64_t total = 0;
  for (const TensorInfo& t : st_->tensors()) total += t.nbytes();
  Progress bar("verify", (int64_t)(total >> 20), "MiB", progress && total >= (1ull << 30));
  for (const TensorInfo& t : st_->tensors()) {
    TOPKV_CHECK(sums_match(checksums_.at(t.name), checksum64(st_->data(t), t.nbytes())), "context pack '{}' is corrupted: "
                "tensor '{}' does not match its checksum (copy it again, or rebuild it with `topkv index build`)",
                path_, t.name);
    // The exact parts of a layer (sinks, window) are fp32 and attended every
    // step: one that is not finite passes a checksum re-sealed over it.
    const bool exact_part = t.dtype == StDType::F32 && (t.name.ends_with("sinks_k") || t.name.ends_with("sinks_v") ||
                                                        t.name.ends_with("window_k") || t.name.ends_with("window_v"));
    if (exact_part) {
      const float* x = reinterpret_cast<const float*>(st_->data(t));
      for (int64_t i = 0; i < t.numel(); ++i)
        TOPKV_CHECK(std::isfinite(x[i]), "context pack '{}' is corrupt: tensor '{}' holds {} at element {} (rebuild "
                    "it with `topkv index build`)", path_, t.name, x[i], i);
    }
    bar.add((int64_t)(t.nbytes() >> 20));
  }
  bar.finish();
  return total;
}

void PackArrayWriter::put(const std::string& name, StDType type, std::vector<int64_t> shape,
                          std::vector<ByteSpan> parts) {
  std::vector<PackWriter::Span> spans;
  for (const ByteSpan& p : parts)
    if (p.bytes) spans.push_back({p.data, p.bytes});
  w_.add(prefix_ + name, type, std::move(shape), std::move(spans));
}

void PackArrayWriter::put_owned(const std::string& name, StDType type, std::vector<int64_t> shape,
                                std::vector<uint8_t> bytes) {
  w_.add_owned(prefix_ + name, type, std::move(shape), std::move(bytes));
}

IndexArrayReader::Mapped PackArrayReader::get_raw(const std::string& name, StDType type,
                                                  const std::vector<int64_t>& shape,
                                                  const std::function<void*(size_t)>&) {
  SafetensorsReader::CowView v = r_.tensor_copy_on_write(prefix_ + name, type, shape);
  return {v.data, (size_t)shape_numel(shape), std::move(v.owner)};
}

}  // namespace topkv
