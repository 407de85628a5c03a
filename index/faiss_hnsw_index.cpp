// faiss-hnsw: Faiss 1.7.3 IndexHNSWFlat with METRIC_INNER_PRODUCT. Faiss keeps
// an fp32 copy of every key in its flat storage (reported in memory()).
//
// Build and appends go through IndexHNSW::add (OpenMP, limited to the
// BuildOptions' threads); searches go through faiss_hnsw_search()
// (index/faiss_search.h), which runs Faiss's HNSW search on the calling thread
// with the call's ef: IndexHNSW::search both costs O(ntotal) per query and, in
// 1.7.3, ignores a per-call efSearch (see that header).
#include <faiss/IndexFlat.h>
#include <faiss/IndexHNSW.h>

#include "index/ann_util.h"
#include "index/backends.h"
#include "index/faiss_search.h"
#include "src/common/progress.h"

namespace topkv {

namespace {

class FaissHnswIndex final : public KvIndex {
 public:
  FaissHnswIndex(const Params& p, const BuildOptions& opt) : KvIndex("faiss-hnsw", p, opt) {
    m_ = p.get_int("M", 16);
    efc_ = p.get_int("efc", 200);
    TOPKV_CHECK(m_ >= 2 && m_ <= 2048, "faiss-hnsw: M={} is out of range: use 2..2048 (16-48 is typical)", m_);
    TOPKV_CHECK(efc_ >= 1 && efc_ <= 1 << 20,
                "faiss-hnsw: efc={} is out of range: use 1..1048576 (40-400 is typical)", efc_);
  }

 protected:
  void build_impl(int64_t n) override {
    index_.reset();
    if (n == 0) return;
    index_ = std::make_unique<faiss::IndexHNSWFlat>(dim(), (int)m_, faiss::METRIC_INNER_PRODUCT);
    index_->hnsw.efConstruction = (int)efc_;
    index_->hnsw.rng = faiss::RandomGenerator((int64_t)opt_.seed);
    add_rows(0, n);
  }

  void add_impl(int64_t from, int64_t to) override { add_rows(from, to); }

  void search_impl(const float* q, int nq, const SearchParams& p, Candidates& out) const override {
    const int64_t n = index_->ntotal;
    if (p.k >= n) return take_all_rows(n, out);
    const int k = (int)p.k;
    const int64_t ef_asked = p.ef > 0 ? p.ef : std::max<int64_t>(p.k, 64);
    const int ef = (int)std::max<int64_t>(k, std::min(ef_asked, n));  // ef >= n already visits every reachable key
    FaissSearchCounts counts;
    std::vector<int64_t> ids;
    std::vector<float> scores;
    for (int g = 0; g < nq; ++g) {
      faiss_hnsw_search(*index_, q + (size_t)g * dim(), k, ef, ids, scores, counts);
      out.ids.insert(out.ids.end(), ids.begin(), ids.end());
    }
    out.stats.keys_scored = counts.keys_scored;
  }

  // fp32 key + 2M level-0 neighbours + M per upper level (1/(M-1) levels expected) + offset + level.
  double bytes_per_key_estimate(int dim) const override {
    return dim * 4.0 + (2.0 * m_ + (double)m_ / (m_ - 1)) * 4.0 + 8.0 + 4.0;
  }
  MemoryReport memory_impl() const override {
    MemoryReport m;
    m.note = "Faiss keeps its own fp32 copy of every key in the flat storage under the graph";
    if (!index_) return m;
    const auto& h = index_->hnsw;
    const auto* storage = static_cast<const faiss::IndexFlatCodes*>(index_->storage);
    m.key_copy_bytes = storage->codes.capacity();
    m.structure_bytes = h.neighbors.capacity() * sizeof(faiss::HNSW::storage_idx_t) +
                        h.offsets.capacity() * sizeof(size_t) + h.levels.capacity() * sizeof(int) +
                        (h.assign_probas.capacity() + h.cum_nneighbor_per_level.capacity()) * 8;
    return m;
  }

  void save_impl(BinaryWriter& w, IndexArrayWriter&) const override { save_faiss_or_none(w, index_.get()); }

  void load_impl(BinaryReader& r, IndexArrayReader&) override {
    index_.reset();  // a throw below leaves no stale index behind
    index_ = load_faiss_or_none<faiss::IndexHNSWFlat>(r, dim(), indexed_, "faiss-hnsw", "IndexHNSWFlat",
                                                      [](const faiss::IndexHNSWFlat&) { return true; });
  }

 private:
  // IndexHNSW::add over rows [from, to), in blocks so the fp32 staging buffer
  // stays small; Faiss copies each block into its storage.
  void add_rows(int64_t from, int64_t to) {
    faiss_add_rows(*index_, keys(), from, to, n_threads(), opt_.progress, "faiss-hnsw");
  }

  int64_t m_, efc_;
  std::unique_ptr<faiss::IndexHNSWFlat> index_;
};

}  // namespace

std::unique_ptr<KvIndex> make_faiss_hnsw_index(const Params& params, const BuildOptions& opt) {
  return std::make_unique<FaissHnswIndex>(params, opt);
}

}  // namespace topkv
