// Dequantisation of weights in the device layout (gpu/quant_units.h), one
// thread per unit (16 or 32 values), grid-stride, every block of the matrix
// in parallel:
//   dequant_16bit_kernel  rows of a matrix -> fp16 or bf16 (round to nearest),
//                         the prefill GEMM's operand (CudaBackend::matmul, T > 8);
//   dequant_rows_kernel   the rows of a table named by device ids -> fp32
//                         times a scale (CudaBackend::embed).
// The values are dequantize_row's bit for bit (the shared unit code); twin:
// qref::dequant_row.
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_quant.h"

namespace topkv::cuda {
namespace {

using namespace qunits;

constexpr int kThreads = 256;

template <class E> __device__ __forceinline__ uint32_t pack2(float a, float b);
template <> __device__ __forceinline__ uint32_t pack2<__half>(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <> __device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

template <class U, class E>
__global__ void __launch_bounds__(kThreads)
    dequant_16bit_kernel(const QuantMatrix m, int64_t row0, int64_t n_rows, E* __restrict__ out) {
  const int nb = (int)(m.cols / U::kValues);
  const int64_t per_row = (int64_t)nb * U::kUnits, total = n_rows * per_row;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total; i += (int64_t)gridDim.x * kThreads) {
    const int64_t r = i / per_row;
    const int ub = (int)(i - r * per_row), b = ub / U::kUnits, k = ub % U::kUnits;
    float v[U::kRuns * 16];
    U::dequant(U::load(m, (row0 + r) * nb + b, k), k, v);
    E* dst = out + r * m.cols + (int64_t)b * U::kValues;
#pragma unroll
    for (int run = 0; run < U::kRuns; ++run) {
      const float* s = v + 16 * run;
      uint4* d4 = reinterpret_cast<uint4*>(dst + U::run_offset(k, run));  // 32-byte aligned: runs start at 16 values
      d4[0] = make_uint4(pack2<E>(s[0], s[1]), pack2<E>(s[2], s[3]), pack2<E>(s[4], s[5]), pack2<E>(s[6], s[7]));
      d4[1] = make_uint4(pack2<E>(s[8], s[9]), pack2<E>(s[10], s[11]), pack2<E>(s[12], s[13]), pack2<E>(s[14], s[15]));
    }
  }
}

template <class U>
__global__ void __launch_bounds__(kThreads)
    dequant_rows_kernel(const QuantMatrix m, const int32_t* __restrict__ ids, int T, float scale,
                        float* __restrict__ out) {
  const int nb = (int)(m.cols / U::kValues);
  const int64_t per_row = (int64_t)nb * U::kUnits, total = (int64_t)T * per_row;
  for (int64_t i = (int64_t)blockIdx.x * kThreads + threadIdx.x; i < total; i += (int64_t)gridDim.x * kThreads) {
    const int t = (int)(i / per_row);
    const int ub = (int)(i - t * per_row), b = ub / U::kUnits, k = ub % U::kUnits;
    float v[U::kRuns * 16];
    U::dequant(U::load(m, (int64_t)ids[t] * nb + b, k), k, v);
    float* dst = out + t * m.cols + (int64_t)b * U::kValues;
#pragma unroll
    for (int run = 0; run < U::kRuns; ++run)
#pragma unroll
      for (int j = 0; j < 16; ++j) {
        const float y = v[16 * run + j];
        dst[U::run_offset(k, run) + j] = scale == 1.f ? y : fmul(y, scale);  // as CpuBackend::embed
      }
  }
}

template <class F> void with_units(GgmlType t, F&& f) {
  TOPKV_CHECK(with_unit_type(t, f), "no device dequantisation for {} (quantised GPU weights are Q4_0, Q4_1, Q5_0, "
              "Q5_1, Q8_0, Q4_K, Q5_K, Q6_K)", ggml_type_name((uint32_t)t));
}

}  // namespace

void dequant_16bit(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, int64_t row0, int64_t n_rows,
                   DType out_type, void* out, cudaStream_t stream) {
  TOPKV_CHECK(row0 >= 0 && n_rows >= 0 && row0 + n_rows <= rows, "dequant of rows {}..{} of a {}-row matrix", row0,
              row0 + n_rows - 1, rows);
  TOPKV_CHECK(out_type == DType::F16 || out_type == DType::BF16, "dequant to fp16 or bf16 only");
  if (n_rows == 0) return;
  const QuantMatrix m = quant_matrix(t, w, rows, cols);
  with_units(t, [&](auto u) {
    using U = decltype(u);
    const int64_t units = n_rows * (cols / U::kValues) * U::kUnits;
    const unsigned blocks = grid_for(units, kThreads, 16384);
    if (out_type == DType::F16)
      dequant_16bit_kernel<U, __half><<<blocks, kThreads, 0, stream>>>(m, row0, n_rows, static_cast<__half*>(out));
    else
      dequant_16bit_kernel<U, __nv_bfloat16>
          <<<blocks, kThreads, 0, stream>>>(m, row0, n_rows, static_cast<__nv_bfloat16*>(out));
  });
  TOPKV_CUDA_CHECK_LAUNCH();
}

void dequant_rows_f32(GgmlType t, const uint8_t* w, int64_t rows, int64_t cols, const int32_t* ids, int T, float scale,
                      float* out, cudaStream_t stream) {
  if (T <= 0) return;
  const QuantMatrix m = quant_matrix(t, w, rows, cols);
  with_units(t, [&](auto u) {
    using U = decltype(u);
    const int64_t units = (int64_t)T * (cols / U::kValues) * U::kUnits;
    dequant_rows_kernel<U><<<grid_for(units, kThreads, 4096), kThreads, 0, stream>>>(m, ids, T, scale, out);
  });
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
