#include "src/common/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "src/common/error.h"
#include "src/common/file_io.h"

namespace topkv {

namespace {

struct DTypeEntry {
  StDType type;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {StDType::F64, "F64", 8}, {StDType::F32, "F32", 4}, {StDType::F16, "F16", 2}, {StDType::BF16, "BF16", 2},
    {StDType::I64, "I64", 8}, {StDType::I32, "I32", 4}, {StDType::I16, "I16", 2}, {StDType::I8, "I8", 1},
    {StDType::U8, "U8", 1},   {StDType::BOOL, "BOOL", 1}, {StDType::F8_E4M3, "F8_E4M3", 1},
};

// The reference implementation refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

// a * b, or false on overflow past 2^63.
bool mul_ok(uint64_t a, uint64_t b, uint64_t& out) {
  if (a != 0 && b > (uint64_t)INT64_MAX / a) return false;
  out = a * b;
  return true;
}

}  // namespace

size_t st_dtype_size(StDType t) { return kDTypes[(size_t)t].size; }
const char* st_dtype_name(StDType t) { return kDTypes[(size_t)t].name; }

StDType parse_st_dtype(std::string_view name) {
  for (auto& e : kDTypes)
    if (name == e.name) return e.type;
  fail("unsupported safetensors dtype '{}' (topkv reads F64, F32, F16, BF16, F8_E4M3, I64, I32, I16, I8, U8, BOOL)", name);
}

StDType st_dtype_of(DType t) {
  switch (t) {
    case DType::F32: return StDType::F32;
    case DType::F16: return StDType::F16;
    case DType::BF16: return StDType::BF16;
    case DType::F8E4M3: return StDType::F8_E4M3;
    case DType::Q8_0: return StDType::U8;
    case DType::I8: break;
  }
  fail_not_a_row_type(t);
}

int64_t st_row_elems(DType t, int64_t dim) {
  return (int64_t)(dtype_bytes(t, (size_t)dim) / st_dtype_size(st_dtype_of(t)));
}

bool st_is_row_type(StDType t) {
  return t == StDType::F32 || t == StDType::F16 || t == StDType::BF16 || t == StDType::F8_E4M3;
}

DType row_dtype_of(StDType t) {
  switch (t) {
    case StDType::F32: return DType::F32;
    case StDType::F16: return DType::F16;
    case StDType::BF16: return DType::BF16;
    case StDType::F8_E4M3: return DType::F8E4M3;
    default: fail("tensor type {} is not a key/value element type (use F32, F16, BF16 or F8_E4M3)", st_dtype_name(t));
  }
}

int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string TensorInfo::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// ---- reader -------------------------------------------------------------------

SafetensorsReader::SafetensorsReader(const std::string& path, std::string_view what) : path_(path) {
  fd_ = open_regular_file(path, what, &stat_).release();
  const auto close_fd = [this] { ::close(fd_), fd_ = -1; };
  const struct stat& st = stat_;
  map_bytes_ = (size_t)st.st_size;
  if (map_bytes_ < 8) {
    close_fd();
    fail("safetensors file '{}' is {} bytes: too short for the 8-byte header length (truncated?)", path,
         map_bytes_);
  }
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd_, 0);
  if (map_ == MAP_FAILED) {
    const int err = errno;
    close_fd();
    map_ = nullptr;
    fail("cannot memory-map '{}': {}", path, std::strerror(err));
  }
  region_ = MappedRegion(path, stat_, map_, map_bytes_);
  try {
    parse();
  } catch (...) {
    region_.reset();
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    close_fd();
    throw;
  }
}

SafetensorsReader::SafetensorsReader(const uint8_t* data, size_t size, const std::string& name) : path_(name) {
  map_ = const_cast<uint8_t*>(data);  // never written: map_copy_on_write copies from it
  map_bytes_ = size;
  if (map_bytes_ < 8)
    fail("safetensors file '{}' is {} bytes: too short for the 8-byte header length (truncated?)", name, map_bytes_);
  parse();
}

void SafetensorsReader::parse() {
  const std::string& path = path_;
  const auto* bytes = static_cast<const uint8_t*>(map_);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  TOPKV_CHECK(n <= kMaxHeaderBytes, "safetensors file '{}': header length {} is over the 100 MB limit (corrupt "
              "or not a safetensors file)", path, n);
  TOPKV_CHECK(n <= map_bytes_ - 8, "safetensors file '{}': header of {} bytes but only {} bytes follow the "
              "length (truncated?)", path, n, map_bytes_ - 8);
  TOPKV_CHECK(n >= 2 && bytes[8] == '{', "safetensors file '{}': the header is not a JSON object", path);
  const uint64_t data_bytes = map_bytes_ - 8 - n;
  data_ = bytes + 8 + n;

  nlohmann::json h;
  try {
    h = nlohmann::json::parse(bytes + 8, bytes + 8 + n);
  } catch (const nlohmann::json::exception& e) {
    fail("safetensors file '{}': header is not valid JSON ({})", path, e.what());
  }
  TOPKV_CHECK(h.is_object(), "safetensors file '{}': the header is not a JSON object", path);
  for (auto& [name, v] : h.items()) {
    if (name == "__metadata__") {
      TOPKV_CHECK(v.is_object(), "safetensors file '{}': __metadata__ must be an object of strings", path);
      for (auto& [k, s] : v.items()) {
        TOPKV_CHECK(s.is_string(), "safetensors file '{}': metadata '{}' is not a string", path, k);
        metadata_[k] = s.get<std::string>();
      }
      continue;
    }
    auto bad = [&path, tensor = std::string(name)](const std::string& what) {
      fail("safetensors file '{}': tensor '{}': {}", path, tensor, what);
    };
    if (!v.is_object()) bad("entry is not an object");
    TensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) bad("missing dtype");
    t.dtype = parse_st_dtype(dt->get<std::string>());
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) bad("missing shape");
    uint64_t numel = 1;
    for (auto& x : *sh) {
      if (!x.is_number_integer() || x.get<int64_t>() < 0) bad("shape " + sh->dump() + " has a bad dimension");
      t.shape.push_back(x.get<int64_t>());
      if (!mul_ok(numel, (uint64_t)t.shape.back(), numel)) bad("shape " + sh->dump() + " overflows");
    }
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      bad("data_offsets must be two non-negative integers");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_bytes)
      bad(fmt::format("data_offsets [{}, {}] outside the {} data bytes the file holds (truncated?)", t.begin,
                      t.end, data_bytes));
    uint64_t want;
    if (!mul_ok(numel, st_dtype_size(t.dtype), want) || want != t.nbytes())
      bad(fmt::format("{} {} needs {} bytes but data_offsets span {}", st_dtype_name(t.dtype), t.shape_str(),
                      numel * st_dtype_size(t.dtype), t.nbytes()));
    tensors_.push_back(std::move(t));
  }
  // The spec: offsets cover the buffer exactly, no holes, no overlaps.
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t at = 0;
  for (auto& t : tensors_) {
    TOPKV_CHECK(t.begin == at, "safetensors file '{}': tensor '{}' starts at byte {} of the data but the "
                "previous one ends at {} (overlap or hole: corrupt file)", path, t.name, t.begin, at);
    at = t.end;
  }
  TOPKV_CHECK(at == data_bytes, "safetensors file '{}': tensors cover {} bytes but {} follow the header "
              "(trailing garbage or a corrupt header)", path, at, data_bytes);
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_[tensors_[i].name] = i;
}

SafetensorsReader::~SafetensorsReader() {
  region_.reset();
  if (map_ && fd_ >= 0) ::munmap(map_, map_bytes_);
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsReader::CowView SafetensorsReader::map_copy_on_write(const TensorInfo& t) const {
  return map_copy_on_write(t, 0, t.nbytes());
}

SafetensorsReader::CowView SafetensorsReader::map_copy_on_write(const TensorInfo& t, uint64_t from,
                                                                uint64_t capacity) const {
  TOPKV_CHECK(from <= t.nbytes() && capacity >= t.nbytes() - from, "internal: mapping {} bytes of tensor '{}' from "
              "byte {} of {}", capacity, t.name, from, t.nbytes());
  if (capacity == 0) return {};
  if (fd_ < 0) {  // a reader over memory: a private copy, zeroed past the tensor
    auto copy = std::make_shared<uint8_t[]>((size_t)capacity);
    std::memcpy(copy.get(), data(t) + from, (size_t)(t.nbytes() - from));
    return {copy.get(), std::move(copy)};
  }
  const uint64_t at = (uint64_t)(data_ - static_cast<const uint8_t*>(map_)) + t.begin + from;
  const uint64_t page = (uint64_t)::sysconf(_SC_PAGESIZE), first = at / page * page, lead = at - first;
  const auto round_up = [page](uint64_t x) { return (x + page - 1) / page * page; };
  const uint64_t total = round_up(lead + capacity), in_file = round_up(lead + (t.nbytes() - from));
  // MAP_NORESERVE: only the pages written need memory, so commit accounting
  // is not charged for the whole range. The region is reserved anonymous,
  // then the file's pages are mapped over its start (MAP_FIXED); the file
  // part ends in the page of the tensor's last byte, never past the file.
  const int flags = MAP_PRIVATE | MAP_NORESERVE;
  void* p = total == in_file ? ::mmap(nullptr, (size_t)total, PROT_READ | PROT_WRITE, flags, fd_, (off_t)first)
                             : ::mmap(nullptr, (size_t)total, PROT_READ | PROT_WRITE, flags | MAP_ANONYMOUS, -1, 0);
  TOPKV_CHECK(p != MAP_FAILED, "cannot map tensor '{}' of '{}' copy-on-write: {}", t.name, path_,
              std::strerror(errno));
  // The owner unregisters the SIGBUS guard of the file part, then unmaps.
  auto guard = std::make_shared<MappedRegion>();
  std::shared_ptr<void> owner(p, [total, guard](void* q) {
    guard->reset();
    ::munmap(q, (size_t)total);
  });
  if (total != in_file && in_file > 0 &&
      ::mmap(p, (size_t)in_file, PROT_READ | PROT_WRITE, flags | MAP_FIXED, fd_, (off_t)first) == MAP_FAILED)
    fail("cannot map tensor '{}' of '{}' copy-on-write: {}", t.name, path_, std::strerror(errno));
  *guard = MappedRegion(path_, stat_, p, (size_t)in_file, first);
  return {static_cast<uint8_t*>(p) + lead, std::move(owner)};
}

std::string SafetensorsReader::metadata_or(const std::string& key, const std::string& def) const {
  auto it = metadata_.find(key);
  return it == metadata_.end() ? def : it->second;
}

const TensorInfo* SafetensorsReader::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& SafetensorsReader::get(const std::string& name) const {
  if (auto* t = find(name)) return *t;
  std::string have;
  size_t shown = 0;
  for (auto& [n, i] : by_name_) {
    if (shown++ == 12) {
      have += ", ...";
      break;
    }
    have += (have.empty() ? "" : ", ") + n;
  }
  fail("safetensors file '{}' has no tensor '{}' (it has: {})", path_, name, have.empty() ? "none" : have);
}

void SafetensorsReader::read_f32(const TensorInfo& t, int64_t first, int64_t count, float* out) const {
  TOPKV_CHECK(first >= 0 && count >= 0 && first + count <= t.numel(),
              "reading elements [{}, {}) of tensor '{}' which has {}", first, first + count, t.name, t.numel());
  const DType dt = row_dtype_of(t.dtype);
  to_f32(dt, data(t) + (size_t)first * dtype_size(dt), out, (size_t)count);
}

// ---- writer -------------------------------------------------------------------

void SafetensorsWriter::add(const std::string& name, StDType dtype, std::vector<int64_t> shape,
                            std::vector<Span> parts) {
  TOPKV_CHECK(!name.empty() && name != "__metadata__", "bad safetensors tensor name '{}'", name);
  for (auto& e : entries_) TOPKV_CHECK(e.name != name, "tensor '{}' added twice", name);
  uint64_t numel = 1, bytes = 0;
  for (int64_t s : shape) {
    TOPKV_CHECK(s >= 0, "tensor '{}': negative dimension in its shape", name);
    TOPKV_CHECK(mul_ok(numel, (uint64_t)s, numel), "tensor '{}': shape overflows", name);
  }
  for (auto& p : parts) bytes += p.bytes;
  TOPKV_CHECK(bytes == numel * st_dtype_size(dtype), "tensor '{}': {} elements of {} need {} bytes, got {}", name,
              numel, st_dtype_name(dtype), numel * st_dtype_size(dtype), bytes);
  entries_.push_back({name, dtype, std::move(shape), std::move(parts), bytes});
}

void SafetensorsWriter::add(const std::string& name, StDType dtype, std::vector<int64_t> shape, const void* data) {
  uint64_t numel = 1;
  for (int64_t s : shape) numel *= (uint64_t)std::max<int64_t>(s, 0);
  add(name, dtype, std::move(shape), {Span{data, (size_t)(numel * st_dtype_size(dtype))}});
}

void SafetensorsWriter::write(const std::string& path, std::string_view what) const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) h["__metadata__"] = metadata_;
  std::vector<const Entry*> order;
  for (auto& e : entries_) order.push_back(&e);
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry* a, const Entry* b) { return st_dtype_size(a->dtype) > st_dtype_size(b->dtype); });
  uint64_t at = 0;
  for (const Entry* e : order) {
    h[e->name] = {{"dtype", st_dtype_name(e->dtype)}, {"shape", e->shape}, {"data_offsets", {at, at + e->bytes}}};
    at += e->bytes;
  }
  std::string header = h.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // align the data to 8 bytes

  AtomicFile f(path, what);
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = (uint8_t)((uint64_t)header.size() >> (8 * i));
  f.write(len, 8);
  f.write(header);
  for (const Entry* e : order)
    for (auto& p : e->parts) f.write(p.data, p.bytes);
  // Synced before the rename: a crash never leaves a complete-looking name
  // over incomplete bytes.
  f.commit();
}

}  // namespace topkv
