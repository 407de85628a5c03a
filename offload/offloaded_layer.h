// OffloadedLayer: the KV of one retrieval layer, split three ways per KV head
// (DESIGN.md, "One decode step"):
//
//   positions [0, S)            attention sinks       exact, always attended
//   positions [S, N - W)        host store + index    searched, top-k attended
//   positions [N - W, N)        window (recent)       exact, always attended
//
// The three parts are disjoint by construction — store row r is position
// S + r, and a token enters the store only when it leaves the window — so the
// log-sum-exp merge never counts a token twice. When the window is full its
// oldest token moves to the store and to that head's index.
//
// Streaming heads (DuoAttention) keep only sinks + window: evicted tokens are
// dropped and they have no index. This class is the CPU runtime and the
// reference for the CUDA one; inputs are fp32, token-major:
//   keys/values: [n_tokens][kv_heads][head_dim], queries: [n_heads][head_dim],
//   output: [n_heads][head_dim], query head g reads KV head g / (n_heads / kv_heads).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "offload/partial_attention.h"
#include "index/kv_index.h"
#include "offload/policy.h"
#include "src/model/kv_past.h"

namespace topkv {

class PackWriter;
class PackReader;

struct AttendStats {
  int64_t retrieved = 0;     // distinct store rows attended, summed over KV heads
  int64_t far_clusters = 0;  // multipole summaries attended, summed over KV heads
  int64_t exact = 0;         // sink + window tokens attended, summed over KV heads
  double search_s = 0;       // wall time in index searches (max over parallel heads)
};

class OffloadedLayer {
 public:
  struct Config {
    int n_heads = 1, kv_heads = 1, head_dim = 64;
    int sinks = 4, window = 256;
    int64_t k = 64;                 // this layer's k (or token budget)
    SearchParams search;            // other search parameters (k is overwritten)
    std::string index = "flat";     // KvIndex spec
    DType store_dtype = DType::F16; // host store element type
    std::vector<char> streaming;    // [kv_heads], 1 = streaming head (empty = none)
    int fold_every = 16;            // fold store rows into the index once this many are pending
    int search_threads = 1;         // threads each head's search may use (heads already run in parallel)
    BuildOptions build;
    RowStore::ChunkAllocator store_alloc;  // where store chunks live (empty: heap; GPU runtime: pinned)
    // More index specs built beside `index` at prefill, for a context pack
    // (`topkv index build --index A --index B`): saved, never searched.
    std::vector<std::string> extra_indexes;
  };

  // One KV head's retrieval at one step: what decode attends besides sinks
  // and window. A streaming head's entry is empty.
  struct Retrieved {
    std::vector<int64_t> ids;      // store rows, distinct
    std::vector<float> scores;     // [group][ids.size()]: exact raw q_g . key(id) (not scaled)
    std::vector<AttnPartial> far;  // [group]: Multipole far-field part (empty partials when none)
    int64_t far_clusters = 0;
    double search_s = 0;
  };

  explicit OffloadedLayer(Config cfg);

  // Takes the prompt's keys and values (post-RoPE keys), fills sinks, store and
  // window, and builds each retrieval head's index (heads in parallel).
  // Element (token t, KV head h, dim j) is at base + t*token_stride + h*head_stride + j;
  // the short form is token-major [t][kv_heads][head_dim].
  void prefill(const float* keys, const float* values, int64_t n_tokens, size_t token_stride,
               size_t head_stride);
  void prefill(const float* keys, const float* values, int64_t n_tokens) {
    prefill(keys, values, n_tokens, (size_t)cfg_.kv_heads * cfg_.head_dim, (size_t)cfg_.head_dim);
  }
  // prefill() in pieces, as a chunked prefill produces them: begin_prefill
  // fixes the context length (so where sinks, store and window end);
  // prefill_rows takes positions [t0, t0 + m) in order, `keys` pointing at
  // position t0 with the same strides as prefill(); end_prefill builds the
  // indexes. With overlap, each index builds while the rows arrive
  // (KvIndex::begin_build: multipole/centroid cluster their blocks as they
  // complete) and end_prefill only finishes; the result is prefill()'s.
  void begin_prefill(int64_t n_tokens, bool overlap);
  void prefill_rows(const float* keys, const float* values, int64_t t0, int64_t m, size_t token_stride,
                    size_t head_stride);
  void end_prefill();
  // While a piecewise prefill runs: positions [begin, end) of a KV head's keys
  // (values) as the layer holds them, in order: sinks (fp32), store rows (its
  // type, in its chunks) and window (fp32, ring runs); end <= the positions
  // taken so far. The past a model's prefill ring reads (KvPastSource,
  // src/model/kv_past.h). A streaming head keeps no store: Error.
  void past_runs(int kv_head, bool values, int64_t begin, int64_t end,
                 const std::function<void(const KvPastRun&)>& f) const;
  // Appends one generated token; evicts the window's oldest token if full.
  void append(const float* key, const float* value);
  // append() in two halves, for a runtime that has the new token's key and
  // value only later (the GPU runtime with the search on the device): all
  // bookkeeping — eviction of the window's oldest token to the store, index
  // folds — happens in begin_append, which needs no new data; fill_appended
  // then writes the token into its place. Between the two, the layer is in
  // the state append() leaves except for that token's data, which must be
  // filled before the next begin_append (it may evict it) or any host
  // attention.
  struct Placement {
    int64_t pos = 0;  // the token's position
    int sink = -1;    // its sink index, or -1: it is in the window
  };
  Placement begin_append();
  // Folds each retrieval head's store rows its index does not hold yet
  // (KvIndex::add_new_rows). A device runtime calls it on a host thread while
  // the decode thread goes on with begin_append / fill_appended: with
  // Config::fold_every out of reach those never touch a built index, and the
  // stores take appends while their earlier rows are read. With `upto`
  // (one per KV head, e.g. stored_rows at the fold's start) only the rows
  // below it, so that what a fold covers does not depend on when its thread
  // runs; empty: every row stored.
  void fold_pending(std::span<const int64_t> upto = {});
  void fill_appended(const Placement& at, const float* key, const float* value);
  // Attention output of each query head over sinks + window + retrieved (+ far).
  void attend(const float* queries, float scale, float* out, AttendStats* stats = nullptr) const;
  // The search half of attend: every retrieval head's index is searched with
  // its query heads (heads in parallel), far clusters folded into `far`.
  // out gets one entry per KV head.
  void retrieve(const float* queries, float scale, std::vector<Retrieved>& out) const;

  // Exact attention over every token the layer holds (sinks + all store rows +
  // window): the reference the retrieved attention is measured against.
  void attend_exact(const float* queries, float scale, float* out) const;
  // The same, and from the same pass over the store the oracle top-k mass:
  // the share of that attention's softmax mass held by the sinks, the window
  // and the k stored keys of highest score, what any top-k at this k could
  // serve at best, averaged over the query heads (what --measure-error
  // records). Low where the attention is spread over the context (counting
  // tasks such as RULER's fwe), near 1 where a few keys hold it (needles).
  double attend_exact_and_mass(const float* queries, float scale, float* out, int64_t k) const;

  // Context packs (offload/context_pack.h). save() writes what each KV head h
  // holds as tensors named prefix + "h<h>." + ...
  //   sinks_k, sinks_v     F32 [sinks held][head_dim]
  //   window_k, window_v   F32 [window tokens][head_dim], oldest first
  //   keys, values         store type [store rows][head_dim]  (retrieval heads with stored rows)
  //   index.<i>            U8 [bytes]: KvIndex::save_bytes of `index` (i = 0)
  //                        and of extra_indexes[i - 1]            (idem)
  // Sinks and stores are referenced, not copied: the layer must stay
  // unchanged until PackWriter::write (the extra indexes cover the prefill
  // only: save right after it). restore() fills a freshly built layer of the
  // same configuration (streaming mask included) holding n_tokens from such
  // tensors, loading index.<index_slot> as its index: the stores use the
  // pack's mapped rows in place (RowStore::append_mapped), the index is
  // loaded, not rebuilt.
  void save(PackWriter& w, const std::string& prefix) const;
  void restore(const PackReader& r, const std::string& prefix, int64_t n_tokens, int index_slot = 0);

  int64_t n_tokens() const { return n_tokens_; }
  // Where sinks and window are, for a device mirror (gpu/gpu_offload_runtime.h):
  // sink i is position i; window positions [window_start, window_start +
  // window_len) sit in ring slot position % window.
  int n_sinks() const { return n_sinks_; }
  int64_t window_start() const { return win_start_; }
  int64_t window_len() const { return win_len_; }
  const float* sink_keys(int kv_head) const { return heads_[(size_t)kv_head].sink_k.data(); }    // [n_sinks][d]
  const float* sink_values(int kv_head) const { return heads_[(size_t)kv_head].sink_v.data(); }
  const float* window_keys(int kv_head) const { return heads_[(size_t)kv_head].win_k.data(); }  // ring [window][d]
  const float* window_values(int kv_head) const { return heads_[(size_t)kv_head].win_v.data(); }
  const RowStore* key_store(int kv_head) const { return heads_[(size_t)kv_head].keys.get(); }
  const RowStore* value_store(int kv_head) const { return heads_[(size_t)kv_head].values.get(); }
  int64_t stored_rows(int kv_head) const;
  const KvIndex* index(int kv_head) const { return heads_[(size_t)kv_head].index.get(); }
  const Config& config() const { return cfg_; }
  size_t host_bytes() const;   // stores + index structures
  // Of host_bytes(), what is used in place from a context pack's mapping
  // (store chunks, index arrays) rather than held in memory of its own.
  size_t in_place_bytes() const;
  size_t window_bytes() const; // sinks + window (GPU-resident in the CUDA runtime)

 private:
  struct Head {
    bool streaming = false;
    std::shared_ptr<RowStore> keys, values;  // store rows = positions [S, N - W)
    std::unique_ptr<KvIndex> index;
    std::vector<std::unique_ptr<KvIndex>> extra_indexes;  // Config::extra_indexes, built at prefill
    std::vector<float> sink_k, sink_v;       // [n_sinks][d]
    std::vector<float> win_k, win_v;         // ring [window][d]
  };
  void push_window(Head& h, int64_t pos, const float* k, const float* v);
  // Adds one query head's sinks + window (exact) to `p`.
  void add_exact_parts(const Head& h, const float* q, float scale, AttnPartial& p) const;
  double exact_pass(const float* queries, float scale, float* out, int64_t k) const;

  Config cfg_;
  std::vector<Head> heads_;
  int64_t n_tokens_ = 0;   // tokens seen
  int n_sinks_ = 0;        // sinks filled (<= cfg_.sinks)
  int64_t win_start_ = 0;  // position of the oldest window token
  int64_t win_len_ = 0;
  int64_t prefill_total_ = -1, prefill_done_ = 0;  // a piecewise prefill in progress (-1: none)
  bool prefill_overlap_ = false;
};

}  // namespace topkv
