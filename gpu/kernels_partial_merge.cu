// The exact log-sum-exp merge of partial attentions (DESIGN.md, "Attention
// over a union of disjoint parts"), twin of partial_merge + partial_finish in
// gpu/partial_attention.h. Split-KV attention uses it to combine its key
// ranges; the offloaded decode combines the window part with the retrieved
// part (and multipole summaries) the same way; a streamed prefill
// (gpu/cuda_streamed_attention.cpp) folds each key block into a running
// partial with merge_partials_into.
//
// One block per row: the block computes the per-part factors e^(m_p - M) once
// into shared memory, then each thread sums its output dims over the parts.
// Memory-bound: parts * (dv + 2) * 4 bytes read per row, dv * 4 written.
#include <algorithm>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kFactorPad = 4;

// kAcc: the running partial acc (m, l, o of row r) is one more part, and
// the merged (M, L, unnormalised O) goes back to it instead of out / L.
template <bool kAcc>
__global__ void __launch_bounds__(kThreads) merge_partials_kernel(const float* __restrict__ m,
                                                                  const float* __restrict__ l,
                                                                  const float* __restrict__ o, int parts, int dv,
                                                                  float* __restrict__ out, float* acc_m,
                                                                  float* acc_l, float* acc_o) {
  // [parts + kFactorPad]: e^(m_p - M), 0 for an empty part and for the pad.
  // The pad: ptxas may load factor[] ahead of the loop's bound in the output
  // sum below (compute-sanitizer memcheck saw 12-byte reads at factor[parts]).
  extern __shared__ float factor[];
  __shared__ float red[kThreads / 32];
  __shared__ float M_sh, L_sh, acc_f;
  const int64_t r = blockIdx.x;
  const float* mr = m + r * parts;
  const float* lr = l + r * parts;
  const float am = kAcc ? acc_m[r] : 0.f, al = kAcc ? acc_l[r] : 0.f;
  // M = max over non-empty parts (l == 0 marks an empty one, whose m may be -inf).
  float M = -INFINITY;
  for (int p = threadIdx.x; p < parts; p += kThreads)
    if (lr[p] != 0.f) M = fmaxf(M, mr[p]);
  M = warp_max(M);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = M;
  __syncthreads();
  if (threadIdx.x == 0) {
    float x = kAcc && al != 0.f ? am : -INFINITY;
    for (int i = 0; i < kThreads / 32; ++i) x = fmaxf(x, red[i]);
    M_sh = x;
  }
  __syncthreads();
  M = M_sh;
  float Lp = 0.f;
  for (int p = threadIdx.x; p < parts; p += kThreads) {
    const float f = lr[p] != 0.f ? expf(mr[p] - M) : 0.f;
    factor[p] = f;
    Lp += lr[p] * f;
  }
  if (threadIdx.x < kFactorPad) factor[parts + threadIdx.x] = 0.f;
  Lp = warp_sum(Lp);
  __syncthreads();  // red[] reuse, factor[] complete
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = Lp;
  __syncthreads();
  if (threadIdx.x == 0) {
    float x = 0.f;
    for (int i = 0; i < kThreads / 32; ++i) x += red[i];
    const float fa = kAcc && al != 0.f ? expf(am - M) : 0.f;
    acc_f = fa;
    L_sh = x + al * fa;
  }
  __syncthreads();
  const float L = L_sh, fa = acc_f;
  const float* orow = o + r * parts * (int64_t)dv;
  for (int d = threadIdx.x; d < dv; d += kThreads) {
    float acc = 0.f;
    for (int p = 0; p < parts; ++p)
      if (factor[p] != 0.f) acc = fmaf(orow[(int64_t)p * dv + d], factor[p], acc);
    if constexpr (kAcc) {
      if (fa != 0.f) acc = fmaf(acc_o[r * dv + d], fa, acc);
      acc_o[r * dv + d] = acc;  // each thread reads and writes only its own dims
    } else {
      out[r * dv + d] = L > 0.f ? acc / L : 0.f;
    }
  }
  if (kAcc && threadIdx.x == 0) acc_m[r] = L > 0.f ? M : -INFINITY, acc_l[r] = L;
}

}  // namespace

void merge_partials(const float* m, const float* l, const float* o, int64_t rows, int parts, int dv, float* out,
                    cudaStream_t stream) {
  if (rows <= 0 || dv <= 0) return;
  TOPKV_CHECK(parts >= 1 && parts <= 8192, "merge of {} partials per row: 1..8192 supported", parts);
  TOPKV_CHECK(rows < INT32_MAX, "merge over {} rows is too large for one launch", rows);
  merge_partials_kernel<false><<<(unsigned)rows, kThreads, (size_t)(parts + kFactorPad) * sizeof(float),
                                                                   stream>>>(m, l, o, parts, dv, out, nullptr, nullptr,
                                                                             nullptr);
  TOPKV_CUDA_CHECK_LAUNCH();
}

void merge_partials_into(const float* m, const float* l, const float* o, int64_t rows, int parts, int dv,
                         float* acc_m, float* acc_l, float* acc_o, cudaStream_t stream) {
  if (rows <= 0 || dv <= 0) return;
  TOPKV_CHECK(parts >= 1 && parts <= 8192, "merge of {} partials per row: 1..8192 supported", parts);
  TOPKV_CHECK(rows < INT32_MAX, "merge over {} rows is too large for one launch", rows);
  TOPKV_CHECK(acc_m && acc_l && acc_o, "merge_partials_into needs the running partial");
  merge_partials_kernel<true><<<(unsigned)rows, kThreads, (size_t)(parts + kFactorPad) * sizeof(float),
                                                                  stream>>>(m, l, o, parts, dv, nullptr, acc_m, acc_l,
                                                                            acc_o);
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
