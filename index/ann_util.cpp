#include "index/ann_util.h"

#include <dlfcn.h>

#include <mutex>

#include "src/common/progress.h"

#include <faiss/impl/io.h>
#include <faiss/index_io.h>

namespace topkv {

void copy_rows_f32(const RowStore& store, int64_t from, int64_t to, float* out) {
  const size_t d = (size_t)store.dim();
  store.for_each_span(from, to, [&](int64_t first, int64_t n, const void* rows) {
    to_f32(store.dtype(), rows, out + (size_t)(first - from) * d, (size_t)n * d);
  });
}

namespace {
// faiss::IOWriter / IOReader over topkv's checksummed files: the Faiss index
// is streamed in place, never staged in a second buffer.
struct BinaryIOWriter final : faiss::IOWriter {
  explicit BinaryIOWriter(BinaryWriter& w) : w(w) { name = "topkv index file"; }
  size_t operator()(const void* ptr, size_t size, size_t nitems) override {
    w.bytes(ptr, size * nitems);
    return nitems;
  }
  BinaryWriter& w;
};

struct BinaryIOReader final : faiss::IOReader {
  explicit BinaryIOReader(BinaryReader& r) : r(r) { name = r.path(); }
  size_t operator()(void* ptr, size_t size, size_t nitems) override {
    // BinaryReader throws a topkv::Error when the file holds fewer bytes.
    r.bytes(ptr, size * nitems);
    return nitems;
  }
  BinaryReader& r;
};
}  // namespace

void write_faiss_index(BinaryWriter& w, const faiss::Index& index) {
  BinaryIOWriter out(w);
  faiss_guard("saving the Faiss index", [&] { faiss::write_index(&index, &out); });
}

std::unique_ptr<faiss::Index> read_faiss_index(BinaryReader& r) {
  BinaryIOReader in(r);
  return faiss_guard("loading the Faiss index",
                     [&] { return std::unique_ptr<faiss::Index>(faiss::read_index(&in)); });
}

void faiss_add_rows(faiss::Index& index, const RowStore& keys, int64_t from, int64_t to, int threads,
                    bool progress, const char* label) {
  ScopedOmpThreads scoped(omp_threads_for(to - from, threads));
  Progress bar(fmt::format("{} build", label), to - from, "keys", progress && to - from >= 10000);
  const std::string what = fmt::format("{}: adding keys", label);
  for_each_f32_block(keys, from, to, RowStore::kChunkRows, [&](int64_t, int64_t n, const float* x) {
    faiss_guard(what.c_str(), [&] { index.add(n, x); });
    bar.add(n);
  });
  bar.finish();
}

void check_loaded_faiss_index(const faiss::Index& ix, int dim, int64_t rows, const std::string& path,
                              const char* label) {
  TOPKV_CHECK(ix.metric_type == faiss::METRIC_INNER_PRODUCT && ix.d == dim && ix.ntotal == rows,
              "{} index '{}' does not match its header (metric {}, d={}, {} vectors; expected inner product, "
              "d={}, {} rows)", label, path, (int)ix.metric_type, ix.d, ix.ntotal, dim, rows);
}


namespace {

using SetThreads = void (*)(int);
using GetThreads = int (*)();

using OpenBlas = std::pair<SetThreads, GetThreads>;

OpenBlas openblas_in(void* handle) {
  return {reinterpret_cast<SetThreads>(dlsym(handle, "openblas_set_num_threads")),
          reinterpret_cast<GetThreads>(dlsym(handle, "openblas_get_num_threads"))};
}

// The OpenBLAS that provides sgemm_ (what Faiss calls), or nulls.
OpenBlas sgemm_openblas() {
  Dl_info info{};
  void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
  if (!sgemm || !dladdr(sgemm, &info) || !info.dli_fname) return {};
  void* h = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  if (!h) return {};
  const OpenBlas found = openblas_in(h);
  dlclose(h);  // drops the reference RTLD_NOLOAD took; the library stays loaded
  return found;
}

// Every OpenBLAS reachable from here, each once: sgemm_'s and the default lookup's.
std::vector<OpenBlas> openblas_instances() {
  std::vector<OpenBlas> out;
  for (const OpenBlas& o : {sgemm_openblas(), openblas_in(RTLD_DEFAULT)})
    if (o.first && o.second && (out.empty() || out[0].first != o.first)) out.push_back(o);
  return out;
}

}  // namespace

ScopedBlasThreads::ScopedBlasThreads(int n) {
  if (n <= 0) return;
  for (auto [set, get] : openblas_instances()) {
    saved_.push_back({set, get()});
    set(n);
  }
}

ScopedBlasThreads::~ScopedBlasThreads() {
  for (auto& s : saved_) s.set(s.threads);
}

namespace {
std::mutex blas_lease_mu;
int blas_leases = 0;
std::unique_ptr<ScopedBlasThreads> blas_single;
}  // namespace

SingleThreadedBlas::SingleThreadedBlas() {
  std::lock_guard lk(blas_lease_mu);
  if (blas_leases++ == 0) blas_single = std::make_unique<ScopedBlasThreads>(1);
}

SingleThreadedBlas::~SingleThreadedBlas() {
  std::lock_guard lk(blas_lease_mu);
  if (--blas_leases == 0) blas_single.reset();
}

int ScopedBlasThreads::sgemm_threads() {
  const OpenBlas o = sgemm_openblas();
  return o.second ? o.second() : -1;
}

}  // namespace topkv
