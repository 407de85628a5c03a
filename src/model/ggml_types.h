// GGML tensor element types as stored in GGUF files (MODELS.md), with their
// block geometry, and the row kernels every weight access goes through:
// dequantise a row to fp32, and the dot product of a quantised row with an
// fp32 vector (the GEMV inner loop, no full dequantisation).
// Reference: ggml-org/ggml src/ggml-common.h, src/ggml-quants.c.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace topkv {

enum class GgmlType : uint32_t {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, BF16 = 30,
};

struct GgmlTypeInfo {
  const char* name;
  int64_t block_elems;  // values per block (1 for F32/F16/BF16)
  size_t block_bytes;   // bytes per block
};

// Whether topkv reads this type code. ggml_type_info throws Error for an
// unsupported type; ggml_type_name names every ggml type code (e.g. "IQ2_XXS"
// for 16) so a file using one is rejected by name, and "unknown" otherwise.
bool ggml_type_supported(uint32_t code);
GgmlTypeInfo ggml_type_info(GgmlType t);
std::string_view ggml_type_name(uint32_t code);
// A supported type from its name, any case ("q4_k", "Q8_0", "bf16"); throws
// Error listing the supported names otherwise.
GgmlType ggml_type_from_name(std::string_view name);
// Bytes for a row of n elements (n must be a multiple of the block size;
// throws Error otherwise).
size_t ggml_row_bytes(GgmlType t, int64_t n);

// dst[0..n) = dequantised src (n a multiple of the block size).
void dequantize_row(GgmlType t, const void* src, float* dst, int64_t n);
// sum_i dequant(row)[i] * x[i] over n elements: fused dequantise+dot per
// block (AVX2 when built for it), x stays fp32.
float dot_quant_row(GgmlType t, const void* row, const float* x, int64_t n);
// The plain reference: dequantise each block, accumulate in double.
float dot_quant_row_ref(GgmlType t, const void* row, const float* x, int64_t n);
// Quantise fp32 to a type (for the GGUF writer / synthetic models). Round to
// nearest as ggml's reference quantize_row_*_ref does for F16..Q5_1; the
// K-quants use a simple min/max encoder (quants_quantize.cpp says how).
void quantize_row(GgmlType t, const float* src, void* dst, int64_t n);

}  // namespace topkv
