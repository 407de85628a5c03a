// The blockwise k-means on the device (`--build-on gpu`): LloydKMeans's
// rounds (index/kmeans.h, its CPU twin), each round's scores of every row
// against every centroid from one cuBLAS product (fp32, no TF32), the labels,
// the clusters' sums and the centroids in gpu/kernels_kmeans.cu. The indexes
// call it from their build threads; the calls take turns on one stream of
// their own, beside the prefill's. Device memory comes from `be` (counted
// against --gpu-mem-budget as "k-means work space": at most ~64 MiB of scores
// plus the rows of the largest block).
#pragma once
#include <memory>

#include "index/kmeans.h"
#include "src/model/backend.h"

namespace topkv {

// Throws Error in a build without CUDA, and when `be` is not a CUDA backend.
std::shared_ptr<const KMeansEngine> make_gpu_kmeans(Backend& be);

}  // namespace topkv
