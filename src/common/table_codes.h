// The bytes of a device summary table (--device-table-type; the device
// search reads them, gpu/device_search_tables.h): every element of the table
// in one type, rounded to nearest or, for bounds, one way, so that a bound
// stays a bound (Quest's page bounds: "Quest: Query-Aware Sparsity for
// Efficient Long-Context LLM Inference" §3.2 needs an upper bound of q.k).
//
// i8 (DType::I8, per-dimension int8): the element of dimension d is
// scale[d] * code, code in [-127, 127], scale[d] = max |x_d| / 127 over the
// whole table (both halves of a page bound's row). A table's columns differ
// in magnitude: Qwen2.5's first layers hold one key dimension near -300
// while most are below 10, so one scale a row would leave those few bits,
// and E4M3's 3 mantissa bits move a centroid's logit by up to 1.7 nats in
// layers 2-27 of the 1.5B (167 in layer 0); per-dimension int8, emulated on
// the same keys, stays within 0.06-0.19 nats (session 23,
// bench/results/tables_f8_qwen1.5b_cpu/). The device multiplies the scales
// into its queries (scores) or its far output (value means) once a kernel
// (LaneScale, gpu/partial_block.cuh).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "src/common/dtype.h"

namespace topkv {

enum class TableRounding : uint8_t {
  Nearest,  // centroids, value means, variances
  Up,       // an upper bound: the least value of the type not below x
  Down,     // a lower bound: the greatest value not above x
};

struct TableCodes {
  DType type = DType::F16;
  int dim = 0;
  std::vector<uint8_t> codes;  // the rows in `type`, as the device holds them
  std::vector<float> scale;    // i8 with rows: [dim] (x = scale[d] * code); otherwise empty
  // The values the table holds, in fp32: to_f32 of the codes, or for i8
  // scale[d] * code as one fp32 product (a bound is checked against this
  // product when encoded). The device's search twin reads these; the
  // kernels multiply the scale into the query or the far output instead,
  // which differs from it only by fp32 rounding.
  std::vector<float> decoded() const;
};

// rows: [n][parts.size() * dim], part p of every row rounded by parts[p]
// (page bounds [M | m]: {Up, Down}; a centroid table: {Nearest}). Element
// types round as from_f32 (Nearest, refused past the type's range and named
// by `what`) or from_f32_directed (Up, Down). i8 takes each dimension's scale
// over every part of every row; codes are never clipped (no element lies
// past 127 scales), and a non-finite element is an error naming `what`. An
// empty table (no far field, no variances) gives no codes and no scales.
TableCodes encode_table(DType t, const std::vector<float>& rows, int dim, std::initializer_list<TableRounding> parts,
                        const char* what);

}  // namespace topkv
