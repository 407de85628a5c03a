#include "src/session/make_runtime.h"

#include "gpu/cuda_backend.h"
#include "gpu/gpu_kmeans.h"
#include "gpu/gpu_offload_runtime.h"
#include "gpu/gpu_page_bounds.h"
#include "src/common/error.h"

namespace topkv {

std::unique_ptr<OffloadRuntime> make_offload_runtime(Backend& be, const ModelConfig& cfg, const OffloadPolicy& policy,
                                                     bool progress) {
  if (is_cuda_backend(be)) return make_gpu_offload_runtime(be, cfg, policy, progress);
  TOPKV_CHECK(policy.search_on != SearchOn::Gpu, "--search-on gpu needs the CUDA backend (--backend cuda); the {} "
              "backend searches on the host", be.name());
  return make_build_runtime(be, cfg, policy, progress);  // the CPU runtime: stores, indexes and search on the host
}

std::unique_ptr<OffloadRuntime> make_build_runtime(Backend& be, const ModelConfig& cfg, const OffloadPolicy& policy,
                                                   bool progress) {
  const bool cuda = is_cuda_backend(be);
  TOPKV_CHECK(cuda || policy.build_on != BuildOn::Gpu, "--build-on gpu needs the CUDA backend (--backend cuda); the {} "
              "backend builds its indexes on the host (drop --build-on, or use lloyd for the GPU's rounds on the host)",
              be.name());
  auto rt = std::make_unique<OffloadRuntime>(cfg, policy, progress);
  if (build_on_gpu(policy, cuda)) rt->set_build_engines(make_gpu_kmeans(be), make_gpu_page_bounds(be));
  return rt;
}

}  // namespace topkv
