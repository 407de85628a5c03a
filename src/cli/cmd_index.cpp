// topkv index build: prefill a long document once, build the per-head indexes
// (one backend or several) and save it all as a context pack
// (offload/context_pack.h) that later `topkv generate --pack` runs map and
// query without prefilling again.
// topkv index info: the pack's manifest and sizes, per part and per layer,
// and with --verify whether every byte still matches its checksum.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
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
#include "src/common/host_memory.h"
#include "src/common/options.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/model/tokenizer.h"
#include "src/common/cli_files.h"
#include "src/common/file_io.h"
#include "src/session/make_runtime.h"
#include "src/session/session.h"

namespace topkv::cli {
namespace {

struct BuildArgs {
  std::string model, prompt, out, json_path, weights = "quant", kv_type = "f32";
  std::vector<std::string> files;
  BackendArgs where;
  int chunk = 256;
  bool quiet = false;
};

// A pack is written after a prefill that may take hours: find out now that
// its file cannot be created, not then.
void check_writable(const std::string& out) {
  check_output_path(out, "context pack");
}

void run_build(const BuildArgs& a, const PolicyArgs& pol, const CLI::App& cmd) {
  if (a.quiet) Progress::set_global_enabled(false);
  const auto note = [&](const std::string& s) {
    if (!a.quiet) fmt::print(stderr, "{}\n", s);
  };
  TOPKV_CHECK(a.chunk > 0, "--chunk must be positive, got {}", a.chunk);
  OffloadPolicy base = cli_default_policy();
  base.attn = AttnMode::TopK;  // a pack is for top-k decoding unless --attn dense says otherwise
  const OffloadPolicy policy = pol.resolve(cmd, base, /*many_indexes=*/true);
  const bool topk = policy.attn == AttnMode::TopK;
  const std::vector<std::string> specs = pol.index_specs();
  const std::vector<std::string> extra(specs.size() > 1 ? specs.begin() + 1 : specs.end(), specs.end());
  TOPKV_CHECK(topk || specs.empty(), "--attn dense builds no index: drop --index, or use --attn topk");
  check_writable(a.out);
  const std::string path = a.model.empty() ? default_model_path() : a.model;
  std::shared_ptr<const GgufFile> file = GgufFile::open(path);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  const ModelConfig cfg = read_model_config(*file);
  std::string source = !a.prompt.empty() ? "-p" : a.files.empty() ? "stdin" : "";
  for (const std::string& f : a.files) source += (source.empty() ? "" : " + ") + f;
  const std::string text = read_input_text(a.prompt, a.files, /*required=*/true);
  const std::vector<int32_t> ids = tok.encode(text, tok.add_bos_default(), /*parse_special=*/false);
  TOPKV_CHECK(!ids.empty(), "the document encodes to no tokens");
  const int64_t n = (int64_t)ids.size();
  if (n > cfg.n_ctx_train)
    fmt::print(stderr, "topkv: warning: the document's {} tokens exceed the {} the model was trained on; quality may "
               "degrade past it\n", n, cfg.n_ctx_train);

  bool cuda = false;
  std::unique_ptr<Backend> backend = make_backend(a.where, cuda);
  ModelOptions mo;
  mo.n_ctx = n;
  mo.max_chunk = (int)std::min<int64_t>(a.chunk, n);
  mo.kv_dtype = parse_dtype(a.kv_type);
  mo.weights = parse_weight_mode(a.weights);
  check_weight_mode(mo.weights, cuda);
  // The host-side runtime whatever the backend: a pack holds host stores and
  // indexes; the model's KV comes to the host through Model::read_kv. On the
  // CUDA backend its clustering indexes take the device's k-means, as
  // `generate` there builds them (make_build_runtime).
  std::unique_ptr<OffloadRuntime> rt;
  if (topk) {  // checks the policy, the head pattern and every index spec before any work
    rt = make_build_runtime(*backend, cfg, policy, !a.quiet);
    rt->build_extra_indexes(extra);
  }
  place_prefill_kv(a.where, cuda, rt.get(), mo);  // reserves only the device k-means' work space, if any
  check_memory_plan(*file, cfg, policy, mo, /*from_pack=*/false, a.quiet, extra);
  Model model(file, *backend, mo);
  model.touch_weights();
  note(fmt::format("topkv: {}; document {} tokens ({})", cfg.summary(), n, source));
  if (const std::string s = describe_prefill_kv(model); !s.empty()) note(s);
  const nlohmann::json prefill_kv = prefill_kv_json(a.where, model);

  Timer prefill_timer;
  const bool overlap = overlap_build(a.where, cuda);
  const std::vector<float> logits = prefill_into(model, ids, mo.max_chunk, rt.get(), overlap);
  // With --overlap-build the indexes were built during the prefill: what is
  // left after it is the build's part here.
  const double prefill_s = prefill_timer.seconds() - (rt ? rt->stats().build_s : 0.0);
  double build_s = 0;
  if (rt) {
    build_s = rt->stats().build_s;
    note(fmt::format("topkv: {}; {} keys indexed in {:.2f} s{}", rt->describe(), rt->stats().keys_indexed, build_s,
                     extra.empty() ? "" : fmt::format(" ({} indexes per head)", 1 + extra.size())));
  }
  Timer write_timer;
  save_context_pack(a.out, *file, model, rt.get(), ids, logits,
                    {{"source", source}, {"backend", backend->name()}, {"prefill_s", prefill_s},
                     {"index_build_s", build_s}, {"created", (int64_t)std::time(nullptr)}});
  const double write_s = write_timer.seconds();
  const size_t pack_bytes = std::filesystem::file_size(a.out);
  note(fmt::format("topkv: wrote context pack {} ({}, {:.2f} s): {} tokens; prefill {:.2f} s ({:.1f} tok/s), index "
                   "build {:.2f} s{}; peak RSS {}", a.out, mib(pack_bytes), write_s, n, prefill_s, n / prefill_s,
                   build_s, rt && overlap ? " after the prefill (the rest overlapped it)" : "",
                   mib(peak_rss_bytes())));
  if (!a.json_path.empty())
    write_json_atomic(a.json_path, {{"pack", a.out},
                                    {"pack_bytes", pack_bytes},
                                    {"model", path},
                                    {"tokens", n},
                                    {"policy", nlohmann::json::parse(policy.to_json())},
                                    {"indexes", specs},
                                    {"retrieval_layers", rt ? rt->retrieval_layers() : std::vector<int>{}},
                                    {"keys_indexed", rt ? rt->stats().keys_indexed : 0},
                                    {"host_bytes", rt ? rt->host_bytes() : 0},
                                    {"prefill_s", prefill_s},
                                    {"prefill_kv", prefill_kv},
                                    {"index_build_s", build_s},
                                    {"overlap_build", rt && overlap},
                                    {"write_s", write_s},
                                    {"peak_rss_bytes", peak_rss_bytes()}});
}

// What a tensor holds (names: offload/context_pack.h), and its layer (-1: none).
std::pair<std::string, int> kind_of(const std::string& s) {
  const std::string last = s.substr(s.rfind('.') + 1);
  const bool model = s.rfind("model.L", 0) == 0, offload = s.rfind("offload.L", 0) == 0;
  int layer = -1;
  if (model || offload) std::from_chars(s.data() + s.find('L') + 1, s.data() + s.size(), layer);
  if (model) return {"model KV", layer};
  if (!offload) return {"tokens, logits", layer};
  if (last == "keys" || last == "values") return {"host stores", layer};
  if (s.find(".index.") != std::string::npos) return {"indexes", layer};
  return {"sinks, windows", layer};
}

void run_info(const std::string& path, bool verify) {
  Timer t;
  ContextPack pack(path, verify);
  const double verify_s = t.seconds();
  const nlohmann::json& m = pack.meta();
  const OffloadPolicy& p = pack.policy();
  const auto line = [](const std::string& label, const std::string& text) { fmt::print("  {:<15}{}\n", label, text); };
  fmt::print("context pack {} ({}, format {})\n", path, format_bytes((double)pack.file().file_bytes()),
             m.value("format", 0));
  const nlohmann::json& model = m.at("model");  // keys checked by ContextPack
  line("model", fmt::format("{} (content hash {})", model.at("path").get<std::string>(),
                            model.at("content_hash").get<std::string>()));
  line("", model.at("summary").get<std::string>());
  const nlohmann::json& tk = m.at("tokenizer");
  line("tokenizer", fmt::format("{}, {} tokens (hash {})", tk.value("model", "?"), tk.value("tokens", 0),
                                tk.at("hash").get<std::string>()));
  const nlohmann::json& lay = m.at("layout");
  const nlohmann::json& rope = lay.at("layers").at(0).at("rope");
  line("layout", fmt::format("{} layers, {} heads / {} KV heads of {}; RoPE {} over {} dims, base {}",
                             lay.value("n_layer", 0), lay.value("n_head", 0), lay.value("n_head_kv", 0),
                             lay.value("head_dim", 0), rope.value("style", "?"), rope.value("n_rot", 0),
                             rope.value("base", 0.0)));
  line("context", fmt::format("{} tokens", pack.n_tokens()));
  if (pack.topk()) {
    const std::string at = store_type_at_spec(p);
    line("fixed", fmt::format("attn topk, sinks {}, window {}, dense layers {}, store {}{}{}", p.sinks, p.window,
                              p.dense_layers, dtype_name(p.store_dtype), at.empty() ? "" : " (layers " + at + ")",
                              p.heads_file.empty() ? "" : ", heads " + p.heads_file));
    line("indexes", fmt::format("{} (generate --index picks one; the first by default)",
                                fmt::join(pack.indexes(), ", ")));
    line("defaults", fmt::format("k {}, schedule {}, ef {}, nprobe {}, threshold {} (generate may change these)",
                                 k_spec(p), k_schedule_spec(p), p.search.ef,
                                 p.search.nprobe, p.search.threshold));
    const nlohmann::json& off = m.at("offload");
    int streaming = 0;
    for (auto& layer : off.value("streaming", nlohmann::json::array()))
      for (auto& s : layer) streaming += s.get<int>();
    line("top-k", fmt::format("layers {} ({} streaming KV heads)",
                              off.value("retrieval_layers", nlohmann::json::array()).dump(), streaming));
  } else {
    line("fixed", "attn dense: the model's full caches, no index");
  }
  line("model layers", fmt::format("{} the model attends itself, kept ({})", m.at("model_layers").size(),
                                   m.at("kv_type").get<std::string>()));
  // Sizes per part, then per layer.
  std::map<std::string, uint64_t> by_kind;
  std::map<int, std::map<std::string, uint64_t>> by_layer;
  for (const TensorInfo& ti : pack.file().tensors()) {
    auto [kind, layer] = kind_of(ti.name);
    by_kind[kind] += ti.nbytes();
    if (layer >= 0) by_layer[layer][kind] += ti.nbytes();
  }
  for (auto& [kind, b] : by_kind) line(kind, format_bytes((double)b));
  fmt::print("  per layer:\n");
  for (auto& [layer, kinds] : by_layer) {
    std::string parts;
    for (auto& [kind, b] : kinds) parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", kind, format_bytes((double)b));
    line(fmt::format("  L{}", layer), parts);
  }
  if (pack.topk()) {
    const ContextPack::LoadSplit c = pack.load_split();
    line("on load", fmt::format("used in place (copy-on-write): the host stores ({}; the CUDA runtime copies them "
                                "into pinned memory unless --stage-rows) and index {}'s arrays ({}); {} "
                                "deserialised", format_bytes((double)c.stores), pack.indexes().front(),
                                format_bytes((double)c.index_arrays), format_bytes((double)c.index_blobs)));
  }
  const nlohmann::json b = m.value("build", nlohmann::json::object());
  line("built", fmt::format("by topkv {} from {}: prefill {:.2f} s, index build {:.2f} s", b.value("topkv", "?"),
                            b.value("source", "?"), b.value("prefill_s", 0.0), b.value("index_build_s", 0.0)));
  if (verify)
    line("verified", fmt::format("every tensor matches its checksum ({} read and checked in {:.2f} s)",
                                 format_bytes((double)pack.file().file_bytes()), verify_s));
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
  build->add_option("-f,--file", a->files, "Read the document from this file (repeatable: the files joined in "
                    "order are one document; stdin when neither -p nor -f)");
  build->add_option("-p,--prompt", a->prompt, "The document as text");
  build->add_option("-o,--out", a->out, "Context pack to write (written whole or not at all)")->check(output_file("context pack"))->required();
  add_backend_options(build, a->where, ". With cuda the prefill runs on the GPU and the pack is written from "
                      "host copies of its KV");
  build->add_option("--weights", a->weights, "quant: the file's quantised rows (on either backend); f32 (CPU) / "
                    "f16 (CUDA): dequantised once at load")
      ->check(CLI::IsMember({"quant", "f16", "f32"}))
      ->capture_default_str();
  build->add_option("--kv-type", a->kv_type, "Element type of the model's KV cache, and of the KV the pack keeps "
                    "for the model's own (dense and sliding-window) layers: f32 or f16")
      ->check(CLI::IsMember({"f32", "f16"}))
      ->capture_default_str();
  build->add_option("--chunk", a->chunk, "Document tokens per prefill step")->capture_default_str();
  build->add_option("--json", a->json_path, "Write statistics here: tokens, prefill and index build times, sizes")->check(output_file("--json statistics"));
  build->add_flag("-q,--quiet", a->quiet, "No progress bar or information on stderr (errors still go there)");
  auto pol = std::make_shared<PolicyArgs>();
  add_policy_options(build, pol);
  build->footer("Here --attn defaults to topk (--attn dense: the pack holds the model's full caches, no index), "
                "and --index may be given several times: each head builds every index, and `generate --pack "
                "--index` picks one of them (the first by default); asking for one that was not built is refused "
                "with the list. --k and the other search options are the defaults generate starts from.");
  build->callback([a, pol, build] { run_build(*a, *pol, *build); });

  auto info_path = std::make_shared<std::string>();
  auto verify = std::make_shared<bool>(false);
  auto* info = index->add_subcommand("info", "Show a context pack's manifest and sizes (per part, per layer)");
  info->add_option("pack", *info_path, "The context pack")->required()->check(CLI::ExistingFile);
  info->add_flag("--verify", *verify, "Also check every tensor against its checksum (reads the whole file)");
  info->callback([info_path, verify] { run_info(*info_path, *verify); });
}

}  // namespace topkv::cli
