// topkv model: `synth` writes a random-weight GGUF of any llama / gemma3 / qwen2
// geometry; `info` describes a GGUF file (geometry, metadata, tensors).
#include <fmt/format.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "src/cli/commands.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/model/gguf.h"
#include "src/model/synth.h"
#include "src/common/cli_files.h"

namespace topkv::cli {

namespace {

struct SynthArgs {
  std::string preset, arch = "llama", type, out;
  int layers = 0, width = 0, heads = 0, kv_heads = 0, head_dim = 0, ffn = 0, vocab = 0, context = 0;
  int sliding_window = 0, global_every = 0;
  float rope_base = 0, rope_base_local = 0, norm_eps = 0;
  uint64_t seed = 1;
  bool tied = false, force = false, quiet = false;
};

void run_synth(const SynthArgs& a, CLI::App* cmd) {
  auto given = [&](const char* name) { return cmd->get_option(name)->count() > 0; };
  SynthConfig c;
  if (!a.preset.empty()) {
    c = synth_preset(a.preset);
    if (given("--arch") && a.arch != c.arch)
      fail("--arch {} conflicts with --preset {} (a {} model); drop one of them", a.arch, a.preset, c.arch);
  } else {
    c = synth_defaults(a.arch);
  }
  if (given("--layers")) c.layers = a.layers;
  if (given("--width")) c.width = a.width;
  if (given("--heads")) c.heads = a.heads;
  if (given("--kv-heads")) c.kv_heads = a.kv_heads;
  if (given("--head-dim")) c.head_dim = a.head_dim;
  if (given("--ffn")) c.ffn = a.ffn;
  if (given("--vocab")) c.vocab = a.vocab;
  if (given("--context")) c.context = a.context;
  if (given("--rope-base")) c.rope_base = a.rope_base;
  if (given("--norm-eps")) c.norm_eps = a.norm_eps;
  if (given("--type")) c.type = ggml_type_from_name(a.type);
  if (given("--seed")) c.seed = a.seed;
  const bool gemma_only_given = given("--sliding-window") || given("--global-every") || given("--rope-base-local");
  if (c.arch == "gemma3") {
    if (given("--sliding-window")) c.sliding_window = a.sliding_window;
    if (given("--global-every")) c.global_every = a.global_every;
    if (given("--rope-base-local")) c.rope_base_local = a.rope_base_local;
    if (a.tied) fail("--tied: gemma3 always ties the output projection to token_embd");
  } else {
    if (gemma_only_given) fail("--sliding-window, --global-every and --rope-base-local apply to --arch gemma3 only");
    if (a.tied) c.tied_output = true;
  }
  synth_validate(c);
  for (int64_t ne0 : {(int64_t)c.width, (int64_t)c.heads * c.head_dim, (int64_t)c.ffn}) {
    GgmlType t = synth_matrix_type(c.type, ne0);
    if (t != c.type)
      fmt::print(stderr, "note: rows of {} elements are not a multiple of 256; those matrices use {} instead of {} "
                 "(as llama.cpp does)\n", ne0, ggml_type_info(t).name, ggml_type_info(c.type).name);
  }
  namespace fs = std::filesystem;
  if (fs::exists(a.out) && !a.force) fail("'{}' exists; pass --force to overwrite it", a.out);
  const uint64_t bytes = synth_file_bytes(c);
  fs::path dir = fs::absolute(a.out).parent_path();
  std::error_code ec;
  auto space = fs::space(dir, ec);
  if (!ec && space.available < bytes + (64u << 20))
    fail("'{}' needs about {} but only {} are free on its disk", a.out, format_bytes((double)bytes),
         format_bytes((double)space.available));
  if (bytes > (1ull << 30))
    fmt::print(stderr, "warning: writing a {} model ({} layers x {}); this takes a while\n",
               format_bytes((double)bytes), c.layers, c.width);
  synth_write(c, a.out, !a.quiet && bytes > (16u << 20));  // a bar only when it takes a moment
  if (!a.quiet)
    fmt::print("wrote {} ({}): {} {} layers, width {}, {}/{} heads of {}, ffn {}, vocab {}, {} weights\n", a.out,
               format_bytes((double)fs::file_size(a.out)), c.arch, c.layers, c.width, c.heads, c.kv_heads,
               c.head_dim, c.ffn, c.vocab, ggml_type_info(c.type).name);
}

// "architecture.key" as a string, or "" when absent.
std::string meta(const GgufFile& f, const std::string& key) {
  const GgufKV* kv = f.find_kv(key);
  return kv ? kv->value_string(4) : "";
}

void run_info(const std::string& path, bool show_tensors, size_t max_array) {
  auto f = GgufFile::open(path);
  const std::string arch = f->get_str_or("general.architecture", "?");
  fmt::print("file:          {} ({})\n", path, format_bytes((double)f->file_size()));
  fmt::print("format:        GGUF v{}, alignment {}, data at offset {}, content hash {:016x}\n", f->version(),
             f->alignment(), f->data_offset(), f->content_hash());
  fmt::print("architecture:  {}{}\n", arch,
             f->has("general.name") ? fmt::format("  ({})", f->get_str("general.name")) : "");
  struct { const char* label; std::string key; } geo[] = {
      {"layers", arch + ".block_count"},
      {"width", arch + ".embedding_length"},
      {"heads", arch + ".attention.head_count"},
      {"kv heads", arch + ".attention.head_count_kv"},
      {"head dim", arch + ".attention.key_length"},
      {"ffn", arch + ".feed_forward_length"},
      {"context", arch + ".context_length"},
      {"sliding window", arch + ".attention.sliding_window"},
      {"rope base", arch + ".rope.freq_base"},
      {"rope base (local)", arch + ".rope.freq_base_swa"},
      {"rms eps", arch + ".attention.layer_norm_rms_epsilon"},
  };
  std::string line;
  for (auto& g : geo)
    if (f->has(g.key)) line += fmt::format("{}{} {}", line.empty() ? "" : ", ", g.label, meta(*f, g.key));
  if (f->has("tokenizer.ggml.tokens"))
    line += fmt::format(", vocab {} ({})", f->get_arr_size("tokenizer.ggml.tokens"),
                        f->get_str_or("tokenizer.ggml.model", "?"));
  fmt::print("geometry:      {}\n", line.empty() ? "(no architecture keys)" : line);

  fmt::print("\nmetadata ({} keys):\n", f->metadata().size());
  for (auto& kv : f->metadata()) {
    std::string type = kv.type == GgufType::ARR ? fmt::format("arr[{}]", gguf_type_name(kv.arr_type))
                                                : gguf_type_name(kv.type);
    fmt::print("  {:<44} {:<9} {}\n", kv.key, type, kv.value_string(max_array));
  }

  std::map<std::string, std::pair<int, uint64_t>> by_type;  // count, bytes
  uint64_t params = 0, bytes = 0;
  if (show_tensors) fmt::print("\ntensors ({}):\n  {:<36} {:<6} {:<18} {:>10}\n", f->tensors().size(), "name", "type",
                               "shape", "bytes");
  for (auto& t : f->tensors()) {
    std::string type = ggml_type_info(t.type).name;
    if (show_tensors)
      fmt::print("  {:<36} {:<6} {:<18} {:>10}\n", t.name, type, t.shape_string(), format_bytes((double)t.nbytes));
    by_type[type].first++;
    by_type[type].second += t.nbytes;
    params += (uint64_t)t.nelements();
    bytes += t.nbytes;
  }
  fmt::print("\ntotals: {} tensors, {:.1f} M parameters, {} of weights ({:.2f} bits per weight)\n",
             f->tensors().size(), params / 1e6, format_bytes((double)bytes), params ? 8.0 * bytes / params : 0.0);
  for (auto& [type, cb] : by_type)
    fmt::print("  {:<6} {:>4} tensors  {:>10}\n", type, cb.first, format_bytes((double)cb.second));
}

}  // namespace

void register_model(CLI::App& app) {
  auto* model = app.add_subcommand("model", "GGUF models: write synthetic ones, describe any");
  model->require_subcommand(1);

  auto a = std::make_shared<SynthArgs>();
  auto* synth = model->add_subcommand(
      "synth", "Write a random-weight GGUF model of any llama, gemma3 or qwen2 geometry (for tests and benchmarks): "
               "tensor names and metadata as in real files, a small SentencePiece vocabulary");
  std::string presets;
  for (auto& n : synth_preset_names()) presets += (presets.empty() ? "" : ", ") + n;
  synth->add_option("-o,--output", a->out, "Output .gguf path (written atomically)")->check(output_file("model"))->required();
  synth->add_option("--preset", a->preset, "Start from a named geometry: " + presets +
                                               " (llama3-8b is ~4.6 GB at q4_k); other flags override it");
  synth->add_option("--arch", a->arch, "Architecture: llama, gemma3 or qwen2 (qwen2: llama plus q/k/v biases and "
                    "NeoX RoPE; default llama)");
  synth->add_option("--layers", a->layers, "Transformer blocks (default 2)");
  synth->add_option("--width", a->width, "Embedding width (default 256)");
  synth->add_option("--heads", a->heads, "Query heads (default 4)");
  synth->add_option("--kv-heads", a->kv_heads, "KV heads; must divide --heads (default llama 2, gemma3 1)");
  synth->add_option("--head-dim", a->head_dim, "Head dimension, even (default 64)");
  synth->add_option("--ffn", a->ffn, "FFN hidden size (default 512)");
  synth->add_option("--vocab", a->vocab, "Vocabulary size, >= the special + 256 byte + character tokens "
                                         "(default 1024)");
  synth->add_option("--context", a->context, "context_length metadata (default 4096)");
  synth->add_option("--sliding-window", a->sliding_window, "gemma3: window of the local layers (default 512)");
  synth->add_option("--global-every", a->global_every,
                    "gemma3: layer i is global when (i+1) is a multiple of this (default 6: layers 5, 11, ...)");
  synth->add_option("--rope-base", a->rope_base, "RoPE base (llama default 1e4; qwen2 1e6; gemma3: global layers, 1e6)");
  synth->add_option("--rope-base-local", a->rope_base_local, "gemma3: RoPE base of the local layers (default 1e4)");
  synth->add_option("--norm-eps", a->norm_eps, "RMSNorm epsilon (llama 1e-5, gemma3 and qwen2 1e-6)");
  synth->add_option("--type", a->type, "Weight type of the matrices and token_embd: f32 f16 bf16 q8_0 q4_0 q4_1 "
                                       "q5_0 q5_1 q4_k q5_k q6_k (default f32; norms are always f32)");
  synth->add_option("--seed", a->seed, "Random seed (default 1); the same seed writes the same file")->check(seed_value());
  synth->add_flag("--tied", a->tied, "llama, qwen2: no output.weight, logits use token_embd (gemma3 always ties)");
  synth->add_flag("--force", a->force, "Overwrite the output file if it exists");
  synth->add_flag("-q,--quiet", a->quiet, "No progress bar or summary");
  synth->callback([a, synth] { run_synth(*a, synth); });

  auto path = std::make_shared<std::string>();
  auto no_tensors = std::make_shared<bool>(false);
  auto max_array = std::make_shared<size_t>(8);
  auto* info = model->add_subcommand("info", "Describe a GGUF file: architecture, geometry, all metadata (arrays "
                                             "abbreviated), the tensor table with types and sizes, totals");
  info->add_option("file", *path, "The .gguf file")->required();
  info->add_flag("--no-tensors", *no_tensors, "Leave out the tensor table (totals are still printed)");
  info->add_option("--max-array", *max_array, "Array elements to show per metadata key (default 8)");
  info->callback([path, no_tensors, max_array] { run_info(*path, !*no_tensors, *max_array); });
}

}  // namespace topkv::cli
