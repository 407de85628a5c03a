// Spherical k-means of one block of keys, as ClusterIndex's blockwise build
// runs it (Multipole Attention, Sec. 3.3: blockwise clustering keeps the
// build linear in the context). An engine is a capability handed in through
// BuildOptions::kmeans: without one the build runs Faiss's k-means on the
// host cores; the CUDA runtime hands in its GPU engine (gpu/gpu_kmeans.h)
// with `--build-on gpu` or `auto` (the default), so that a long prefill's
// clustering runs on the device instead of the host.
//
// LloydKMeans is the engine's plain CPU twin: the same initial rows, the
// same Lloyd rounds, the same tie rules, so a GPU engine's labels equal its
// labels wherever the floating-point order of the dot products does not
// decide (tests/gpu/test_gpu_kmeans.cpp). `--build-on lloyd` hands it to a
// host build: the device's indexes on any machine.
//
// Layouts: rows and centroids are row-major [n][d] fp32; every input row has
// unit norm (the build normalises), and so has every centroid on return.
#pragma once
#include <cstdint>
#include <vector>

namespace topkv {

class KMeansEngine {
 public:
  virtual ~KMeansEngine() = default;
  virtual const char* name() const = 0;
  // k centroids from `iters` Lloyd rounds over the n_train unit rows of
  // `train`, started from the rows select_rows(n_train, k, seed) picks;
  // then each of the n_all rows of `all` labelled with its nearest centroid
  // (largest inner product; the lowest index on a tie). `train` may be `all`.
  // Safe to call from several threads at once.
  virtual void cluster(const float* train, int64_t n_train, const float* all, int64_t n_all, int d, int64_t k,
                       int iters, uint64_t seed, float* centroids, int32_t* labels) const = 0;
  // Device memory it takes for blocks of rows of d elements (a memory plan's
  // line; 0 for an engine on the host).
  virtual double device_bytes(int d) const {
    (void)d;
    return 0;
  }
};

// m distinct rows of [0, n), ascending: Knuth's selection sampling
// (Algorithm S) with mt19937_64(seed), no index array. A k-means's starting
// rows (m = k), and the blockwise build's training sample; 1 <= m <= n.
std::vector<int64_t> select_rows(int64_t n, int64_t m, uint64_t seed);

// One Lloyd round's update of the twin and of every engine: centroid j is the
// normalised sum of its rows (one whose sum is zero keeps its place); then
// every cluster that no row chose takes half of a large one
// (kmeans_split_empty, Faiss's rule), so no centroid is wasted.
class LloydKMeans final : public KMeansEngine {
 public:
  const char* name() const override { return "lloyd"; }
  void cluster(const float* train, int64_t n_train, const float* all, int64_t n_all, int d, int64_t k, int iters,
               uint64_t seed, float* centroids, int32_t* labels) const override;
};

// Faiss's split of empty clusters (Clustering.cpp, split_clusters): each
// cluster j with counts[j] == 0 copies a cluster m picked with probability
// (counts[m] - 1) / (n - k) in a round-robin walk, both moved apart by a
// relative 1/1024 in alternating dimensions and normalised again, and takes
// half of m's count. The walk's draws come from mt19937_64(seed). Returns how
// many it split. centroids [k][d] unit rows; the counts sum to n >= k.
int64_t kmeans_split_empty(float* centroids, int32_t* counts, int64_t k, int d, int64_t n, uint64_t seed);

// Labels of n unit rows against k centroids (largest inner product, lowest
// index on ties): the twin's assignment step.
void kmeans_assign_reference(const float* x, int64_t n, const float* centroids, int64_t k, int d, int32_t* labels);

}  // namespace topkv
