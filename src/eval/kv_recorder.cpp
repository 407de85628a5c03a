#include "src/eval/kv_recorder.h"

#include <algorithm>

#include "offload/partial_attention.h"
#include "src/common/error.h"
#include "src/model/model.h"

namespace topkv {

KvRecorder::KvRecorder(const ModelConfig& cfg, std::vector<int> layers, DType dtype)
    : cfg_(cfg), layers_(std::move(layers)), dtype_(dtype) {
  TOPKV_CHECK(!layers_.empty(), "no layer to record");
  for (int il : layers_) {
    TOPKV_CHECK(il >= 0 && il < cfg_.n_layer, "layer {} does not exist (the model has {} layers)", il, cfg_.n_layer);
    const auto& lc = cfg_.layers[(size_t)il];
    TOPKV_CHECK(!lc.sliding && lc.window == 0, "layer {} is a sliding-window layer: it keeps only its last {} keys; "
                "dump full-context layers", il, lc.window);
  }
  data_.resize(layers_.size());
  gen_k_.assign(layers_.size(), std::vector<std::vector<float>>((size_t)cfg_.n_head_kv));
  gen_v_ = gen_k_;
}

bool KvRecorder::overrides(int layer) const {
  return std::find(layers_.begin(), layers_.end(), layer) != layers_.end();
}

void KvRecorder::take_prefill(const Model& model) {
  n_prompt_ = model.n_past();
  const int hd = cfg_.head_dim, G = cfg_.n_head / cfg_.n_head_kv;
  for (size_t i = 0; i < layers_.size(); ++i) {
    std::vector<float> k, v;
    model.read_kv(layers_[i], k, v);  // [kv][n][hd]
    AttentionData& d = data_[i];
    d.scale = cfg_.attn_scale;
    d.source = fmt::format("{} layer {}", arch_name(cfg_.arch), layers_[i]);
    d.heads.clear();
    for (int h = 0; h < cfg_.n_head_kv; ++h) {
      AttentionHead head;
      head.keys = std::make_shared<RowStore>(hd, dtype_);
      head.values = std::make_shared<RowStore>(hd, dtype_);
      head.keys->append_f32(k.data() + (size_t)h * n_prompt_ * hd, n_prompt_);
      head.values->append_f32(v.data() + (size_t)h * n_prompt_ * hd, n_prompt_);
      head.group = G;
      d.heads.push_back(std::move(head));
    }
  }
}

void KvRecorder::decode_attention(int layer, const float* q, const float* k, const float* v, int64_t pos, float scale,
                                  float* out) {
  const size_t i = (size_t)(std::find(layers_.begin(), layers_.end(), layer) - layers_.begin());
  const int hd = cfg_.head_dim, G = cfg_.n_head / cfg_.n_head_kv;
  AttentionData& d = data_[i];
  TOPKV_CHECK(!d.heads.empty(), "kv recorder: decode before take_prefill");
  TOPKV_CHECK(pos == n_prompt_ + (int64_t)(gen_k_[i][0].size() / hd), "kv recorder: layer {} decodes position {} "
              "out of order", layer, pos);
  for (int h = 0; h < cfg_.n_head_kv; ++h) {
    auto& gk = gen_k_[i][(size_t)h];
    auto& gv = gen_v_[i][(size_t)h];
    gk.insert(gk.end(), k + (size_t)h * hd, k + (size_t)(h + 1) * hd);
    gv.insert(gv.end(), v + (size_t)h * hd, v + (size_t)(h + 1) * hd);
    AttentionHead& head = d.heads[(size_t)h];
    head.queries.insert(head.queries.end(), q + (size_t)h * G * hd, q + (size_t)(h + 1) * G * hd);
    head.n_queries += 1;
    const int64_t n_gen = (int64_t)(gk.size() / hd);
    for (int g = 0; g < G; ++g) {
      const float* qg = q + ((size_t)h * G + g) * hd;
      AttnPartial prompt(hd), gen(hd);
      std::vector<float> s((size_t)std::max(n_prompt_, n_gen));
      std::vector<int64_t> ids((size_t)n_prompt_);
      for (int64_t r = 0; r < n_prompt_; ++r) s[(size_t)r] = head.keys->dot(r, qg) * scale, ids[(size_t)r] = r;
      partial_add_rows(prompt, s.data(), *head.values, ids.data(), n_prompt_);
      for (int64_t r = 0; r < n_gen; ++r) s[(size_t)r] = dot_f32(gk.data() + r * hd, qg, hd) * scale;
      partial_add(gen, s.data(), nullptr, gv.data(), n_gen);
      partial_merge(prompt, gen);
      partial_finish(prompt, out + ((size_t)h * G + g) * hd);
    }
  }
}

}  // namespace topkv
