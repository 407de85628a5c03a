#include "offload/context_pack.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cstring>

#include "src/common/binary_io.h"
#include "src/common/error.h"

namespace topkv {

namespace {

// 1: each index one blob. 2: an index's large arrays are tensors of their own
// (used in place); packs of format 1 still load (their indexes are copied).
constexpr int kPackFormat = 2;

std::string hash_hex(uint64_t h) { return fmt::format("{:016x}", h); }

// The positions [from, n) of model layer `il` that a pack keeps: all of a
// full-context layer, the window of a sliding-window one (the only keys its
// later queries see).
int64_t kept_from(const ModelConfig& cfg, int il, int64_t n) {
  const int64_t window = cfg.layers[(size_t)il].window;
  return window > 0 ? std::max<int64_t>(0, n - window) : 0;
}

std::string model_tensor(int il, const char* kv) { return fmt::format("model.L{}.{}", il, kv); }

// Tokenizer identity: every tokenizer.* metadata entry, keys, types and values.
uint64_t tokenizer_hash(const GgufFile& f) {
  uint64_t h = fnv1a64(nullptr, 0);
  const auto add = [&h](const void* p, size_t n) { h = fnv1a64(&n, sizeof n, fnv1a64(p, n, h)); };
  for (const GgufKV& kv : f.metadata()) {
    if (kv.key.rfind("tokenizer.", 0) != 0) continue;
    add(kv.key.data(), kv.key.size());
    add(&kv.type, sizeof kv.type);
    add(&kv.i, sizeof kv.i), add(&kv.u, sizeof kv.u), add(&kv.f, sizeof kv.f);
    add(kv.str.data(), kv.str.size());
    add(&kv.arr_type, sizeof kv.arr_type), add(&kv.arr_count, sizeof kv.arr_count);
    if (kv.arr_data) add(kv.arr_data, (size_t)kv.arr_count * gguf_type_size(kv.arr_type));
    for (std::string_view s : kv.arr_str) add(s.data(), s.size());
  }
  return h;
}

nlohmann::json layout_json(const ModelConfig& c) {
  nlohmann::json layers = nlohmann::json::array();
  for (const LayerConfig& l : c.layers)
    layers.push_back({{"window", l.window},
                      {"rope",
                       {{"style", l.rope.style == RopeStyle::NeoX ? "neox" : "interleaved"},
                        {"n_rot", l.rope.n_rot},
                        {"base", l.rope.base},
                        {"freq_scale", l.rope.freq_scale},
                        {"freq_factors", l.rope.freq_factors != nullptr}}}});
  return {{"n_layer", c.n_layer}, {"n_head", c.n_head},     {"n_head_kv", c.n_head_kv},   {"head_dim", c.head_dim},
          {"n_vocab", c.n_vocab}, {"attn_scale", c.attn_scale}, {"layers", layers}};
}

}  // namespace

void save_context_pack(const std::string& path, const GgufFile& file, const Model& model, const OffloadRuntime* rt,
                       std::span<const int32_t> tokens, std::span<const float> logits, const nlohmann::json& build) {
  const ModelConfig& cfg = model.config();
  const int64_t n = model.n_past();
  TOPKV_CHECK(n >= 1 && (int64_t)tokens.size() == n, "internal: a pack of {} tokens from a model holding {}",
              tokens.size(), n);
  TOPKV_CHECK((int64_t)logits.size() == cfg.n_vocab, "internal: {} logits for a vocabulary of {}", logits.size(),
              cfg.n_vocab);
  PackWriter w;
  w.add("tokens", StDType::I32, {n}, {{tokens.data(), tokens.size_bytes()}});
  w.add("logits", StDType::F32, {cfg.n_vocab}, {{logits.data(), logits.size_bytes()}});
  // The layers the model attends itself, in its cache's element type (f16
  // keys stay f16: the restored context equals the one that was built).
  const DType kv_type = model.options().kv_dtype;
  nlohmann::json model_layers = nlohmann::json::array();
  std::vector<float> k, v;
  for (int il = 0; il < cfg.n_layer; ++il) {
    if (rt && rt->overrides(il)) continue;
    const int64_t from = kept_from(cfg, il, n);
    model.read_kv(il, k, v, from);
    for (auto [src, what] : {std::pair{&k, "k"}, std::pair{&v, "v"}}) {
      std::vector<uint8_t> bytes(src->size() * dtype_size(kv_type));
      from_f32(kv_type, src->data(), bytes.data(), src->size());
      w.add_owned(model_tensor(il, what), st_dtype_of(kv_type), {cfg.n_head_kv, n - from, cfg.head_dim},
                  std::move(bytes));
    }
    model_layers.push_back({{"layer", il}, {"from", from}});
  }
  if (rt) rt->save(w);
  nlohmann::json& m = w.meta();
  m["format"] = kPackFormat;
  m["tokens"] = n;
  m["model"] = {{"path", file.path()},
                {"content_hash", hash_hex(file.content_hash())},
                {"arch", arch_name(cfg.arch)},
                {"summary", cfg.summary()}};
  m["tokenizer"] = {{"model", file.get_str_or("tokenizer.ggml.model", "?")},
                    {"tokens", file.has("tokenizer.ggml.tokens") ? file.get_arr_size("tokenizer.ggml.tokens") : 0},
                    {"hash", hash_hex(tokenizer_hash(file))}};
  m["layout"] = layout_json(cfg);
  OffloadPolicy dense;
  dense.attn = AttnMode::Dense;
  m["policy"] = nlohmann::json::parse(rt ? rt->policy().to_json() : dense.to_json());
  m["kv_type"] = dtype_name(kv_type);
  m["model_layers"] = model_layers;
  m["build"] = build;
  m["build"]["topkv"] = TOPKV_VERSION;
  w.write(path);
}

ContextPack::ContextPack(const std::string& path, bool verify) : file_(std::make_unique<PackReader>(path)) {
  const nlohmann::json& m = meta();
  try {
    const int format = m.at("format").get<int>();
    TOPKV_CHECK(format >= 1 && format <= kPackFormat, "context pack '{}' has format {}, this topkv reads formats "
                "1..{}: upgrade topkv or rebuild the pack", path, format, kPackFormat);
    n_tokens_ = m.at("tokens").get<int64_t>();
    policy_.apply_json(m.at("policy").dump(), path + " (policy)");
    for (const char* key : {"path", "content_hash", "summary"}) m.at("model").at(key).get<std::string>();
    m.at("tokenizer").at("hash").get<std::string>();
    for (const char* key : {"layout", "kv_type", "model_layers"}) m.at(key);
    if (topk()) indexes_ = m.at("offload").at("indexes").get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail("context pack '{}' has incomplete metadata ({}): rebuild it with `topkv index build`", path, e.what());
  }
  TOPKV_CHECK(n_tokens_ >= 1, "context pack '{}' holds no tokens", path);
  if (verify) file_->verify_all(/*progress=*/true);
}

std::vector<int32_t> ContextPack::tokens() const {
  const auto* p = reinterpret_cast<const int32_t*>(file_->tensor("tokens", StDType::I32, {n_tokens_}));
  return std::vector<int32_t>(p, p + n_tokens_);
}

void ContextPack::check_model(const GgufFile& f) const {
  const nlohmann::json& m = meta().at("model");
  const std::string want = m.at("content_hash").get<std::string>(), have = hash_hex(f.content_hash());
  TOPKV_CHECK(want == have, "context pack '{}' was built with the model {} ({}, content hash {}), not with {} "
              "(content hash {}): give that model with -m", file_->path(), m.at("path").get<std::string>(),
              m.at("summary").get<std::string>(), want, f.path(), have);
}

OffloadPolicy ContextPack::policy_for_run(const OffloadPolicy& p, bool model_holds_context) const {
  const OffloadPolicy& b = policy_;
  if (!topk()) {
    TOPKV_CHECK(p.attn == AttnMode::Dense, "context pack '{}' was built with --attn dense: it holds the model's full "
                "caches and no index; decode it with --attn dense, or rebuild it with `topkv index build --attn "
                "topk`", file_->path());
    return p;
  }
  TOPKV_CHECK(p.attn == AttnMode::TopK, "context pack '{}' was built with --attn topk (its top-k layers keep their "
              "KV in host stores, not in the model's cache): drop --attn dense, or rebuild it with --attn dense",
              file_->path());
  TOPKV_CHECK(std::find(indexes_.begin(), indexes_.end(), canonical_spec(p.index)) != indexes_.end(),
              "context pack '{}' holds the indexes {}, not {}: query one of those (--index), or rebuild the pack "
              "with `topkv index build --index {}`", file_->path(), fmt::join(indexes_, ", "), p.index, p.index);
  const auto fixed = [&](bool same, const char* flag, const std::string& built, const std::string& asked) {
    TOPKV_CHECK(same, "context pack '{}' was built with {} {}; this run asks for {}: {} is fixed when the pack is "
                "built (drop it here, or rebuild the pack with `topkv index build` to change it)", file_->path(), flag,
                built, asked, flag);
  };
  fixed(b.sinks == p.sinks, "--sinks", std::to_string(b.sinks), std::to_string(p.sinks));
  fixed(b.window == p.window, "--window", std::to_string(b.window), std::to_string(p.window));
  if (model_holds_context)
    TOPKV_CHECK(p.dense_layers >= b.dense_layers, "context pack '{}' was built with --dense-layers {}: it holds no "
                "index for layers {}..{}, which --dense-layers {} would serve with top-k; use {} or more",
                file_->path(), b.dense_layers, p.dense_layers, b.dense_layers - 1, p.dense_layers, b.dense_layers);
  else
    fixed(b.dense_layers == p.dense_layers, "--dense-layers", std::to_string(b.dense_layers),
          std::to_string(p.dense_layers));
  fixed(b.store_dtype == p.store_dtype, "--store-type", dtype_name(b.store_dtype), dtype_name(p.store_dtype));
  const auto at = [](const OffloadPolicy& x) {
    const std::string s = store_type_at_spec(x);
    return s.empty() ? std::string("(none)") : s;
  };
  fixed(at(b) == at(p), "--store-type-at", at(b), at(p));
  const auto heads = [](const OffloadPolicy& x) {
    return x.heads_file.empty() ? std::string("(none)")
                                : fmt::format("{} (threshold {}, sparsity {})", x.heads_file, x.heads_threshold,
                                              x.heads_sparsity);
  };
  fixed(heads(b) == heads(p), "--heads", heads(b), heads(p));
  OffloadPolicy run = p;
  run.heads_file.clear();  // the pack's streaming masks stand (OffloadRuntime::take_pack)
  // Its indexes are built: where the build ran (--build-on gpu when the pack was
  // made) does not bind a run that only restores them, on any backend.
  run.build_on = BuildOn::Host;
  return run;
}

std::vector<float> ContextPack::restore(Model& model, OffloadRuntime* rt) const {
  const ModelConfig& cfg = model.config();
  const int64_t n = n_tokens_;
  TOPKV_CHECK((rt != nullptr) == topk(), "internal: a {} pack restored {} an offloaded runtime",
              topk() ? "top-k" : "dense", rt ? "with" : "without");
  TOPKV_CHECK(model.n_past() == 0, "internal: restoring a context pack into a model that holds {} tokens",
              model.n_past());
  TOPKV_CHECK(n <= model.options().n_ctx, "context pack '{}' holds {} tokens, more than the context size {}: raise "
              "it (-c)", file_->path(), n, model.options().n_ctx);
  // The model's own layers: the pack must hold exactly those this run does not serve.
  std::vector<std::pair<int, int64_t>> want, have;
  for (int il = 0; il < cfg.n_layer; ++il)
    if (!rt || !rt->overrides(il)) want.emplace_back(il, kept_from(cfg, il, n));
  DType kv_type = DType::F32;
  try {
    kv_type = parse_dtype(meta().at("kv_type").get<std::string>());
    for (auto& e : meta().at("model_layers")) have.emplace_back(e.at("layer").get<int>(), e.at("from").get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    fail("context pack '{}' has incomplete metadata ({}): rebuild it", file_->path(), e.what());
  }
  TOPKV_CHECK(want == have, "context pack '{}' keeps the KV of {} model layers, this run needs {}: the pack's model "
              "or --dense-layers differ", file_->path(), have.size(), want.size());
  // Position blocks: bounded memory for a whole-context dense layer.
  const int64_t block = 4096, hd = cfg.head_dim, nkv = cfg.n_head_kv;
  const size_t es = dtype_size(kv_type);
  std::vector<float> k, v;
  for (auto [il, from] : want) {
    const int64_t m = n - from;
    const uint8_t* src[2];
    for (int j = 0; j < 2; ++j) src[j] = file_->tensor(model_tensor(il, j ? "v" : "k"), st_dtype_of(kv_type), {nkv, m, hd});
    for (int64_t b0 = 0; b0 < m; b0 += block) {
      const int64_t len = std::min(block, m - b0);
      k.resize((size_t)(nkv * len * hd));
      v.resize(k.size());
      for (int64_t h = 0; h < nkv; ++h)
        for (int j = 0; j < 2; ++j)
          to_f32(kv_type, src[j] + (size_t)((h * m + b0) * hd) * es, (j ? v : k).data() + (size_t)(h * len * hd),
                 (size_t)(len * hd));
      model.write_kv(il, k.data(), v.data(), from + b0, len);
    }
  }
  if (rt) rt->take_pack(*file_);
  model.set_n_past(n);
  const auto* lp = reinterpret_cast<const float*>(file_->tensor("logits", StDType::F32, {cfg.n_vocab}));
  return std::vector<float>(lp, lp + cfg.n_vocab);
}

ContextPack::LoadSplit ContextPack::load_split(int index_slot) const {
  LoadSplit c;
  const std::string blob_suffix = fmt::format(".index.{}", index_slot), array_infix = blob_suffix + ".";
  for (const TensorInfo& t : file_->tensors()) {
    const std::string& s = t.name;
    const auto ends = [&](const std::string& suffix) {
      return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
    };
    if (ends(".keys") || ends(".values")) {
      c.stores += t.nbytes();
    } else if (ends(blob_suffix)) {
      c.index_blobs += t.nbytes();
    } else if (s.find(array_infix) != std::string::npos) {
      c.index_arrays += t.nbytes();
    }
  }
  return c;
}

}  // namespace topkv
