// Helpers shared by the backends that wrap an ANN library (hnswlib, Faiss):
// copying keys out of the store as fp32, scoping OpenMP's thread count to one
// call (src/common/omp_scope.h), and embedding a Faiss index in a topkv file.
#pragma once
#include <omp.h>

#include <cstdint>
#include <memory>
#include <vector>

#include <faiss/Index.h>
#include <faiss/impl/FaissException.h>

#include "index/row_store.h"
#include "src/common/binary_io.h"
#include "src/common/error.h"
#include "src/common/omp_scope.h"

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

// OpenBLAS's own thread count, set for a scope (several threads each running
// a small k-means must not each fan out into BLAS's pool). Looked up at run
// time: with another BLAS (or none loaded) it does nothing. n = 0 keeps it.
// Faiss calls the Fortran sgemm_ of whichever library provides it — on
// Debian the openblas-pthread libblas.so.3, a second OpenBLAS instance beside
// the libopenblas.so.0 we link, with its own thread count — so the count is
// set in every OpenBLAS found: the default lookup and the one holding sgemm_
// (without that, 16 k-means blocks each ran 16 BLAS threads on 16 cores).
class ScopedBlasThreads {
 public:
  explicit ScopedBlasThreads(int n);
  ~ScopedBlasThreads();
  ScopedBlasThreads(const ScopedBlasThreads&) = delete;
  ScopedBlasThreads& operator=(const ScopedBlasThreads&) = delete;
  // The thread count of the OpenBLAS that provides sgemm_ (what Faiss
  // calls), or -1 when that is not OpenBLAS.
  static int sgemm_threads();

 private:
  struct Saved {
    void (*set)(int);
    int threads;
  };
  std::vector<Saved> saved_;
};

// While any lease is held, OpenBLAS runs single-threaded (ScopedBlasThreads(1));
// the last lease to go restores it. Index builds running side by side (heads
// in parallel, blocks built while prefill goes on) share one setting instead
// of saving and restoring each other's.
class SingleThreadedBlas {
 public:
  SingleThreadedBlas();
  ~SingleThreadedBlas();
  SingleThreadedBlas(const SingleThreadedBlas&) = delete;
  SingleThreadedBlas& operator=(const SingleThreadedBlas&) = delete;
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

// The save/load body of a Faiss-backed KvIndex: a flag (is there an index:
// there is exactly when rows are indexed), then the Faiss index. load reads it
// back as a T that also passes `type_ok` (what the backend's parameters
// require), checked against dim and rows; null when no rows were indexed.
inline void save_faiss_or_none(BinaryWriter& w, const faiss::Index* index) {
  w.pod<uint8_t>(index ? 1 : 0);
  if (index) write_faiss_index(w, *index);
}
template <class T, class TypeOk>
std::unique_ptr<T> load_faiss_or_none(BinaryReader& r, int dim, int64_t rows, const char* label,
                                      const std::string& expected, TypeOk&& type_ok) {
  const uint8_t has = r.pod<uint8_t>();
  TOPKV_CHECK(has == (rows > 0 ? 1 : 0), "{} index '{}': index flag {} does not match {} rows", label, r.path(),
              has, rows);
  if (!has) return nullptr;
  std::unique_ptr<faiss::Index> any = read_faiss_index(r);
  auto* t = dynamic_cast<T*>(any.get());
  TOPKV_CHECK(t && type_ok(*t), "{} index '{}' holds a Faiss index of another type than {}", label, r.path(),
              expected);
  check_loaded_faiss_index(*t, dim, rows, r.path(), label);
  any.release();
  return std::unique_ptr<T>(t);
}

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
