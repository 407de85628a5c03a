// Quest's page bounds of a run of stored keys: for each page of P consecutive
// rows, the element-wise max M and min m of its keys, one row [M | m] of
// 2 dim floats ("Quest: Query-Aware Sparsity for Efficient Long-Context LLM
// Inference" §3.2; index/quest_index.cpp). An engine is a capability handed
// in through BuildOptions::bounds, as the k-means is (index/kmeans.h): the
// CUDA runtime hands in its device engine (gpu/gpu_page_bounds.h) with
// `--build-on gpu` or `auto`, so that a long prefill's pages are bounded on
// the device, and the host cores only receive the finished rows.
//
// page_bounds_reference is every engine's plain twin and the host build
// itself: each key as the store decodes it (RowStore::row_f32), the page's
// first row copied, then M_i = (M_i < k_i ? k_i : M_i) and m_i = (k_i < m_i ?
// k_i : m_i) row by row in order. An engine must give the same bits: max and
// min are exact, and that order decides between -0 and +0 as the twin does.
//
// Layout: out is [end_page - first_page][2 dim] fp32, row-major.
#pragma once
#include <cstdint>

#include "index/row_store.h"

namespace topkv {

class PageBoundsEngine {
 public:
  virtual ~PageBoundsEngine() = default;
  virtual const char* name() const = 0;
  // Bounds of pages [first_page, end_page) of `page` rows each, over the
  // store's rows [first_page * page, min(end_page * page, n_rows)); every
  // page holds at least one of them (n_rows > (end_page - 1) * page),
  // n_rows <= keys.size() and page <= max_page() (checked here: Error).
  // Safe to call from several threads at once.
  void bound_pages(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page, int64_t n_rows,
                   float* out) const {
    check_page_range(keys, page, first_page, end_page, n_rows, max_page());
    if (end_page > first_page) bound_impl(keys, page, first_page, end_page, n_rows, out);
  }
  // The longest page it bounds (a backend with longer pages builds on the host).
  virtual int64_t max_page() const { return INT64_MAX; }
  // Device memory it takes for keys of d elements (a memory plan's line; 0
  // for an engine on the host).
  virtual double device_bytes(int d) const {
    (void)d;
    return 0;
  }
  // Throws Error unless bound_pages may take these arguments (above).
  static void check_page_range(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page,
                               int64_t n_rows, int64_t max_page);

 protected:
  // bound_pages on checked arguments, at least one page.
  virtual void bound_impl(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page, int64_t n_rows,
                          float* out) const = 0;
};

// The twin (above) on `threads` host threads, pages split between them.
void page_bounds_reference(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page, int64_t n_rows,
                           float* out, int threads);
// The twin's step: rows [lo, hi) folded into one page's bound row [M | m]
// (a page's first row is copied in, then every later one folded); `key`:
// dim() floats of scratch.
void page_bounds_fold(const RowStore& keys, int64_t lo, int64_t hi, float* bound_row, float* key);

// The twin as an engine, one thread a call: what quest's streaming build
// runs when no engine is handed in, and what tests wrap.
class HostPageBounds final : public PageBoundsEngine {
 public:
  const char* name() const override { return "host"; }

 protected:
  void bound_impl(const RowStore& keys, int64_t page, int64_t first_page, int64_t end_page, int64_t n_rows,
                  float* out) const override {
    page_bounds_reference(keys, page, first_page, end_page, n_rows, out, 1);
  }
};

}  // namespace topkv
