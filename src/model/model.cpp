#include "src/model/model.h"

#include <algorithm>
#include <tuple>

#include "src/common/error.h"
#include "src/common/options.h"

namespace topkv {


Model::Model(std::shared_ptr<const GgufFile> file, Backend& backend, const ModelOptions& opt)
    : file_(std::move(file)), be_(backend), opt_(opt), cfg_(read_model_config(*file_)) {
  TOPKV_CHECK(opt_.n_ctx > 0, "the context size must be positive, got {}", opt_.n_ctx);
  TOPKV_CHECK(opt_.max_chunk > 0, "the prefill chunk must be positive, got {}", opt_.max_chunk);
  const ModelTensors t = find_model_tensors(*file_, cfg_);

  // Weights: prepared once on the backend; bytes counted for this mode and
  // the backend's other one so the CLI can show what that choice would cost.
  const WeightMode other = be_.other_weight_mode(opt_.weights);
  const auto prep = [&](const GgufTensor* g, bool count = true) {
    if (!g) return Weight{};
    const Weight view = weight_view(*g);
    if (count) {
      weight_bytes_ += be_.prepared_weight_bytes(view, opt_.weights);
      weight_bytes_other_ += be_.prepared_weight_bytes(view, other);
    }
    return be_.prepare_weight(view, opt_.weights);
  };
  token_embd_ = prep(t.token_embd);
  output_norm_ = prep(t.output_norm);
  output_ = t.output == t.token_embd ? token_embd_ : prep(t.output);
  layers_.resize(cfg_.n_layer);
  for (int il = 0; il < cfg_.n_layer; ++il) map_layer_tensors(t.layers[il], layers_[il], prep);

  all_weights_ = {&token_embd_, &output_norm_};
  if (t.output != t.token_embd) all_weights_.push_back(&output_);
  for (const LayerWeights& L : layers_)
    for (const Weight* w : {&L.attn_norm, &L.wq, &L.wk, &L.wv, &L.wo, &L.q_norm, &L.k_norm, &L.post_attn_norm,
                            &L.ffn_norm, &L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.post_ffw_norm, &L.bq, &L.bk, &L.bv})
      if (w->data) all_weights_.push_back(w);

  for (int il : opt_.override_layers)
    TOPKV_CHECK(il >= 0 && il < cfg_.n_layer, "override layer {} is out of range (the model has layers 0..{})", il,
                cfg_.n_layer - 1);
  cache_.resize(cfg_.n_layer);
  const auto candidate = [&](int il) {
    return std::find(opt_.host_kv_candidates.begin(), opt_.host_kv_candidates.end(), il) !=
           opt_.host_kv_candidates.end();
  };
  // The reserve the model will hold to: the first of device_reserves that
  // what is left can hold once the prefill releases the candidates' caches,
  // i.e. what is left now less the caches that stay and the buffers below
  // (the check at the end confirms it with what the allocations left).
  const auto cache_bytes = [&](int il) {  // 0 for a layer an override holds (no cache)
    const int64_t cap = planned_kv_capacity(cfg_, opt_, il);
    return cap == 0 ? int64_t(0) : (int64_t)kv_cache_shape(cfg_.n_head_kv, cfg_.head_dim, cap, opt_.kv_dtype).bytes();
  };
  const std::vector<int64_t>& reserves = opt_.device_reserves;
  if (!reserves.empty() && be_.memory_left() >= 0) {
    int64_t after = be_.memory_left() - (int64_t)planned_scratch_bytes(cfg_, opt_);
    for (int il = 0; il < cfg_.n_layer; ++il)
      if (!candidate(il)) after -= cache_bytes(il);
    while (reserve_choice_ + 1 < (int)reserves.size() && reserves[(size_t)reserve_choice_] > after) ++reserve_choice_;
  }
  const auto reserve = [&] { return reserves.empty() ? int64_t(0) : reserves[(size_t)reserve_choice_]; };
  // The layers that must be on the backend first, then the candidates while they fit.
  for (int pass = 0; pass < 2; ++pass)
    for (int il = 0; il < cfg_.n_layer; ++il) {
      if (candidate(il) != (pass == 1)) continue;
      const int64_t cap = planned_kv_capacity(cfg_, opt_, il);
      if (cap == 0) {  // described but not allocated: an override holds this layer's KV
        cache_[il].dtype = opt_.kv_dtype, cache_[il].n_kv_heads = cfg_.n_head_kv, cache_[il].head_dim = cfg_.head_dim;
        continue;
      }
      bool in_host = pass == 1 && opt_.kv_place == ModelOptions::KvPlace::Host;
      if (pass == 1 && opt_.kv_place == ModelOptions::KvPlace::Auto) {
        const int64_t left = be_.memory_left();
        // Slack for what no plan line counts: the backend's scratch, which the
        // prefill grows (dequantised weight tiles, attention work space,
        // stream stages: 0.84-0.86 GiB for the 8B geometry at chunk 8192), and
        // the GPU sampler's buffers. Without it a budget filled to the brim by
        // the caches failed a 2-9 MiB allocation after the prefill (session
        // 19, the 8B geometry at 131K under 24G).
        constexpr double kSlack = 1024.0 * (1 << 20);
        const double need = (double)kv_cache_shape(cfg_.n_head_kv, cfg_.head_dim, cap, opt_.kv_dtype).bytes() +
                            (double)planned_scratch_bytes(cfg_, opt_) + (double)reserve() + kSlack;
        in_host = left >= 0 && need > (double)left;
      }
      // A prefill ring holds the chunk; the runtime's stores hold the past.
      const bool ring = in_host && opt_.host_kv_past;
      const int64_t slots = ring ? std::min<int64_t>(cap, opt_.max_chunk) : cap;
      cache_[il] = in_host ? be_.alloc_kv_host(cfg_.n_head_kv, cfg_.head_dim, slots, opt_.kv_dtype)
                           : be_.alloc_kv(cfg_.n_head_kv, cfg_.head_dim, slots, opt_.kv_dtype);
      cache_[il].ring = ring, cache_[il].layer = il;
    }

  const size_t C = (size_t)opt_.max_chunk, f = sizeof(float);
  const size_t qd = (size_t)cfg_.n_head * cfg_.head_dim, kvd = (size_t)cfg_.n_head_kv * cfg_.head_dim;
  x_ = be_.alloc(C * cfg_.n_embd * f), xb_ = be_.alloc(C * cfg_.n_embd * f);
  q_ = be_.alloc(C * qd * f), att_ = be_.alloc(C * qd * f);
  k_ = be_.alloc(C * kvd * f), v_ = be_.alloc(C * kvd * f);
  gate_ = be_.alloc(C * cfg_.n_ff * f), up_ = be_.alloc(C * cfg_.n_ff * f);
  logits_ = be_.alloc((size_t)kLogitRows * cfg_.n_vocab * f);

  // What the offload runtime allocates after the prefill (the reserve: its
  // search tables, mirrors and work space at the context size) must fit what is
  // left then, at best all that is left now plus the retrieval layers' caches
  // on the backend, which the prefill releases. When even that cannot hold it,
  // stop here rather than after a prefill. A later (smaller) reserve is taken
  // if the allocations left less than the choice above foresaw.
  if (reserve() > 0) {
    int64_t left = be_.memory_left();
    if (left >= 0) {
      for (int il : opt_.host_kv_candidates)
        if (il >= 0 && il < cfg_.n_layer && !cache_[(size_t)il].in_host) left += (int64_t)cache_[(size_t)il].bytes();
      while (reserve_choice_ + 1 < (int)reserves.size() && reserves[(size_t)reserve_choice_] > left) ++reserve_choice_;
      TOPKV_CHECK(left >= reserve(),
                  "the GPU cannot hold what the top-k runtime needs at a context of {} tokens: {} (its search tables, "
                  "sinks + window mirrors and work space: the memory plan's GPU lines{}) against {} left beside the "
                  "weights and buffers. Raise --gpu-mem-budget, lower -c, choose an index with smaller tables (a "
                  "larger quest:page or multipole:ratio){}, or --search-on host (no tables on the GPU)",
                  opt_.n_ctx, format_bytes((double)reserve()),
                  reserves.size() > 1 ? ", with the smallest tables the run may choose" : "",
                  format_bytes((double)left),
                  // With several reserves the budget already tried the smaller table types.
                  reserves.size() > 1 ? "" : ", store them in fewer bytes (--device-table-type i8: half of f16's)");
    }
  }
}

int64_t Model::planned_kv_capacity(const ModelConfig& cfg, const ModelOptions& opt, int il) {
  if (std::find(opt.override_layers.begin(), opt.override_layers.end(), il) != opt.override_layers.end()) return 0;
  const LayerConfig& lc = cfg.layers[(size_t)il];
  return lc.window > 0 ? std::min<int64_t>(opt.n_ctx, lc.window + opt.max_chunk - 1) : opt.n_ctx;
}

// The buffers the constructor allocates after the caches (keep the two in step).
size_t Model::planned_scratch_bytes(const ModelConfig& cfg, const ModelOptions& opt) {
  const size_t C = (size_t)opt.max_chunk, f = sizeof(float);
  const size_t qd = (size_t)cfg.n_head * cfg.head_dim, kvd = (size_t)cfg.n_head_kv * cfg.head_dim;
  return C * f * (2 * (size_t)cfg.n_embd + 2 * qd + 2 * kvd + 2 * (size_t)cfg.n_ff) +
         (size_t)kLogitRows * cfg.n_vocab * f;
}

Model::~Model() = default;

size_t Model::touch_weights() const {
  if (!be_.host_memory()) return 0;  // uploaded at load: already resident where the ops read them
  constexpr size_t kPage = 4096;
  size_t bytes = 0;
  unsigned sum = 0;
  for (const Weight* w : all_weights_) {
    const size_t n = w->bytes();
    const uint8_t* p = w->data;
#pragma omp parallel for reduction(+ : sum) schedule(static)
    for (size_t off = 0; off < n; off += kPage) sum += p[off];
    bytes += n;
  }
  volatile unsigned sink = sum;  // keep the reads
  (void)sink;
  return bytes;
}

void Model::rewind(int64_t n) {
  TOPKV_CHECK(n >= 0 && n <= n_past_, "cannot rewind to position {}: the cache holds {} positions", n, n_past_);
  TOPKV_CHECK(!override_ || n == n_past_, "cannot rewind while an attention override serves some layers: the "
              "override keeps its own state; set a fresh one instead");
  for (int il = 0; il < cfg_.n_layer; ++il) {
    const int64_t window = cfg_.layers[(size_t)il].window, cap = cache_[(size_t)il].capacity;
    TOPKV_CHECK(!cache_[(size_t)il].ring || cap == 0 || n == n_past_, "cannot take back positions: layer {} keeps "
                "only a prefill ring (its past is in the top-k runtime's stores, which keep what they took)", il);
    if (window > 0 && cap < opt_.n_ctx)
      TOPKV_CHECK(n_past_ - n <= cap - window, "cannot take back {} positions: layer {}'s sliding-window ring "
                  "has room for {} beyond its window (raise max_chunk)", n_past_ - n, il, cap - window);
  }
  n_past_ = n;
}

size_t Model::kv_bytes() const {
  size_t b = 0;
  for (const auto& c : cache_) b += c.bytes();
  return b;
}

std::vector<float> Model::prefill(std::span<const int32_t> tokens, int chunk, bool all_logits,
                                  const std::function<void(int64_t)>& on_chunk) {
  const int64_t T = (int64_t)tokens.size();
  TOPKV_CHECK(T > 0, "nothing to run: no tokens");
  TOPKV_CHECK(chunk > 0 && chunk <= opt_.max_chunk, "prefill chunk {} must be in 1..{} (the model's max_chunk)",
              chunk, opt_.max_chunk);
  TOPKV_CHECK(n_past_ + T <= opt_.n_ctx,
              "the context is full: {} tokens in the cache + {} new exceed the context size {}; raise the "
              "context size (-c)", n_past_, T, opt_.n_ctx);
  for (int64_t t = 0; t < T; ++t)
    TOPKV_CHECK(tokens[t] >= 0 && tokens[t] < cfg_.n_vocab, "token id {} at position {} is outside the "
                "vocabulary (0..{})", tokens[t], t, cfg_.n_vocab - 1);
  std::vector<float> logits((size_t)(all_logits ? T : 1) * cfg_.n_vocab);
  for (int64_t done = 0; done < T;) {
    const int n = (int)std::min<int64_t>(chunk, T - done);
    const bool last = done + n == T;
    float* out = all_logits ? logits.data() + (size_t)done * cfg_.n_vocab : (last ? logits.data() : nullptr);
    forward_chunk(tokens.data() + done, n, all_logits, out);
    done += n;
    if (on_chunk) on_chunk(done);
  }
  return logits;
}

// Runs T tokens at positions n_past_..; writes logits of every row (all) or of
// the last row (when out is not null) to host memory `out`.
void Model::forward_chunk(const int32_t* ids, int T, bool all, float* out) {
  be_.embed(token_embd_, ids, T, cfg_.embed_scale, x_.f32());
  for (int il = 0; il < cfg_.n_layer; ++il) layer(il, T);
  n_past_ += T;
  if (!out) return;
  const int first = all ? 0 : T - 1;
  for (int r0 = first; r0 < T; r0 += kLogitRows) {
    const int nr = std::min(kLogitRows, T - r0);
    project_logits(r0, nr);
    be_.to_host(logits_, 0, out + (size_t)(r0 - first) * cfg_.n_vocab, (size_t)nr * cfg_.n_vocab * sizeof(float));
  }
}

// logits_[0..nr) = output(norm(x_ rows r0..r0+nr-1)), nr <= kLogitRows. With
// post-norms the last layer's FFN output (in xb_) joins those rows of x_ first.
void Model::project_logits(int r0, int nr) {
  const size_t off = (size_t)r0 * cfg_.n_embd;
  MatmulInput in = pending_ffn_output(cfg_.n_layer);
  if (in.add) in.add += off;
  in.x = x_.f32() + off, in.norm = &output_norm_, in.eps = cfg_.rms_eps, in.formed = xb_.f32() + off;
  const MatmulJob logits[] = {{&output_, logits_.f32(), {}}};
  be_.matmul_group(in, nr, logits);
}

// One transformer block on the chunk in x_ (positions n_past_..n_past_+T-1).
//   llama:  x += o(attn(rope(q(n(x))), rope(k(n(x))), v(n(x))));  x += down(silu(gate(n(x))) * up(n(x)))
//   qwen2:  the same with a bias on q, k and v (NeoX RoPE pairing).
//   gemma3: the same with QK-norm before RoPE, gelu-tanh gate, and an RMSNorm
//           on each branch output before it joins the residual.
// Biases and, without post-norms, the residual adds ride on the matmul's
// epilogue; the pre-norms, gemma3's post-norm residual adds and the GLU on
// the input of the next group of products (MatmulInput): on a device backend
// with quantised weights, each group is one kernel that forms and quantises
// its input and one GEMV launch. With post-norms the FFN's output is left in
// xb_ and joins the residual where the next layer (or the logits) forms its
// input (pending_ffn_output).
// Split in three so that a recorded decode step can end a segment before an
// overridden layer's attention (src/model/model_decode.cpp).
void Model::layer(int il, int T) {
  const bool overridden = override_ && override_->overrides(il);
  attention_input(il, T, /*write_cache=*/!overridden);
  if (overridden)
    overridden_attention(il, T);  // reads q_, k_, v_, writes att_
  else
    dense_attention(il, T);
  attention_output_ffn(il, T);
}

// x_ -> q_, k_, v_ (normed, projected, QK-normed, rotated); with write_cache,
// k and v also go into the layer's cache (one fused op on a device backend).
void Model::attention_input(int il, int T, bool write_cache) {
  const LayerWeights& L = layers_[il];
  const LayerConfig& lc = cfg_.layers[il];
  const int hd = cfg_.head_dim, nh = cfg_.n_head, nkv = cfg_.n_head_kv;
  const float eps = cfg_.rms_eps;
  float *x = x_.f32(), *xb = xb_.f32(), *q = q_.f32(), *k = k_.f32(), *v = v_.f32();
  MatmulInput in = pending_ffn_output(il);
  in.x = x, in.norm = &L.attn_norm, in.eps = eps, in.formed = xb;
  const auto bias = [](const Weight& b) { return MatmulEpilogue{b.data ? &b : nullptr, false}; };
  const MatmulJob qkv[] = {{&L.wq, q, bias(L.bq)}, {&L.wk, k, bias(L.bk)}, {&L.wv, v, bias(L.bv)}};
  be_.matmul_group(in, T, qkv);
  if (write_cache)
    TOPKV_CHECK(cache_[il].capacity > 0, "layer {} has no KV cache (it is among ModelOptions::override_layers, "
                "or release_kv handed it to an override): its attention needs an attention override that serves "
                "it (set_attention_override)", il);
  be_.attention_prologue(q, k, v, T, nh, nkv, hd, cfg_.qk_norm ? &L.q_norm : nullptr,
                         cfg_.qk_norm ? &L.k_norm : nullptr, eps, n_past_, lc.rope,
                         write_cache ? &cache_[il] : nullptr);
}

// q_ -> att_ over the layer's own cache (k_ and v_ were written by attention_input).
void Model::dense_attention(int il, int T) {
  be_.attention(q_.f32(), T, cfg_.n_head, n_past_, cache_[il], cfg_.layers[il].window, cfg_.attn_scale, att_.f32());
}

// att_ -> output projection -> residual, then the FFN block -> residual.
void Model::attention_output_ffn(int il, int T) {
  const LayerWeights& L = layers_[il];
  const float eps = cfg_.rms_eps;
  float *x = x_.f32(), *xb = xb_.f32(), *att = att_.f32(), *gate = gate_.f32(), *up = up_.f32();
  const MatmulEpilogue residual{nullptr, /*accumulate=*/true};
  // Post-norms: the projection goes to xb_ and joins x as the FFN forms its input.
  be_.matmul(att, L.wo, T, cfg_.post_norms ? xb : x, cfg_.post_norms ? MatmulEpilogue{} : residual);
  MatmulInput ffn_in{x};
  if (cfg_.post_norms) ffn_in.add = xb, ffn_in.add_norm = &L.post_attn_norm;
  ffn_in.norm = &L.ffn_norm, ffn_in.eps = eps, ffn_in.formed = xb;
  const MatmulJob gate_up[] = {{&L.ffn_gate, gate, {}}, {&L.ffn_up, up, {}}};
  be_.matmul_group(ffn_in, T, gate_up);
  MatmulInput glu_in{gate};
  glu_in.up = up, glu_in.glu = cfg_.glu, glu_in.formed = gate;
  const MatmulJob down[] = {{&L.ffn_down, cfg_.post_norms ? xb : x, cfg_.post_norms ? MatmulEpilogue{} : residual}};
  be_.matmul_group(glu_in, T, down);
}

MatmulInput Model::pending_ffn_output(int il) const {
  MatmulInput in;
  if (cfg_.post_norms && il > 0) in.add = xb_.f32(), in.add_norm = &layers_[il - 1].post_ffw_norm;
  return in;
}


// Attention of an overridden layer: token by token (each appends its own key
// before attending, so later tokens of the chunk see earlier ones).
void Model::overridden_attention(int il, int T) {
  const size_t qs = (size_t)cfg_.n_head * cfg_.head_dim, ks = (size_t)cfg_.n_head_kv * cfg_.head_dim;
  if (override_->on_device()) {
    for (int t = 0; t < T; ++t)
      override_->decode_attention_device(il, q_.f32() + t * qs, k_.f32() + t * ks, v_.f32() + t * ks, n_past_ + t,
                                         cfg_.attn_scale, att_.f32() + t * qs);
    return;
  }
  const size_t qn = (size_t)T * cfg_.n_head * cfg_.head_dim, kn = (size_t)T * cfg_.n_head_kv * cfg_.head_dim;
  host_q_.resize(qn);
  host_k_.resize(kn);
  host_v_.resize(kn);
  host_att_.resize(qn);
  be_.to_host(q_, 0, host_q_.data(), qn * sizeof(float));
  be_.to_host(k_, 0, host_k_.data(), kn * sizeof(float));
  be_.to_host(v_, 0, host_v_.data(), kn * sizeof(float));
  for (int t = 0; t < T; ++t)
    override_->decode_attention(il, host_q_.data() + t * qs, host_k_.data() + t * ks, host_v_.data() + t * ks,
                                n_past_ + t, cfg_.attn_scale, host_att_.data() + t * qs);
  be_.from_host(host_att_.data(), att_, 0, qn * sizeof(float));
}

void Model::release_kv(int il) {
  TOPKV_CHECK(il >= 0 && il < cfg_.n_layer, "layer {} is out of range (0..{})", il, cfg_.n_layer - 1);
  recorded_.reset();  // a recorded step may point into this cache
  ++kv_epoch_;
  KvLayerCache& c = cache_[(size_t)il];
  c.k = {}, c.v = {}, c.capacity = 0;
}

size_t Model::host_kv_bytes() const {
  size_t b = 0;
  for (const KvLayerCache& c : cache_)
    if (c.in_host) b += c.bytes();
  return b;
}

std::vector<int> Model::host_kv_layers() const {
  std::vector<int> out;
  for (int il = 0; il < cfg_.n_layer; ++il)
    if (cache_[(size_t)il].in_host && cache_[(size_t)il].capacity > 0) out.push_back(il);
  return out;
}

std::vector<int> Model::ring_kv_layers() const {
  std::vector<int> out;
  for (int il = 0; il < cfg_.n_layer; ++il)
    if (cache_[(size_t)il].ring && cache_[(size_t)il].capacity > 0) out.push_back(il);
  return out;
}

void Model::set_kv_past(const KvPastSource* past) {
  for (KvLayerCache& c : cache_)
    if (c.ring) c.past = past;
}

ModelOptions::KvPlace parse_kv_place(const std::string& s) {
  if (s == "auto") return ModelOptions::KvPlace::Auto;
  if (s == "gpu") return ModelOptions::KvPlace::Device;
  if (s == "host") return ModelOptions::KvPlace::Host;
  fail("--prefill-kv must be auto, gpu or host, not '{}'", s);
}

int64_t Model::kv_capacity(int il) const {
  TOPKV_CHECK(il >= 0 && il < cfg_.n_layer, "layer {} is out of range (0..{})", il, cfg_.n_layer - 1);
  return cache_[(size_t)il].capacity;
}

void Model::write_kv(int il, const float* k, const float* v, int64_t pos0, int64_t n) {
  TOPKV_CHECK(il >= 0 && il < cfg_.n_layer, "layer {} is out of range (0..{})", il, cfg_.n_layer - 1);
  KvLayerCache& c = cache_[(size_t)il];
  TOPKV_CHECK(c.capacity > 0, "layer {} has no KV cache to write (an attention override serves it: give its "
              "context to the override's take_context)", il);
  TOPKV_CHECK(pos0 >= 0 && n >= 1 && pos0 + n <= opt_.n_ctx, "write_kv of positions {}..{} does not fit the "
              "context size {}", pos0, pos0 + n - 1, opt_.n_ctx);
  TOPKV_CHECK(n <= c.capacity, "layer {} keeps {} positions (a sliding-window ring) but {} were written at once; "
              "write only its last {}", il, c.capacity, n, c.capacity);
  const size_t hd = (size_t)c.head_dim, es = dtype_size(c.dtype);
  const int64_t slot0 = pos0 % c.capacity, first = std::min(n, c.capacity - slot0);  // the ring may wrap once
  std::vector<uint8_t> tmp((size_t)n * hd * es);
  for (int h = 0; h < c.n_kv_heads; ++h)
    for (auto [src, dst] : {std::pair{k, &c.k}, std::pair{v, &c.v}}) {
      from_f32(c.dtype, src + (size_t)h * n * hd, tmp.data(), (size_t)n * hd);
      const size_t head = (size_t)h * c.head_stride();
      be_.from_host(tmp.data(), *dst, (head + (size_t)slot0 * hd) * es, (size_t)first * hd * es);
      if (n > first) be_.from_host(tmp.data() + (size_t)first * hd * es, *dst, head * es, (size_t)(n - first) * hd * es);
    }
}

void Model::set_n_past(int64_t n) {
  TOPKV_CHECK(n >= 0 && n <= opt_.n_ctx, "cannot hold a context of {} positions: the context size is {}", n,
              opt_.n_ctx);
  n_past_ = n;
}

void Model::read_kv(int il, std::vector<float>& k, std::vector<float>& v, int64_t from, int64_t count) const {
  TOPKV_CHECK(il >= 0 && il < cfg_.n_layer, "layer {} is out of range (0..{})", il, cfg_.n_layer - 1);
  const KvLayerCache& c = cache_[(size_t)il];
  TOPKV_CHECK(from >= 0 && from <= n_past_, "cannot read positions from {}: the cache holds {}", from, n_past_);
  if (count < 0) count = n_past_ - from;
  TOPKV_CHECK(count <= n_past_ - from, "cannot read positions {}..{}: the cache holds {}", from, from + count,
              n_past_);
  TOPKV_CHECK(c.capacity > 0 || count == 0, "layer {} has no KV cache to read (an attention override holds "
              "its keys)", il);
  TOPKV_CHECK(n_past_ - from <= c.capacity, "layer {} keeps only its last {} positions ({}); positions from {} "
              "cannot be read back", il, c.capacity, c.ring ? "a prefill ring: the top-k runtime's stores hold the "
              "rest" : "sliding window", from);
  const size_t hd = (size_t)c.head_dim, n = (size_t)count, es = dtype_size(c.dtype);
  k.resize((size_t)c.n_kv_heads * n * hd);
  v.resize(k.size());
  if (n == 0) return;
  // Position p sits in slot p % capacity: at most two runs of slots.
  const size_t first = (size_t)(from % c.capacity), run1 = std::min(n, (size_t)c.capacity - first);
  std::vector<uint8_t> tmp(std::max(run1, n - run1) * hd * es);
  for (int h = 0; h < c.n_kv_heads; ++h)
    for (auto [src, dst] : {std::pair{&c.k, &k}, std::pair{&c.v, &v}})
      for (auto [slot, len, at] : {std::tuple{first, run1, (size_t)0}, std::tuple{(size_t)0, n - run1, run1}}) {
        if (!len) continue;
        be_.to_host(*src, ((size_t)h * c.head_stride() + slot * hd) * es, tmp.data(), len * hd * es);
        to_f32(c.dtype, tmp.data(), dst->data() + ((size_t)h * n + at) * hd, len * hd);
      }
}

}  // namespace topkv
