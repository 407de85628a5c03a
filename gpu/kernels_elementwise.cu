// Elementwise kernels of the CUDA backend: gated activations, residual add,
// embedding gather, KV-cache write. All memory-bound: grid-stride loops with
// coalesced accesses, each input read once and each output written once.
// Arithmetic follows the CPU twins expression for expression (accurate expf /
// tanhf, no fast-math) so the two agree to a few ulp.
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kThreads = 256;

// out may alias gate or up: each element is read and written by one thread.
__global__ void glu_silu_kernel(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.f + expf(-g)) * up[i];
  }
}

__global__ void glu_gelu_tanh_kernel(const float* gate, const float* up, int64_t n, float* out) {
  constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
    const float g = gate[i];
    out[i] = 0.5f * g * (1.f + tanhf(kC * (g + 0.044715f * g * g * g))) * up[i];
  }
}

__global__ void add_kernel(const float* __restrict__ x, int64_t n, float* __restrict__ y) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    y[i] += x[i];
}

// One block per token; threads stride along the row.
template <class E>
__global__ void embed_kernel(const E* __restrict__ table, int64_t cols, const int32_t* __restrict__ ids,
                             float scale, float* __restrict__ out) {
  const int t = blockIdx.x;
  const E* row = table + (int64_t)ids[t] * cols;
  float* o = out + (int64_t)t * cols;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = to_float(row[c]);
    o[c] = scale != 1.f ? v * scale : v;
  }
}

// One block per (token, KV head) of the tokens written; threads along head_dim.
template <class E>
__global__ void kv_write_kernel(E* __restrict__ k_cache, E* __restrict__ v_cache, int n_kv, int head_dim,
                                int64_t capacity, const float* __restrict__ k, const float* __restrict__ v,
                                int t_first, int64_t pos0, const int64_t* dev_pos) {
  const int t = t_first + blockIdx.x / n_kv, h = blockIdx.x % n_kv;
  const int64_t slot = ((dev_pos ? *dev_pos : pos0) + t) % capacity;
  const int64_t src = ((int64_t)t * n_kv + h) * head_dim;
  const int64_t dst = ((int64_t)h * capacity + slot) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    k_cache[dst + d] = from_float<E>(k[src + d]);
    v_cache[dst + d] = from_float<E>(v[src + d]);
  }
}

// Element by element: dst[i] = src[i] through fp32 (exact for every source
// store type, q8_0 blocks included; the destination rounds to nearest even,
// as the host's from_f32). Twin: the host's to_f32 then from_f32.
template <class S, class D>
__global__ void convert_kernel(const void* __restrict__ src, D* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    dst[i] = from_float<D>(elem_at<S>(src, i));
}

}  // namespace

void check_kernel_image(int major, int minor) {
  cudaFuncAttributes attr{};
  const cudaError_t e = cudaFuncGetAttributes(&attr, add_kernel);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("this build has no CUDA kernels for the device (compute capability {}.{}): {}. Rebuild with "
         "-DCMAKE_CUDA_ARCHITECTURES={}{}",
         major, minor, cudaGetErrorString(e), major, minor);
  }
}

void glu(GluKind kind, const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream) {
  if (n <= 0) return;
  const unsigned blocks = grid_for(n, kThreads);
  if (kind == GluKind::SiLU)
    glu_silu_kernel<<<blocks, kThreads, 0, stream>>>(gate, up, n, out);
  else
    glu_gelu_tanh_kernel<<<blocks, kThreads, 0, stream>>>(gate, up, n, out);
  TOPKV_CUDA_CHECK_LAUNCH();
}

void add(const float* x, int64_t n, float* y, cudaStream_t stream) {
  if (n <= 0) return;
  add_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, y);
  TOPKV_CUDA_CHECK_LAUNCH();
}

void embed_rows(DType table_type, const void* table, int64_t cols, const int32_t* ids, int T, float scale,
                float* out, cudaStream_t stream) {
  if (T <= 0) return;
  with_elem_type(table_type, [&](auto e) {
    using E = decltype(e);
    embed_kernel<E><<<T, kThreads, 0, stream>>>(static_cast<const E*>(table), cols, ids, scale, out);
  });
  TOPKV_CUDA_CHECK_LAUNCH();
}

void kv_write(DType dtype, void* k_cache, void* v_cache, int n_kv, int head_dim, int64_t capacity,
              const float* k, const float* v, int T, int64_t pos0, cudaStream_t stream, const int64_t* dev_pos) {
  if (T <= 0) return;
  // With T > capacity the ring would be written more than once in this chunk;
  // sequential writes leave the last `capacity` tokens, so write only those.
  const int t_first = (int64_t)T > capacity ? T - (int)capacity : 0;
  const int64_t blocks = (int64_t)(T - t_first) * n_kv;
  TOPKV_CHECK(blocks < (int64_t)1 << 31, "kv_write of {} tokens x {} heads is too large for one launch", T, n_kv);
  const int threads = head_dim >= 128 ? 128 : 64;
  with_elem_type(dtype, [&](auto e) {
    using E = decltype(e);
    kv_write_kernel<E><<<(unsigned)blocks, threads, 0, stream>>>(static_cast<E*>(k_cache), static_cast<E*>(v_cache),
                                                                 n_kv, head_dim, capacity, k, v, t_first, pos0,
                                                                 dev_pos);
  });
  TOPKV_CUDA_CHECK_LAUNCH();
}

void convert(DType from, const void* src, DType to, void* dst, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  TOPKV_CHECK(!dtype_blocked(from) || n % (int64_t)kQ8Block == 0,
              "internal: convert of {} {} elements, not whole blocks of {}", n, dtype_name(from), kQ8Block);
  with_store_type(from, [&](auto s_elem) {
    with_elem_type(to, [&](auto d_elem) {
      using S = decltype(s_elem);
      using D = decltype(d_elem);
      convert_kernel<S, D><<<grid_for(n, kThreads), kThreads, 0, stream>>>(src, static_cast<D*>(dst), n);
    });
  });
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
