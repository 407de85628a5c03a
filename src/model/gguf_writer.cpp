#include "src/model/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "src/common/error.h"
#include "src/common/file_io.h"
#include "src/common/progress.h"

namespace topkv {

namespace {

template <typename T>
void append_pod(std::string& out, const T& v) {
  out.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
void append_str(std::string& out, std::string_view s) {
  append_pod<uint64_t>(out, s.size());
  out.append(s.data(), s.size());
}
std::string encode_scalar(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

}  // namespace

void GgufWriter::set_raw(std::string_view key, GgufType type, std::string value_bytes) {
  TOPKV_CHECK(!key.empty(), "GGUF metadata keys must not be empty");
  std::string enc;
  append_pod<uint32_t>(enc, (uint32_t)type);
  enc += value_bytes;
  for (auto& kv : kvs_)
    if (kv.first == key) {
      kv.second = std::move(enc);
      return;
    }
  kvs_.emplace_back(std::string(key), std::move(enc));
}

void GgufWriter::set_u8(std::string_view k, uint8_t v) { set_raw(k, GgufType::U8, encode_scalar(&v, 1)); }
void GgufWriter::set_i8(std::string_view k, int8_t v) { set_raw(k, GgufType::I8, encode_scalar(&v, 1)); }
void GgufWriter::set_u16(std::string_view k, uint16_t v) { set_raw(k, GgufType::U16, encode_scalar(&v, 2)); }
void GgufWriter::set_i16(std::string_view k, int16_t v) { set_raw(k, GgufType::I16, encode_scalar(&v, 2)); }
void GgufWriter::set_u32(std::string_view k, uint32_t v) { set_raw(k, GgufType::U32, encode_scalar(&v, 4)); }
void GgufWriter::set_i32(std::string_view k, int32_t v) { set_raw(k, GgufType::I32, encode_scalar(&v, 4)); }
void GgufWriter::set_u64(std::string_view k, uint64_t v) { set_raw(k, GgufType::U64, encode_scalar(&v, 8)); }
void GgufWriter::set_i64(std::string_view k, int64_t v) { set_raw(k, GgufType::I64, encode_scalar(&v, 8)); }
void GgufWriter::set_f32(std::string_view k, float v) { set_raw(k, GgufType::F32, encode_scalar(&v, 4)); }
void GgufWriter::set_f64(std::string_view k, double v) { set_raw(k, GgufType::F64, encode_scalar(&v, 8)); }
void GgufWriter::set_bool(std::string_view k, bool v) {
  uint8_t b = v ? 1 : 0;
  set_raw(k, GgufType::BOOL, encode_scalar(&b, 1));
}
void GgufWriter::set_str(std::string_view k, std::string_view v) {
  std::string enc;
  append_str(enc, v);
  set_raw(k, GgufType::STR, std::move(enc));
}
void GgufWriter::set_arr_str(std::string_view k, const std::vector<std::string>& v) {
  std::string enc;
  append_pod<uint32_t>(enc, (uint32_t)GgufType::STR);
  append_pod<uint64_t>(enc, v.size());
  for (auto& s : v) append_str(enc, s);
  set_raw(k, GgufType::ARR, std::move(enc));
}
void GgufWriter::set_arr(std::string_view k, GgufType elem, const void* data, uint64_t count) {
  size_t es = gguf_type_size(elem);
  TOPKV_CHECK(es > 0, "GGUF array '{}': element type {} is not a numeric scalar", k, gguf_type_name(elem));
  std::string enc;
  append_pod<uint32_t>(enc, (uint32_t)elem);
  append_pod<uint64_t>(enc, count);
  enc.append(static_cast<const char*>(data), count * es);
  set_raw(k, GgufType::ARR, std::move(enc));
}
void GgufWriter::set_arr_f32(std::string_view k, const std::vector<float>& v) {
  set_arr(k, GgufType::F32, v.data(), v.size());
}
void GgufWriter::set_arr_i32(std::string_view k, const std::vector<int32_t>& v) {
  set_arr(k, GgufType::I32, v.data(), v.size());
}
void GgufWriter::set_alignment(uint32_t a) {
  TOPKV_CHECK(a > 0 && (a & (a - 1)) == 0, "GGUF alignment {} is not a power of two", a);
  alignment_ = a;
  set_u32("general.alignment", a);
}

void GgufWriter::add_tensor(std::string_view name, GgmlType type, std::vector<int64_t> ne, RowFiller fill) {
  TOPKV_CHECK(!name.empty(), "GGUF tensor names must not be empty");
  TOPKV_CHECK(ne.size() >= 1 && ne.size() <= 4, "tensor '{}': {} dimensions (1 to 4 allowed)", name, ne.size());
  TOPKV_CHECK(ggml_type_supported((uint32_t)type), "tensor '{}': type {} is not supported", name,
              ggml_type_name((uint32_t)type));
  for (auto& t : tensors_) TOPKV_CHECK(t.name != name, "tensor '{}' added twice", name);
  int64_t nrows = 1;
  for (size_t d = 0; d < ne.size(); ++d) {
    TOPKV_CHECK(ne[d] >= 1, "tensor '{}': dimension {} is {} (must be >= 1)", name, d, ne[d]);
    if (d > 0) nrows *= ne[d];
  }
  GgmlTypeInfo ti = ggml_type_info(type);
  TOPKV_CHECK(ne[0] % ti.block_elems == 0,
              "tensor '{}': rows of {} elements cannot be stored as {} (blocks of {}); pick another type", name,
              ne[0], ti.name, ti.block_elems);
  size_t row_bytes = ggml_row_bytes(type, ne[0]);
  tensors_.push_back({std::string(name), type, std::move(ne), nrows, row_bytes, row_bytes * (size_t)nrows,
                      std::move(fill)});
}

void GgufWriter::add_tensor_f32(std::string_view name, GgmlType type, std::vector<int64_t> ne,
                                std::vector<float> values) {
  int64_t n = 1;
  for (auto e : ne) n *= e;
  TOPKV_CHECK((int64_t)values.size() == n, "tensor '{}': {} values for a shape of {} elements", name,
              values.size(), n);
  int64_t row = ne.empty() ? 0 : ne[0];
  auto shared = std::make_shared<std::vector<float>>(std::move(values));
  add_tensor(name, type, std::move(ne), [shared, type, row](int64_t r0, int64_t nr, uint8_t* dst) {
    size_t rb = ggml_row_bytes(type, row);
    for (int64_t r = 0; r < nr; ++r) quantize_row(type, shared->data() + (r0 + r) * row, dst + r * rb, row);
  });
}

void GgufWriter::add_tensor_raw(std::string_view name, GgmlType type, std::vector<int64_t> ne,
                                std::vector<uint8_t> bytes) {
  auto shared = std::make_shared<std::vector<uint8_t>>(std::move(bytes));
  add_tensor(name, type, std::move(ne), nullptr);
  Tensor& t = tensors_.back();
  if (shared->size() != t.nbytes) {
    std::string nm = t.name;
    size_t want = t.nbytes;
    tensors_.pop_back();
    fail("tensor '{}': {} bytes given, its shape and type need {}", nm, shared->size(), want);
  }
  size_t rb = t.row_bytes;
  t.fill = [shared, rb](int64_t r0, int64_t nr, uint8_t* dst) {
    std::memcpy(dst, shared->data() + r0 * rb, nr * rb);
  };
}

uint64_t GgufWriter::data_bytes() const {
  uint64_t s = 0;
  for (auto& t : tensors_) s += t.nbytes;
  return s;
}

void GgufWriter::write(const std::string& path, bool progress) const {
  AtomicFile out(path, "model");  // a unique temporary beside it, renamed at the end
  auto align_up = [&](uint64_t x) { return (x + alignment_ - 1) / alignment_ * alignment_; };
  const std::string zeros(alignment_, '\0');

  std::string head = "GGUF";
  append_pod<uint32_t>(head, 3);
  append_pod<uint64_t>(head, tensors_.size());
  append_pod<uint64_t>(head, kvs_.size());
  for (auto& [key, enc] : kvs_) {
    append_str(head, key);
    head += enc;
  }
  uint64_t offset = 0;
  for (auto& t : tensors_) {
    append_str(head, t.name);
    append_pod<uint32_t>(head, (uint32_t)t.ne.size());
    for (auto e : t.ne) append_pod<uint64_t>(head, (uint64_t)e);
    append_pod<uint32_t>(head, (uint32_t)t.type);
    append_pod<uint64_t>(head, offset);
    offset = align_up(offset + t.nbytes);
  }
  out.write(head.data(), head.size());
  out.write(zeros.data(), align_up(head.size()) - head.size());

  Progress bar("writing " + std::filesystem::path(path).filename().string(), (int64_t)data_bytes(), "bytes",
               progress);
  std::vector<uint8_t> buf;
  for (auto& t : tensors_) {
    // ~16 MiB of rows at a time
    int64_t chunk = std::max<int64_t>(1, (int64_t)((16u << 20) / std::max<size_t>(t.row_bytes, 1)));
    for (int64_t r0 = 0; r0 < t.nrows; r0 += chunk) {
      int64_t nr = std::min(chunk, t.nrows - r0);
      buf.resize((size_t)nr * t.row_bytes);
      t.fill(r0, nr, buf.data());
      out.write(buf.data(), buf.size());
      bar.add((int64_t)buf.size());
    }
    out.write(zeros.data(), align_up(t.nbytes) - t.nbytes);
  }
  bar.finish();
  out.commit();
}

}  // namespace topkv
