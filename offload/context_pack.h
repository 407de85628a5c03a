// Context packs (DESIGN.md, "Index build tool"): a long document prefilled
// once (on rented compute, say) and saved with everything a later
// `topkv generate --pack` needs to go on from it without prefilling again:
// the top-k layers' host stores and built indexes, their sinks and windows,
// the KV the model attends itself (dense and sliding-window layers), the
// context's tokens and the logits after its last token (the "fixed context"
// use of Squeezed Attention, Sec. 1; "prefill once, query many times" of the
// top-k paper). Loading maps the file: stores are used in place, indexes are
// loaded, not rebuilt, so each query pays only for what it reads.
//
// File: offload/pack_file.h (safetensors + per-tensor checksums). Tensors:
//   tokens                        I32 [n]
//   logits                        F32 [n_vocab]      after the last context token
//   model.L<l>.k, model.L<l>.v    kv type [n_head_kv][m][head_dim]: positions [n - m, n) of each
//                                 layer the model attends itself (m = n for a dense full-context
//                                 layer, min(n, window) for a sliding-window one)
//   offload.L<l>.h<h>.*           each top-k layer (OffloadedLayer::save)
// Metadata "topkv.context_pack" (JSON):
//   format        1 (a reader refuses newer formats)
//   tokens        n
//   model         {path, content_hash (GgufFile::content_hash, 16 hex digits), arch, summary}
//   policy        OffloadPolicy::to_json: the fields fixed at build (index and its parameters,
//                 sinks, window, dense_layers, store_type, head pattern) and the query-time
//                 defaults (k, k schedule, ef, ...) a run may change
//   kv_type       element type of the model.* tensors
//   model_layers  [{layer, from}] for the model.* tensors
//   offload       OffloadRuntime::save: tokens, retrieval_layers, streaming masks
//   build         {source, prefill_s, index_build_s, topkv}: provenance, not used to load
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "offload/offload_runtime.h"
#include "offload/pack_file.h"
#include "src/model/gguf.h"
#include "src/model/model.h"

namespace topkv {

// Writes the context `model` holds (prefilled with `tokens`, whose last
// logits are `logits`) and what `rt` took from it (after take_prefill) to
// `path`, atomically. `file` is the model's GGUF file; `build` goes into the
// metadata as is.
void save_context_pack(const std::string& path, const GgufFile& file, const Model& model, const OffloadRuntime& rt,
                       std::span<const int32_t> tokens, std::span<const float> logits, const nlohmann::json& build);

class ContextPack {
 public:
  // Maps the pack and reads its metadata; Error when it is not a context
  // pack or comes from a newer topkv.
  explicit ContextPack(const std::string& path);

  const PackReader& file() const { return *file_; }
  const nlohmann::json& meta() const { return file_->meta(); }
  int64_t n_tokens() const { return n_tokens_; }
  std::vector<int32_t> tokens() const;
  const OffloadPolicy& policy() const { return policy_; }  // as built

  // Error unless `f` is the model the pack was built with (content hash).
  void check_model(const GgufFile& f) const;
  // The policy to run on this pack: `requested` (the pack's policy with the
  // run's changes) after checking that it changes no field fixed at build;
  // an Error names the field and says to rebuild. Its head-pattern file is
  // dropped: the pack carries the streaming heads.
  OffloadPolicy policy_for_run(const OffloadPolicy& requested) const;
  // Puts the context into `model` (fresh: n_past() 0, context size >= the
  // pack's tokens) and `rt` (built with policy_for_run): the model's own
  // layers get their KV, the top-k layers take the pack (take_pack), the
  // model resumes at position n with `rt` as its attention override and
  // gives back the caches of the layers `rt` serves. Returns the logits
  // after the last context token.
  std::vector<float> restore(Model& model, OffloadRuntime& rt) const;

 private:
  std::unique_ptr<PackReader> file_;
  int64_t n_tokens_ = 0;
  OffloadPolicy policy_;
};

}  // namespace topkv
