// GGUF model files (version 3, and 2 which has the same layout): a reader that
// memory-maps the file and checks every count, length, offset, alignment and
// size against the file before it touches a byte, so a truncated, corrupted or
// foreign file is a topkv::Error that says what is wrong, never a crash.
// Format: docs/MODELS.md; reference: ggml-org/ggml src/gguf.cpp.
//
//   auto f = GgufFile::open("model.gguf");
//   uint32_t layers = f->get_u32("gemma3.block_count");
//   const GgufTensor& w = f->tensor("blk.0.attn_q.weight");
//   float y0 = dot_quant_row(w.type, w.row(0), x, w.ne[0]);
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/mapped_file.h"
#include "src/model/ggml_types.h"

namespace topkv {

// Metadata value types (GGUF spec numbering).
enum class GgufType : uint32_t {
  U8 = 0, I8 = 1, U16 = 2, I16 = 3, U32 = 4, I32 = 5, F32 = 6, BOOL = 7,
  STR = 8, ARR = 9, U64 = 10, I64 = 11, F64 = 12,
};
const char* gguf_type_name(GgufType t);  // "u32", "str", "arr", ...; "type N" if unknown
size_t gguf_type_size(GgufType t);       // bytes of a scalar; 0 for STR/ARR/unknown

// One metadata entry. Strings and array elements point into the mapping (valid
// as long as the GgufFile lives); numeric arrays are packed little-endian.
struct GgufKV {
  std::string key;
  GgufType type = GgufType::U8;
  // Scalars, widened: integers in `i` (signed types, bool) or `u` (unsigned),
  // floats in `f`.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  std::string_view str;                   // type == STR
  GgufType arr_type = GgufType::U8;       // type == ARR: element type
  uint64_t arr_count = 0;                 //                element count
  const uint8_t* arr_data = nullptr;      //                numeric elements
  std::vector<std::string_view> arr_str;  //                string elements

  // Human-readable value; arrays show at most `max_elems` elements then "...".
  std::string value_string(size_t max_elems = 8) const;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  int n_dims = 0;
  int64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the contiguous dimension
  uint64_t offset = 0;           // into the data section
  const uint8_t* data = nullptr; // into the mapping
  size_t nbytes = 0;
  size_t row_bytes = 0;          // bytes of one row of ne[0] elements

  int64_t nrows() const { return ne[1] * ne[2] * ne[3]; }
  int64_t nelements() const { return ne[0] * nrows(); }
  const void* row(int64_t r) const { return data + (size_t)r * row_bytes; }
  std::string shape_string() const;  // "640 x 262144"
};

class GgufFile {
 public:
  // Maps and validates the file; throws topkv::Error naming the file and the
  // problem (bad magic, truncated metadata, tensor beyond the file, ...).
  static std::unique_ptr<GgufFile> open(const std::string& path);
  // The same parser and checks over `size` bytes in memory (not copied: they
  // must outlive the GgufFile); `name` stands for the path in messages. open()
  // is this over the file's mapping. Used by the fuzzer (tests/fuzz/fuzz_gguf),
  // where every read past the input is a heap overflow that ASan reports.
  static std::unique_ptr<GgufFile> from_memory(const uint8_t* data, size_t size, const std::string& name);
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  uint32_t version() const { return version_; }
  const std::string& path() const { return path_; }
  size_t file_size() const { return size_; }
  size_t data_offset() const { return data_offset_; }  // start of the data section
  uint32_t alignment() const { return alignment_; }

  // ---- metadata ----
  bool has(std::string_view key) const { return find_kv(key) != nullptr; }
  const GgufKV* find_kv(std::string_view key) const;
  const std::vector<GgufKV>& metadata() const { return kvs_; }  // file order

  // Typed getters. Integers convert between integer types when the value
  // fits; floats accept f32/f64. A missing key or a wrong type throws an
  // Error naming the key, the type found and the file.
  uint32_t get_u32(std::string_view key) const;
  int32_t get_i32(std::string_view key) const;
  uint64_t get_u64(std::string_view key) const;
  float get_f32(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::string get_str(std::string_view key) const;
  uint32_t get_u32_or(std::string_view key, uint32_t def) const;
  int32_t get_i32_or(std::string_view key, int32_t def) const;
  uint64_t get_u64_or(std::string_view key, uint64_t def) const;
  float get_f32_or(std::string_view key, float def) const;
  bool get_bool_or(std::string_view key, bool def) const;
  std::string get_str_or(std::string_view key, const std::string& def) const;
  // Arrays: strings, floats (f32/f64 elements), integers (any integer element
  // type whose values fit in i32, e.g. tokenizer.ggml.token_type).
  std::vector<std::string> get_arr_str(std::string_view key) const;
  std::vector<float> get_arr_f32(std::string_view key) const;
  std::vector<int32_t> get_arr_i32(std::string_view key) const;
  uint64_t get_arr_size(std::string_view key) const;  // element count of an array

  // ---- tensors ----
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // file order
  const GgufTensor* find(std::string_view name) const;
  const GgufTensor& tensor(std::string_view name) const;  // throws Error naming it
  uint64_t tensor_bytes() const;  // sum of nbytes

  // Identity of the model for caches and context packs: 64-bit FNV-1a over
  // (1) every byte before the data section (header, all metadata, all tensor
  // infos) and (2) a sample of each tensor's data: its first and last 4 KiB
  // and 14 evenly spaced 4 KiB windows between them (whole tensor when it is
  // at most 64 KiB). Changing any metadata, shape, type or name changes it;
  // a change in tensor bytes outside the samples does not. Computed on the
  // first call (it reads ~64 KiB per tensor), then cached.
  uint64_t content_hash() const;

 private:
  GgufFile() = default;
  void parse();  // base_, size_ (not empty), path_ set

  std::string path_;
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;  // base_ is our mapping (open), not the caller's bytes (from_memory)
  MappedRegion region_;  // the SIGBUS guard of the mapping (src/common/mapped_file.h)
  uint32_t version_ = 0;
  uint32_t alignment_ = 32;
  size_t data_offset_ = 0;
  std::vector<GgufKV> kvs_;
  std::map<std::string, size_t, std::less<>> kv_index_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
  mutable std::once_flag hash_once_;
  mutable uint64_t hash_ = 0;
};

}  // namespace topkv
