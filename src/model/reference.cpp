#include "src/model/reference.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "src/common/error.h"

namespace topkv::ref {

void rms_norm(const float* x, const float* w, int64_t rows, int dim, float eps, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += (double)x[r * dim + i] * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(ss / dim + eps);
    for (int i = 0; i < dim; ++i) out[r * dim + i] = (float)(x[r * dim + i] * inv * w[i]);
  }
}

void rope(float* x, int T, int n_heads, int head_dim, int64_t pos0, const RopeParams& p) {
  const int half = p.n_rot / 2;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + ((size_t)t * n_heads + h) * head_dim;
      for (int i = 0; i < half; ++i) {
        const double factor = p.freq_factors ? p.freq_factors[i] : 1.0;
        const double theta = p.freq_scale * (double)(pos0 + t) * std::pow((double)p.base, -2.0 * i / p.n_rot) / factor;
        const int a = p.style == RopeStyle::NeoX ? i : 2 * i, b = p.style == RopeStyle::NeoX ? i + half : 2 * i + 1;
        const double xa = v[a], xb = v[b];
        v[a] = (float)(xa * std::cos(theta) - xb * std::sin(theta));
        v[b] = (float)(xa * std::sin(theta) + xb * std::cos(theta));
      }
    }
}

void matmul(const float* x, const float* w, int64_t rows, int64_t cols, int T, float* y) {
  for (int t = 0; t < T; ++t)
    for (int64_t r = 0; r < rows; ++r) {
      double s = 0;
      for (int64_t i = 0; i < cols; ++i) s += (double)x[t * cols + i] * w[r * cols + i];
      y[t * rows + r] = (float)s;
    }
}

void glu(GluKind kind, const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double act = kind == GluKind::SiLU
                           ? g / (1.0 + std::exp(-g))
                           : 0.5 * g * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (g + 0.044715 * g * g * g)));
    out[i] = (float)(act * up[i]);
  }
}

void attention(const float* q, int n_head, int n_kv, int hd, const float* k, const float* v, int64_t n,
               float scale, float* out) {
  const int group = n_head / n_kv;
  std::vector<double> s(n);
  for (int h = 0; h < n_head; ++h) {
    const int kh = h / group;
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      double dot = 0;
      for (int i = 0; i < hd; ++i) dot += (double)q[h * hd + i] * k[(j * n_kv + kh) * hd + i];
      s[j] = dot * scale;
      mx = std::max(mx, s[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j < n; ++j) sum += (s[j] = std::exp(s[j] - mx));
    for (int i = 0; i < hd; ++i) {
      double o = 0;
      for (int64_t j = 0; j < n; ++j) o += s[j] * v[(j * n_kv + kh) * hd + i];
      out[h * hd + i] = (float)(o / sum);
    }
  }
}

namespace {

std::vector<float> dequant(const GgufTensor* t) {
  if (!t) return {};
  std::vector<float> out((size_t)t->nelements());
  for (int64_t r = 0; r < t->nrows(); ++r) dequantize_row(t->type, t->row(r), out.data() + r * t->ne[0], t->ne[0]);
  return out;
}

}  // namespace

ReferenceModel::ReferenceModel(const GgufFile& f) : cfg_(read_model_config(f)) {
  const ModelTensors t = find_model_tensors(f, cfg_);
  token_embd_ = dequant(t.token_embd);
  output_norm_ = dequant(t.output_norm);
  output_ = dequant(t.output);
  layers_.resize(cfg_.n_layer);
  for (int il = 0; il < cfg_.n_layer; ++il) map_layer_tensors(t.layers[il], layers_[il], dequant);
}

std::vector<float> ReferenceModel::forward(int32_t token) {
  const ModelConfig& c = cfg_;
  TOPKV_CHECK(token >= 0 && token < c.n_vocab, "token id {} is outside the vocabulary", token);
  const int d = c.n_embd, hd = c.head_dim, qd = c.n_head * hd, kvd = c.n_head_kv * hd;
  std::vector<float> x(d), xb(d), q(qd), k(kvd), v(kvd), att(qd), gate(c.n_ff), up(c.n_ff);
  for (int i = 0; i < d; ++i) x[i] = token_embd_[(size_t)token * d + i] * c.embed_scale;
  for (int il = 0; il < c.n_layer; ++il) {
    Layer& L = layers_[il];
    const LayerConfig& lc = c.layers[il];
    rms_norm(x.data(), L.attn_norm.data(), 1, d, c.rms_eps, xb.data());
    matmul(xb.data(), L.wq.data(), qd, d, 1, q.data());
    matmul(xb.data(), L.wk.data(), kvd, d, 1, k.data());
    matmul(xb.data(), L.wv.data(), kvd, d, 1, v.data());
    for (auto [out, b] : {std::pair{&q, &L.bq}, std::pair{&k, &L.bk}, std::pair{&v, &L.bv}})
      for (size_t i = 0; i < b->size(); ++i) (*out)[i] += (*b)[i];
    if (c.qk_norm) {
      rms_norm(q.data(), L.q_norm.data(), c.n_head, hd, c.rms_eps, q.data());
      rms_norm(k.data(), L.k_norm.data(), c.n_head_kv, hd, c.rms_eps, k.data());
    }
    rope(q.data(), 1, c.n_head, hd, pos_, lc.rope);
    rope(k.data(), 1, c.n_head_kv, hd, pos_, lc.rope);
    L.keys.insert(L.keys.end(), k.begin(), k.end());
    L.values.insert(L.values.end(), v.begin(), v.end());
    // Keys this token sees: the last `window` positions (itself included), or all.
    const int64_t n_all = pos_ + 1, n = lc.window > 0 ? std::min(n_all, lc.window) : n_all;
    const size_t first = (size_t)(n_all - n) * kvd;
    attention(q.data(), c.n_head, c.n_head_kv, hd, L.keys.data() + first, L.values.data() + first, n, c.attn_scale,
              att.data());
    matmul(att.data(), L.wo.data(), d, qd, 1, xb.data());
    if (c.post_norms) rms_norm(xb.data(), L.post_attn_norm.data(), 1, d, c.rms_eps, xb.data());
    for (int i = 0; i < d; ++i) x[i] += xb[i];
    rms_norm(x.data(), L.ffn_norm.data(), 1, d, c.rms_eps, xb.data());
    matmul(xb.data(), L.ffn_gate.data(), c.n_ff, d, 1, gate.data());
    matmul(xb.data(), L.ffn_up.data(), c.n_ff, d, 1, up.data());
    glu(c.glu, gate.data(), up.data(), c.n_ff, gate.data());
    matmul(gate.data(), L.ffn_down.data(), d, c.n_ff, 1, xb.data());
    if (c.post_norms) rms_norm(xb.data(), L.post_ffw_norm.data(), 1, d, c.rms_eps, xb.data());
    for (int i = 0; i < d; ++i) x[i] += xb[i];
  }
  ++pos_;
  rms_norm(x.data(), output_norm_.data(), 1, d, c.rms_eps, xb.data());
  std::vector<float> logits(c.n_vocab);
  matmul(xb.data(), output_.data(), c.n_vocab, d, 1, logits.data());
  return logits;
}

}  // namespace topkv::ref
