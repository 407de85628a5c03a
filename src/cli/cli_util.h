// Pieces the commands that run a model share (generate, index build): the
// default model, the input text, the memory plan check, the statistics file.
#pragma once
#include <CLI/CLI.hpp>
#include <cstddef>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "offload/offload_runtime.h"
#include "offload/policy.h"
#include "src/model/gguf.h"
#include "src/model/model.h"
#include "src/session/session.h"

namespace topkv::cli {

// Where the model runs (generate, index build): --backend, --gpu-mem-budget, --threads.
struct BackendArgs {
  std::string backend = "auto", gpu_mem_budget, overlap_build = "auto", prefill_kv = "auto";
  int threads = 0, q8_terms = 0;
};
// Adds the options; `cuda_note` ends --backend's help (what cuda means for this command).
// `prefill_options`: also --overlap-build and --prefill-kv (commands whose
// top-k runtime takes the prefill; eval prefills densely and shares it).
void add_backend_options(CLI::App* cmd, BackendArgs& a, const std::string& cuda_note, bool prefill_options = true);
// --q8-terms: the activation terms of the CUDA backend's decode products on
// quantised weights (CudaBackendOptions::q8_terms; 0 when not given).
void add_q8_terms_option(CLI::App* cmd, int& terms);
// The CUDA backend for "cuda", or "auto" with a GPU visible (cuda = true);
// else the CPU backend. Throws Error on a budget for the CPU or a bad size.
std::unique_ptr<Backend> make_backend(const BackendArgs& a, bool& cuda);

// --overlap-build resolved: auto overlaps when the model runs on the GPU
// (its prefill leaves the host cores free).
bool overlap_build(const BackendArgs& a, bool cuda);
// The session layer's options (src/session/session.h) for these flags.
SessionOptions session_options(const BackendArgs& a, bool progress, bool measure_error = false);
// --prefill-kv: where the retrieval layers' caches live while the model
// prefills (ModelOptions::host_kv_candidates, kv_place, device_reserves).
// `rt` is the top-k runtime that will take those layers (null: dense, or a
// pack, where they get no cache at all). Throws Error on a choice that does
// not apply to the run.
void place_prefill_kv(const BackendArgs& a, bool cuda, const OffloadRuntime* rt, ModelOptions& mo);
// One line on the layers whose prefill streams from host memory, or "".
std::string describe_prefill_kv(const Model& model);
// The same for a JSON report, read before the runtime takes the layers
// (release_kv): {"mode", "host_layers", "ring_layers", "host_bytes"}.
nlohmann::json prefill_kv_json(const BackendArgs& a, const Model& model);

inline constexpr const char* kDefaultModel = ".models/gemma-3-270m-q4_k_m.gguf";  // scripts/fetch-model.sh

// -m omitted: the fetch script's output, looked for under the working
// directory and then upwards from the executable (build/bin/topkv in a checkout).
std::string default_model_path();

// The text of -p `text` or of the -f `files` joined in order (not both), else
// stdin when it is not a terminal. `required`: an empty or missing text is an
// Error; otherwise it comes back empty.
std::string read_input_text(const std::string& text, const std::vector<std::string>& files, bool required);

// Prints the memory plan of a run (unless quiet) and refuses one that cannot
// fit, with the numbers, before any work. `from_pack`, `extra_indexes`: see
// MemoryPlanInput; `runtime`: the offload runtime that will decode, whose
// device memory (OffloadRuntime::device_plan) fills the plan's GPU column.
void check_memory_plan(const GgufFile& file, const ModelConfig& cfg, const OffloadPolicy& policy,
                       const ModelOptions& mo, bool from_pack, bool quiet,
                       const std::vector<std::string>& extra_indexes = {}, const OffloadRuntime* runtime = nullptr);

std::string mib(size_t bytes);  // "12.3 MiB"
// Writes path.tmp and renames it to path (invalid UTF-8 in strings is written as U+FFFD).
void write_json_atomic(const std::string& path, const nlohmann::json& j);

}  // namespace topkv::cli
