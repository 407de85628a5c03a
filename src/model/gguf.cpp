// GGUF reader: memory map + a bounds-checked cursor. Every count read from the
// file is checked against the bytes that remain before anything is allocated
// or dereferenced (a count of 2^60 strings must not become a reserve() call).
#include "src/model/gguf.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <type_traits>

#include "src/common/binary_io.h"
#include "src/common/error.h"
#include "src/common/file_io.h"

namespace topkv {

const char* gguf_type_name(GgufType t) {
  static const char* names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32",
                                "bool", "str", "arr", "u64", "i64", "f64"};
  auto i = (uint32_t)t;
  return i < 13 ? names[i] : "unknown";
}

size_t gguf_type_size(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: return 8;
    default: return 0;
  }
}

static bool is_int_type(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}
static bool is_signed_type(GgufType t) {
  return t == GgufType::I8 || t == GgufType::I16 || t == GgufType::I32 || t == GgufType::I64;
}

// Reads scalar of type t at p into the widened fields of kv (i, u, f).
static void load_scalar(GgufType t, const uint8_t* p, int64_t& i, uint64_t& u, double& f) {
  switch (t) {
    case GgufType::U8: u = p[0]; break;
    case GgufType::I8: i = (int8_t)p[0]; break;
    case GgufType::BOOL: i = p[0]; break;
    case GgufType::U16: { uint16_t v; std::memcpy(&v, p, 2); u = v; break; }
    case GgufType::I16: { int16_t v; std::memcpy(&v, p, 2); i = v; break; }
    case GgufType::U32: { uint32_t v; std::memcpy(&v, p, 4); u = v; break; }
    case GgufType::I32: { int32_t v; std::memcpy(&v, p, 4); i = v; break; }
    case GgufType::F32: { float v; std::memcpy(&v, p, 4); f = v; break; }
    case GgufType::U64: std::memcpy(&u, p, 8); break;
    case GgufType::I64: std::memcpy(&i, p, 8); break;
    case GgufType::F64: std::memcpy(&f, p, 8); break;
    default: break;
  }
}

static std::string scalar_string(GgufType t, int64_t i, uint64_t u, double f) {
  if (t == GgufType::BOOL) return i ? "true" : "false";
  if (t == GgufType::F32) return fmt::format("{}", (float)f);
  if (t == GgufType::F64) return fmt::format("{}", f);
  return is_signed_type(t) ? fmt::format("{}", i) : fmt::format("{}", u);
}

static std::string quoted(std::string_view s, size_t max_chars = 80) {
  std::string out = "\"";
  for (size_t k = 0; k < s.size() && k < max_chars; ++k) {
    unsigned char c = s[k];
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '"') out += "\\\"";
    else if (c < 0x20) out += fmt::format("\\x{:02x}", c);
    else out += (char)c;
  }
  if (s.size() > max_chars) out += "...";
  return out + "\"";
}

std::string GgufKV::value_string(size_t max_elems) const {
  if (type == GgufType::STR) return quoted(str);
  if (type != GgufType::ARR) return scalar_string(type, i, u, f);
  std::string out = fmt::format("[{} x {}: ", arr_count, gguf_type_name(arr_type));
  for (uint64_t k = 0; k < arr_count && k < max_elems; ++k) {
    if (k) out += ", ";
    if (arr_type == GgufType::STR) {
      out += quoted(arr_str[k], 24);
    } else {
      int64_t ei = 0; uint64_t eu = 0; double ef = 0;
      load_scalar(arr_type, arr_data + k * gguf_type_size(arr_type), ei, eu, ef);
      out += scalar_string(arr_type, ei, eu, ef);
    }
  }
  if (arr_count > max_elems) out += ", ...";
  return out + "]";
}

std::string GgufTensor::shape_string() const {
  std::string s;
  for (int d = 0; d < n_dims; ++d) s += (d ? " x " : "") + std::to_string(ne[d]);
  return s;
}

// ---- parsing -------------------------------------------------------------------

namespace {

// What a read is for, in the message when it fails: a string, or a callable
// that makes one. A callable runs only when the read fails, so a vocabulary of
// 262,144 strings is read without formatting 262,144 descriptions.
template <typename W>
std::string describe(const W& what) {
  if constexpr (std::is_invocable_v<const W&>)
    return what();
  else
    return std::string(what);
}

// Bounds-checked reads from the file's bytes; `what` says which part of the
// file is being read so a truncation error can point at it.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* base, size_t size) : path_(path), base_(base), size_(size) {}
  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename W>
  void need(uint64_t n, const W& what) const {
    if (n > remaining())
      fail("'{}' is truncated or corrupt: {} needs {} bytes at offset {} but only {} remain "
           "(file size {}); re-download or re-convert the model",
           path_, describe(what), n, pos_, remaining(), size_);
  }
  template <typename W>
  const uint8_t* take(uint64_t n, const W& what) {
    need(n, what);
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }
  template <typename T, typename W>
  T pod(const W& what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  template <typename W>
  std::string_view str(const W& what) {
    uint64_t n = pod<uint64_t>([&] { return describe(what) + " (string length)"; });
    if (n > remaining())
      fail("'{}' is truncated or corrupt: {} has length {} at offset {}, beyond the end of the file ({} bytes "
           "remain)",
           path_, describe(what), n, pos_ - 8, remaining());
    return {(const char*)take(n, what), (size_t)n};
  }

 private:
  const std::string& path_;
  const uint8_t* base_;
  size_t size_, pos_ = 0;
};

}  // namespace

GgufFile::~GgufFile() {
  region_.reset();
  if (mapped_) munmap((void*)base_, size_);
}

static void check_not_empty(size_t size, const std::string& path) {
  if (size == 0) fail("'{}' is empty, not a GGUF model", path);
}

std::unique_ptr<GgufFile> GgufFile::open(const std::string& path) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = path;
  struct stat st {};
  Fd fd = open_regular_file(path, "model", &st);  // never blocks on a FIFO; a folder is an Error
  check_not_empty((size_t)st.st_size, path);
  void* p = mmap(nullptr, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd.get(), 0);
  int err = errno;
  TOPKV_CHECK(p != MAP_FAILED, "cannot memory-map '{}': {}", path, std::strerror(err));
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = (size_t)st.st_size;
  f->mapped_ = true;
  f->region_ = MappedRegion(path, st, p, f->size_);
  f->parse();
  return f;
}

std::unique_ptr<GgufFile> GgufFile::from_memory(const uint8_t* data, size_t size, const std::string& name) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->path_ = name;
  check_not_empty(size, name);
  f->base_ = data;
  f->size_ = size;
  f->parse();
  return f;
}

void GgufFile::parse() {
  Cursor c(path_, base_, size_);
  // ---- header ----
  if (size_ < 4 || std::memcmp(base_, "GGUF", 4) != 0) {
    std::string magic(reinterpret_cast<const char*>(base_), std::min<size_t>(4, size_));
    const char* hint = (magic == "ggjt" || magic == "ggmf" || magic == "ggml" || magic == "tjgg" ||
                        magic == "lmgg")
                           ? " (an old GGML-era file: convert it to GGUF with llama.cpp)"
                           : "";
    fail("'{}' is not a GGUF file: it starts with {} instead of \"GGUF\"{}", path_, quoted(magic), hint);
  }
  c.take(4, "magic");
  version_ = c.pod<uint32_t>("header (version)");
  if (version_ != 2 && version_ != 3) {
    if (version_ == 1)
      fail("'{}' is GGUF version 1, which is not supported (versions 2 and 3 are); "
           "re-convert it with a current llama.cpp", path_);
    if ((version_ & 0xffff) == 0 && (version_ >> 24) <= 3)
      fail("'{}' looks like a big-endian GGUF (version field {:#x}); only little-endian files are supported",
           path_, version_);
    fail("'{}' has unsupported GGUF version {} (versions 2 and 3 are supported)", path_, version_);
  }
  uint64_t n_tensors = c.pod<uint64_t>("header (tensor count)");
  uint64_t n_kv = c.pod<uint64_t>("header (metadata count)");
  // Counts only cap the reservations (smallest entries: a KV is key length 8 +
  // type 4 + 1 byte, a tensor info 32 bytes), so a huge count cannot allocate;
  // an entry beyond the end of the file is reported where it is cut.
  const uint64_t max_kv = c.remaining() / 13, max_tensors = c.remaining() / 32;

  // ---- metadata ----
  kvs_.reserve(std::min(n_kv, max_kv));
  for (uint64_t k = 0; k < n_kv; ++k) {
    GgufKV kv;
    const auto entry = [&] { return fmt::format("metadata entry {} of {}", k, n_kv); };
    kv.key = std::string(c.str([&] { return entry() + " key"; }));
    const auto where = [&] { return fmt::format("{} ('{}')", entry(), kv.key); };
    uint32_t type = c.pod<uint32_t>([&] { return where() + " type"; });
    if (type > 12) fail("'{}' is corrupt: {} has unknown value type {}", path_, where(), type);
    kv.type = (GgufType)type;
    if (kv.type == GgufType::STR) {
      kv.str = c.str(where);
    } else if (kv.type == GgufType::ARR) {
      uint32_t et = c.pod<uint32_t>([&] { return where() + " array element type"; });
      if (et > 12) fail("'{}' is corrupt: {} is an array of unknown element type {}", path_, where(), et);
      if (et == (uint32_t)GgufType::ARR)
        fail("'{}': {} is an array of arrays, which GGUF readers do not support", path_, where());
      kv.arr_type = (GgufType)et;
      kv.arr_count = c.pod<uint64_t>([&] { return where() + " array length"; });
      if (kv.arr_type == GgufType::STR) {
        if (kv.arr_count > c.remaining() / 8)
          fail("'{}' is truncated or corrupt: {} claims {} strings but only {} bytes remain", path_, where(), kv.arr_count,
               c.remaining());
        kv.arr_str.reserve(kv.arr_count);
        for (uint64_t e = 0; e < kv.arr_count; ++e)
          kv.arr_str.push_back(c.str([&] { return fmt::format("{} element {}", where(), e); }));
      } else {
        size_t es = gguf_type_size(kv.arr_type);
        if (kv.arr_count > c.remaining() / es)
          fail("'{}' is truncated or corrupt: {} claims {} elements of {} bytes but only {} bytes remain", path_, where(),
               kv.arr_count, es, c.remaining());
        kv.arr_data = c.take(kv.arr_count * es, where);
      }
    } else {
      load_scalar(kv.type, c.take(gguf_type_size(kv.type), [&] { return where() + " value"; }), kv.i, kv.u, kv.f);
      if (kv.type == GgufType::BOOL && kv.i > 1)
        fail("'{}' is corrupt: {} is a bool with byte value {}", path_, where(), kv.i);
    }
    if (!kv_index_.emplace(kv.key, kvs_.size()).second)
      fail("'{}' is corrupt: metadata key '{}' appears twice", path_, kv.key);
    kvs_.push_back(std::move(kv));
  }
  if (const GgufKV* a = find_kv("general.alignment")) {
    if (a->type != GgufType::U32)
      fail("'{}': general.alignment must be a u32, found {}", path_, gguf_type_name(a->type));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      fail("'{}': general.alignment {} is not a power of two", path_, a->u);
    alignment_ = (uint32_t)a->u;
  }

  // ---- tensor infos ----
  tensors_.reserve(std::min(n_tensors, max_tensors));
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GgufTensor t;
    const auto entry = [&] { return fmt::format("tensor info {} of {}", k, n_tensors); };
    t.name = std::string(c.str([&] { return entry() + " name"; }));
    if (t.name.empty()) fail("'{}' is corrupt: {} has an empty name", path_, entry());
    const auto where = [&] { return fmt::format("{} ('{}')", entry(), t.name); };
    uint32_t n_dims = c.pod<uint32_t>([&] { return where() + " n_dims"; });
    if (n_dims < 1 || n_dims > 4)
      fail("'{}' is corrupt: {} has {} dimensions (1 to 4 are allowed)", path_, where(), n_dims);
    t.n_dims = (int)n_dims;
    int64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = c.pod<uint64_t>([&] { return where() + " shape"; });
      if (ne == 0 || ne > (uint64_t)std::numeric_limits<int64_t>::max() / (uint64_t)nel)
        fail("'{}' is corrupt: {} has dimension {} of size {} ({})", path_, where(), d, ne,
             ne == 0 ? "empty tensors are not allowed" : "the element count overflows");
      t.ne[d] = (int64_t)ne;
      nel *= (int64_t)ne;
    }
    uint32_t type = c.pod<uint32_t>([&] { return where() + " type"; });
    if (!ggml_type_supported(type))
      fail("'{}': {} has tensor type {} (code {}), which topkv does not support (supported: F32, F16, "
           "BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K); re-quantise the model to one of those",
           path_, where(), ggml_type_name(type), type);
    t.type = (GgmlType)type;
    GgmlTypeInfo ti = ggml_type_info(t.type);
    if (t.ne[0] % ti.block_elems != 0)
      fail("'{}' is corrupt: {} has a row of {} elements, not a multiple of the {} block size {}", path_, where(),
           t.ne[0], ti.name, ti.block_elems);
    t.row_bytes = ggml_row_bytes(t.type, t.ne[0]);
    // nel fits in int64, and block_bytes/block_elems <= 2 here... except for
    // F32 (4 bytes/element): check the multiplication anyway.
    if ((uint64_t)t.nrows() > std::numeric_limits<uint64_t>::max() / t.row_bytes)
      fail("'{}' is corrupt: {} byte size overflows", path_, where());
    t.nbytes = t.row_bytes * (size_t)t.nrows();
    t.offset = c.pod<uint64_t>([&] { return where() + " offset"; });
    if (t.offset % alignment_ != 0)
      fail("'{}' is corrupt: {} has offset {}, not a multiple of the alignment {}", path_, where(), t.offset,
           alignment_);
    if (!tensor_index_.emplace(t.name, tensors_.size()).second)
      fail("'{}' is corrupt: tensor name '{}' appears twice", path_, t.name);
    tensors_.push_back(std::move(t));
  }

  // ---- data section ----
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  if (tensors_.empty()) return;
  if (data_offset_ > size_)
    fail("'{}' is truncated: the data section would start at offset {} but the file has {} bytes", path_,
         data_offset_, size_);
  uint64_t data_size = size_ - data_offset_;
  std::vector<const GgufTensor*> by_offset;
  for (auto& t : tensors_) {
    if (t.offset > data_size || t.nbytes > data_size - t.offset)
      fail("'{}' is truncated or corrupt: tensor '{}' ({} bytes at data offset {}) ends beyond the end of "
           "the file (data section holds {} bytes)",
           path_, t.name, t.nbytes, t.offset, data_size);
    t.data = base_ + data_offset_ + t.offset;
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensor *a = by_offset[k - 1], *b = by_offset[k];
    if (a->offset + a->nbytes > b->offset)
      fail("'{}' is corrupt: tensors '{}' (data offset {}, {} bytes) and '{}' (data offset {}) overlap", path_,
           a->name, a->offset, a->nbytes, b->name, b->offset);
  }
}

// ---- metadata access -----------------------------------------------------------

const GgufKV* GgufFile::find_kv(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second];
}

namespace {
const GgufKV& need_kv(const GgufFile& f, std::string_view key) {
  const GgufKV* kv = f.find_kv(key);
  if (!kv) fail("model '{}' has no metadata key '{}' (is it the architecture you expect?)", f.path(), key);
  return *kv;
}
[[noreturn]] void wrong_type(const GgufFile& f, const GgufKV& kv, const char* want) {
  std::string found = kv.type == GgufType::ARR ? fmt::format("array of {}", gguf_type_name(kv.arr_type))
                                               : gguf_type_name(kv.type);
  fail("model '{}': metadata key '{}' is {}, expected {}", f.path(), kv.key, found, want);
}
// An integer metadata value (any integer type), range-checked to [lo, hi].
int64_t int_in_range(const GgufFile& f, const GgufKV& kv, int64_t lo, uint64_t hi, const char* want) {
  if (!is_int_type(kv.type)) wrong_type(f, kv, want);
  bool ok = is_signed_type(kv.type) ? (kv.i >= lo && (kv.i < 0 || (uint64_t)kv.i <= hi))
                                    : kv.u <= hi;
  if (!ok)
    fail("model '{}': metadata key '{}' = {} does not fit in {}", f.path(), kv.key, kv.value_string(), want);
  return is_signed_type(kv.type) ? kv.i : (int64_t)kv.u;
}
}  // namespace

uint32_t GgufFile::get_u32(std::string_view key) const {
  return (uint32_t)int_in_range(*this, need_kv(*this, key), 0, UINT32_MAX, "u32");
}
int32_t GgufFile::get_i32(std::string_view key) const {
  return (int32_t)int_in_range(*this, need_kv(*this, key), INT32_MIN, INT32_MAX, "i32");
}
uint64_t GgufFile::get_u64(std::string_view key) const {
  const GgufKV& kv = need_kv(*this, key);
  if (kv.type == GgufType::U64) return kv.u;
  return (uint64_t)int_in_range(*this, kv, 0, UINT64_MAX, "u64");
}
float GgufFile::get_f32(std::string_view key) const {
  const GgufKV& kv = need_kv(*this, key);
  if (kv.type != GgufType::F32 && kv.type != GgufType::F64) wrong_type(*this, kv, "f32");
  return (float)kv.f;
}
bool GgufFile::get_bool(std::string_view key) const {
  const GgufKV& kv = need_kv(*this, key);
  if (kv.type != GgufType::BOOL) wrong_type(*this, kv, "bool");
  return kv.i != 0;
}
std::string GgufFile::get_str(std::string_view key) const {
  const GgufKV& kv = need_kv(*this, key);
  if (kv.type != GgufType::STR) wrong_type(*this, kv, "str");
  return std::string(kv.str);
}

uint32_t GgufFile::get_u32_or(std::string_view key, uint32_t def) const { return has(key) ? get_u32(key) : def; }
int32_t GgufFile::get_i32_or(std::string_view key, int32_t def) const { return has(key) ? get_i32(key) : def; }
uint64_t GgufFile::get_u64_or(std::string_view key, uint64_t def) const { return has(key) ? get_u64(key) : def; }
float GgufFile::get_f32_or(std::string_view key, float def) const { return has(key) ? get_f32(key) : def; }
bool GgufFile::get_bool_or(std::string_view key, bool def) const { return has(key) ? get_bool(key) : def; }
std::string GgufFile::get_str_or(std::string_view key, const std::string& def) const {
  return has(key) ? get_str(key) : def;
}

std::vector<std::string> GgufFile::get_arr_str(std::string_view key) const {
  const GgufKV& kv = need_kv(*this, key);
  if (kv.type != GgufType::ARR || kv.arr_type != GgufType::STR) wrong_type(*this, kv, "array of str");
  return {kv.arr_str.begin(), kv.arr_str.end()};
}

std::vector<float> GgufFile::get_arr_f32(std::string_view key) const {
  const GgufKV& kv = need_kv(*this, key);
  if (kv.type != GgufType::ARR || (kv.arr_type != GgufType::F32 && kv.arr_type != GgufType::F64))
    wrong_type(*this, kv, "array of f32");
  std::vector<float> out(kv.arr_count);
  size_t es = gguf_type_size(kv.arr_type);
  for (uint64_t e = 0; e < kv.arr_count; ++e) {
    int64_t i = 0; uint64_t u = 0; double f = 0;
    load_scalar(kv.arr_type, kv.arr_data + e * es, i, u, f);
    out[e] = (float)f;
  }
  return out;
}

std::vector<int32_t> GgufFile::get_arr_i32(std::string_view key) const {
  const GgufKV& kv = need_kv(*this, key);
  if (kv.type != GgufType::ARR || !is_int_type(kv.arr_type)) wrong_type(*this, kv, "array of integers");
  std::vector<int32_t> out(kv.arr_count);
  size_t es = gguf_type_size(kv.arr_type);
  for (uint64_t e = 0; e < kv.arr_count; ++e) {
    int64_t i = 0; uint64_t u = 0; double f = 0;
    load_scalar(kv.arr_type, kv.arr_data + e * es, i, u, f);
    int64_t v = is_signed_type(kv.arr_type) ? i : (int64_t)std::min<uint64_t>(u, (uint64_t)INT64_MAX);
    if (v < INT32_MIN || v > INT32_MAX)
      fail("model '{}': metadata array '{}' element {} = {} does not fit in i32", path_, kv.key, e, v);
    out[e] = (int32_t)v;
  }
  return out;
}

uint64_t GgufFile::get_arr_size(std::string_view key) const {
  const GgufKV& kv = need_kv(*this, key);
  if (kv.type != GgufType::ARR) wrong_type(*this, kv, "array");
  return kv.arr_count;
}

// ---- tensors -------------------------------------------------------------------

const GgufTensor* GgufFile::find(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find(name);
  if (!t)
    fail("model '{}' has no tensor '{}' ({} tensors; is it the architecture you expect?)", path_, name,
         tensors_.size());
  return *t;
}

uint64_t GgufFile::tensor_bytes() const {
  uint64_t s = 0;
  for (auto& t : tensors_) s += t.nbytes;
  return s;
}

uint64_t GgufFile::content_hash() const {
  std::call_once(hash_once_, [this] {
    constexpr size_t kWindow = 4096, kWindows = 16;
    uint64_t h = fnv1a64(base_, std::min(data_offset_, size_));
    for (auto& t : tensors_) {
      if (t.nbytes <= kWindow * kWindows) {
        h = fnv1a64(t.data, t.nbytes, h);
        continue;
      }
      for (size_t w = 0; w < kWindows; ++w) {
        size_t at = (t.nbytes - kWindow) * w / (kWindows - 1);  // first window at 0, last ends at nbytes
        h = fnv1a64(t.data + at, kWindow, h);
      }
    }
    hash_ = h;
  });
  return hash_;
}

}  // namespace topkv
