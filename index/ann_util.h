// Helpers shared by the backends that wrap an ANN library (hnswlib, Faiss):
// copying keys out of the store as fp32, scoping OpenMP's thread count to one
// call, and embedding a Faiss index in a topkv file.
#pragma once
#include <omp.h>

#include <cstdint>
#include <memory>

#include <faiss/Index.h>
#include <faiss/impl/FaissException.h>

#include "index/row_store.h"
#include "src/common/binary_io.h"
#include "src/common/error.h"

namespace topkv {

// Rows [from, to) of `store` as contiguous fp32 (converted from f16/bf16).
void copy_rows_f32(const RowStore& store, int64_t from, int64_t to, float* out);

// Calls f(first_row, n_rows, fp32 rows) for [from, to) in blocks of at most
// `block` rows, so a library that needs contiguous fp32 input never forces a
// second fp32 copy of all keys at once.
template <typename F>
void for_each_f32_block(const RowStore& store, int64_t from, int64_t to, int64_t block, F&& f) {
  std::unique_ptr<float[]> buf(new float[(size_t)std::min(block, to - from) * (size_t)store.dim()]);
  for (int64_t lo = from; lo < to; lo += block) {
    int64_t hi = std::min(to, lo + block);
    copy_rows_f32(store, lo, hi, buf.get());
    f(lo, hi - lo, static_cast<const float*>(buf.get()));
  }
}

// When a query's k covers the whole index, its exact top-k is every indexed
// row: `out.ids` gets [0, n) without a search. Graph backends need this on
// inner product: HNSW leaves some small-norm keys without in-links (no key
// has them among its nearest by -q·k), so no ef reaches them.
template <typename Candidates>
void take_all_rows(int64_t n, Candidates& out) {
  out.ids.reserve(out.ids.size() + (size_t)n);
  for (int64_t i = 0; i < n; ++i) out.ids.push_back(i);
}

// Sets the calling thread's OpenMP team size for the parallel regions it opens
// (Faiss's build and training) and restores it on scope exit. OpenMP keeps
// this setting per thread, so concurrent callers do not disturb each other.
class ScopedOmpThreads {
 public:
  explicit ScopedOmpThreads(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n < 1 ? 1 : n); }
  ~ScopedOmpThreads() { omp_set_num_threads(saved_); }
  ScopedOmpThreads(const ScopedOmpThreads&) = delete;
  ScopedOmpThreads& operator=(const ScopedOmpThreads&) = delete;

 private:
  int saved_;
};

// OpenMP threads worth using for a Faiss build step over `rows` keys: a team
// costs a fork/join per parallel region, and k-means or a small add opens many
// short ones (on a loaded host each waits for a descheduled thread: measured
// 15 ms -> 830 ms for a 1000-key IVF build with 2 threads on 2 busy cores), so
// small steps run on the calling thread.
inline int omp_threads_for(int64_t rows, int threads) { return rows >= 8192 ? threads : 1; }

// Streams a Faiss index through faiss::write_index into a topkv file, and
// back. The reader checks the index's type with a dynamic_cast by the caller.
void write_faiss_index(BinaryWriter& w, const faiss::Index& index);
std::unique_ptr<faiss::Index> read_faiss_index(BinaryReader& r);

// Checks that an index read back from `path` is an inner-product index of
// dimension `dim` holding `rows` vectors (what the topkv header promised).
void check_loaded_faiss_index(const faiss::Index& index, int dim, int64_t rows, const std::string& path,
                              const char* label);

// faiss::Index::add over store rows [from, to) in fp32 blocks (the staging
// buffer stays one chunk), with `threads` OpenMP threads for large adds and a
// progress bar labelled `label` when `progress` and the add is large. Faiss
// numbers vectors in add order, so its ids are the store's row ids.
void faiss_add_rows(faiss::Index& index, const RowStore& keys, int64_t from, int64_t to, int threads,
                    bool progress, const char* label);

// Runs f(), turning a faiss::FaissException into a topkv::Error that names
// `what` (Faiss reports bad arguments and allocation failures this way).
template <typename F>
decltype(auto) faiss_guard(const char* what, F&& f) {
  try {
    return f();
  } catch (const faiss::FaissException& e) {
    fail("{} failed inside Faiss: {}", what, e.what());
  }
}

}  // namespace topkv
