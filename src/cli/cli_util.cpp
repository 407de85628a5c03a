#include "src/cli/cli_util.h"

#include <fmt/ranges.h>


#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>

#include "gpu/cuda_backend.h"
#include "offload/memory_plan.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/cli_files.h"
#include "src/common/file_io.h"
#include "src/session/backend_choice.h"

namespace topkv::cli {

namespace fs = std::filesystem;

void add_backend_options(CLI::App* cmd, BackendArgs& a, const std::string& cuda_note, bool prefill_options) {
  cmd->add_option("--backend", a.backend, "Where the model runs: cpu, cuda, or auto (cuda when a GPU is visible)" +
                  cuda_note)
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--gpu-mem-budget", a.gpu_mem_budget,
                  "Most GPU memory the run may hold, e.g. 16G or 1500M (weights, KV cache and window, buffers, "
                  "prefill scratch); the run stops with a breakdown rather than exceed it");
  cmd->add_option("--threads", a.threads, "CPU threads (default: OpenMP's, i.e. all cores or OMP_NUM_THREADS)")->check(thread_count());
  add_q8_terms_option(cmd, a.q8_terms);
  if (!prefill_options) return;
  cmd->add_option("--overlap-build", a.overlap_build, "Top-k: build the indexes while the model prefills (multipole "
                  "and centroid cluster each 8K-key block as it completes): on, off, or auto (on when the model "
                  "runs on the GPU, whose prefill leaves the host cores free)")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--prefill-kv", a.prefill_kv, "Top-k on the GPU: where the retrieval layers' KV lives while the "
                  "model prefills: gpu; host (each chunk's attention streams the past up in blocks from the top-k "
                  "runtime's host stores, which take each chunk as it is done: no second copy of the context; at "
                  "the store's type, so E4M3 with --store-type f8. Needs the build during the prefill "
                  "(--overlap-build) and no streaming heads, else as host-copy); host-copy (a full pinned copy of "
                  "each layer's KV at --kv-type beside the stores); or auto (on the GPU while --gpu-mem-budget or "
                  "the device's free memory holds it beside what decoding will need, as host from the first layer "
                  "that does not fit)")
      ->check(CLI::IsMember({"auto", "gpu", "host", "host-copy"}))
      ->capture_default_str();
}

void place_prefill_kv(const BackendArgs& a, bool cuda, const OffloadRuntime* rt, ModelOptions& mo) {
  const bool copy = a.prefill_kv == "host-copy";
  mo.kv_place = parse_kv_place(copy ? "host" : a.prefill_kv);
  if (a.prefill_kv == "auto") {
    if (!cuda || !rt) return;
  } else {
    TOPKV_CHECK(cuda, "--prefill-kv {} applies to the CUDA backend; this run uses the CPU, where every cache is "
                "host memory already", a.prefill_kv);
    TOPKV_CHECK(rt, "--prefill-kv {} applies to --attn topk's retrieval layers when the context is prefilled (not "
                "restored from a pack); this run has none", a.prefill_kv);
  }
  mo.host_kv_candidates = rt->retrieval_layers();
  mo.device_reserves = rt->device_reserves(mo.n_ctx);
  // A layer placed in host memory keeps only the chunk when the runtime takes
  // the prefill chunk by chunk and keeps every row: its stores are the past.
  mo.host_kv_past = !copy && overlap_build(a, cuda) && rt->serves_prefill_past();
}

std::string describe_prefill_kv(const Model& model) {
  const std::vector<int> layers = model.host_kv_layers();
  if (layers.empty()) return "";
  const bool rings = model.options().host_kv_past;
  return fmt::format("topkv: the KV of layers {} lives in host memory ({} pinned{}): each prefill chunk streams {} "
                     "up (it does not fit the GPU beside the rest; --prefill-kv)", fmt::join(layers, ","),
                     format_bytes((double)model.host_kv_bytes()), rings ? " for the chunk" : "",
                     rings ? "the past from the top-k runtime's stores" : "it");
}

nlohmann::json prefill_kv_json(const BackendArgs& a, const Model& model) {
  return {{"mode", a.prefill_kv},
          {"host_layers", model.host_kv_layers()},
          {"ring_layers", model.ring_kv_layers()},
          {"host_bytes", model.host_kv_bytes()}};
}

void add_q8_terms_option(CLI::App* cmd, int& terms) {
  cmd->add_option("--q8-terms", terms, "CUDA, quantised weights: how the decode products (<= 8 tokens) round the "
                  "activations: 2 (the default: a 16-bit code in two int8 halves, ~15 bits; greedy tokens as "
                  "with --weights f16) or 1 (ggml's q8_1 alone: ~1e-2 per product; ~2% faster on an 8B model at "
                  "short context)")
      ->check(CLI::IsMember({1, 2}));
}

bool overlap_build(const BackendArgs& a, bool cuda) { return a.overlap_build == "on" || (a.overlap_build == "auto" && cuda); }

namespace {

BackendSpec backend_spec(const BackendArgs& a) {
  BackendSpec spec;  // a malformed budget is an error whichever backend runs
  spec.name = a.backend, spec.threads = a.threads, spec.q8_terms = a.q8_terms;
  spec.budget_given = !a.gpu_mem_budget.empty();
  if (spec.budget_given) spec.gpu_mem_budget = parse_size(a.gpu_mem_budget);
  return spec;
}

}  // namespace

std::unique_ptr<Backend> make_backend(const BackendArgs& a, bool& cuda) { return open_backend(backend_spec(a), cuda); }

SessionOptions session_options(const BackendArgs& a, bool progress, bool measure_error) {
  SessionOptions o;
  o.backend = backend_spec(a);
  o.overlap_build = overlap_build(a, resolves_to_cuda(a.backend));
  o.progress = progress, o.measure_error = measure_error;
  return o;
}

std::string default_model_path() {
  std::vector<fs::path> roots{fs::current_path()};
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  for (fs::path p = exe.parent_path(); !ec && !p.empty() && p != p.root_path(); p = p.parent_path()) roots.push_back(p);
  for (const auto& r : roots)
    if (fs::is_regular_file(r / kDefaultModel, ec)) return (r / kDefaultModel).string();
  fail("no model given (-m) and the default model {} was not found here or above the executable; run "
       "scripts/fetch-model.sh to install it, or pass -m model.gguf", kDefaultModel);
}

std::string read_input_text(const std::string& text, const std::vector<std::string>& files, bool required) {
  TOPKV_CHECK(text.empty() || files.empty(), "give the prompt either as -p text or as -f file, not both");
  if (!text.empty()) return text;
  std::string out;
  for (const std::string& file : files) {
    out += read_text_input(file, "prompt file", 1ull << 30);
  }
  if (files.empty()) {
    if (!isatty(STDIN_FILENO))
      out.assign(std::istreambuf_iterator<char>(std::cin), {});
    else
      TOPKV_CHECK(!required, "no prompt: give -p text, -f file, or pipe the prompt on stdin");
  }
  TOPKV_CHECK(!required || !out.empty(), "the prompt is empty");
  return out;
}

void check_memory_plan(const GgufFile& file, const ModelConfig& cfg, const OffloadPolicy& policy,
                       const ModelOptions& mo, bool from_pack, bool quiet,
                       const std::vector<std::string>& extra_indexes, const OffloadRuntime* runtime) {
  MemoryPlanInput mi;
  if (runtime) mi.device_lines = runtime->device_plan(mo.n_ctx);
  mi.cfg = &cfg, mi.policy = &policy, mi.context = mo.n_ctx, mi.max_chunk = mo.max_chunk;
  mi.kv_dtype = mo.kv_dtype, mi.from_pack = from_pack;
  mi.retrieval_rings = mo.host_kv_past;
  mi.extra_indexes = extra_indexes;
  mi.weight_bytes = (double)file.file_size();  // quant: the mapped file becomes resident
  if (mo.weights == WeightMode::F32) {         // f32: 4 bytes per parameter
    mi.weight_bytes = 0;
    for (const auto& t : file.tensors()) mi.weight_bytes += 4.0 * t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3];
  }
  MemoryPlan plan = plan_memory(mi);
  if (!quiet) fmt::print(stderr, "{}\n", plan.table());
  check_plan_fits(plan, host_memory_available());
}

std::string mib(size_t b) { return fmt::format("{:.1f} MiB", (double)b / (1024.0 * 1024.0)); }

void write_json_atomic(const std::string& path, const nlohmann::json& j) {
  // Generated text cut at a token limit may end inside a UTF-8 character:
  // such bytes are written as U+FFFD rather than refused.
  write_file_atomic(path, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "JSON file");
}

}  // namespace topkv::cli
