// flat: exact maximum inner product by scanning every key. The oracle the
// other backends are measured against, and a fine choice for short contexts.
// Reads keys in place from the shared store; owns nothing.
#include <omp.h>

#include "index/backends.h"
#include "index/topk_collector.h"

namespace topkv {

namespace {

class FlatIndex final : public KvIndex {
 public:
  FlatIndex(const Params& p, const BuildOptions& opt) : KvIndex("flat", p, opt) {}

 protected:
  double bytes_per_key_estimate(int) const override { return 0.0; }
  void build_impl(int64_t) override {}
  void add_impl(int64_t, int64_t) override {}
  void save_impl(BinaryWriter&, IndexArrayWriter&) const override {}
  void load_impl(BinaryReader&, IndexArrayReader&) override {}
  MemoryReport memory_impl() const override { return {0, 0, 0, "reads keys in place from the store"}; }

  void search_impl(const float* q, int nq, const SearchParams& p, Candidates& out) const override {
    const int64_t n = indexed_, block = 4096;
    const int64_t n_blocks = (n + block - 1) / block;
    const int threads = std::max(1, std::min<int>(p.n_threads, (int)n_blocks));
    const int d = keys_->dim();
    const int64_t k = std::min(p.k, n);
    std::vector<std::vector<TopKCollector>> local((size_t)threads, std::vector<TopKCollector>((size_t)nq));
#pragma omp parallel num_threads(threads)
    {
      auto& tops = local[(size_t)omp_get_thread_num()];
      for (auto& t : tops) t.reset(k);
      std::vector<float> s((size_t)block * nq);
#pragma omp for schedule(dynamic, 4)
      for (int64_t b = 0; b < n_blocks; ++b) {
        int64_t lo = b * block, hi = std::min(n, lo + block);
        keys_->for_each_span(lo, hi, [&](int64_t first, int64_t cnt, const void* rows) {
          dot_rows_multi(keys_->dtype(), rows, (size_t)cnt, (size_t)d, q, (size_t)nq, s.data());
          for (int64_t i = 0; i < cnt; ++i)
            for (int g = 0; g < nq; ++g) tops[(size_t)g].push(s[(size_t)i * nq + g], first + i);
        });
      }
    }
    for (int g = 0; g < nq; ++g) {
      TopKCollector all(k);
      for (auto& t : local) all.merge(t[(size_t)g]);
      for (auto& e : all.take_sorted()) out.ids.push_back(e.second);
    }
    out.stats.keys_scored = n * nq;
  }
};

}  // namespace

std::unique_ptr<KvIndex> make_flat_index(const Params& params, const BuildOptions& opt) {
  return std::make_unique<FlatIndex>(params, opt);
}

}  // namespace topkv
