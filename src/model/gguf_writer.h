// GGUF v3 writer: metadata of every value type and tensors of the supported
// GGML types, aligned to general.alignment (32 unless set). Tensor data is
// produced row-chunk by row-chunk while writing, so a multi-GB synthetic
// model never sits in memory. The file is written to `path.tmp` and renamed
// into place only when complete: a failed write leaves nothing behind.
//
//   GgufWriter w;
//   w.set_str("general.architecture", "llama");
//   w.add_tensor_f32("output_norm.weight", GgmlType::F32, {4096}, ones);
//   w.write("model.gguf");
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "src/model/ggml_types.h"
#include "src/model/gguf.h"

namespace topkv {

class GgufWriter {
 public:
  // Fills rows [row0, row0 + nrows) of a tensor, already encoded in its type,
  // into dst (nrows * row_bytes bytes).
  using RowFiller = std::function<void(int64_t row0, int64_t nrows, uint8_t* dst)>;

  // ---- metadata: setting a key again replaces its value, keeping its place ----
  void set_u8(std::string_view key, uint8_t v);
  void set_i8(std::string_view key, int8_t v);
  void set_u16(std::string_view key, uint16_t v);
  void set_i16(std::string_view key, int16_t v);
  void set_u32(std::string_view key, uint32_t v);
  void set_i32(std::string_view key, int32_t v);
  void set_u64(std::string_view key, uint64_t v);
  void set_i64(std::string_view key, int64_t v);
  void set_f32(std::string_view key, float v);
  void set_f64(std::string_view key, double v);
  void set_bool(std::string_view key, bool v);
  void set_str(std::string_view key, std::string_view v);
  void set_arr_str(std::string_view key, const std::vector<std::string>& v);
  void set_arr_f32(std::string_view key, const std::vector<float>& v);
  void set_arr_i32(std::string_view key, const std::vector<int32_t>& v);
  // Numeric array of any scalar element type; `data` holds count packed
  // little-endian elements of gguf_type_size(elem) bytes.
  void set_arr(std::string_view key, GgufType elem, const void* data, uint64_t count);
  // Sets general.alignment (a power of two) and aligns the data to it.
  void set_alignment(uint32_t alignment);

  // ---- tensors (written in the order added) ----
  // ne[0] is the contiguous dimension (1 to 4 dims, each >= 1, ne[0] a
  // multiple of the type's block size). Throws Error on a bad shape or a
  // duplicate name.
  void add_tensor(std::string_view name, GgmlType type, std::vector<int64_t> ne, RowFiller fill);
  // fp32 values (ne[0] * nrows of them), quantised to `type` when written.
  void add_tensor_f32(std::string_view name, GgmlType type, std::vector<int64_t> ne, std::vector<float> values);
  // Bytes already encoded in `type` (exactly the tensor's byte size).
  void add_tensor_raw(std::string_view name, GgmlType type, std::vector<int64_t> ne, std::vector<uint8_t> bytes);

  size_t tensor_count() const { return tensors_.size(); }
  uint64_t data_bytes() const;  // tensor data, without alignment padding

  // Writes path + ".tmp", then renames it to path. `progress` shows a bar
  // (bytes) on stderr. Throws Error (and removes the .tmp) on any failure.
  void write(const std::string& path, bool progress = false) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    int64_t nrows;
    size_t row_bytes, nbytes;
    RowFiller fill;
  };
  void set_raw(std::string_view key, GgufType type, std::string value_bytes);
  std::vector<std::pair<std::string, std::string>> kvs_;  // key, encoded (type + value)
  std::vector<Tensor> tensors_;
  uint32_t alignment_ = 32;
};

}  // namespace topkv
