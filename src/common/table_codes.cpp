#include "src/common/table_codes.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "src/common/error.h"

namespace topkv {

namespace {

// amax / 127, moved up an ulp at a time until 127 * s >= amax in fp32, so
// that the outermost element of a dimension has a code (127 or -127) on its
// side; 0 for a dimension that is all zeros.
float i8_scale(float amax) {
  if (amax == 0.f) return 0.f;
  float s = amax / 127.f;
  while (127.f * s < amax) s = std::nextafter(s, std::numeric_limits<float>::infinity());
  return s;
}

int8_t i8_code(float x, float s, TableRounding r) {
  if (s == 0.f) return 0;  // the dimension is all zeros
  const float t = x / s;
  if (r == TableRounding::Nearest) return (int8_t)std::clamp(std::lround(t), -127L, 127L);
  // One way: from the quotient's ceiling (floor), then checked against the
  // product TableCodes::decoded forms, code * s in fp32, and moved a code where the
  // division rounded: out until it bounds x (127 and -127 always do,
  // i8_scale), in while the next code still does (the tightest bound).
  if (r == TableRounding::Up) {
    int c = std::clamp((int)std::ceil(t), -127, 127);
    while ((float)c * s < x) ++c;
    while (c > -127 && (float)(c - 1) * s >= x) --c;
    return (int8_t)c;
  }
  int c = std::clamp((int)std::floor(t), -127, 127);
  while ((float)c * s > x) --c;
  while (c < 127 && (float)(c + 1) * s <= x) ++c;
  return (int8_t)c;
}

void encode_i8(const std::vector<float>& rows, std::initializer_list<TableRounding> parts, const char* what,
               TableCodes& out) {
  const int dim = out.dim;
  out.scale.assign((size_t)dim, 0.f);
  for (size_t i = 0; i < rows.size(); ++i) {
    TOPKV_CHECK(std::isfinite(rows[i]), "{} {} is not finite: the table cannot hold it", what, rows[i]);
    float& m = out.scale[i % (size_t)dim];  // the amax first
    m = std::max(m, std::fabs(rows[i]));
  }
  for (float& s : out.scale) s = i8_scale(s);
  out.codes.resize(rows.size());
  const size_t len = parts.size() * (size_t)dim;
  for (size_t i = 0; i < rows.size(); ++i) {
    const TableRounding r = parts.begin()[(i % len) / (size_t)dim];
    out.codes[i] = (uint8_t)i8_code(rows[i], out.scale[i % (size_t)dim], r);
  }
}

}  // namespace

TableCodes encode_table(DType t, const std::vector<float>& rows, int dim, std::initializer_list<TableRounding> parts,
                        const char* what) {
  const size_t len = parts.size() * (size_t)dim;
  TOPKV_CHECK(dim >= 1 && parts.size() >= 1 && rows.size() % len == 0,
              "internal: a table of {} elements is not rows of {} parts of dimension {}", rows.size(), parts.size(), dim);
  TableCodes out;
  out.type = t, out.dim = dim;
  if (rows.empty()) return out;
  if (t == DType::I8) return encode_i8(rows, parts, what, out), out;
  out.codes.resize(dtype_bytes(t, rows.size()));
  const size_t e = dtype_size(t);
  for (size_t r = 0; r < rows.size() / len; ++r)
    for (size_t p = 0; p < parts.size(); ++p) {
      const float* src = rows.data() + r * len + p * (size_t)dim;
      uint8_t* dst = out.codes.data() + (r * len + p * (size_t)dim) * e;
      const TableRounding how = parts.begin()[p];
      if (how == TableRounding::Nearest) from_f32_in_range(t, src, dst, (size_t)dim, what);
      else from_f32_directed(t, src, dst, (size_t)dim, how == TableRounding::Up);
    }
  return out;
}

std::vector<float> TableCodes::decoded() const {
  std::vector<float> x(codes.size() / dtype_size(type));
  if (type != DType::I8) {
    to_f32(type, codes.data(), x.data(), x.size());
    return x;
  }
  TOPKV_CHECK(x.empty() || scale.size() == (size_t)dim, "internal: i8 codes with {} scales for dimension {}",
              scale.size(), dim);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (float)(int8_t)codes[i] * scale[i % (size_t)dim];
  return x;
}

}  // namespace topkv
