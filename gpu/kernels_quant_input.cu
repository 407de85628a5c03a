// A group's input formed from the residual stream and quantised to q8_1 in
// one kernel (MatmulInput, src/model/backend.h; the CUDA backend's decode
// path on quantised weights). Twin: the default Backend::matmul_group's
// forming (rms_norm, add, glu) followed by quantize_q8_1 (qref::quantize_q8_1).
//   form_norm_q8_kernel  one block per token: [x += add_norm ? norm(add) : add],
//                        then the RMSNorm of x times `norm`, quantised in
//                        blocks of 32 (a warp each). The row's sums of squares
//                        are block reductions; the values are read again from
//                        L1/L2 rather than held, so any width fits.
//   form_glu_q8_kernel   a warp per block of 32: act(gate) * up, quantised.
// The arithmetic of each value is the unfused kernels' (rms_norm_kernel's
// x * inv * w, glu's expressions; q8 codes by quant_units.h), so the codes
// differ from the unfused path only where the two sums of squares round
// differently (tests/gpu/test_cuda_quant.cpp bounds the products).
// Bound: latency (one launch instead of two to four); the bytes are the row.
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_quant.h"
#include "gpu/quant_gemv_args.cuh"
#include "gpu/quant_matvec_ref.h"

namespace topkv::cuda {
namespace {

using namespace qunits;

constexpr int kFormThreads = 1024;
constexpr int kGluThreads = 256;

// Sum over the block (every thread gets it); `red` holds 32 floats.
__device__ float block_sum(float v, float* red) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  v = warp_sum(v);
  __syncthreads();  // red may still be read by an earlier call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < (int)(blockDim.x / 32) ? red[lane] : 0.f;
  return warp_sum(v);
}

__global__ void __launch_bounds__(kFormThreads)
    form_norm_q8_kernel(float* __restrict__ x, const float* __restrict__ add, const float* __restrict__ add_norm,
                        const float* __restrict__ norm, float eps, int64_t cols, int terms,
                        int8_t* __restrict__ qs, Q8Scale* __restrict__ ds) {
  __shared__ float red[32];
  const int64_t t = blockIdx.x;
  float* xr = x + t * cols;
  if (add) {
    const float* ar = add + t * cols;
    float inv_a = 1.f;
    if (add_norm) {
      float ss = 0.f;
      for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) ss = fmaf(ar[i], ar[i], ss);
      inv_a = 1.f / sqrtf(block_sum(ss, red) / (float)cols + eps);
    }
    for (int64_t i = threadIdx.x; i < cols; i += blockDim.x)
      xr[i] = xr[i] + (add_norm ? ar[i] * inv_a * add_norm[i] : ar[i]);
    __syncthreads();  // the updated row is read by other threads below
  }
  float ss = 0.f;
  for (int64_t i = threadIdx.x; i < cols; i += blockDim.x) ss = fmaf(xr[i], xr[i], ss);
  const float inv = 1.f / sqrtf(block_sum(ss, red) / (float)cols + eps);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  const int64_t blocks = cols / 32;
  for (int64_t b = warp; b < blocks; b += warps) {
    const int64_t i = b * 32 + lane;
    quantize_q8_1_warp(xr[i] * inv * norm[i], t, b, blocks, terms, qs, ds);
  }
}

template <int KIND>  // 0: SiLU, 1: GELU (tanh)
__global__ void __launch_bounds__(kGluThreads)
    form_glu_q8_kernel(const float* __restrict__ gate, const float* __restrict__ up, int64_t n_blocks,
                       int64_t row_blocks, int terms, int8_t* __restrict__ qs, Q8Scale* __restrict__ ds) {
  const int64_t blk = (int64_t)blockIdx.x * (kGluThreads / 32) + threadIdx.x / 32;
  if (blk >= n_blocks) return;  // whole warps
  const int64_t i = blk * 32 + threadIdx.x % 32;
  const float g = gate[i];
  float f;
  if constexpr (KIND == 0) {
    f = g / (1.f + expf(-g)) * up[i];
  } else {
    constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
    f = 0.5f * g * (1.f + tanhf(kC * (g + 0.044715f * g * g * g))) * up[i];
  }
  quantize_q8_1_warp(f, blk / row_blocks, blk % row_blocks, row_blocks, terms, qs, ds);
}

}  // namespace

void form_q8_1(const FormQ8Args& a, void* workspace, cudaStream_t stream) {
  if (a.T <= 0) return;
  TOPKV_CHECK(a.cols > 0 && a.cols % 32 == 0, "form_q8_1: {} columns are not whole blocks of 32", a.cols);
  qref::check_q8_terms(a.terms);
  const Q8DeviceActivations q = carve_q8_activations(workspace, a.T, a.cols, a.terms);
  if (a.up) {
    TOPKV_CHECK(!a.norm && !a.add, "form_q8_1: a GLU input takes no norm or residual add");
    const int64_t n_blocks = (int64_t)a.T * a.cols / 32;
    const unsigned grid = (unsigned)((n_blocks + kGluThreads / 32 - 1) / (kGluThreads / 32));
    if (a.glu == GluKind::SiLU)
      form_glu_q8_kernel<0><<<grid, kGluThreads, 0, stream>>>(a.x, a.up, n_blocks, a.cols / 32, a.terms, q.qs, q.ds);
    else
      form_glu_q8_kernel<1><<<grid, kGluThreads, 0, stream>>>(a.x, a.up, n_blocks, a.cols / 32, a.terms, q.qs, q.ds);
  } else {
    TOPKV_CHECK(a.norm, "form_q8_1: the input is a norm or a GLU (a plain x goes to quantize_q8_1)");
    form_norm_q8_kernel<<<a.T, kFormThreads, 0, stream>>>(a.x, a.add, a.add_norm, a.norm, a.eps, a.cols, a.terms,
                                                          q.qs, q.ds);
  }
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
