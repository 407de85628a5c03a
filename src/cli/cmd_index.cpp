// topkv index build: prefill a long document once, build the per-head indexes
// and save it all as a context pack (offload/context_pack.h) that later
// `topkv generate --pack` runs map and query without prefilling again.
// topkv index info: what a pack holds, and with --verify whether every byte
// still matches its checksum (after copying it between machines).
#include <fmt/format.h>

#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>

#include "offload/context_pack.h"
#include "src/cli/cli_util.h"
#include "src/cli/commands.h"
#include "src/cli/policy_options.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/model/tokenizer.h"

namespace topkv::cli {
namespace {

struct BuildArgs {
  std::string model, prompt, prompt_file, out, json_path, weights = "quant", kv_type = "f32";
  int threads = 0, chunk = 256;
  bool quiet = false;
};

// A pack is written after a prefill that may take hours: find out now that
// its file cannot be created, not then.
void check_writable(const std::string& out) {
  const std::string probe = out + ".tmp";
  { std::ofstream f(probe); TOPKV_CHECK(f, "cannot create '{}': check that the directory exists and is writable", probe); }
  std::remove(probe.c_str());
}

void run_build(const BuildArgs& a, const PolicyArgs& pol, const CLI::App& cmd) {
  if (a.quiet) Progress::set_global_enabled(false);
  const auto note = [&](const std::string& s) {
    if (!a.quiet) fmt::print(stderr, "{}\n", s);
  };
  TOPKV_CHECK(!a.out.empty(), "give the context pack to write with -o doc.pack");
  TOPKV_CHECK(a.chunk > 0, "--chunk must be positive, got {}", a.chunk);
  TOPKV_CHECK(!cmd.count("--attn") || pol.attn == "topk", "a context pack holds top-k layers: drop --attn dense");
  OffloadPolicy policy = pol.resolve(cmd);
  policy.attn = AttnMode::TopK;
  check_writable(a.out);
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  const ModelConfig cfg = read_model_config(*file);
  const std::string source = !a.prompt_file.empty() ? a.prompt_file : !a.prompt.empty() ? "-p" : "stdin";
  const std::string text = read_input_text(a.prompt, a.prompt_file, /*required=*/true);
  const std::vector<int32_t> ids = tok.encode(text, tok.add_bos_default(), /*parse_special=*/false);
  TOPKV_CHECK(!ids.empty(), "the document encodes to no tokens");
  const int64_t n = (int64_t)ids.size();
  if (n > cfg.n_ctx_train)
    fmt::print(stderr, "topkv: warning: the document's {} tokens exceed the {} the model was trained on; quality may "
               "degrade past it\n", n, cfg.n_ctx_train);

  auto backend = make_cpu_backend({a.threads});
  ModelOptions mo;
  mo.n_ctx = n;
  mo.max_chunk = (int)std::min<int64_t>(a.chunk, n);
  mo.kv_dtype = parse_dtype(a.kv_type);
  mo.weights = parse_weight_mode(a.weights);
  OffloadRuntime rt(cfg, policy, !a.quiet);  // checks the policy and head pattern before any work
  check_memory_plan(*file, cfg, policy, mo, /*from_pack=*/false, a.quiet);
  Model model(file, *backend, mo);
  model.touch_weights();
  note(fmt::format("topkv: {}; document {} tokens ({})", cfg.summary(), n, source));

  Timer prefill_timer;
  Progress bar("prefill", n, "tok", n > mo.max_chunk);
  const std::vector<float> logits = model.prefill(ids, mo.max_chunk, false, [&](int64_t done) { bar.set(done); });
  bar.finish();
  const double prefill_s = prefill_timer.seconds();
  rt.take_prefill(model);
  note(fmt::format("topkv: {}; {} keys indexed in {:.2f} s", rt.describe(), rt.stats().keys_indexed,
                   rt.stats().build_s));
  Timer write_timer;
  save_context_pack(a.out, *file, model, rt, ids, logits,
                    {{"source", source}, {"prefill_s", prefill_s}, {"index_build_s", rt.stats().build_s},
                     {"created", (int64_t)std::time(nullptr)}});
  const double write_s = write_timer.seconds();
  const size_t pack_bytes = std::filesystem::file_size(a.out);
  note(fmt::format("topkv: wrote context pack {} ({}, {:.2f} s): {} tokens; prefill {:.2f} s ({:.1f} tok/s), index "
                   "build {:.2f} s; peak RSS {}", a.out, mib(pack_bytes), write_s, n, prefill_s, n / prefill_s,
                   rt.stats().build_s, mib(peak_rss_bytes())));
  if (!a.json_path.empty())
    write_json_atomic(a.json_path, {{"pack", a.out},
                                    {"pack_bytes", pack_bytes},
                                    {"model", path},
                                    {"tokens", n},
                                    {"policy", nlohmann::json::parse(policy.to_json())},
                                    {"retrieval_layers", rt.retrieval_layers()},
                                    {"keys_indexed", rt.stats().keys_indexed},
                                    {"host_bytes", rt.host_bytes()},
                                    {"prefill_s", prefill_s},
                                    {"index_build_s", rt.stats().build_s},
                                    {"write_s", write_s},
                                    {"peak_rss_bytes", peak_rss_bytes()}});
}

// Bytes of the pack's tensors by what they hold (names: offload/context_pack.h).
std::map<std::string, uint64_t> bytes_by_kind(const PackReader& r) {
  std::map<std::string, uint64_t> out;
  for (const TensorInfo& t : r.tensors()) {
    const std::string& s = t.name;
    const std::string last = s.substr(s.rfind('.') + 1);
    const std::string kind = s.rfind("model.", 0) == 0         ? "model KV"
                             : s.rfind("offload.", 0) != 0     ? "tokens, logits"
                             : last == "keys" || last == "values" ? "host stores"
                             : last == "index"                 ? "indexes"
                                                               : "sinks, windows";
    out[kind] += t.nbytes();
  }
  return out;
}

void run_info(const std::string& path, bool verify) {
  ContextPack pack(path);
  const nlohmann::json& m = pack.meta();
  const OffloadPolicy& p = pack.policy();
  const auto line = [](const char* label, const std::string& text) { fmt::print("  {:<15}{}\n", label, text); };
  fmt::print("context pack {} ({}, format {})\n", path, format_bytes((double)pack.file().file_bytes()),
             m.value("format", 0));
  const nlohmann::json& model = m.at("model");  // keys checked by ContextPack
  line("model", fmt::format("{} (content hash {})", model.at("path").get<std::string>(),
                            model.at("content_hash").get<std::string>()));
  line("", model.at("summary").get<std::string>());
  line("context", fmt::format("{} tokens", pack.n_tokens()));
  line("fixed", fmt::format("index {}, sinks {}, window {}, dense layers {}, store {}{}", p.index, p.sinks, p.window,
                            p.dense_layers, dtype_name(p.store_dtype),
                            p.heads_file.empty() ? "" : ", heads " + p.heads_file));
  line("defaults", fmt::format("k {}{}, schedule {}, ef {}, nprobe {}, threshold {} (generate may change these)",
                               p.search.k, p.k_fraction > 0 ? fmt::format(" (k-fraction {})", p.k_fraction) : "",
                               p.k_schedule == KSchedule::Linear ? "linear" : "uniform", p.search.ef,
                               p.search.nprobe, p.search.threshold));
  const nlohmann::json& off = m.at("offload");
  int streaming = 0;
  for (auto& layer : off.value("streaming", nlohmann::json::array()))
    for (auto& s : layer) streaming += s.get<int>();
  line("top-k", fmt::format("layers {} ({} streaming KV heads)",
                            off.value("retrieval_layers", nlohmann::json::array()).dump(), streaming));
  line("model layers", fmt::format("{} the model attends itself, kept ({})", m.at("model_layers").size(),
                               m.at("kv_type").get<std::string>()));
  for (auto& [kind, b] : bytes_by_kind(pack.file())) line(kind.c_str(), format_bytes((double)b));
  const nlohmann::json b = m.value("build", nlohmann::json::object());
  line("built", fmt::format("by topkv {} from {}: prefill {:.2f} s, index build {:.2f} s", b.value("topkv", "?"),
                            b.value("source", "?"), b.value("prefill_s", 0.0), b.value("index_build_s", 0.0)));
  if (!verify) return;
  Timer t;
  const uint64_t checked = pack.file().verify_all(/*progress=*/true);
  line("verified", fmt::format("every tensor matches its checksum ({} in {:.2f} s)", format_bytes((double)checked),
                               t.seconds()));
}

}  // namespace

void register_index(CLI::App& app) {
  auto* index = app.add_subcommand("index", "Build and inspect context packs (a document prefilled and indexed once)");
  index->require_subcommand(1);

  auto a = std::make_shared<BuildArgs>();
  auto* build = index->add_subcommand(
      "build", "Prefill a document, build the per-head indexes and save a context pack for `generate --pack`");
  build->add_option("-m,--model", a->model,
                    fmt::format("GGUF model file (default: {}, installed by scripts/fetch-model.sh)", kDefaultModel));
  build->add_option("-f,--file", a->prompt_file, "Read the document from this file (stdin when neither -p nor -f)");
  build->add_option("-p,--prompt", a->prompt, "The document as text");
  build->add_option("-o,--out", a->out, "Context pack to write (written whole or not at all)")->required();
  build->add_option("--threads", a->threads, "CPU threads (default: OpenMP's, i.e. all cores or OMP_NUM_THREADS)");
  build->add_option("--weights", a->weights, "quant: the file's quantised rows; f32: dequantised once at load")
      ->check(CLI::IsMember({"quant", "f32"}))
      ->capture_default_str();
  build->add_option("--kv-type", a->kv_type, "Element type of the model's KV cache, and of the KV the pack keeps "
                    "for the model's own (dense and sliding-window) layers: f32 or f16")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
  build->add_option("--chunk", a->chunk, "Document tokens per prefill step")->capture_default_str();
  build->add_option("--json", a->json_path, "Write statistics here: tokens, prefill and index build times, sizes");
  build->add_flag("-q,--quiet", a->quiet, "No progress bar or information on stderr (errors still go there)");
  auto pol = std::make_shared<PolicyArgs>();
  add_policy_options(build, pol);
  build->callback([a, pol, build] { run_build(*a, *pol, *build); });

  auto info_path = std::make_shared<std::string>();
  auto verify = std::make_shared<bool>(false);
  auto* info = index->add_subcommand("info", "Show what a context pack holds: model, tokens, policy, sizes");
  info->add_option("pack", *info_path, "The context pack")->required()->check(CLI::ExistingFile);
  info->add_flag("--verify", *verify, "Also check every tensor against its checksum (reads the whole file)");
  info->callback([info_path, verify] { run_info(*info_path, *verify); });
}

}  // namespace topkv::cli
