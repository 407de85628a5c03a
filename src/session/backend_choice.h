// Where a model runs: the one meaning of --backend auto for every command,
// the benchmarks and the server. auto is the CUDA backend when this build has
// CUDA and a device is visible, else the CPU backend.
#pragma once
#include <cstddef>
#include <memory>
#include <string>

#include "src/model/backend.h"

namespace topkv {

struct BackendSpec {
  std::string name = "auto";  // auto, cpu or cuda
  size_t gpu_mem_budget = 0;  // CUDA: bytes the backend may hold (0: what the device has)
  bool budget_given = false;  // a budget was asked for (an Error on the CPU backend)
  int threads = 0;            // CPU: 0 = OpenMP's default
  int q8_terms = 0;           // CUDA: CudaBackendOptions::q8_terms (0: its default)
};

// true when `name` resolves to the CUDA backend. Error on an unknown name.
bool resolves_to_cuda(const std::string& name);
// Why auto resolved to the CPU backend ("" when it did not, or was not auto).
std::string auto_backend_note(const std::string& name);
// The backend `spec` names; `cuda` says which it is. Error on a budget for
// the CPU backend, or when CUDA was asked for and cannot start.
std::unique_ptr<Backend> open_backend(const BackendSpec& spec, bool& cuda);

}  // namespace topkv
