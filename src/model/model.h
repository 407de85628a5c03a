// The forward pass of a llama / gemma3 / qwen2 model on a Backend, with dense
// attention over a KV cache: prefill a prompt in chunks, then decode one token
// at a time. Weights reference the memory-mapped GGUF file (or dequantised
// copies, --weights f32), or live where the backend put them (CUDA: the
// file's blocks, or fp16 with --weights f16).
//
// KV cache (one KvLayerCache per layer, layout in backend.h): layers that see
// the whole context keep n_ctx slots; gemma3's sliding-window layers keep a
// ring of window + max_chunk - 1 slots, so their memory does not grow with
// the context.
//
//   auto file = std::shared_ptr<GgufFile>(GgufFile::open(path));
//   auto be = make_cpu_backend();
//   Model m(file, *be, {.n_ctx = 4096});
//   auto logits = m.prefill(prompt_ids, 256);   // [vocab] of the last token
//   logits = m.decode(next_id);
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "src/model/attention_override.h"
#include "src/model/backend.h"
#include "src/model/gguf.h"
#include "src/model/model_config.h"

namespace topkv {

struct ModelOptions {
  int64_t n_ctx = 4096;       // positions the cache can hold
  int max_chunk = 512;        // largest prefill chunk (sizes scratch and rings)
  DType kv_dtype = DType::F32;
  WeightMode weights = WeightMode::Quant;
  // Decode steps are recorded once and replayed (CUDA graphs) when the
  // backend can record; false runs every step op by op. TOPKV_CUDA_GRAPHS=0
  // in the environment turns recording off for every CUDA backend.
  bool record_decode = true;
  // Layers whose attention is always served by an attention override (the
  // offloaded runtimes, filled by take_context): they get no cache at all
  // (capacity 0), so a long context is not allocated twice. Running such a
  // layer without an override that serves it is an Error.
  std::vector<int> override_layers;
  // Layers whose cache may live in host memory (KvLayerCache::in_host; the
  // prefill then streams it, backend.h): the retrieval layers, whose cache
  // serves only the prefill. kv_place says where their caches go:
  //   Device  on the backend (a cache that does not fit is an Error);
  //   Host    all in host memory (Backend::alloc_kv_host);
  //   Auto    on the backend while Backend::memory_left(), less the
  //           activations, the device reserve and 1 GiB of slack (the
  //           backend's scratch), holds them; in host memory from the first
  //           that does not fit.
  // device_reserves: what else will need backend memory later (the offload
  // runtime's tables and buffers, OffloadRuntime::device_bytes_estimate), one
  // per type its device tables may take, most preferred first
  // (OffloadRuntime::device_table_choices). The model takes the first that
  // what it leaves can hold once the prefill releases the candidates' caches
  // (Model::device_reserve_choice), and refuses when none fits. Empty: none.
  enum class KvPlace { Auto, Device, Host };
  std::vector<int> host_kv_candidates;
  KvPlace kv_place = KvPlace::Auto;
  std::vector<int64_t> device_reserves;
  // A candidate placed in host memory keeps only the chunk being prefilled (a
  // prefill ring of max_chunk slots, KvLayerCache::ring): the past is read
  // from the offload runtime's stores, which take each chunk as it is done
  // (set_kv_past). Set when such a runtime takes the prefill chunk by chunk
  // and keeps every row (no streaming heads): the prefill then holds no second
  // host copy of the context. The past comes back at the store's type: with
  // an 8-bit store (--store-type f8) the prefill attends E4M3 keys and values.
  bool host_kv_past = false;
};
// "auto" | "gpu" | "host" (--prefill-kv); throws Error.
ModelOptions::KvPlace parse_kv_place(const std::string& s);

class Model {
 public:
  // Reads the config, checks every tensor, prepares weights on the backend and
  // allocates the cache. Throws Error on a bad file or bad options.
  Model(std::shared_ptr<const GgufFile> file, Backend& backend, const ModelOptions& opt);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const ModelOptions& options() const { return opt_; }
  int64_t n_past() const { return n_past_; }  // tokens in the cache
  void reset() { n_past_ = 0; }                // forget the context (the cache is overwritten)
  // Forgets the positions from n on, keeping [0, n): run several continuations
  // of one prompt. A sliding-window layer's ring has max_chunk - 1 slots of
  // slack beyond its window, so at most that many positions can be taken back;
  // more (or any with an attention override set) is an Error.
  void rewind(int64_t n);

  // Runs `tokens` at positions n_past().. in chunks of at most `chunk`
  // (<= max_chunk) tokens. Returns the logits of the last token [n_vocab], or
  // with all_logits those of every token [T][n_vocab]. `on_chunk(done)` is
  // called after each chunk with the number of tokens processed so far.
  std::vector<float> prefill(std::span<const int32_t> tokens, int chunk, bool all_logits = false,
                             const std::function<void(int64_t)>& on_chunk = {});
  // One token at position n_past(); its logits [n_vocab]. On a backend that
  // can record (CUDA), the step is recorded once (after one step run op by
  // op) and replayed from then on; a step with an attention override is
  // recorded as segments that end before each overridden layer's attention,
  // which runs between the replays. A change of the overridden layers, or
  // release_kv, makes it record again.
  std::vector<float> decode(int32_t token);
  // The same step, leaving the logits [n_vocab] in backend memory (valid until
  // the next prefill or decode): sample them there (gpu/cuda_sampler.h)
  // instead of copying 4 * n_vocab bytes to the host.
  const float* decode_on_backend(int32_t token);
  // How many decode steps were recorded so far, and whether the last decode
  // replayed a recording (tests and benchmarks).
  int steps_recorded() const { return steps_recorded_; }
  void set_record_decode(bool on) { opt_.record_decode = on; }  // for comparisons; see ModelOptions
  bool last_decode_replayed() const { return last_replayed_; }

  // Reads every page of the weights once, so that a mapped file is resident
  // before timing starts (the first prefill would otherwise pay the page
  // faults). Returns the bytes touched.
  size_t touch_weights() const;

  // From now on the layers `ov` overrides take their decode attention from it
  // (the offloaded top-k runtime); null restores dense attention. Set it after
  // the prompt is prefilled and ov->take_prefill(*this) has run.
  void set_attention_override(AttentionOverride* ov) { override_ = ov; }
  // The keys and values of positions [from, from + count) (count -1: to
  // n_past()), as fp32 [n_head_kv][count][head_dim] in host memory. A
  // sliding-window layer's ring keeps only its last positions: `from` must be
  // among them.
  void read_kv(int layer, std::vector<float>& k, std::vector<float>& v, int64_t from = 0, int64_t count = -1) const;
  // read_kv as a KvReader (src/model/attention_override.h), for an override's
  // take_prefill and the overlapped build's absorb. It refers to this model.
  KvReader kv_reader() const {
    return [this](int il, int64_t t0, int64_t m, std::vector<float>& k, std::vector<float>& v) {
      read_kv(il, k, v, t0, m);
    };
  }
  // Frees the cache of a layer the override now serves (after take_prefill):
  // its keys live in the override from then on, so the backend memory is given
  // back. Attending that layer without the override afterwards is an Error.
  void release_kv(int layer);
  // A context without a prefill (benchmarks at contexts a real prefill would
  // take hours for; a context pack, offload/context_pack.h): write_kv stores the keys (post-RoPE) and values of
  // positions [pos0, pos0 + n) of one layer, fp32 [n_head_kv][n][head_dim] in
  // host memory, into its cache (a sliding-window layer's ring holds at most
  // its capacity: write its last positions); set_n_past then declares
  // positions [0, n) present. Every layer with a cache must have been written
  // where decode will read it; override layers take theirs via take_context.
  void write_kv(int layer, const float* k, const float* v, int64_t pos0, int64_t n);
  void set_n_past(int64_t n);
  // Slots of a layer's cache: n_ctx, a sliding window's ring, or 0 (override layer / released).
  int64_t kv_capacity(int layer) const;
  // The layers whose cache lives in host memory (ModelOptions::kv_place),
  // and those of them that keep only a prefill ring (ModelOptions::host_kv_past).
  std::vector<int> host_kv_layers() const;
  std::vector<int> ring_kv_layers() const;
  // Where the rings' past comes from while a prefill runs (null: none; a
  // chunk past the first then stops with an Error). The source must hold
  // every position before each chunk when the chunk attends.
  void set_kv_past(const KvPastSource* past);
  size_t host_kv_bytes() const;  // what they hold (pinned host memory on a CUDA backend)
  // Which of ModelOptions::device_reserves the memory check took (0 when
  // there are none): the offload runtime's device table type by the budget.
  int device_reserve_choice() const { return reserve_choice_; }
  // What a model with these options will allocate, known before it is built
  // (benchmarks skip what cannot fit a memory budget): one layer's cache
  // slots, and the bytes of the activation scratch.
  static int64_t planned_kv_capacity(const ModelConfig& cfg, const ModelOptions& opt, int layer);
  static size_t planned_scratch_bytes(const ModelConfig& cfg, const ModelOptions& opt);

  // Memory: the weights as held (Backend::prepared_weight_bytes), what the
  // backend's other weight mode would take (Backend::other_weight_mode), and
  // the KV cache.
  size_t weight_bytes() const { return weight_bytes_; }
  size_t weight_bytes_other_mode() const { return weight_bytes_other_; }
  size_t kv_bytes() const;

 private:
  struct LayerWeights {
    Weight attn_norm, wq, wk, wv, wo, q_norm, k_norm, post_attn_norm;
    Weight ffn_norm, ffn_gate, ffn_up, ffn_down, post_ffw_norm;
    Weight bq, bk, bv;  // qwen2's projection biases (empty otherwise)
  };
  static constexpr int kLogitRows = 16;  // all_logits: rows projected to the vocabulary at a time
  void forward_chunk(const int32_t* ids, int T, bool all_logits, float* logits_out);
  void project_logits(int r0, int nr);
  void layer(int il, int T);
  void attention_input(int il, int T, bool write_cache);
  void dense_attention(int il, int T);
  void attention_output_ffn(int il, int T);
  // What the input of layer il (il = n_layer: the logits) still has to add to
  // the residual stream: with post-norms, layer il-1's FFN output in xb_.
  MatmulInput pending_ffn_output(int il) const;
  void overridden_attention(int il, int T);
  // Decode (src/model/model_decode.cpp): one token, logits into logits_.
  struct StepRecording {
    std::vector<int> overridden;  // the layers whose attention runs between segments
    uint64_t kv_epoch = 0;
    std::vector<std::unique_ptr<Backend::Recording>> segments;  // overridden.size() + 1
  };
  void decode_step(int32_t token);
  void record_step(const std::vector<int>& overridden, int32_t token);
  std::vector<int> overridden_layers() const;

  std::shared_ptr<const GgufFile> file_;
  Backend& be_;
  ModelOptions opt_;
  ModelConfig cfg_;
  Weight token_embd_, output_norm_, output_;
  std::vector<LayerWeights> layers_;
  std::vector<const Weight*> all_weights_;  // every distinct weight above
  std::vector<KvLayerCache> cache_;
  size_t weight_bytes_ = 0, weight_bytes_other_ = 0;
  int64_t n_past_ = 0;
  int reserve_choice_ = 0;
  AttentionOverride* override_ = nullptr;
  std::vector<float> host_q_, host_k_, host_v_, host_att_;  // staging for the override
  // Scratch, rows for max_chunk tokens: x residual stream [C][d], xb [C][d],
  // q/att [C][n_head*hd], k/v [C][n_kv*hd], gate/up [C][n_ff], logits [kLogitRows][vocab].
  Buffer x_, xb_, q_, k_, v_, att_, gate_, up_, logits_;
  // Recorded decode step (declared last: destroyed before the buffers it uses).
  uint64_t kv_epoch_ = 0;                  // bumped by release_kv
  bool warm_ = false;                      // a step of warm_layers_ / warm_epoch_ ran op by op
  std::vector<int> warm_layers_;
  uint64_t warm_epoch_ = 0;
  int steps_recorded_ = 0;
  bool last_replayed_ = false;
  std::unique_ptr<StepRecording> recorded_;
};

}  // namespace topkv
