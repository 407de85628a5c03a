// Whole-model rows of `topkv bench gpu-ops` (see gpu_model_bench.h). Each
// decode mode runs `decode` steps after two untimed ones (the recorded mode
// runs its first step op by op and records on the second); the median step
// is reported, host wall time per step including the logits' trip to the
// host (or the device argmax's 4 bytes).
#ifdef TOPKV_HAVE_CUDA
#include "bench/gpu_model_bench.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <sstream>
#include <vector>

#include "gpu/cuda_backend.h"
#include "gpu/cuda_sampler.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/timer.h"
#include "src/model/model.h"
#include "src/model/sampler.h"
#include "src/model/synth.h"

namespace topkv::bench {

namespace {

double median_ms(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

void bench_model_file(Backend& be, const std::string& path, const std::string& label, const ModelBenchOptions& o,
                      const RowSink& sink) {
  TOPKV_CHECK(o.prompt > 0 && o.decode > 0, "model bench: --prompt and --decode must be positive");
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  ModelOptions opt;
  opt.n_ctx = o.prompt + 3 * (o.decode + 2) + 8, opt.max_chunk = std::min(512, o.prompt);
  opt.weights = o.weights;
  Timer load;
  Model m(file, be, opt);
  sink.note("model", label + " load", fmt::format("{:.1f} s; {}; --weights {}; device memory {}", load.seconds(),
                                                  m.config().summary(), weight_mode_name(o.weights),
                                                  cuda_memory_use(be).describe()));
  std::mt19937 rng(9);
  std::vector<int32_t> prompt((size_t)o.prompt);
  for (auto& id : prompt) id = (int32_t)(rng() % (uint32_t)m.config().n_vocab);
  Timer t;
  std::vector<float> logits = m.prefill(prompt, opt.max_chunk);
  const double pre_s = t.seconds();
  sink.add("model", fmt::format("{} prefill {} tokens (chunk {})", label, o.prompt, opt.max_chunk), pre_s * 1e6, 0, 0);

  const int64_t V = m.config().n_vocab;
  int32_t next = argmax(logits);
  // mode 0: op by op; 1: recorded step, logits to the host; 2: recorded, device argmax.
  const char* names[] = {"decode step, op by op", "decode step, CUDA graph", "decode step, CUDA graph + device argmax"};
  double med[3] = {0, 0, 0};
  for (int mode = 0; mode < 3; ++mode) {
    m.set_record_decode(mode > 0);
    std::vector<double> ms;
    for (int i = 0; i < o.decode + 2; ++i) {
      Timer s;
      if (mode < 2) {
        logits = m.decode(next);
        next = argmax(logits);
      } else {
        next = cuda_argmax(be, m.decode_on_backend(next), V);
      }
      if (i >= 2) ms.push_back(s.ms());
    }
    med[mode] = median_ms(ms);
    sink.add("model", fmt::format("{} {} (median of {})", label, names[mode], o.decode), med[mode] * 1e3, 0, 0);
  }
  TOPKV_CHECK(m.steps_recorded() == 1, "model bench: expected one recorded step, got {}", m.steps_recorded());
  sink.note("model", label + " tokens/s", fmt::format("prefill {:.0f}; decode {:.1f} op by op, {:.1f} graph, {:.1f} "
                                                      "graph + device argmax", o.prompt / pre_s, 1e3 / med[0],
                                                      1e3 / med[1], 1e3 / med[2]));
}

void bench_synth_models(Backend& be, const std::string& list, const ModelBenchOptions& o, const RowSink& sink) {
  if (list.empty() || list == "none") return;
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / fmt::format("topkv-bench-{}", (unsigned)std::random_device{}());
  fs::create_directories(dir);
  struct Cleanup {
    fs::path d;
    ~Cleanup() {
      std::error_code ec;
      fs::remove_all(d, ec);
    }
  } cleanup{dir};
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (item.empty()) continue;
    const size_t at = item.find('@');
    const std::string preset = item.substr(0, at);
    SynthConfig c = synth_preset(preset);
    std::string label = preset;
    if (at != std::string::npos) {
      const int layers = std::stoi(item.substr(at + 1));
      TOPKV_CHECK(layers > 0 && layers <= c.layers, "--synth {}: the preset has 1..{} layers", item, c.layers);
      c.layers = layers;
      label += fmt::format(" ({} of its layers)", layers);
    }
    if (o.synth_type != "preset") c.type = ggml_type_from_name(o.synth_type);
    const std::string path = (dir / (preset + ".gguf")).string();
    Timer w;
    synth_write(c, path);
    sink.note("model", label + " synth", fmt::format("{} {} written in {:.1f} s", format_bytes((double)
                                                     fs::file_size(path)), ggml_type_name((uint32_t)c.type),
                                                     w.seconds()));
    bench_model_file(be, path, label, o, sink);
    fs::remove(path);
  }
}

}  // namespace topkv::bench
#endif  // TOPKV_HAVE_CUDA
