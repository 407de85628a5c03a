// safetensors files (https://github.com/huggingface/safetensors, "Format"):
//
//   [8 bytes]  N, unsigned little-endian: length of the header
//   [N bytes]  JSON object, UTF-8, may be padded with spaces:
//                {"__metadata__": {"key": "value", ...},          (optional, string -> string)
//                 "name": {"dtype": "F16", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
//   [rest]     the byte buffer; data_offsets are relative to its start
//
// Tensors are little-endian, row-major (C order). The spec requires the
// offsets to index the whole buffer without holes or overlaps; the reader
// checks that, and every shape, size and offset against the file, so a
// truncated or corrupt file is a topkv::Error naming what is wrong, never an
// out-of-bounds read. Reading memory-maps the file (nothing is copied until a
// tensor is converted). The writer streams tensors from caller memory (no
// copy either), pads the header to 8 bytes as the reference implementation
// does, and writes through a temporary file renamed at the end.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <sys/stat.h>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "src/common/dtype.h"
#include "src/common/mapped_file.h"

namespace topkv {

// The element types of the safetensors spec that topkv reads and writes.
enum class StDType : uint8_t { F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL, F8_E4M3 };

size_t st_dtype_size(StDType t);
const char* st_dtype_name(StDType t);  // "F32", "BF16", ...
StDType parse_st_dtype(std::string_view name);  // throws Error for names topkv does not know
StDType st_dtype_of(DType t);                    // F32 / F16 / BF16 / F8_E4M3; U8 for Q8_0 (its bytes)
// Elements of st_dtype_of(t) in a tensor row holding one row of `dim` elements
// of t: dim, or a Q8_0 row's bytes (the spec has no block types).
int64_t st_row_elems(DType t, int64_t dim);
bool st_is_row_type(StDType t);                  // F32, F16 or BF16: a row-store type
DType row_dtype_of(StDType t);                   // throws Error unless st_is_row_type

int64_t shape_numel(const std::vector<int64_t>& shape);  // product of the shape (1 for a scalar)

struct TensorInfo {
  std::string name;
  StDType dtype = StDType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data buffer
  int64_t numel() const { return shape_numel(shape); }
  uint64_t nbytes() const { return end - begin; }
  std::string shape_str() const;  // "[2, 3]"
};

class SafetensorsReader {
 public:
  // Maps and validates; throws Error (`what` names the file's kind in messages).
  explicit SafetensorsReader(const std::string& path, std::string_view what = "safetensors file");
  // The same parser and checks over `size` bytes in memory (not copied: they
  // must outlive the reader); `name` stands for the path in messages. The
  // constructor above is this over the file's mapping. Used by the fuzzers
  // (tests/fuzz), where a read past the input is a heap overflow ASan reports.
  SafetensorsReader(const uint8_t* data, size_t size, const std::string& name);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  uint64_t file_bytes() const { return map_bytes_; }  // as opened
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The metadata value of `key`, or `def` when absent.
  std::string metadata_or(const std::string& key, const std::string& def) const;
  const std::vector<TensorInfo>& tensors() const { return tensors_; }  // in buffer order
  const TensorInfo* find(const std::string& name) const;  // null when absent
  const TensorInfo& get(const std::string& name) const;   // throws Error naming the file and the tensors it has
  const uint8_t* data(const TensorInfo& t) const { return data_ + t.begin; }

  // Elements [first, first + count) of a F32/F16/BF16 tensor as fp32.
  void read_f32(const TensorInfo& t, int64_t first, int64_t count, float* out) const;

  // Tensor t's bytes in a fresh private, writable mapping of the same open
  // file (not of whatever the path names now): reads come from the page
  // cache, nothing is copied; the first write to a page gives this process
  // its own copy of that page (copy-on-write) and never reaches the file.
  // Each call maps anew, so what one owner wrote is not seen by the next.
  // The mapping lives as long as `owner`. An empty tensor maps nothing.
  // (A reader over memory gives a private heap copy instead.)
  struct CowView {
    uint8_t* data = nullptr;
    std::shared_ptr<void> owner;
  };
  CowView map_copy_on_write(const TensorInfo& t) const;
  // The tensor's bytes from byte `from` on, at the start of a writable
  // region of `capacity` bytes (>= what is left of the tensor): those bytes
  // copy-on-write as above, the rest zeroed memory of this process's own
  // (taken only where written). A row store's last chunk, in place with room
  // to append.
  CowView map_copy_on_write(const TensorInfo& t, uint64_t from, uint64_t capacity) const;

 private:
  void parse();  // the header at map_ (map_bytes_ >= 8)

  std::string path_;
  int fd_ = -1;  // kept open for map_copy_on_write; -1 for a reader over memory
  struct stat stat_ {};  // as opened (src/common/mapped_file.h)
  void* map_ = nullptr;  // our mapping of the file, or the caller's bytes (fd_ < 0)
  size_t map_bytes_ = 0;
  MappedRegion region_;  // the SIGBUS guard of map_
  const uint8_t* data_ = nullptr;  // start of the byte buffer
  std::map<std::string, std::string> metadata_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t> by_name_;
};

class SafetensorsWriter {
 public:
  struct Span {
    const void* data;
    size_t bytes;
  };
  // Adds a tensor whose bytes are the concatenation of `parts` (which must
  // stay valid until write()). Their total must equal numel x element size.
  void add(const std::string& name, StDType dtype, std::vector<int64_t> shape, std::vector<Span> parts);
  void add(const std::string& name, StDType dtype, std::vector<int64_t> shape, const void* data);
  void set_metadata(const std::string& key, const std::string& value) { metadata_[key] = value; }
  // Writes `path` through an AtomicFile (src/common/file_io.h): a unique
  // temporary beside it, synced and renamed over it. Throws Error on I/O
  // failure (the temporary file is removed). Tensor data is laid out by decreasing element size (stable), so
  // every tensor starts aligned to its element size and can be used in place
  // from a memory mapping.
  void write(const std::string& path, std::string_view what = "safetensors file") const;

 private:
  struct Entry {
    std::string name;
    StDType dtype;
    std::vector<int64_t> shape;
    std::vector<Span> parts;
    uint64_t bytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace topkv
