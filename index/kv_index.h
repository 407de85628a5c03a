// KvIndex: the one interface every per-(layer, KV head) key index implements.
//
// An index is built over a shared RowStore of keys (and, for backends that
// summarise values, of values). It never owns the store; backends that can
// read keys in place do so (flat, quest, centroid, multipole), those whose
// library keeps its own copy (hnswlib, Faiss) say so in memory().
//
// Search takes the G query vectors of the KV head's query heads (GQA, G >= 1)
// and returns the union of the ids each needs, with the exact inner product of
// every returned key with every query (scores are raw q·k: the caller applies
// the attention scale). Multipole-style backends also return the clusters they
// did not select, with q·centroid, so the decode step can add them as an
// approximate part of the log-sum-exp merge (DESIGN.md, "Multipole").
//
// Rows appended to the store after build() are found even before
// add_new_rows() folds them into the structure: search scans that tail
// exactly. add_new_rows() and search() on the same index are serialised by a
// reader/writer lock (hnswlib's addPoint is not safe beside searchKnn), so a
// runtime may fold rows in from another thread at any time.
#pragma once
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "index/index_arrays.h"
#include "index/row_store.h"
#include "src/common/binary_io.h"
#include "src/common/options.h"
#include "src/common/rw_lock.h"
#include "src/common/table_codes.h"

namespace topkv {

// How the G query heads of one KV head are served.
enum class GqaMode : uint8_t {
  Union = 0,  // each query head searches with budget k; the result is the union
  Mean = 1,   // one search with the mean query; scores still exact per head
};

struct SearchParams {
  int64_t k = 64;          // ids per query head (top-k backends) or token budget (quest, centroid)
  int ef = 0;              // HNSW search list size; 0 = max(k, 64)
  int nprobe = 0;          // IVF lists probed; 0 = backend default
  double threshold = 0.0;  // centroid/multipole: keep clusters whose estimated share >= threshold
                           // (0 = budget mode: keep best clusters until k tokens)
  double rerank = 0.0;     // centroid/multipole, budget mode: R > 1 selects clusters until R*k tokens,
                           // then each head's k best of their rows by exact q.k; 1 = off; 0 = the
                           // index's own (its spec's rerank=), so one built index serves both
  GqaMode gqa = GqaMode::Union;
  int n_threads = 1;       // threads this one call may use
  double scale = 0.0;      // attention score scale for softmax-share estimates (centroid threshold
                           // mode); 0 = 1/sqrt(dim). Scores returned are always raw q·k.
};

struct SearchStats {
  int64_t keys_scored = 0;       // key rows dotted with a query while searching, summed over queries
  int64_t summaries_scored = 0;  // centroids / page bounds / coarse nodes evaluated, summed over queries
  int64_t tail_scanned = 0;      // rows past indexed_rows() scanned exactly
};

// Two-level searches: the tokens a query head's coarse cut covers at budget
// k, expand * k (the one formula of the host search, the tables and the device).
inline int64_t expanded_budget(double expand, int64_t k) { return (int64_t)std::min(expand * (double)k, 4.0e18); }

// Per-cluster summaries kept by centroid-type backends (Squeezed Attention's
// centroids; Multipole Attention's far-field terms). Rows [0, n_fine) are the
// clusters of keys; a hierarchical index (levels=2) appends its coarse
// clusters after them, each summarising the union of its fine clusters, so a
// far cluster may be either kind and is used the same way.
// The arrays are owned, or in place in a context pack (index/host_array.h).
struct ClusterSummaries {
  int dim = 0, value_dim = 0;
  int64_t n_fine = 0;                 // rows that are clusters of keys (the rest are coarse)
  HostArray<int64_t> counts;          // N_j: keys in cluster j
  HostArray<float> key_centroids;     // [n_clusters][dim]: mean of the raw keys of cluster j
  HostArray<float> value_means;       // [n_clusters][value_dim]: mean value (multipole only)
  int64_t size() const { return (int64_t)counts.size(); }
};

// A budget-mode search as flat tables, for a search that runs elsewhere (the
// GPU's, gpu/device_search_tables.h): each group of keys (a cluster, a Quest page)
// has one summary row that scores it against a query, and the rows it holds.
// Groups are taken by score, largest first, until the token budget k is
// covered, per query head; every group not taken is a far row when
// value_means is set (Multipole). Only rows [0, covered) are grouped.
struct SummaryTables {
  enum class Kind : uint8_t {
    Centroid,    // score = q . row, row [dim]: the cluster's key centroid
    PageBounds,  // score = sum_i max(q_i M_i, q_i m_i), row [2*dim] = [M | m] (Quest)
  };
  Kind kind = Kind::Centroid;
  int dim = 0;
  int64_t covered = 0;
  int64_t page = 0;                  // PageBounds: group p holds rows [p*page, p*page + counts[p])
  std::vector<float> rows;           // [n][row_len()]
  std::vector<int32_t> counts;       // [n] keys per group
  std::vector<int32_t> offsets;      // Centroid: [n + 1] into members
  std::vector<int32_t> members;      // Centroid: row ids, group by group
  std::vector<float> value_means;    // [n][dim] mean value per group, or empty (no far field)
  // The far rows' spread term (multipole:spread, index/multipole_index.cpp):
  // key_var [n][dim] is each group's per-dimension variance of its keys, or
  // empty (no term); a far group's logit gains far_spread_logit(...) below.
  std::vector<float> key_var;
  double spread = 0.0, spread_clip = 1.0;
  // With a rerank (SearchParams::rerank > 1), the rows of a selected group
  // that no query head keeps are far rows too, each with its exact logit
  // s q.k and the group's mean value (multipole:rerank_far,
  // index/multipole_index.cpp); false: they are dropped.
  bool far_dropped = false;
  // Two levels (PageBounds only; quest:coarse_ratio): coarse group c bounds
  // the fine groups [c*coarse_ratio, (c+1)*coarse_ratio) (coarse_level()).
  // Each query head first takes coarse groups until expand*k tokens; the
  // fine groups of the coarse ones any head took are then scored and cut at
  // k as with one level. 0: one level.
  int64_t coarse_ratio = 0;
  double expand = 0.0;
  int64_t size() const { return (int64_t)counts.size(); }
  int row_len() const { return kind == Kind::PageBounds ? 2 * dim : dim; }
  int32_t max_count() const;
  // The coarse level as tables of its own (one level, page = page *
  // coarse_ratio): rows the element-wise max / min of their fine rows
  // (exact: a coarse bound is at least every fine bound below it), counts
  // the sums.
  SummaryTables coarse_level() const;
  // Pages f times longer (PageBounds only: page * f): each run of f pages
  // bounded by the element-wise max / min of theirs, as coarse_level()
  // bounds its coarse pages, counts the sums. Two levels keep their coarse
  // pages (coarse_ratio / f: f divides it, leaving at least 2). Exactly the
  // tables the same index exports when built with page * f (min and max
  // are exact), at 1/f of the fine rows: what the device holds when the
  // budget cannot hold the index's own pages (DeviceTableChoice::page_factor).
  SummaryTables coarsened(int64_t f) const;
  // Whether pages f times longer keep a two-level index's coarse pages
  // whole: f divides coarse_ratio and leaves at least 2 pages a coarse page
  // (always, for one level: coarse_ratio 0). coarsened() and
  // KvIndex::summary_page_factor_max both ask it.
  static bool longer_pages_tile(int64_t coarse_ratio, int64_t f) {
    return coarse_ratio == 0 || (coarse_ratio % f == 0 && coarse_ratio / f >= 2);
  }
  // rows in table type t, as the device search holds them
  // (--device-table-type; src/common/table_codes.h): page bounds rounded
  // outward, M up and m down, so that a narrower bound still bounds every
  // key of its page (Quest, "Quest: Query-Aware Sparsity for Efficient
  // Long-Context LLM Inference" §3.2, needs an upper bound of q.k; an f8
  // step is 1/16 to 1/8 of a value); centroids to nearest; an element past
  // the type's range is an error, never clipped. i8: with its per-dimension
  // scales (the coarse level's are the fine level's: its bounds are the
  // fine bounds' max and min, so each dimension's largest magnitude is the same).
  TableCodes encoded_rows(DType t) const;
  // Tokens a query head's coarse cut covers at budget k.
  int64_t coarse_budget(int64_t k) const { return expanded_budget(expand, k); }
};

// The spread term of a far group with per-dimension key variance `var`, for
// query q and logit scale s: min(a s^2/2 sum_i q_i^2 var_i, ln clip). For keys
// Gaussian about the centroid C, the mean of exp(s q.k) is exp(s q.C) times
// exp(s^2/2 q^2.var) ("Multipole Attention for Efficient Long Context
// Reasoning" §3.2 keeps only the first factor); a < 1 and the clip temper it
// for real keys' heavier tails. Host search and the device's twin share it.
double far_spread_logit(const float* q, const float* var, int dim, double a, double clip, double s);

struct SearchResult {
  int nq = 0;
  std::vector<int64_t> ids;     // distinct row ids, ascending
  std::vector<float> scores;    // [nq][ids.size()]: exact q_g · key(id)
  // Multipole: clusters not selected (their members are not in `ids`).
  std::vector<int32_t> far_clusters;
  std::vector<float> far_scores;                 // [nq][far_clusters.size()]: q_g · C_j
  const ClusterSummaries* summaries = nullptr;   // valid until the index next changes
  SearchStats stats;
};

struct MemoryReport {
  size_t structure_bytes = 0;   // what the index itself holds: graph, lists, centroids, page bounds
  size_t key_copy_bytes = 0;    // a private copy of the keys the backend's library insists on
  size_t shared_store_bytes = 0;  // keys read in place from the shared store (not owned)
  std::string note;             // e.g. "hnswlib keeps its own copy of every key"
  size_t mapped_bytes = 0;      // structure used in place from a context pack (not in structure_bytes;
                                // pages written since are private copies, counted by the OS only)
  size_t owned() const { return structure_bytes + key_copy_bytes; }
};

class KMeansEngine;      // index/kmeans.h
class PageBoundsEngine;  // index/page_bounds.h

struct BuildOptions {
  int n_threads = 0;      // 0 = all cores
  uint64_t seed = 1234;
  bool progress = false;  // draw a progress bar on stderr
  // The clustering backends' blockwise k-means (centroid, multipole): null
  // runs Faiss's on the host cores; an engine (the GPU's, gpu/gpu_kmeans.h)
  // runs each block's instead. Not saved: an index is the same kind of index
  // whichever engine clustered it.
  std::shared_ptr<const KMeansEngine> kmeans;
  // Quest's page bounds at a build (not a fold of a few rows): null bounds
  // them on the host cores; an engine (the GPU's, gpu/gpu_page_bounds.h)
  // bounds them instead. The same bits either way (index/page_bounds.h).
  std::shared_ptr<const PageBoundsEngine> bounds;
};

class KvIndex {
 public:
  virtual ~KvIndex() = default;

  // Creates an empty index of backend `spec.name` with its build parameters
  // (e.g. "hnswlib:M=32,efc=200"). Unknown names or parameters are an Error.
  static std::unique_ptr<KvIndex> create(const Spec& spec, const BuildOptions& opt = {});
  static std::unique_ptr<KvIndex> create(const std::string& spec, const BuildOptions& opt = {});

  const std::string& name() const { return name_; }
  const Params& params() const { return params_; }
  // Threads this index's builds and appends use (BuildOptions::n_threads; 0 there = every core).
  int build_threads() const { return n_threads(); }
  virtual bool needs_values() const { return false; }
  // true: each query head's candidates are cut to its k best by exact score
  // (flat, HNSW, IVF). false: the backend's own budget decides (quest, centroid).
  virtual bool is_topk() const { return true; }
  // The form export_summaries gives this backend's index (the capability a
  // search elsewhere, e.g. the GPU's, is chosen by), or none: graphs, IVF, flat.
  virtual std::optional<SummaryTables::Kind> summary_kind() const { return std::nullopt; }
  // Whether SearchParams::rerank > 1 changes this backend's search, and the
  // factor its spec sets (what SearchParams::rerank 0 means; 1: none).
  virtual bool reranks() const { return false; }
  // Whether the build clusters blocks of keys with BuildOptions::kmeans (the
  // GPU engine with --build-on gpu|auto, gpu/gpu_kmeans.h).
  virtual bool uses_kmeans() const { return false; }
  // Whether the build bounds pages of keys with BuildOptions::bounds (quest;
  // the GPU engine with --build-on gpu|auto, gpu/gpu_page_bounds.h).
  virtual bool uses_page_bounds() const { return false; }
  virtual double own_rerank() const { return 1.0; }
  // The rerank factor a search with `p` runs: p.rerank, or the spec's own
  // when p.rerank is 0; 1 on a backend that does not rerank.
  double rerank_of(const SearchParams& p) const { return reranks() ? (p.rerank > 0.0 ? p.rerank : own_rerank()) : 1.0; }
  // `spec` split into what is built and how it is searched: a backend that
  // reranks() takes its spec's rerank=R as a search parameter (p.rerank = R),
  // so "multipole" and "multipole:rerank=4" are one build searched two ways.
  // Returns the canonical build spec; the spec is checked as create() does.
  static std::string split_search_params(const std::string& spec, SearchParams& p);
  // Bytes the structure will hold per indexed key of dimension `dim`
  // (structure + any private key copy, not the shared store), from the
  // backend's parameters: what a memory plan needs before any key exists.
  virtual double bytes_per_key_estimate(int dim) const = 0;
  // Bytes per indexed key of the SummaryTables this backend exports, as a
  // device search holds them with table elements of `elem` bytes (group rows,
  // value means; counts, offsets and member ids as int32): what a GPU memory
  // plan counts. 0 for a backend without summary_kind().
  // page_factor: the tables' pages that many times longer (SummaryTables::
  // coarsened), at most summary_page_factor_max().
  virtual double summary_bytes_per_key(int dim, size_t elem, int page_factor) const {
    (void)dim, (void)elem, (void)page_factor;
    return 0.0;
  }
  // How many times longer than its own pages the device may hold this
  // backend's page bounds (SummaryTables::coarsened), a power of two: 1 for
  // a backend whose groups do not merge (clusters) or without summaries.
  virtual int summary_page_factor_max() const { return 1; }
  // Summary groups (clusters, pages) per indexed key of those tables: what a
  // device search's work space scales with (a score per group and query
  // head). 0 for a backend without summary_kind().
  virtual double summary_groups_per_key() const { return 0.0; }

  // Builds over every row currently in `keys`. `values` is required when
  // needs_values(), ignored otherwise.
  void build(std::shared_ptr<const RowStore> keys, std::shared_ptr<const RowStore> values = nullptr);
  // build() while the rows arrive (the index build overlapped with a chunked
  // prefill): begin_build fixes the rows [0, n_total) the build covers;
  // rows_ready(n) says the store's rows [0, n) are final, so a backend may
  // start on them on its own threads; end_build (all n_total rows in the
  // store) waits for that work and completes. The index is then the one
  // build() makes over those rows. Backends with nothing to start early do
  // it all in end_build. The index must not be searched in between.
  void begin_build(std::shared_ptr<const RowStore> keys, std::shared_ptr<const RowStore> values, int64_t n_total);
  void rows_ready(int64_t n);
  void end_build();
  // Folds rows appended to the store since into the structure, all of them
  // or those below `upto` (rows appended meanwhile wait for the next fold:
  // a fold on another thread then covers the same rows however it is timed).
  // Returns how many.
  int64_t add_new_rows(int64_t upto = -1);
  int64_t indexed_rows() const { return indexed_; }
  bool attached() const { return keys_ != nullptr; }  // built or loaded over a store
  int64_t size() const { return keys_ ? keys_->size() : 0; }
  int dim() const { return keys_ ? keys_->dim() : 0; }
  const RowStore& keys() const { return *keys_; }

  // queries: nq x dim() fp32, row-major. Throws Error on bad input (no keys,
  // nq < 1, k < 1, NaN/Inf in a query); k larger than the index returns all.
  SearchResult search(const float* queries, int nq, const SearchParams& p) const;

  MemoryReport memory() const;

  // The index as SummaryTables, for a budget-mode search (threshold 0, GQA
  // union) run elsewhere; false when the backend has no such form (graphs,
  // IVF, flat). Cluster indexes export their fine clusters (levels=2's coarse
  // level is a CPU shortcut a GPU does not need).
  bool export_summaries(SummaryTables& out) const;

  // Saves the structure (never the keys: they live in the store). The file
  // carries a format version, the backend and its parameters, and a
  // fingerprint of the keys it was built on.
  void save(const std::string& path) const;
  // Loads an index saved by save(), attaching it to `keys` (and `values`),
  // which must hold at least the rows it was built on.
  static std::unique_ptr<KvIndex> load(const std::string& path, std::shared_ptr<const RowStore> keys,
                                       std::shared_ptr<const RowStore> values = nullptr,
                                       const BuildOptions& opt = {});
  // The same bytes save() writes, in memory (a context pack embeds them), and
  // load() from such bytes; `name` stands for the path in error messages.
  // With `arrays` the large arrays go there instead (each a tensor of a
  // context pack, index/index_arrays.h) and the bytes hold the rest; loading
  // such bytes needs the matching reader, which may give the arrays in place.
  std::vector<uint8_t> save_bytes(IndexArrayWriter* arrays = nullptr) const;
  static std::unique_ptr<KvIndex> load_bytes(const std::string& name, const uint8_t* data, size_t n,
                                             std::shared_ptr<const RowStore> keys,
                                             std::shared_ptr<const RowStore> values = nullptr,
                                             const BuildOptions& opt = {}, IndexArrayReader* arrays = nullptr);

 protected:
  KvIndex(std::string name, Params params, const BuildOptions& opt)
      : name_(std::move(name)), params_(std::move(params)), opt_(opt) {}

  // What each backend writes. Rows are read from keys_ (and values_).
  struct Candidates {
    std::vector<int64_t> ids;  // may repeat across queries; rows < indexed_rows()
    std::vector<int32_t> far_clusters;  // multipole: clusters not selected (union semantics is the
    std::vector<float> far_scores;      //   backend's job); [nq][far] q·C_j
    const ClusterSummaries* summaries = nullptr;
    SearchStats stats;
  };
  virtual void build_impl(int64_t n_rows) = 0;               // rows [0, n_rows)
  // Streaming build (begin_build ...): the defaults start nothing early.
  virtual void begin_build_impl(int64_t n_total) { (void)n_total; }
  virtual void rows_ready_impl(int64_t n) { (void)n; }
  virtual void end_build_impl(int64_t n_total) { build_impl(n_total); }
  virtual void add_impl(int64_t from, int64_t to) = 0;       // rows [from, to)
  virtual void search_impl(const float* queries, int nq, const SearchParams& p, Candidates& out) const = 0;
  virtual MemoryReport memory_impl() const = 0;
  virtual bool export_impl(SummaryTables&) const { return false; }
  // Small fields through w / r, large arrays through `arrays`, in the same
  // order on both sides (index/index_arrays.h).
  virtual void save_impl(BinaryWriter& w, IndexArrayWriter& arrays) const = 0;
  virtual void load_impl(BinaryReader& r, IndexArrayReader& arrays) = 0;

  int n_threads() const;  // opt_.n_threads resolved (0 -> hardware threads)
  // arrays null: inline in w / r.
  void save_to(BinaryWriter& w, IndexArrayWriter* arrays) const;
  static std::unique_ptr<KvIndex> load_from(BinaryReader& r, std::shared_ptr<const RowStore> keys,
                                            std::shared_ptr<const RowStore> values, const BuildOptions& opt,
                                            IndexArrayReader* arrays);

  std::string name_;
  Params params_;
  BuildOptions opt_;
  std::shared_ptr<const RowStore> keys_, values_;
  // Atomic: a device runtime folds on a host thread (add_new_rows under mu_)
  // while the decode thread asks how far the index reaches.
  std::atomic<int64_t> indexed_{0};
  int64_t build_total_ = -1;  // rows of a streaming build in progress (-1: none)
  mutable RwLock mu_;  // writer-preferring: add_new_rows() is not starved by searches
};

// Names of the registered backends with a one-line description each.
struct BackendInfo {
  std::string name, description, params_help;
};
const std::vector<BackendInfo>& index_backends();

}  // namespace topkv
