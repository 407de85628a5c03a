// topkv kv dump: prefill a text, decode a few greedy steps, and write the
// chosen layers' post-RoPE keys, values and decode queries to safetensors
// (bench/kv_dump.h), readable by `topkv bench recall --dump` and numpy/PyTorch.
#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "bench/kv_dump.h"
#include "src/cli/cli_util.h"
#include "src/cli/commands.h"
#include "src/common/error.h"
#include "src/common/options.h"
#include "src/common/progress.h"
#include "src/eval/kv_recorder.h"
#include "src/model/model.h"
#include "src/model/tokenizer.h"
#include "src/common/cli_files.h"
#include "src/common/file_io.h"

namespace topkv::cli {
namespace {

struct KvDumpArgs {
  std::string model, text_file, prompt, out, layers, dtype = "f16";
  int queries = 16, chunk = 256, threads = 0;
  int64_t max_tokens = 0;
};

void run_kv_dump(const KvDumpArgs& a) {
  TOPKV_CHECK(!a.out.empty(), "give the output file with -o dump.safetensors");
  TOPKV_CHECK(a.queries >= 1, "--queries must be at least 1");
  TOPKV_CHECK(a.prompt.empty() != a.text_file.empty(), "give the text either with -f file or with -p text");
  std::string text = a.prompt;
  if (!a.text_file.empty()) {
    text = read_text_input(a.text_file, "text file", 1ull << 30);
  }
  const std::string model_path = a.model.empty() ? default_model_path() : a.model;
  std::shared_ptr<const GgufFile> file = GgufFile::open(model_path);
  const Tokenizer tok = Tokenizer::from_gguf(*file);
  const ModelConfig cfg = read_model_config(*file);
  std::vector<int32_t> ids = tok.encode(text, tok.add_bos_default(), false);
  if (a.max_tokens > 0 && (int64_t)ids.size() > a.max_tokens) ids.resize((size_t)a.max_tokens);
  TOPKV_CHECK(ids.size() >= 2, "the text encodes to {} tokens: too short to dump", ids.size());
  std::vector<int> layers;
  if (a.layers.empty()) {
    for (int il = 0; il < cfg.n_layer; ++il)
      if (cfg.layers[(size_t)il].window == 0) layers.push_back(il);
  } else {
    for (int64_t l : parse_sweep(a.layers)) layers.push_back((int)l);
  }
  KvRecorder rec(cfg, layers, parse_dtype(a.dtype));
  auto backend = make_cpu_backend({a.threads});
  ModelOptions mo;
  mo.n_ctx = (int64_t)ids.size() + a.queries + 1;
  mo.max_chunk = std::min<int>(a.chunk, (int)ids.size());
  Model model(file, *backend, mo);
  Progress bar("prefill", (int64_t)ids.size(), "tok", ids.size() > (size_t)mo.max_chunk);
  std::vector<float> logits = model.prefill(ids, mo.max_chunk, false, [&](int64_t d) { bar.set(d); });
  bar.finish();
  rec.take_prefill(model);
  model.set_attention_override(&rec);
  for (int s = 0; s < a.queries; ++s) {
    const int32_t next = (int32_t)(std::max_element(logits.begin(), logits.end()) - logits.begin());
    logits = model.decode(next);
  }
  KvDumpWriter w(fmt::format("{} ({})", file->get_str_or("general.name", model_path), model_path));
  for (size_t i = 0; i < rec.layers().size(); ++i) w.add_layer(rec.layers()[i], rec.data(i));
  w.write(a.out);
  fmt::print(stderr, "wrote {}: layers {}, {} keys x {} KV heads x {} dims, {} decode queries x {} heads ({})\n",
             a.out, a.layers.empty() ? "all full-context" : a.layers, rec.prompt_tokens(), cfg.n_head_kv,
             cfg.head_dim, a.queries, cfg.n_head, a.dtype);
}

}  // namespace

void register_kv(CLI::App& app) {
  auto* kv = app.add_subcommand("kv", "KV-cache tools");
  kv->require_subcommand(1);
  auto a = std::make_shared<KvDumpArgs>();
  auto* cmd = kv->add_subcommand("dump", "Prefill a text and write keys, values and the next decode steps' queries "
                                 "of chosen layers to safetensors (for bench recall --dump, numpy, PyTorch)");
  cmd->add_option("-m,--model", a->model,
                  fmt::format("GGUF model file (default: {}, installed by scripts/fetch-model.sh)", kDefaultModel));
  cmd->add_option("-f,--file", a->text_file, "Text to prefill");
  cmd->add_option("-p,--prompt", a->prompt, "Text to prefill, given inline");
  cmd->add_option("-o,--out", a->out, "Output .safetensors file")->check(output_file("KV dump"))->required();
  cmd->add_option("--layers", a->layers, "Layers to dump, e.g. 5,11,17 (default: every full-context layer)");
  cmd->add_option("--queries", a->queries, "Greedy decode steps whose queries are recorded")->capture_default_str();
  cmd->add_option("--max-tokens", a->max_tokens, "Cut the text to this many tokens (0 = all)");
  cmd->add_option("--dtype", a->dtype, "Key/value element type in the file: f16, bf16 or f32")
      ->check(CLI::IsMember({"f16", "bf16", "f32"}))->capture_default_str();
  cmd->add_option("--chunk", a->chunk, "Prefill chunk")->capture_default_str();
  cmd->add_option("--threads", a->threads, "CPU threads (0 = OpenMP default)")->check(thread_count());
  cmd->callback([a] { run_kv_dump(*a); });
}

}  // namespace topkv::cli
