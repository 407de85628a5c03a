// faiss-ivf: Faiss 1.7.3 inverted file over inner product. A flat coarse
// quantizer (IndexFlatIP) holds nlist centroids from k-means over (a sample of)
// the keys; each key is stored in the list of its best centroid, either as
// fp32 (codec=flat: IndexIVFFlat) or fp16 (codec=fp16: IndexIVFScalarQuantizer
// QT_fp16, no residual). The lists are Faiss's own copy of the keys (reported
// in memory()); the base class rescoring from the store makes the returned
// scores exact for either codec.
//
// Searches go through faiss_ivf_search() (index/faiss_search.h): the call's
// nprobe (clipped to nlist), coarse assignment and list scan on the calling
// thread, no OpenMP region. Appends go to the lists of their nearest centroid
// without retraining, so an index built on very few keys keeps its few lists.
#include <faiss/IndexFlat.h>
#include <faiss/IndexIVFFlat.h>
#include <faiss/IndexScalarQuantizer.h>
#include <faiss/invlists/InvertedLists.h>

#include <cmath>
#include <random>

#include "index/ann_util.h"
#include "index/backends.h"
#include "index/faiss_search.h"
#include "src/common/progress.h"

namespace topkv {

namespace {

// Faiss warns below this many training points per centroid (and k-means
// centroids get noisy), so the automatic nlist never goes under it.
constexpr int64_t kMinPointsPerList = 39;

class FaissIvfIndex final : public KvIndex {
 public:
  FaissIvfIndex(const Params& p, const BuildOptions& opt) : KvIndex("faiss-ivf", p, opt) {
    nlist_ = p.get_int("nlist", 0);
    nprobe_ = p.get_int("nprobe", 32);
    max_train_ = p.get_int("max_train", 0);
    codec_ = p.get_str("codec", "flat");
    TOPKV_CHECK(nlist_ >= 0 && nlist_ <= (1 << 24), "faiss-ivf: nlist={} is out of range: use 0 (auto) or 1..{}",
                nlist_, 1 << 24);
    TOPKV_CHECK(nprobe_ >= 1, "faiss-ivf: nprobe={} must be at least 1", nprobe_);
    TOPKV_CHECK(max_train_ >= 0, "faiss-ivf: max_train={} must be 0 (auto) or a number of keys", max_train_);
    TOPKV_CHECK(codec_ == "flat" || codec_ == "fp16", "faiss-ivf: codec='{}' is unknown: use flat or fp16", codec_);
  }

  // The nlist a build over n keys uses: the nlist parameter clipped to n
  // (k-means cannot make more centroids than points), or by default 4·sqrt(n)
  // kept to at least 39 keys per list.
  static int64_t effective_nlist(int64_t asked, int64_t n) {
    if (asked > 0) return std::min(asked, n);
    int64_t auto_nlist = (int64_t)std::llround(4.0 * std::sqrt((double)n));
    return std::clamp<int64_t>(std::min(auto_nlist, n / kMinPointsPerList), 1, n);
  }

 protected:
  void build_impl(int64_t n) override {
    index_.reset();
    if (n == 0) return;
    const int64_t nlist = effective_nlist(nlist_, n);
    auto* coarse = new faiss::IndexFlatIP(dim());
    std::unique_ptr<faiss::IndexIVF> ivf;
    if (codec_ == "flat")
      ivf = std::make_unique<faiss::IndexIVFFlat>(coarse, dim(), (size_t)nlist, faiss::METRIC_INNER_PRODUCT);
    else
      ivf = std::make_unique<faiss::IndexIVFScalarQuantizer>(coarse, dim(), (size_t)nlist,
                                                             faiss::ScalarQuantizer::QT_fp16,
                                                             faiss::METRIC_INNER_PRODUCT, false);
    ivf->own_fields = true;
    ivf->cp.seed = (int)opt_.seed;
    ivf->cp.min_points_per_centroid = 1;  // an explicit nlist near n is the user's choice: no stderr warning
    ivf->cp.max_points_per_centroid = 1 << 30;  // we sample (max_train) ourselves

    // k-means over a uniform sample of the keys (all of them when n is small).
    const int64_t max_train = max_train_ > 0 ? max_train_ : 256 * nlist;
    const int64_t n_train = std::max(nlist, std::min(n, max_train));
    ScopedOmpThreads threads(omp_threads_for(n_train, n_threads()));
    std::vector<float> train((size_t)n_train * dim());
    if (n_train == n) {
      copy_rows_f32(keys(), 0, n, train.data());
    } else {
      std::vector<int64_t> rows((size_t)n);
      for (int64_t i = 0; i < n; ++i) rows[(size_t)i] = i;
      std::mt19937_64 rng(opt_.seed);
      for (int64_t i = 0; i < n_train; ++i)  // partial Fisher-Yates: the first n_train are the sample
        std::swap(rows[(size_t)i], rows[(size_t)(i + (int64_t)(rng() % (uint64_t)(n - i)))]);
      for (int64_t i = 0; i < n_train; ++i) keys().row_f32(rows[(size_t)i], train.data() + (size_t)i * dim());
    }
    faiss_guard("faiss-ivf: training the coarse quantizer", [&] { ivf->train(n_train, train.data()); });
    train = {};
    index_ = std::move(ivf);
    add_rows(0, n);
  }

  void add_impl(int64_t from, int64_t to) override { add_rows(from, to); }

  void search_impl(const float* q, int nq, const SearchParams& p, Candidates& out) const override {
    if (p.k >= index_->ntotal) return take_all_rows(index_->ntotal, out);
    const int k = (int)p.k;
    const int nprobe = (int)std::min<int64_t>(p.nprobe > 0 ? p.nprobe : nprobe_, (int64_t)index_->nlist);
    std::vector<int64_t> labels((size_t)nq * k);
    std::vector<float> scores((size_t)nq * k);
    FaissSearchCounts counts;
    faiss_ivf_search(*index_, q, nq, k, nprobe, labels.data(), scores.data(), counts);
    for (int64_t id : labels)
      if (id >= 0) out.ids.push_back(id);
    out.stats.keys_scored = counts.keys_scored;
    out.stats.summaries_scored = counts.summaries_scored;
  }

  // Codes (fp32 or fp16 per element) + an 8-byte id per key; centroids are negligible.
  double bytes_per_key_estimate(int dim) const override { return dim * (codec_ == "flat" ? 4.0 : 2.0) + 8.0; }
  MemoryReport memory_impl() const override {
    MemoryReport m;
    m.note = codec_ == "flat" ? "Faiss keeps its own fp32 copy of every key in the inverted lists"
                              : "Faiss keeps its own fp16 copy of every key in the inverted lists";
    if (!index_) return m;
    auto* lists = dynamic_cast<const faiss::ArrayInvertedLists*>(index_->invlists);
    auto* coarse = static_cast<const faiss::IndexFlatCodes*>(index_->quantizer);
    m.structure_bytes = coarse->codes.capacity();  // the centroids
    if (lists) {
      for (size_t l = 0; l < lists->nlist; ++l) {
        m.key_copy_bytes += lists->codes[l].capacity();
        m.structure_bytes += lists->ids[l].capacity() * sizeof(faiss::Index::idx_t);
      }
      m.structure_bytes += lists->nlist * 2 * sizeof(std::vector<uint8_t>);
    }
    return m;
  }

  void save_impl(BinaryWriter& w, IndexArrayWriter&) const override { save_faiss_or_none(w, index_.get()); }

  void load_impl(BinaryReader& r, IndexArrayReader&) override {
    index_.reset();  // a throw below leaves no stale index behind
    index_ = load_faiss_or_none<faiss::IndexIVF>(
        r, dim(), indexed_, "faiss-ivf", "IndexIVF with codec=" + codec_, [&](const faiss::IndexIVF& ivf) {
          const bool codec_ok = codec_ == "flat" ? dynamic_cast<const faiss::IndexIVFFlat*>(&ivf) != nullptr
                                                 : dynamic_cast<const faiss::IndexIVFScalarQuantizer*>(&ivf) != nullptr;
          return codec_ok && dynamic_cast<const faiss::IndexFlat*>(ivf.quantizer) &&
                 dynamic_cast<const faiss::ArrayInvertedLists*>(ivf.invlists);
        });
  }

 private:
  // IndexIVF::add over rows [from, to): Faiss numbers vectors in add order, so
  // its ids are our row ids.
  void add_rows(int64_t from, int64_t to) {
    faiss_add_rows(*index_, keys(), from, to, n_threads(), opt_.progress, "faiss-ivf");
  }

  int64_t nlist_, nprobe_, max_train_;
  std::string codec_;
  std::unique_ptr<faiss::IndexIVF> index_;
};

}  // namespace

std::unique_ptr<KvIndex> make_faiss_ivf_index(const Params& params, const BuildOptions& opt) {
  return std::make_unique<FaissIvfIndex>(params, opt);
}

}  // namespace topkv
