// Random quantised rows for the tests of the GGML row kernels and of the
// quantised GPU kernels: every code bit random, every scale a finite fp16.
#pragma once
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "src/common/dtype.h"
#include "src/model/ggml_types.h"

namespace topkv::test {

// n values of type t (n a multiple of the block size; rows of a matrix are
// consecutive runs of blocks, so n = rows * cols makes a matrix): random
// bytes with every scale field replaced by a finite fp16 of magnitude in
// [0.001, 0.1) (K-quants: d and dmin positive, as ggml's encoder writes them).
// Plain float types get random values in [-2, 2).
inline std::vector<uint8_t> random_quant_row(GgmlType t, int64_t n, std::mt19937& rng) {
  const GgmlTypeInfo ti = ggml_type_info(t);
  std::vector<uint8_t> b(ggml_row_bytes(t, n));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.1f), val(-2.f, 2.f);
  if (ti.block_elems == 1) {
    std::vector<float> v((size_t)n);
    for (auto& x : v) x = val(rng);
    quantize_row(t, v.data(), b.data(), n);
    return b;
  }
  const auto put16 = [&](size_t at, uint16_t v) { std::memcpy(b.data() + at, &v, 2); };
  for (auto& x : b) x = (uint8_t)byte(rng);
  for (int64_t i = 0; i < n / ti.block_elems; ++i) {
    const size_t at = (size_t)i * ti.block_bytes;
    const auto s = [&] { return f32_to_f16(scale(rng) * (byte(rng) & 1 ? 1 : -1)); };
    switch (t) {
      case GgmlType::Q8_0: case GgmlType::Q4_0: case GgmlType::Q5_0: put16(at, s()); break;
      case GgmlType::Q4_1: case GgmlType::Q5_1: put16(at, s()), put16(at + 2, s()); break;
      case GgmlType::Q4_K: case GgmlType::Q5_K:
        put16(at, f32_to_f16(scale(rng))), put16(at + 2, f32_to_f16(scale(rng)));
        break;
      case GgmlType::Q6_K: put16(at + 208, s()); break;
      default: break;
    }
  }
  return b;
}

}  // namespace topkv::test
