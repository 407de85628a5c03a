// Quest's page bounds on the device (gpu/gpu_page_bounds.cpp runs it over
// blocks of a store's rows copied up raw). Twin: page_bounds_reference
// (index/page_bounds.h), bit for bit: the same decoding of each element
// (elem_at, the host's to_f32), the page's first row copied, then the twin's
// comparisons row by row in order, so -0 against +0 resolves as there.
#include "gpu/cuda_common.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

constexpr int kThreads = 128;

// One block a page, a thread per dimension (strided): every row is read once,
// each warp's loads of a row coalesced.
template <class S>
__global__ void __launch_bounds__(kThreads)
    page_bounds_kernel(const void* __restrict__ rows, int64_t n_rows, int d, int64_t page, float* __restrict__ out) {
  const int64_t p = blockIdx.x, lo = p * page, hi = min(n_rows, lo + page);
  float* mx = out + p * 2 * d;
  float* mn = mx + d;
  for (int j = threadIdx.x; j < d; j += kThreads) {
    float hi_v = elem_at<S>(rows, lo * d + j), lo_v = hi_v;
    for (int64_t r = lo + 1; r < hi; ++r) {
      const float k = elem_at<S>(rows, r * d + j);
      hi_v = hi_v < k ? k : hi_v;  // std::max(hi_v, k)
      lo_v = k < lo_v ? k : lo_v;  // std::min(lo_v, k)
    }
    mx[j] = hi_v;
    mn[j] = lo_v;
  }
}

}  // namespace

void page_bounds(DType store, const void* rows, int64_t n_rows, int d, int64_t page, float* out,
                 cudaStream_t stream) {
  if (n_rows <= 0) return;
  TOPKV_CHECK(page >= 1 && (!dtype_blocked(store) || d % (int)kQ8Block == 0),
              "internal: page bounds of {}-row pages over {} rows of {} {}", page, n_rows, d, dtype_name(store));
  const int64_t pages = (n_rows + page - 1) / page;
  TOPKV_CHECK(pages <= INT32_MAX, "internal: {} pages in one page-bounds launch", pages);
  with_store_type(store, [&](auto elem) {
    page_bounds_kernel<decltype(elem)><<<(unsigned)pages, kThreads, 0, stream>>>(rows, n_rows, d, page, out);
  });
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace topkv::cuda
