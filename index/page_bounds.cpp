#include "index/page_bounds.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "src/common/error.h"

namespace topkv {

void page_bounds_reference(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page, int64_t n_rows,
                           float* out, int threads) {
  TOPKV_CHECK(page >= 1 && first_page >= 0 && end_page >= first_page && n_rows <= keys.size() &&
                  (end_page == first_page || n_rows > (end_page - 1) * page),
              "internal: bounds of pages {}..{} of {} rows over {} of the store's {} rows", first_page, end_page,
              page, n_rows, keys.size());
  const int d = keys.dim();
  const size_t w = 2 * (size_t)d;
  threads = (int)std::max<int64_t>(1, std::min<int64_t>(threads, end_page - first_page));
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> k((size_t)d);
#pragma omp for schedule(static)
    for (int64_t p = first_page; p < end_page; ++p) {
      float* mx = out + (size_t)(p - first_page) * w;
      float* mn = mx + d;
      const int64_t lo = p * page, hi = std::min(n_rows, lo + page);
      keys.row_f32(lo, mx);
      std::copy(mx, mx + d, mn);
      for (int64_t i = lo + 1; i < hi; ++i) {
        keys.row_f32(i, k.data());
        for (int j = 0; j < d; ++j) {
          mx[j] = std::max(mx[j], k[(size_t)j]);  // (mx < k) ? k : mx
          mn[j] = std::min(mn[j], k[(size_t)j]);  // (k < mn) ? k : mn
        }
      }
    }
  }
}

}  // namespace topkv
