// Context packs (DESIGN.md, "Index build tool"; issue 6): a long context
// prefilled once (on rented compute, say) and saved with everything a later
// `topkv generate --pack` needs to go on from it without prefilling again:
// the top-k layers' host stores and built indexes, their sinks and windows,
// the KV the model attends itself (dense and sliding-window layers), the
// context's tokens and the logits after its last token (the "fixed context"
// use of Squeezed Attention, Sec. 1; "prefill once, query many times" of the
// top-k paper). A pack built with --attn dense holds the full caches instead.
//
// Loading maps the file and checks every checksum (before any other work);
// the stores are then used in place: their whole chunks from the read-only
// mapping, each one's last partial chunk (< RowStore::kChunkRows rows)
// through a copy-on-write mapping with room to append. The CUDA runtime
// copies them into pinned memory instead, since its kernels read retrieved
// rows from the store and cannot read file pages on the GPU host
// (gpu/gpu_offload_runtime.h), unless --stage-rows (the host then copies each
// step's retrieved rows to the GPU). The large arrays
// of the quest, centroid and multipole indexes (bounds, centroids, counts,
// member lists, value means) are tensors of their own, used in place through
// private copy-on-write mappings (index/host_array.h): a decode step that
// folds keys into a cluster gets its own copy of the pages it changes, the
// file and the next restore see none of it. hnswlib and Faiss indexes are one
// blob their library deserialises (neither can search a mapping). `topkv
// index info` prints the amounts.
//
// File: offload/pack_file.h (safetensors + per-tensor checksums). Tensors:
//   tokens                        I32 [n]
//   logits                        F32 [n_vocab]      after the last context token
//   model.L<l>.k, model.L<l>.v    kv type [n_head_kv][m][head_dim]: positions [n - m, n) of each
//                                 layer the model attends itself (m = n for a full-context layer,
//                                 min(n, window) for a sliding-window one)
//   offload.L<l>.h<h>.*           each top-k layer (OffloadedLayer::save): sinks_k/v, window_k/v,
//                                 keys, values, index.<i> (an index's blob, KvIndex::save_bytes)
//                                 and index.<i>.<array> (its arrays, index/index_arrays.h)
// Manifest "topkv.context_pack" (JSON):
//   format        2 (1: each index one blob, arrays inline; read still. A reader refuses newer formats)
//   tokens        n
//   model         {path, content_hash (GgufFile::content_hash, 16 hex digits), arch, summary}
//   tokenizer     {model, tokens, hash}: FNV-1a 64 of every tokenizer.* metadata entry
//   layout        {n_layer, n_head, n_head_kv, head_dim, n_vocab, attn_scale,
//                  layers: [{window, rope: {style, n_rot, base, freq_scale, freq_factors}}]}
//   policy        OffloadPolicy::to_json: attn; for top-k the fields fixed at build (index,
//                 sinks, window, dense_layers, store_type, head pattern) and the query-time
//                 defaults (k, k schedule, ef, ...) a run may change
//   kv_type       element type of the model.* tensors
//   model_layers  [{layer, from}] for the model.* tensors
//   offload       (top-k) OffloadRuntime::save: tokens, retrieval_layers, streaming, indexes
//   build         {source, prefill_s, index_build_s, created, topkv}: provenance
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
// logits are `logits`) to `path`: with `rt` (after take_prefill; its extra
// indexes included) a top-k pack, without one a dense pack of the model's
// caches. `file` is the model's GGUF file; `build` goes into the manifest.
void save_context_pack(const std::string& path, const GgufFile& file, const Model& model, const OffloadRuntime* rt,
                       std::span<const int32_t> tokens, std::span<const float> logits, const nlohmann::json& build);

class ContextPack {
 public:
  // Maps the pack, reads its manifest and (verify) checks every tensor's
  // checksum; Error when it is not a context pack, comes from a newer topkv,
  // or is corrupted or truncated.
  explicit ContextPack(const std::string& path, bool verify = true);

  const PackReader& file() const { return *file_; }
  const nlohmann::json& meta() const { return file_->meta(); }
  int64_t n_tokens() const { return n_tokens_; }
  std::vector<int32_t> tokens() const;
  const OffloadPolicy& policy() const { return policy_; }  // as built
  bool topk() const { return policy_.attn == AttnMode::TopK; }
  const std::vector<std::string>& indexes() const { return indexes_; }  // built in (top-k), canonical specs

  // Error unless `f` is the model the pack was built with: its content hash
  // covers every metadata entry (tokenizer, layout and RoPE included; the
  // manifest records those for people and tools) and a sample of every tensor.
  void check_model(const GgufFile& f) const;
  // The policy to run on this pack: `requested` (the pack's policy with the
  // run's changes) after checking it: the same attention mode; for top-k an
  // index built into the pack and no other change of a field fixed at build.
  // An Error names the field and the pack's value. The head-pattern file is
  // dropped: the pack carries the streaming heads. `model_holds_context`:
  // the model keeps every layer's KV of the context already (an evaluation
  // prefilled it densely, src/eval/shared_context.h), so the run may keep
  // more first layers dense than the pack did: its top-k layers are then a
  // subset of the pack's, which take_pack restores alone.
  OffloadPolicy policy_for_run(const OffloadPolicy& requested, bool model_holds_context = false) const;
  // Puts the context into `model` (n_past() 0, context size >= the pack's
  // tokens) and, for a top-k pack, `rt` (built with policy_for_run): the
  // model's own layers get their KV, the top-k layers take the pack
  // (take_pack) and the model resumes at position n. The caller then sets
  // `rt` as the model's attention override (attach_runtime,
  // src/session/session.h). Returns the logits after the last context token.
  // May be called again (after Model::reset, with a fresh runtime) to start
  // over from the pack.
  std::vector<float> restore(Model& model, OffloadRuntime* rt) const;

  // What a restore of `index_slot` uses in place and what it copies (see
  // the header comment): the stores (in place, except the CUDA runtime's
  // pinned copies), each index's arrays (in place, copy-on-write) and its
  // blob (deserialised: all of an hnswlib or Faiss index, the header of the
  // others).
  struct LoadSplit {
    uint64_t stores = 0, index_blobs = 0, index_arrays = 0;
  };
  LoadSplit load_split(int index_slot = 0) const;

 private:
  std::unique_ptr<PackReader> file_;
  int64_t n_tokens_ = 0;
  OffloadPolicy policy_;
  std::vector<std::string> indexes_;
};

}  // namespace topkv
