#include "src/session/backend_choice.h"

#include "gpu/cuda_backend.h"
#include "gpu/device.h"
#include "src/common/error.h"

namespace topkv {

bool resolves_to_cuda(const std::string& name) {
  TOPKV_CHECK(name == "auto" || name == "cpu" || name == "cuda", "unknown backend '{}': use cpu, cuda or auto",
              name);
  return name == "cuda" || (name == "auto" && cuda_device_count() > 0);
}

std::string auto_backend_note(const std::string& name) {
  if (name != "auto" || resolves_to_cuda(name)) return "";
#ifdef TOPKV_HAVE_CUDA
  return "no CUDA device is visible; using the CPU backend";
#else
  return "this build has no CUDA; using the CPU backend";
#endif
}

std::unique_ptr<Backend> open_backend(const BackendSpec& spec, bool& cuda) {
  cuda = resolves_to_cuda(spec.name);
  if (cuda) {
    CudaBackendOptions co;
    co.mem_budget = spec.gpu_mem_budget, co.q8_terms = spec.q8_terms;
    return make_cuda_backend(co);
  }
  TOPKV_CHECK(!spec.budget_given, "--gpu-mem-budget applies to the CUDA backend; this run uses the CPU (--backend {})",
              spec.name);
  TOPKV_CHECK(spec.q8_terms == 0, "--q8-terms applies to the CUDA backend's decode products; this run uses the CPU "
              "(--backend {}), whose products on quantised weights keep fp32 activations", spec.name);
  return make_cpu_backend({spec.threads});
}

}  // namespace topkv
