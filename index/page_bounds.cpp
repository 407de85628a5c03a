#include "index/page_bounds.h"

#include <omp.h>

#include <algorithm>
#include <vector>

#include "src/common/error.h"

namespace topkv {

void PageBoundsEngine::check_page_range(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page,
                                        int64_t n_rows, int64_t max_page) {
  TOPKV_CHECK(page >= 1 && page <= max_page && first_page >= 0 && end_page >= first_page && n_rows <= keys.size() &&
                  (end_page == first_page || n_rows > (end_page - 1) * page),
              "internal: bounds of pages {}..{} of {} rows (at most {}) over {} of the store's {} rows", first_page,
              end_page, page, max_page, n_rows, keys.size());
}

void page_bounds_fold(const RowStore& keys, int64_t lo, int64_t hi, float* bound_row, float* k) {
  const int d = keys.dim();
  float* mx = bound_row;
  float* mn = mx + d;
  for (int64_t i = lo; i < hi; ++i) {
    keys.row_f32(i, k);
    for (int j = 0; j < d; ++j) {
      mx[j] = std::max(mx[j], k[(size_t)j]);  // (mx < k) ? k : mx
      mn[j] = std::min(mn[j], k[(size_t)j]);  // (k < mn) ? k : mn
    }
  }
}

void page_bounds_reference(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page, int64_t n_rows,
                           float* out, int threads) {
  PageBoundsEngine::check_page_range(keys, page, first_page, end_page, n_rows, INT64_MAX);
  const int d = keys.dim();
  const size_t w = 2 * (size_t)d;
  threads = (int)std::max<int64_t>(1, std::min<int64_t>(threads, end_page - first_page));
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> k((size_t)d);
#pragma omp for schedule(static)
    for (int64_t p = first_page; p < end_page; ++p) {
      float* row = out + (size_t)(p - first_page) * w;
      const int64_t lo = p * page, hi = std::min(n_rows, lo + page);
      keys.row_f32(lo, row);  // the page's first row is its max and its min
      std::copy(row, row + d, row + d);
      page_bounds_fold(keys, lo + 1, hi, row, k.data());
    }
  }
}

}  // namespace topkv
