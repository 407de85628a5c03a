// y[T][rows] = x[T][cols] * W^T on the device, twin of cpu::matmul.
//   decode (T <= kGemvMaxTokens): gemv_kernel, one warp per output row. Each
//     lane keeps kUnroll independent 16-byte weight loads in flight (evict-
//     first: the weight is read once per call and must not push the
//     activations out of L1/L2), converts them to fp32 and dots them with the
//     fp32 activations, which every warp of the SM re-reads from L1. Bound:
//     rows*cols*sizeof(W) bytes of HBM; at T=4 the L1 traffic of x (8x the
//     weight bytes) may start to bind.
//   prefill: cast x to W's 16-bit type (scaled into fp16's range), cuBLAS
//     GemmEx on tensor cores with fp32 accumulation and fp32 output.
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kGemvThreads = 256;  // 8 warps = 8 output rows per block
constexpr int kUnroll = 4;

template <class W> __device__ __forceinline__ void unpack16(const uint4& raw, float* out) {
  if constexpr (sizeof(W) == 4) {
    out[0] = __uint_as_float(raw.x), out[1] = __uint_as_float(raw.y), out[2] = __uint_as_float(raw.z);
    out[3] = __uint_as_float(raw.w);
  } else {
    Vec16<W>::unpack(raw, out);
  }
}

// Rows 16-byte aligned (cols a multiple of 16/sizeof(W)) and x 16-byte aligned.
// The epilogue of one output row: + bias, + what y holds (accumulate).
__device__ __forceinline__ void store_row(float* y, int64_t at, float s, const float* bias, int64_t row,
                                          bool accumulate) {
  if (bias) s += bias[row];
  y[at] = accumulate ? y[at] + s : s;
}

template <class W, int NT>
__global__ void __launch_bounds__(kGemvThreads) gemv_vec_kernel(const W* __restrict__ w, int64_t rows, int64_t cols,
                                                                const float* __restrict__ x, float* __restrict__ y,
                                                                const float* __restrict__ bias, bool accumulate) {
  constexpr int V = 16 / sizeof(W);  // weights per 16-byte load
  constexpr int64_t kStep = 32 * V;  // one load per lane
  const int lane = threadIdx.x % 32;
  const int64_t row = (int64_t)blockIdx.x * (kGemvThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const W* wr = w + row * cols;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;

  auto fma_chunk = [&](const uint4& raw, int64_t c) {
    float wf[V];
    unpack16<W>(raw, wf);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float4* xv = reinterpret_cast<const float4*>(x + t * cols + c);
#pragma unroll
      for (int j = 0; j < V / 4; ++j) {
        const float4 xx = __ldg(xv + j);
        acc[t] = fmaf(wf[4 * j], xx.x, acc[t]);
        acc[t] = fmaf(wf[4 * j + 1], xx.y, acc[t]);
        acc[t] = fmaf(wf[4 * j + 2], xx.z, acc[t]);
        acc[t] = fmaf(wf[4 * j + 3], xx.w, acc[t]);
      }
    }
  };

  int64_t c = (int64_t)lane * V;
  for (; c + (kUnroll - 1) * kStep < cols; c += kUnroll * kStep) {
    uint4 raw[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) raw[u] = __ldcs(reinterpret_cast<const uint4*>(wr + c + u * kStep));
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) fma_chunk(raw[u], c + u * kStep);
  }
  for (; c < cols; c += kStep) fma_chunk(__ldcs(reinterpret_cast<const uint4*>(wr + c)), c);

#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) store_row(y, t * rows + row, s, bias, row, accumulate);
  }
}

// Any cols / alignment: one element per lane per step.
template <class W, int NT>
__global__ void __launch_bounds__(kGemvThreads) gemv_scalar_kernel(const W* __restrict__ w, int64_t rows,
                                                                   int64_t cols, const float* __restrict__ x,
                                                                   float* __restrict__ y,
                                                                   const float* __restrict__ bias, bool accumulate) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (int64_t)blockIdx.x * (kGemvThreads / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const W* wr = w + row * cols;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.f;
  for (int64_t c = lane; c < cols; c += 32) {
    const float wv = to_float(wr[c]);
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[t] = fmaf(wv, x[t * cols + c], acc[t]);
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0) store_row(y, t * rows + row, s, bias, row, accumulate);
  }
}

template <class W, int NT>
void launch_gemv(const W* w, int64_t rows, int64_t cols, const float* x, float* y, cudaStream_t stream,
                 const float* bias, bool accumulate) {
  const unsigned blocks = (unsigned)((rows + kGemvThreads / 32 - 1) / (kGemvThreads / 32));
  constexpr int V = 16 / sizeof(W);
  const bool vec = cols % V == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (vec)
    gemv_vec_kernel<W, NT><<<blocks, kGemvThreads, 0, stream>>>(w, rows, cols, x, y, bias, accumulate);
  else
    gemv_scalar_kernel<W, NT><<<blocks, kGemvThreads, 0, stream>>>(w, rows, cols, x, y, bias, accumulate);
}

constexpr int kCastThreads = 256;

// scalars[0] (as bits) = max |x| over the grid; scalars[0] must be zero first.
// Non-negative floats order as their bit patterns; NaN is skipped by fmaxf.
__global__ void absmax_kernel(const float* __restrict__ x, int64_t n, unsigned* absmax_bits) {
  __shared__ float part[kCastThreads / 32];
  float m = 0.f;
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    m = fmaxf(m, fabsf(x[i]));
  m = warp_max(m);
  if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int i = 1; i < kCastThreads / 32; ++i) m = fmaxf(m, part[i]);
    atomicMax(absmax_bits, __float_as_uint(m));
  }
}

// out = fp16(x * 2^-k) with k the smallest with max|x| 2^-k <= 2^15, so that
// no product overflows fp16 (max 65504); alpha = 2^k undoes it exactly in
// the GEMM. Powers of two lose no precision (short of fp16 subnormals).
__global__ void cast_f16_scaled_kernel(const float* __restrict__ x, int64_t n, __half* __restrict__ out,
                                       float* scalars) {
  const float amax = __uint_as_float(reinterpret_cast<const unsigned*>(scalars)[0]);
  int k = 0;
  if (isfinite(amax) && amax > 32768.f) {
    int e;
    frexpf(amax, &e);  // amax < 2^e
    k = e - 15;
  }
  const float s = ldexpf(1.f, -k);
  if (blockIdx.x == 0 && threadIdx.x == 0) scalars[1] = ldexpf(1.f, k);
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2half_rn(x[i] * s);
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n, int64_t rows) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] += bias[i % rows];
}

__global__ void cast_bf16_kernel(const float* __restrict__ x, int64_t n, __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    out[i] = __float2bfloat16_rn(x[i]);
}

}  // namespace

void gemv(DType w_type, const void* w, int64_t rows, int64_t cols, const float* x, int T, float* y,
          cudaStream_t stream, const float* bias, bool accumulate) {
  TOPKV_CHECK(T >= 1 && T <= kGemvMaxTokens, "gemv runs 1..{} tokens, got {}", kGemvMaxTokens, T);
  if (rows <= 0) return;
  with_elem_type(w_type, [&](auto e) {
    using W = decltype(e);
    const W* wp = static_cast<const W*>(w);
    switch (T) {
      case 1: launch_gemv<W, 1>(wp, rows, cols, x, y, stream, bias, accumulate); break;
      case 2: launch_gemv<W, 2>(wp, rows, cols, x, y, stream, bias, accumulate); break;
      case 3: launch_gemv<W, 3>(wp, rows, cols, x, y, stream, bias, accumulate); break;
      default: launch_gemv<W, 4>(wp, rows, cols, x, y, stream, bias, accumulate); break;
    }
  });
  TOPKV_CUDA_CHECK_LAUNCH();
}

size_t gemm_workspace_bytes(int64_t cols, int T) { return (size_t)cols * (size_t)T * 2; }

void add_bias(float* y, const float* bias, int T, int64_t rows, cudaStream_t stream) {
  const int64_t n = (int64_t)T * rows;
  if (n <= 0) return;
  add_bias_kernel<<<grid_for(n, kCastThreads, 4096), kCastThreads, 0, stream>>>(y, bias, n, rows);
  TOPKV_CUDA_CHECK_LAUNCH();
}

void cast_activations_16bit(DType w_type, const float* x, int T, int64_t cols, void* workspace, float* scalars,
                            cudaStream_t stream) {
  const int64_t nx = (int64_t)T * cols;
  if (nx <= 0) return;
  const unsigned blocks = grid_for(nx, kCastThreads, 4096);
  if (w_type == DType::F16) {
    TOPKV_CUDA_CHECK(cudaMemsetAsync(scalars, 0, sizeof(float), stream));
    absmax_kernel<<<blocks, kCastThreads, 0, stream>>>(x, nx, reinterpret_cast<unsigned*>(scalars));
    TOPKV_CUDA_CHECK_LAUNCH();
    cast_f16_scaled_kernel<<<blocks, kCastThreads, 0, stream>>>(x, nx, static_cast<__half*>(workspace), scalars);
  } else {
    TOPKV_CHECK(w_type == DType::BF16, "16-bit activations are fp16 or bf16");
    cast_bf16_kernel<<<blocks, kCastThreads, 0, stream>>>(x, nx, static_cast<__nv_bfloat16*>(workspace));
  }
  TOPKV_CUDA_CHECK_LAUNCH();
}

void gemm_16bit_cast(cublasHandle_t handle, DType w_type, const void* w, int64_t rows, int64_t cols, const void* x16,
                     int T, float* y, int64_t ldy, float* scalars, cudaStream_t stream, bool accumulate) {
  TOPKV_CHECK(rows < INT32_MAX && cols < INT32_MAX && ldy < INT32_MAX && (int64_t)T * cols < INT32_MAX,
              "matmul of {} x {} by {} tokens exceeds cuBLAS's 32-bit sizes", rows, cols, T);
  TOPKV_CHECK(ldy >= rows, "gemm: output stride {} below the {} rows", ldy, rows);
  if (rows <= 0 || T <= 0) return;
  TOPKV_CUBLAS_CHECK(cublasSetStream(handle, stream));
  const int m = (int)rows, n = T, k = (int)cols;
  // Column-major view: W [rows][cols] row-major is a cols x rows matrix, so
  // Y^T (rows x T, ld ldy) = op_T(W) (rows x cols) * X^T (cols x T, ld cols).
  if (w_type == DType::F16) {
    // alpha = scalars[1] (set by the cast), beta = scalars[2] (zero) or scalars[3] (one).
    TOPKV_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_DEVICE));
    const cublasStatus_t st = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, scalars + 1, w, CUDA_R_16F, k,
                                           x16, CUDA_R_16F, k, scalars + (accumulate ? 3 : 2), y, CUDA_R_32F, (int)ldy,
                                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    TOPKV_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
    TOPKV_CUBLAS_CHECK(st);
  } else {
    TOPKV_CHECK(w_type == DType::BF16, "gemm_16bit_cast takes fp16 or bf16 weights");
    const float one = 1.f, beta = accumulate ? 1.f : 0.f;
    TOPKV_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
    TOPKV_CUBLAS_CHECK(cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w, CUDA_R_16BF, k, x16,
                                    CUDA_R_16BF, k, &beta, y, CUDA_R_32F, (int)ldy, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT));
  }
}

namespace {
// cuBLAS's product with beta = accumulate (the body of gemm).
void gemm_product(cublasHandle_t handle, DType w_type, const void* w, int64_t rows, int64_t cols, const float* x,
                  int T, float* y, void* workspace, float* scalars, cudaStream_t stream, bool accumulate) {
  TOPKV_CHECK(rows < INT32_MAX && cols < INT32_MAX && (int64_t)T * cols < INT32_MAX,
              "matmul of {} x {} by {} tokens exceeds cuBLAS's 32-bit sizes", rows, cols, T);
  if (w_type == DType::F32) {
    TOPKV_CUBLAS_CHECK(cublasSetStream(handle, stream));
    const int m = (int)rows, n = T, k = (int)cols;
    const float one = 1.f, beta = accumulate ? 1.f : 0.f;
    TOPKV_CUBLAS_CHECK(cublasSetPointerMode(handle, CUBLAS_POINTER_MODE_HOST));
    TOPKV_CUBLAS_CHECK(cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, static_cast<const float*>(w), k,
                                   x, k, &beta, y, m));
    return;
  }
  cast_activations_16bit(w_type, x, T, cols, workspace, scalars, stream);
  gemm_16bit_cast(handle, w_type, w, rows, cols, workspace, T, y, rows, scalars, stream, accumulate);
}

}  // namespace

void gemm(cublasHandle_t handle, DType w_type, const void* w, int64_t rows, int64_t cols, const float* x, int T,
          float* y, void* workspace, float* scalars, cudaStream_t stream, const float* bias, bool accumulate) {
  if (rows <= 0 || T <= 0) return;
  gemm_product(handle, w_type, w, rows, cols, x, T, y, workspace, scalars, stream, accumulate);
  if (bias) add_bias(y, bias, T, rows, stream);
}

}  // namespace topkv::cuda
