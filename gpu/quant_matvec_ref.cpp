// CPU twins of the quantised-weight kernels (see quant_matvec_ref.h). The
// arithmetic is gpu/quant_units.h's, shared with the kernels; what lives here
// is the kernels' order of summation and the host side of the layout.
#include "gpu/quant_matvec_ref.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "src/common/error.h"

namespace topkv::qref {

using namespace qunits;

namespace {

// The file's block of type t split into the planes' parts (quant_units.h).
void split_block(GgmlType t, const uint8_t* b, uint8_t* p0, uint8_t* p1, uint8_t* p2) {
  switch (t) {
    case GgmlType::Q8_0: std::memcpy(p0, b + 2, 32), std::memcpy(p1, b, 2); break;      // d, qs[32]
    case GgmlType::Q4_0: std::memcpy(p0, b + 2, 16), std::memcpy(p1, b, 2); break;      // d, qs[16]
    case GgmlType::Q4_1: std::memcpy(p0, b + 4, 16), std::memcpy(p1, b, 4); break;      // d, m, qs[16]
    case GgmlType::Q5_0:                                                                // d, qh[4], qs[16]
      std::memcpy(p0, b + 6, 16), std::memcpy(p1, b + 2, 4), std::memcpy(p2, b, 2);
      break;
    case GgmlType::Q5_1:                                                                // d, m, qh[4], qs[16]
      std::memcpy(p0, b + 8, 16), std::memcpy(p1, b + 4, 4), std::memcpy(p2, b, 4);
      break;
    case GgmlType::Q4_K: std::memcpy(p0, b, 144); break;
    case GgmlType::Q5_K: std::memcpy(p0, b, 176); break;
    case GgmlType::Q6_K: std::memcpy(p0, b, 208), std::memcpy(p1, b + 208, 2); break;  // ql, qh, scales, d
    default: fail("internal: no device layout for {}", ggml_type_name((uint32_t)t));
  }
}

// The warp's butterfly (__shfl_xor_sync with offsets 16, 8, 4, 2, 1): every
// lane ends with the same sum; lane 0's order of additions.
float warp_sum(float v[32]) {
  for (int o = 16; o > 0; o >>= 1) {
    float n[32];
    for (int l = 0; l < 32; ++l) n[l] = fadd(v[l], v[l ^ o]);
    std::memcpy(v, n, sizeof n);
  }
  return v[0];
}

template <class U, int S>
void mmvq_rows(const QuantMatrix& m, const Q8Activations& x, float* y, const float* bias, bool accumulate) {
  const int64_t nb = m.cols / U::kValues, units = nb * U::kUnits;
#pragma omp parallel for schedule(static) if (m.rows * units * x.T > (1 << 16))
  for (int64_t r = 0; r < m.rows; ++r)
    for (int t = 0; t < x.T; ++t) {
      const Q8Row xr = x.row(t);
      float lane[32];
      for (int l = 0; l < 32; ++l) {  // lane l takes units l, l + 32, ... in order
        float acc = 0.f;
        for (int64_t u = l; u < units; u += 32) {
          const int64_t b = u / U::kUnits;
          const int k = (int)(u % U::kUnits);
          acc = fadd(acc, U::template dot<S>(U::load(m, r * nb + b, k), U::template load_x<S>(xr, b, k), k));
        }
        lane[l] = acc;
      }
      float s = warp_sum(lane);
      if (bias) s = fadd(s, bias[r]);
      float& out = y[(size_t)t * m.rows + r];
      out = accumulate ? fadd(out, s) : s;
    }
}

void check_shape(GgmlType t, int64_t rows, int64_t cols) {
  TOPKV_CHECK(qunits::has_device_layout(t), "{} has no device layout (the quantised GPU kernels read Q4_0, Q4_1, "
              "Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K)", ggml_type_name((uint32_t)t));
  TOPKV_CHECK(rows > 0 && cols > 0 && cols % block_values(t) == 0, "a {} x {} matrix of {} needs rows > 0 and cols "
              "a multiple of {}", rows, cols, ggml_type_name((uint32_t)t), block_values(t));
}

}  // namespace

bool has_device_layout(GgmlType t) { return qunits::has_device_layout(t); }

size_t device_bytes(GgmlType t, int64_t rows, int64_t cols) {
  check_shape(t, rows, cols);
  size_t off[kMaxPlanes], total;
  plane_offsets(t, rows, cols, off, &total);
  return total;
}

void repack(GgmlType t, const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst) {
  check_shape(t, rows, cols);
  const PlaneBytes pb = plane_bytes(t);
  const size_t file_block = ggml_type_info(t).block_bytes;
  const int64_t blocks = rows * (cols / block_values(t));
  size_t off[kMaxPlanes], total;
  plane_offsets(t, rows, cols, off, &total);
  std::memset(dst, 0, total);  // the padding between planes
#pragma omp parallel for schedule(static) if (blocks > 4096)
  for (int64_t g = 0; g < blocks; ++g)
    split_block(t, src + (size_t)g * file_block, dst + off[0] + (size_t)g * pb.b[0], dst + off[1] + (size_t)g * pb.b[1],
                dst + off[2] + (size_t)g * pb.b[2]);
}

float abs_bound(GgmlType t, const uint8_t* src, int64_t n_blocks) {
  const size_t bb = ggml_type_info(t).block_bytes;
  const auto h = [](const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return std::fabs(f16_to_f32(v));
  };
  float bound = 0.f;
  for (int64_t g = 0; g < n_blocks; ++g) {
    const uint8_t* b = src + (size_t)g * bb;
    float v;
    switch (t) {
      case GgmlType::Q8_0: v = h(b) * 128.f; break;
      case GgmlType::Q4_0: v = h(b) * 8.f; break;
      case GgmlType::Q4_1: v = h(b) * 15.f + h(b + 2); break;
      case GgmlType::Q5_0: v = h(b) * 16.f; break;
      case GgmlType::Q5_1: v = h(b) * 31.f + h(b + 2); break;
      case GgmlType::Q4_K: v = h(b) * 63.f * 15.f + h(b + 2) * 63.f; break;
      case GgmlType::Q5_K: v = h(b) * 63.f * 31.f + h(b + 2) * 63.f; break;
      case GgmlType::Q6_K: v = h(b + 208) * 128.f * 32.f; break;
      default: fail("internal: abs_bound of {}", ggml_type_name((uint32_t)t));
    }
    if (!std::isnan(bound) && !(v <= bound)) bound = v;  // a NaN scale sticks
  }
  return bound;
}

int Q8Activations::code(int t, int64_t i) const {
  const qunits::Q8Row r = row(t);
  return terms == 2 ? 256 * (int)r.qs[i] + (int)r.lo[i] : (int)r.qs[i];
}

std::vector<float> Q8Activations::dequantised() const {
  std::vector<float> v((size_t)T * cols);
  for (int t = 0; t < T; ++t)
    for (int64_t i = 0; i < cols; ++i) v[(size_t)t * cols + i] = fmul(row(t).ds[i / 32].d, (float)code(t, i));
  return v;
}

void check_q8_terms(int terms) {
  TOPKV_CHECK(terms >= 1 && terms <= kQ8MaxTerms, "q8_1 activations take 1 term (q8_1) or 2 (q8_1x2), got {}",
              terms);
}

Q8Activations quantize_q8_1(const float* x, int T, int64_t cols, int terms) {
  TOPKV_CHECK(T >= 0 && cols % 32 == 0, "q8_1 activations need cols a multiple of 32, got {}", cols);
  check_q8_terms(terms);
  Q8Activations a;
  a.T = T, a.terms = terms, a.cols = cols;
  const int64_t blocks = cols / 32;
  a.qs.resize((size_t)T * terms * cols);
  a.ds.resize((size_t)T * blocks);
  for (int t = 0; t < T; ++t)
    for (int64_t b = 0; b < blocks; ++b) {
      const float* xb = x + (size_t)t * cols + b * 32;
      int8_t* q8 = q8_block_codes(a.qs.data(), t, b, cols, terms);
      float amax = 0.f;
      for (int l = 0; l < 32; ++l) amax = std::fmax(amax, std::fabs(xb[l]));
      const float d = q8_scale(amax, terms);
      int sum = 0;
      for (int l = 0; l < 32; ++l) {
        const int q = q8_code(xb[l], d, amax);
        put_q8_code(q8, cols, l, q, terms);
        sum += q;
      }
      a.ds[(size_t)t * blocks + b] = Q8Scale{d, fmul(d, (float)sum)};
    }
  return a;
}

void mmvq(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, const Q8Activations& x, float* y,
          const float* bias, bool accumulate) {
  check_shape(t, rows, cols);
  TOPKV_CHECK(x.cols == cols, "mmvq: activations of {} columns for a matrix of {}", x.cols, cols);
  const QuantMatrix m = quant_matrix(t, w, rows, cols);
  with_unit_type(t, [&](auto u) {
    with_q8_terms(x.terms, [&](auto s) { mmvq_rows<decltype(u), decltype(s)::value>(m, x, y, bias, accumulate); });
  });
}

void dequant_row(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, int64_t r, float* out) {
  check_shape(t, rows, cols);
  TOPKV_CHECK(r >= 0 && r < rows, "dequant_row: row {} of {}", r, rows);
  const QuantMatrix m = quant_matrix(t, w, rows, cols);
  with_unit_type(t, [&](auto u) {
    using U = decltype(u);
    const int64_t nb = cols / U::kValues;
    for (int64_t b = 0; b < nb; ++b)
      for (int k = 0; k < U::kUnits; ++k) {
        float v[U::kRuns * 16];
        U::dequant(U::load(m, r * nb + b, k), k, v);
        for (int run = 0; run < U::kRuns; ++run)
          std::memcpy(out + b * U::kValues + U::run_offset(k, run), v + 16 * run, 16 * sizeof(float));
      }
  });
}

}  // namespace topkv::qref
