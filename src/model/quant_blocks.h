// Block layouts of the GGML quantisation types topkv reads, byte for byte as in
// ggml-org/ggml src/ggml-common.h (block_q8_0 ... block_q6_K). Internal to the
// quants*.cpp files; everything else goes through ggml_types.h.
//
// Every block size is even and GGUF aligns each tensor to >= 32 bytes, so
// these structs (alignment 2) can be read in place from a mapped file.
// On a CUDA device (--weights quant) the same bytes are split into planes so
// that every block's quants start 16-byte aligned: gpu/quant_units.h gives
// that layout per type.
#pragma once
#include <cstdint>

#include "src/common/dtype.h"

namespace topkv::quant {

constexpr int QK = 32;    // values per block of the "legacy" types
constexpr int QK_K = 256; // values per super-block of the K-quants

struct BlockQ8_0 { uint16_t d; int8_t qs[QK]; };
struct BlockQ4_0 { uint16_t d; uint8_t qs[QK / 2]; };
struct BlockQ4_1 { uint16_t d, m; uint8_t qs[QK / 2]; };
struct BlockQ5_0 { uint16_t d; uint8_t qh[4]; uint8_t qs[QK / 2]; };
struct BlockQ5_1 { uint16_t d, m; uint8_t qh[4]; uint8_t qs[QK / 2]; };
// K-quants: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes
// (see unpack_scale_min_k4); qs holds 64 values per 32 bytes, low nibbles
// first; Q5_K's qh holds the 5th bit (bit 2c / 2c+1 for the two sub-blocks of
// chunk c). Q6_K: 16 sub-blocks of 16 with int8 scales.
struct BlockQ4_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qs[QK_K / 2]; };
struct BlockQ5_K { uint16_t d, dmin; uint8_t scales[12]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; };
struct BlockQ6_K { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; uint16_t d; };

static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18 && sizeof(BlockQ4_1) == 20);
// The host store's Q8_0 (src/common/dtype.h) is this block: one layout, two names.
static_assert(sizeof(BlockQ8_0) == kQ8BlockBytes && QK == kQ8Block);
static_assert(sizeof(BlockQ5_0) == 22 && sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ4_K) == 144 && sizeof(BlockQ5_K) == 176 && sizeof(BlockQ6_K) == 210);

// Scale and min of sub-block j (0..7) of a Q4_K/Q5_K block: j < 4 keep the low
// 6 bits of bytes j and j+4; j >= 4 take 4 bits from byte j+4 and their top 2
// bits from the spare high bits of bytes j-4 (scale) and j (min).
inline void unpack_scale_min_k4(int j, const uint8_t* s, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (uint8_t)((s[j + 4] & 15) | ((s[j - 4] >> 6) << 4));
    m = (uint8_t)((s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Fast fused dequantise+dot kernels (quants_dot_avx2.cpp). Return false when
// the build has no AVX2 or the type has no fast path; the caller then uses the
// scalar reference.
bool dot_row_fast(uint32_t type, const void* row, const float* x, int64_t n, float* out);

}  // namespace topkv::quant
