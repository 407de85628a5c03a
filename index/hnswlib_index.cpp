// hnswlib: hnswlib 0.6.2's HierarchicalNSW (Malkov & Yashunin, HNSW) over
// hnswlib's inner-product space, distance = 1 - q·k. hnswlib keeps its own
// fp32 copy of every key next to its level-0 links, so this backend owns a
// second copy of the keys (reported in memory()).
//
// Differences from calling hnswlib the usual way, and why:
// - ef per call. HierarchicalNSW::setEf() sets a member that every searchKnn()
//   reads, so two concurrent searches with different ef would race. We run
//   searchKnn's own steps (greedy descent over the upper levels, then the
//   const searchBaseLayerST) with the call's ef instead.
// - Distance count. hnswlib's metric_distance_computations is one atomic
//   shared by all searches; a thin space wrapper counts evaluations per thread
//   so each call reports its own keys_scored.
// - Build in parallel with oneTBB, as hnswlib's Python bindings do (first point
//   alone, the rest concurrently; addPoint locks per element). addPoint draws
//   each level from a generator shared without a lock, exactly as in those
//   bindings: levels stay geometric, the build is not reproducible.
// - Appends: resizeIndex() grows the capacity by 1.5x when rows are folded in;
//   KvIndex's reader/writer lock keeps addPoint away from searches.
// - Save/load embed the graph in hnswlib's own layout (below); graphs also
//   move to and from hnswlib's own files (index/hnswlib_index.h).
//
// hnswlib 0.6.2's headers define non-inline functions, so this must stay the
// only translation unit of the program that includes them.
//
// HNSW under inner product is weak when queries are not distributed like the
// keys (attention queries are not): "1 - q·k" is no metric, the neighbour
// heuristic prunes links unevenly, and some keys end up with no in-links at
// level 0, unreachable at any ef. Measured with M=16, efc=100 on 3000
// clustered keys with a shared mean (tests/test_index_ann.cpp data): 911 keys
// had no in-link and ~6% of the true top-10 were unreachable. This backend is
// the faithful hnswlib baseline for that comparison, not a fix.

#include "index/ann_util.h"
#include "index/backends.h"
#include <hnswlib/hnswlib.h>

#include <cstring>

#include "index/hnswlib_index.h"
#include "src/common/progress.h"
#include "src/common/task_group.h"

namespace topkv {

namespace {

// ---- hnswlib 0.6.2's graph layout over any byte sink / source ----------------
//
// saveIndex() writes only to a path; these write the same bytes to any sink
// and read them back from any source, so a topkv index file embeds the graph.
// tests/test_index_ann.cpp checks the bytes against saveIndex() (through
// export_hnswlib_graph) and loading against loadIndex() (import_hnswlib_graph).
//
// Layout (all little-endian PODs, hnswlib's member types):
//   offsetLevel0_, max_elements_, cur_element_count, size_data_per_element_,
//   label_offset_, offsetData_ (size_t), maxlevel_ (int), enterpoint_node_
//   (uint32), maxM_, maxM0_, M_ (size_t), mult_ (double), ef_construction_
//   (size_t); then cur_element_count level-0 records of size_data_per_element_
//   bytes (links, vector, label); then per element a uint32 byte count of its
//   upper-level links followed by those bytes.

// sink(const void* p, size_t n) receives the bytes in order.
template <typename Sink>
void write_hnswlib(const hnswlib::HierarchicalNSW<float>& h, Sink&& sink) {
  auto pod = [&](const auto& v) { sink(&v, sizeof(v)); };
  pod(h.offsetLevel0_);
  pod(h.max_elements_);
  pod(h.cur_element_count);
  pod(h.size_data_per_element_);
  pod(h.label_offset_);
  pod(h.offsetData_);
  pod(h.maxlevel_);
  pod(h.enterpoint_node_);
  pod(h.maxM_);
  pod(h.maxM0_);
  pod(h.M_);
  pod(h.mult_);
  pod(h.ef_construction_);
  sink(h.data_level0_memory_, h.cur_element_count * h.size_data_per_element_);
  for (size_t i = 0; i < h.cur_element_count; ++i) {
    int level = h.element_levels_[i];
    unsigned int bytes = level > 0 ? (unsigned int)(h.size_links_per_element_ * (size_t)level) : 0u;
    pod(bytes);
    if (bytes) sink(h.linkLists_[i], bytes);
  }
}

// source(void* p, size_t n) fills exactly n bytes or throws. Builds a graph over
// `space` (whose dimension must match the file's) with room for at least
// `capacity` elements. Every count and link is validated, so a file of another
// dimension or degree is an Error rather than an out-of-bounds read.
template <typename Source>
std::unique_ptr<hnswlib::HierarchicalNSW<float>> read_hnswlib(hnswlib::SpaceInterface<float>* space,
                                                               Source&& source, size_t capacity,
                                                               size_t random_seed = 100) {
  auto pod = [&](auto& v) { source(&v, sizeof(v)); };
  size_t offset_level0, max_elements, count, size_data, label_offset, offset_data, max_m, max_m0, m, efc;
  int max_level;
  hnswlib::tableint entry;
  double mult;
  pod(offset_level0);
  pod(max_elements);
  pod(count);
  pod(size_data);
  pod(label_offset);
  pod(offset_data);
  pod(max_level);
  pod(entry);
  pod(max_m);
  pod(max_m0);
  pod(m);
  pod(mult);
  pod(efc);
  TOPKV_CHECK(m >= 2 && m <= 10000 && max_m == m && max_m0 == 2 * m,
              "hnswlib graph: degree M={} (maxM={}, maxM0={}) is not one hnswlib 0.6.2 builds", m, max_m, max_m0);
  TOPKV_CHECK(count <= (size_t)UINT32_MAX, "hnswlib graph: {} elements is more than hnswlib can hold", count);

  auto h = std::make_unique<hnswlib::HierarchicalNSW<float>>(space, std::max<size_t>({capacity, count, 1}), m,
                                                              efc, random_seed);
  TOPKV_CHECK(h->offsetLevel0_ == offset_level0 && h->size_data_per_element_ == size_data &&
                  h->label_offset_ == label_offset && h->offsetData_ == offset_data,
              "hnswlib graph: element layout ({} bytes per element) does not match keys of {} bytes "
              "(built for another head dimension?)",
              size_data, space->get_data_size());
  TOPKV_CHECK(count == 0 ? max_level == -1 : (max_level >= 0 && max_level < 64 && entry < count),
              "hnswlib graph: entry point {} / top level {} is invalid for {} elements", entry, max_level, count);
  h->cur_element_count = count;
  h->maxlevel_ = max_level;
  h->enterpoint_node_ = entry;
  h->ef_construction_ = efc;
  h->mult_ = mult;
  h->revSize_ = 1.0 / mult;
  source(h->data_level0_memory_, count * size_data);

  auto check_links = [&](const hnswlib::linklistsizeint* ll, size_t max_links, size_t i) {
    size_t n = h->getListCount(const_cast<hnswlib::linklistsizeint*>(ll));
    TOPKV_CHECK(n <= max_links, "hnswlib graph: element {} has {} links, more than {}", i, n, max_links);
    const hnswlib::tableint* ids = reinterpret_cast<const hnswlib::tableint*>(ll + 1);
    for (size_t j = 0; j < n; ++j)
      TOPKV_CHECK(ids[j] < count, "hnswlib graph: element {} links to {} of {}", i, ids[j], count);
  };
  for (size_t i = 0; i < count; ++i) {
    check_links(h->get_linklist0((hnswlib::tableint)i), max_m0, i);
    h->label_lookup_[h->getExternalLabel((hnswlib::tableint)i)] = (hnswlib::tableint)i;
    unsigned int bytes;
    pod(bytes);
    TOPKV_CHECK(bytes % h->size_links_per_element_ == 0 &&
                    bytes / h->size_links_per_element_ <= (size_t)std::max(max_level, 0),
                "hnswlib graph: element {} has {} bytes of upper links, not a whole number of levels <= {}", i,
                bytes, max_level);
    int level = (int)(bytes / h->size_links_per_element_);
    h->element_levels_[i] = level;
    h->linkLists_[i] = nullptr;
    if (level > 0) {
      h->linkLists_[i] = (char*)malloc(bytes);
      if (!h->linkLists_[i]) throw std::bad_alloc();
      source(h->linkLists_[i], bytes);
      for (int l = 1; l <= level; ++l) check_links(h->get_linklist((hnswlib::tableint)i, l), max_m, i);
    }
    if (h->isMarkedDeleted((hnswlib::tableint)i)) h->num_deleted_ += 1;
  }
  if (count > 0)
    TOPKV_CHECK(h->element_levels_[entry] == max_level, "hnswlib graph: entry point {} is on level {}, not the top {}",
                entry, h->element_levels_[entry], max_level);
  return h;
}

// ---- the backend --------------------------------------------------------------

thread_local int64_t tl_distances = 0;

// hnswlib::InnerProductSpace with a per-thread count of distance evaluations.
class CountingIpSpace final : public hnswlib::SpaceInterface<float> {
 public:
  explicit CountingIpSpace(size_t dim) : ip_(dim) {
    param_.dist = ip_.get_dist_func();
    param_.param = ip_.get_dist_func_param();
  }
  size_t get_data_size() override { return ip_.get_data_size(); }
  hnswlib::DISTFUNC<float> get_dist_func() override { return &counted; }
  void* get_dist_func_param() override { return &param_; }

 private:
  struct Param {
    hnswlib::DISTFUNC<float> dist;
    void* param;
  };
  static float counted(const void* a, const void* b, const void* p) {
    ++tl_distances;
    auto* P = static_cast<const Param*>(p);
    return P->dist(a, b, P->param);
  }
  hnswlib::InnerProductSpace ip_;
  Param param_;
};

using Graph = hnswlib::HierarchicalNSW<float>;

// hnswlib reports failures (out of memory, corrupted links) as
// std::runtime_error; say which step failed.
template <typename F>
decltype(auto) guarded(const char* what, F&& f) {
  try {
    return f();
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail("hnswlib: {} failed: {}", what, e.what());
  }
}

class HnswlibIndex final : public KvIndex {
 public:
  HnswlibIndex(const Params& p, const BuildOptions& opt) : KvIndex("hnswlib", p, opt) {
    m_ = p.get_int("M", 16);
    efc_ = p.get_int("efc", 200);
    TOPKV_CHECK(m_ >= 2 && m_ <= 2048, "hnswlib: M={} is out of range: use 2..2048 (16-48 is typical)", m_);
    TOPKV_CHECK(efc_ >= 1 && efc_ <= 1 << 20, "hnswlib: efc={} is out of range: use 1..1048576 (100-400 is typical)",
                efc_);
  }

  // import_hnswlib_graph: a graph from hnswlib's loadIndex() over `keys`.
  void attach_native(std::shared_ptr<const RowStore> keys, const std::string& path) {
    std::unique_lock lk(mu_);
    keys_ = std::move(keys);
    space_ = std::make_unique<CountingIpSpace>((size_t)dim());
    graph_ = guarded("loading an hnswlib file", [&] {
      return std::make_unique<Graph>(space_.get(), path, false, (size_t)keys_->size());
    });
    const Graph& g = *graph_;
    TOPKV_CHECK(g.offsetData_ == g.size_links_level0_ && g.label_offset_ == g.offsetData_ + (size_t)dim() * 4 &&
                    g.size_data_per_element_ == g.label_offset_ + sizeof(hnswlib::labeltype),
                "hnswlib file '{}' holds vectors of another size than the store's {} fp32 values", path, dim());
    // loadIndex() counts deletion marks onto an uninitialised counter; recount.
    graph_->num_deleted_ = 0;
    for (size_t i = 0; i < g.cur_element_count; ++i)
      TOPKV_CHECK(!g.isMarkedDeleted((hnswlib::tableint)i),
                  "hnswlib file '{}' has deleted elements (topkv indexes never delete): rebuild it", path);
    TOPKV_CHECK(graph_->M_ == (size_t)m_, "hnswlib file '{}' has M={}, the index was created with M={}", path,
                graph_->M_, m_);
    indexed_ = (int64_t)graph_->cur_element_count;
    TOPKV_CHECK(indexed_ <= keys_->size(), "hnswlib file '{}' holds {} vectors, the store only {} rows", path,
                indexed_, keys_->size());
    check_labels(path);
  }

  void export_native(const std::string& path) const {
    std::shared_lock lk(mu_);
    TOPKV_CHECK(graph_, "the hnswlib index has no graph to export (it holds no keys)");
    // saveIndex is not declared const in 0.6.2 but only reads the graph.
    guarded("writing an hnswlib file", [&] { const_cast<Graph&>(*graph_).saveIndex(path); });
  }

 protected:
  void build_impl(int64_t n) override {
    graph_.reset();
    space_.reset();
    if (n == 0) return;
    space_ = std::make_unique<CountingIpSpace>((size_t)dim());
    graph_ = guarded("building the graph", [&] {
      return std::make_unique<Graph>(space_.get(), (size_t)n, (size_t)m_, (size_t)efc_, (size_t)opt_.seed);
    });
    add_rows(0, n);
  }

  void add_impl(int64_t from, int64_t to) override {
    if ((size_t)to > graph_->max_elements_) {
      size_t grown = std::max<size_t>((size_t)to, graph_->max_elements_ + graph_->max_elements_ / 2);
      guarded("growing the graph", [&] { graph_->resizeIndex(grown); });
    }
    add_rows(from, to);
  }

  void search_impl(const float* q, int nq, const SearchParams& p, Candidates& out) const override {
    const size_t n = graph_->cur_element_count;
    if (p.k >= (int64_t)n) return take_all_rows((int64_t)n, out);
    const size_t k = (size_t)p.k;
    const int64_t ef_asked = p.ef > 0 ? p.ef : std::max<int64_t>(p.k, 64);
    const size_t ef = std::max(k, (size_t)std::min<int64_t>(ef_asked, (int64_t)n));
    const int64_t counted_before = tl_distances;
    for (int g = 0; g < nq; ++g) search_one(q + (size_t)g * dim(), k, ef, out.ids);
    out.stats.keys_scored = tl_distances - counted_before;
  }

  // fp32 key + level-0 links (2M + count) + label + upper-level links + per-element tables and lock.
  double bytes_per_key_estimate(int dim) const override {
    return dim * 4.0 + (2.0 * m_ + 1) * 4.0 + 8.0 + (m_ + 1.0) * 4.0 / (m_ - 1) + sizeof(void*) + sizeof(int) + 40.0;
  }
  MemoryReport memory_impl() const override {
    MemoryReport m;
    m.note = "hnswlib keeps its own fp32 copy of every key beside its level-0 links";
    if (!graph_) return m;
    const Graph& g = *graph_;
    const size_t cap = g.max_elements_;
    m.key_copy_bytes = cap * g.data_size_;
    size_t upper = 0;
    for (size_t i = 0; i < g.cur_element_count; ++i)
      upper += (size_t)std::max(g.element_levels_[i], 0) * g.size_links_per_element_;
    m.structure_bytes = cap * (g.size_data_per_element_ - g.data_size_)  // level-0 links + labels
                        + upper                                           // links of levels >= 1
                        + cap * (sizeof(void*) + sizeof(int) + sizeof(std::mutex))  // per-element tables, locks
                        + g.link_list_update_locks_.size() * sizeof(std::mutex)
                        + g.label_lookup_.size() * 32 + g.label_lookup_.bucket_count() * sizeof(void*)
                        + cap * sizeof(hnswlib::vl_type);  // a visited list (one per concurrent search)
    return m;
  }

  void save_impl(BinaryWriter& w, IndexArrayWriter&) const override {
    w.pod<uint8_t>(graph_ ? 1 : 0);
    if (graph_) write_hnswlib(*graph_, [&](const void* p, size_t n) { w.bytes(p, n); });
  }

  void load_impl(BinaryReader& r, IndexArrayReader&) override {
    graph_.reset();
    space_.reset();
    uint8_t has_graph = r.pod<uint8_t>();
    TOPKV_CHECK(has_graph == (indexed_ > 0 ? 1 : 0), "hnswlib index '{}': graph flag {} does not match {} rows",
                r.path(), has_graph, indexed_);
    if (!has_graph) return;
    space_ = std::make_unique<CountingIpSpace>((size_t)dim());
    graph_ = read_hnswlib(space_.get(), [&](void* p, size_t n) { r.bytes(p, n); }, (size_t)indexed_,
                          (size_t)opt_.seed);
    TOPKV_CHECK(graph_->cur_element_count == (size_t)indexed_,
                "hnswlib index '{}' holds {} elements but its header says {} rows", r.path(),
                graph_->cur_element_count, indexed_);
    TOPKV_CHECK(graph_->M_ == (size_t)m_, "hnswlib index '{}': graph degree {} differs from its parameters' M={}",
                r.path(), graph_->M_, m_);
    check_labels(r.path());
  }

 private:
  // Labels are row ids: each of [0, indexed_) exactly once.
  void check_labels(const std::string& path) const {
    TOPKV_CHECK(graph_->label_lookup_.size() == graph_->cur_element_count,
                "hnswlib graph '{}' labels two elements alike", path);
    for (size_t i = 0; i < graph_->cur_element_count; ++i)
      TOPKV_CHECK(graph_->getExternalLabel((hnswlib::tableint)i) < (size_t)indexed_,
                  "hnswlib graph '{}': element {} is labelled with row {}, beyond the {} indexed rows", path, i,
                  graph_->getExternalLabel((hnswlib::tableint)i), indexed_);
  }

  // addPoint for rows [from, to): row i gets label i. The first point of an
  // empty graph goes in alone (it becomes the entry point), the rest in
  // parallel when there are enough of them to be worth it.
  void add_rows(int64_t from, int64_t to) {
    const bool f32 = keys_->dtype() == DType::F32;
    auto add = [&](int64_t i, float* buf) {
      const float* v = static_cast<const float*>(keys_->row(i));
      if (!f32) {
        keys_->row_f32(i, buf);
        v = buf;
      }
      graph_->addPoint(v, (hnswlib::labeltype)i);
    };
    std::vector<float> buf((size_t)dim());
    Progress bar("hnswlib build", to - from, "keys", opt_.progress && to - from >= 10000);
    guarded("adding keys", [&] {
      if (graph_->cur_element_count == 0 && from < to) {
        add(from++, buf.data());
        bar.add(1);
      }
      const int threads = n_threads();
      if (threads == 1 || to - from < 256) {
        for (int64_t i = from; i < to; ++i) add(i, buf.data());
        bar.add(to - from);
        return;
      }
      parallel_for_blocks(from, to, 64, threads, [&](int64_t lo, int64_t hi) {
        std::vector<float> local((size_t)dim());
        for (int64_t i = lo; i < hi; ++i) add(i, local.data());
        bar.add(hi - lo);
      });
    });
    bar.finish();
  }

  // HierarchicalNSW::searchKnn with the call's ef in place of the shared ef_.
  void search_one(const float* q, size_t k, size_t ef, std::vector<int64_t>& ids) const {
    const Graph& g = *graph_;
    hnswlib::tableint cur = g.enterpoint_node_;
    float cur_dist = g.fstdistfunc_(q, g.getDataByInternalId(cur), g.dist_func_param_);
    for (int level = g.maxlevel_; level > 0; --level) {
      for (bool changed = true; changed;) {
        changed = false;
        const unsigned int* ll = g.get_linklist(cur, level);
        const int size = g.getListCount(const_cast<unsigned int*>(ll));
        const hnswlib::tableint* nb = reinterpret_cast<const hnswlib::tableint*>(ll + 1);
        for (int i = 0; i < size; ++i) {
          float d = g.fstdistfunc_(q, g.getDataByInternalId(nb[i]), g.dist_func_param_);
          if (d < cur_dist) {
            cur_dist = d;
            cur = nb[i];
            changed = true;
          }
        }
      }
    }
    auto top = g.searchBaseLayerST<false, false>(cur, q, ef);  // no deletions in topkv
    while (top.size() > k) top.pop();
    for (; !top.empty(); top.pop()) ids.push_back((int64_t)g.getExternalLabel(top.top().second));
  }

  int64_t m_, efc_;
  std::unique_ptr<CountingIpSpace> space_;
  std::unique_ptr<Graph> graph_;
};

}  // namespace

std::unique_ptr<KvIndex> make_hnswlib_index(const Params& params, const BuildOptions& opt) {
  return std::make_unique<HnswlibIndex>(params, opt);
}

void export_hnswlib_graph(const KvIndex& index, const std::string& path) {
  auto* h = dynamic_cast<const HnswlibIndex*>(&index);
  TOPKV_CHECK(h, "only an 'hnswlib' index can be exported as an hnswlib graph (this one is '{}')", index.name());
  h->export_native(path);
}

std::unique_ptr<KvIndex> import_hnswlib_graph(const std::string& path, std::shared_ptr<const RowStore> keys,
                                              const std::string& params, const BuildOptions& opt) {
  TOPKV_CHECK(keys, "importing an hnswlib graph needs the key store it was built on");
  auto idx = std::make_unique<HnswlibIndex>(Params(params), opt);
  idx->attach_native(std::move(keys), path);
  return idx;
}

}  // namespace topkv
