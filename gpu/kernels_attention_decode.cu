// Decode attention (T = 1): the host side of gpu/attention_decode_kernel.cuh
// (v2) and gpu/attention_decode_v3_kernel.cuh (v3; the kernels and their
// design notes): the plans, the launches, and the exact merges of the
// splits' partials (log2 units, as the kernels write them).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>

#include "gpu/attention_decode_kernel.cuh"
#include "gpu/attention_decode_v3_kernel.cuh"
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

using namespace decode_attn;

// Exact merge of the splits: block (query head, 32 dims); the 8 warps take
// every 8th split, each lane one dim; parts with l = 0 are skipped unread.
__global__ void __launch_bounds__(kMergeWarps * 32) decode_merge_kernel(const float* __restrict__ pm,
                                                                      const float* __restrict__ pl,
                                                                      const float* __restrict__ po, int S, int hd,
                                                                      float* __restrict__ out) {
  __shared__ float red[kMergeWarps][32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = blockIdx.x;
  const int d = blockIdx.y * 32 + lane;
  const float* mr = pm + h * S;
  const float* lr = pl + h * S;
  float M = -INFINITY;
  for (int s = lane; s < S; s += 32)
    if (lr[s] > 0.f) M = fmaxf(M, mr[s]);
  M = warp_max(M);
  float L = 0.f;
  for (int s = lane; s < S; s += 32)
    if (lr[s] > 0.f) L += lr[s] * exp2f(mr[s] - M);
  L = warp_sum(L);
  float acc = 0.f;
  if (d < hd)
    for (int s = warp; s < S; s += kMergeWarps)
      if (lr[s] > 0.f) acc = fmaf(po[(h * S + s) * hd + d], exp2f(mr[s] - M), acc);
  red[warp][lane] = acc;
  __syncthreads();
  if (warp == 0 && d < hd) {
    float sum = 0.f;
#pragma unroll
    for (int w = 0; w < kMergeWarps; ++w) sum += red[w][lane];
    out[h * hd + d] = L > 0.f ? sum / L : 0.f;
  }
}

template <class E, int HD, int R> void set_smem_limit_v2(int device_limit) {
  // A device with less shared memory per block than Hopper's 227 KB keeps
  // its default: the launch then fails with the runtime's resource error.
  if ((int)Geo<E, HD, R>::smem_bytes > device_limit) return;
  TOPKV_CUDA_CHECK(cudaFuncSetAttribute(decode_attention_kernel<E, HD, R>,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)Geo<E, HD, R>::smem_bytes));
}

template <class E, int HD, int R> void launch_v2(const DecodeKernelArgs& ka, dim3 grid, cudaStream_t stream) {
  using G = Geo<E, HD, R>;
  decode_attention_kernel<E, HD, R><<<grid, G::NT, G::smem_bytes, stream>>>(ka);
  TOPKV_CUDA_CHECK_LAUNCH();
}

template <class E, int HD, int R> void set_carveout_v3() {
  // The largest shared-memory carveout, so that blocks_per_sm blocks of
  // 48 KB fit (the kernel reads no global memory through L1 but q).
  TOPKV_CUDA_CHECK(cudaFuncSetAttribute(decode_attn_v3::decode_attention_v3_kernel<E, HD, R>,
                                        cudaFuncAttributePreferredSharedMemoryCarveout,
                                        (int)cudaSharedmemCarveoutMaxShared));
}

template <class E, int HD, int R> void launch_v3(const DecodeKernelArgs& ka, dim3 grid, cudaStream_t stream) {
  using G = decode_attn_v3::Geo<E, HD, R>;
  decode_attn_v3::decode_attention_v3_kernel<E, HD, R><<<grid, G::NT, G::smem_bytes, stream>>>(ka);
  TOPKV_CUDA_CHECK_LAUNCH();
}

// Calls f(E{}, integral_constant<HD>, integral_constant<R>) for the instantiation.
template <class F> void with_decode_kernel(DType t, int head_dim, int R, F&& f) {
  with_elem_type(t, [&](auto e) {
    auto by_r = [&](auto hd) {
      if (R == 4)
        f(e, hd, std::integral_constant<int, 4>{});
      else
        f(e, hd, std::integral_constant<int, 8>{});
    };
    switch (head_dim) {
      case 32: by_r(std::integral_constant<int, 32>{}); break;
      case 64: by_r(std::integral_constant<int, 64>{}); break;
      case 96: by_r(std::integral_constant<int, 96>{}); break;
      case 128: by_r(std::integral_constant<int, 128>{}); break;
      case 256: by_r(std::integral_constant<int, 256>{}); break;
      default: fail("no CUDA decode attention kernel for head_dim {} (compiled: 32, 64, 96, 128, 256)", head_dim);
    }
  });
}

// The instantiation's launch and occupancy, by kernel.
template <class E, int HD, int R> const void* kernel_fn(DecodeKernel k) {
  return k == DecodeKernel::V2 ? (const void*)decode_attention_kernel<E, HD, R>
                               : (const void*)decode_attn_v3::decode_attention_v3_kernel<E, HD, R>;
}
template <class E, int HD, int R> std::pair<int, size_t> block_shape(DecodeKernel k) {
  if (k == DecodeKernel::V2) return {Geo<E, HD, R>::NT, Geo<E, HD, R>::smem_bytes};
  return {decode_attn_v3::Geo<E, HD, R>::NT, decode_attn_v3::Geo<E, HD, R>::smem_bytes};
}

}  // namespace

DecodeKernel decode_kernel_from_env() {
  const char* env = std::getenv("TOPKV_DECODE_ATTN");
  if (!env || !*env || std::strcmp(env, "v3") == 0) return DecodeKernel::V3;
  if (std::strcmp(env, "v2") == 0) return DecodeKernel::V2;
  fail("TOPKV_DECODE_ATTN={} names no decode attention kernel: use v2 (one block per SM) or v3 (the default)",
       env);
}

const char* decode_kernel_name(DecodeKernel k) { return k == DecodeKernel::V2 ? "v2" : "v3"; }

void init_decode_attention() {
  int dev = 0, limit = 0;
  TOPKV_CUDA_CHECK(cudaGetDevice(&dev));
  TOPKV_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  for (DType t : {DType::F32, DType::F16, DType::BF16})
    for (int hd : {32, 64, 96, 128, 256})
      for (int R : {4, 8})
        with_decode_kernel(t, hd, R, [limit](auto e, auto h, auto r) {
          set_smem_limit_v2<decltype(e), decltype(h)::value, decltype(r)::value>(limit);
          set_carveout_v3<decltype(e), decltype(h)::value, decltype(r)::value>();
        });
}

DecodeAttentionPlan plan_decode_attention(int n_head, int n_kv, int head_dim, int64_t max_keys, int sm_count,
                                          DecodeKernel kernel) {
  TOPKV_CHECK(n_kv > 0 && n_head % n_kv == 0, "{} query heads do not split over {} KV heads", n_head, n_kv);
  TOPKV_CHECK(attention_head_dim_supported(head_dim), "no CUDA decode attention kernel for head_dim {}", head_dim);
  TOPKV_CHECK(kernel == DecodeKernel::V2 || kernel == DecodeKernel::V3, "unknown decode attention kernel {}",
              (int)kernel);
  const int group = n_head / n_kv;
  DecodeAttentionPlan p;
  p.kernel = kernel;
  p.rows_per_block = group <= 4 ? 4 : 8;
  p.row_tiles = (group + p.rows_per_block - 1) / p.rows_per_block;
  const int64_t base = (int64_t)n_kv * p.row_tiles;
  int64_t splits = 1;
  if (kernel == DecodeKernel::V2) {
    // One block per SM (each holds 8-16 warps); splits beyond the keys a
    // split needs to be worth its merge are not made.
    p.blocks_per_sm = 1;
    splits = std::max<int64_t>(1, std::max(sm_count, 1) / base);
    splits = std::min({splits, std::max<int64_t>(1, (max_keys + kMinSplitKeys - 1) / kMinSplitKeys),
                       (int64_t)kMaxSplits});
  } else {
    // One wave of blocks_per_sm blocks on every SM, each split >= kMinSplitKeys
    // keys when the cache is full (the kernel cuts fewer visible keys into
    // fewer, never shorter, splits).
    namespace v3 = decode_attn_v3;
    p.blocks_per_sm = v3::blocks_per_sm(p.rows_per_block);
    splits = std::max<int64_t>(1, (int64_t)std::max(sm_count, 1) * p.blocks_per_sm / base);
    splits = std::min({splits, std::max<int64_t>(1, max_keys / v3::kMinSplitKeys), (int64_t)v3::kMaxSplits});
  }
  p.n_splits = (int)splits;
  const size_t n_part = (size_t)n_head * p.n_splits;
  if (p.n_splits > 1)
    p.workspace_bytes = kernel == DecodeKernel::V2 ? n_part * (size_t)(head_dim + 2) * sizeof(float)
                                                   : decode_attn_v3::partials_bytes(n_part, head_dim);
  return p;
}

int decode_attention_resident_blocks(const DecodeAttentionPlan& p, DType kv_type, int head_dim) {
  int blocks = 0;
  with_decode_kernel(kv_type, head_dim, p.rows_per_block, [&](auto e, auto h, auto r) {
    using E = decltype(e);
    constexpr int HD = decltype(h)::value, R = decltype(r)::value;
    const auto [threads, smem] = block_shape<E, HD, R>(p.kernel);
    TOPKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel_fn<E, HD, R>(p.kernel), threads,
                                                                   smem));
  });
  return blocks;
}

void decode_attention(const DecodeAttentionArgs& a, const DecodeAttentionPlan& p, void* workspace,
                      cudaStream_t stream) {
  const int group = a.n_head / a.n_kv;
  TOPKV_CHECK(a.capacity > 0 && a.n_kv > 0 && group * a.n_kv == a.n_head,
              "decode attention over {} query heads / {} KV heads and a {}-slot cache", a.n_head, a.n_kv, a.capacity);
  const bool v3 = p.kernel == DecodeKernel::V3;
  TOPKV_CHECK(p.n_splits >= 1 && p.n_splits <= (v3 ? decode_attn_v3::kMaxSplits : kMaxSplits),
              "decode attention plan with {} splits (1..{} for {})", p.n_splits,
              v3 ? decode_attn_v3::kMaxSplits : kMaxSplits, decode_kernel_name(p.kernel));
  DecodeKernelArgs ka{};
  ka.q = a.q, ka.out = a.out, ka.k = a.k, ka.v = a.v, ka.dev_pos = a.dev_pos;
  ka.pos = a.pos, ka.capacity = a.capacity, ka.window = a.window, ka.scale = a.scale;
  ka.group = group, ka.row_tiles = p.row_tiles, ka.n_splits = p.n_splits;
  if (p.n_splits > 1) {
    TOPKV_CHECK(workspace, "split decode attention needs {} bytes of work space", p.workspace_bytes);
    const size_t n_part = (size_t)a.n_head * p.n_splits;
    if (v3)
      decode_attn_v3::carve_partials_v3(workspace, n_part, ka.part_m, ka.part_l, ka.part_o);
    else
      carve_partials(workspace, n_part, ka.part_m, ka.part_l, ka.part_o);
  }
  const int64_t blocks_y = (int64_t)a.n_kv * p.row_tiles;
  TOPKV_CHECK(blocks_y <= 65535, "decode attention over {} KV heads x {} row tiles is too large", a.n_kv,
              p.row_tiles);
  const dim3 grid((unsigned)p.n_splits, (unsigned)blocks_y);
  with_decode_kernel(a.kv_type, a.head_dim, p.rows_per_block, [&](auto e, auto h, auto r) {
    if (v3)
      launch_v3<decltype(e), decltype(h)::value, decltype(r)::value>(ka, grid, stream);
    else
      launch_v2<decltype(e), decltype(h)::value, decltype(r)::value>(ka, grid, stream);
  });
  if (p.n_splits > 1) {
    const dim3 mgrid((unsigned)a.n_head, (unsigned)((a.head_dim + 31) / 32));
    if (v3)
      decode_attn_v3::decode_merge_v3_kernel<<<mgrid, decode_attn_v3::kMergeThreads, 0, stream>>>(
          ka.part_m, ka.part_l, ka.part_o, p.n_splits, a.head_dim, a.out);
    else
      decode_merge_kernel<<<mgrid, kMergeWarps * 32, 0, stream>>>(ka.part_m, ka.part_l, ka.part_o, p.n_splits,
                                                                 a.head_dim, a.out);
    TOPKV_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace topkv::cuda
