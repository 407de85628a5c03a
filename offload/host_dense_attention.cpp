#include "offload/host_dense_attention.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>

#include "offload/partial_attention.h"
#include "src/common/error.h"
#include "src/common/parallel_errors.h"
#include "src/common/progress.h"
#include "src/common/timer.h"
#include "src/common/vec_math.h"
#include "src/model/model.h"

namespace topkv {

namespace {
constexpr int64_t kTile = 128;  // keys scored at a time: their scores and fp32 values stay in L1/L2
}

HostDenseAttention::HostDenseAttention(const ModelConfig& cfg, int dense_layers, DType dtype, bool progress)
    : cfg_(cfg), dtype_(dtype), progress_(progress), layers_(offloaded_layers(cfg, dense_layers)) {
  TOPKV_CHECK(dtype_ == DType::F16 || dtype_ == DType::F32, "host-dense attention keeps f16 or f32 rows, not {}",
              dtype_name(dtype_));
  TOPKV_CHECK(cfg_.n_head_kv >= 1 && cfg_.n_head % cfg_.n_head_kv == 0,
              "{} query heads cannot be grouped over {} KV heads", cfg_.n_head, cfg_.n_head_kv);
  TOPKV_CHECK(!layers_.empty(), "host-dense attention has no layer to serve: every full-context layer is among the "
              "first --dense-layers {} (the model has {} layers); lower --dense-layers", dense_layers, cfg_.n_layer);
  slot_.assign((size_t)cfg_.n_layer, -1);
  heads_.resize(layers_.size());
  for (size_t i = 0; i < layers_.size(); ++i) {
    slot_[(size_t)layers_[i]] = (int)i;
    for (int h = 0; h < cfg_.n_head_kv; ++h)
      heads_[i].push_back({std::make_unique<RowStore>(cfg_.head_dim, dtype_),
                           std::make_unique<RowStore>(cfg_.head_dim, dtype_)});
  }
}

bool HostDenseAttention::overrides(int layer) const {
  return layer >= 0 && layer < (int)slot_.size() && slot_[(size_t)layer] >= 0;
}

int64_t HostDenseAttention::n_tokens(int layer) const {
  TOPKV_CHECK(overrides(layer), "layer {} is not served by host-dense attention", layer);
  return heads_[(size_t)slot_[(size_t)layer]][0].k->size();
}

size_t HostDenseAttention::host_bytes() const {
  size_t b = 0;
  for (auto& layer : heads_)  // rows held, counted as OffloadedLayer counts its stores
    for (auto& h : layer) b += (size_t)h.k->size() * h.k->row_bytes() + (size_t)h.v->size() * h.v->row_bytes();
  return b;
}

std::string HostDenseAttention::describe() const {
  std::string ids;
  for (int il : layers_) ids += fmt::format("{}{}", ids.empty() ? "" : " ", il);
  return fmt::format("host-dense attention (exact, on {} CPU threads) on {} of {} layers ({}), {} rows",
                     omp_get_max_threads(), layers_.size(), cfg_.n_layer, ids, dtype_name(dtype_));
}

void HostDenseAttention::take_prefill(const Model& model) {
  take_context(model.n_past(), model.kv_reader());
}

// Layers one after another, each in pieces of kContextPiece
// positions (one fp32 piece at a time; the reader parallelises inside), heads
// of a piece in parallel.
void HostDenseAttention::take_context(int64_t n, const KvReader& read) {
  TOPKV_CHECK(n >= 1, "host-dense attention needs a context of at least one token");
  for (auto& layer : heads_)
    TOPKV_CHECK(layer[0].k->size() == 0, "host-dense attention already holds a context; start a new one");
  const int kv = cfg_.n_head_kv;
  const size_t hd = (size_t)cfg_.head_dim;
  Progress bar("host KV", (int64_t)layers_.size() * kv * n, "keys", progress_ && n * kv >= 100000);
  Timer t;
  std::vector<float> k, v;
  for (size_t i = 0; i < layers_.size(); ++i)
    for (int64_t t0 = 0; t0 < n; t0 += kContextPiece) {
      const int64_t m = std::min(kContextPiece, n - t0);
      const size_t per_head = (size_t)m * hd;
      read_positions(read, layers_[i], t0, m, kv * hd, k, v);  // [kv][m][hd]: each head's rows contiguous
      ParallelErrors errors;  // a store past its capacity throws (src/common/parallel_errors.h)
#pragma omp parallel for schedule(static) if (kv > 1)
      for (int h = 0; h < kv; ++h) errors.run([&] {
        heads_[i][(size_t)h].k->append_f32(k.data() + h * per_head, m);
        heads_[i][(size_t)h].v->append_f32(v.data() + h * per_head, m);
      });
      errors.rethrow();
      bar.add((int64_t)kv * m);
    }
  bar.finish();
  stats_.build_s = t.seconds();
}

int64_t HostDenseAttention::blocks_per_head(int64_t n_keys, int kv_heads, int threads) {
  const int64_t want = (4 * (int64_t)std::max(threads, 1) + kv_heads - 1) / kv_heads;  // ~4 tasks per core
  const int64_t most = std::max<int64_t>(1, n_keys / kMinBlock);
  return std::clamp<int64_t>(want, 1, most);
}

void HostDenseAttention::decode_attention(int layer, const float* q, const float* k, const float* v, int64_t pos,
                                          float scale, float* out) {
  TOPKV_CHECK(overrides(layer), "internal: layer {} is not served by host-dense attention", layer);
  std::vector<Head>& heads = heads_[(size_t)slot_[(size_t)layer]];
  TOPKV_CHECK(pos == heads[0].k->size(), "host-dense layer {} holds {} tokens but the model decodes position {}",
              layer, heads[0].k->size(), pos);
  Timer timer;
  const int kv = cfg_.n_head_kv, G = cfg_.n_head / kv, hd = cfg_.head_dim;
  for (int h = 0; h < kv; ++h) {
    heads[(size_t)h].k->append_f32(k + (size_t)h * hd, 1);
    heads[(size_t)h].v->append_f32(v + (size_t)h * hd, 1);
  }
  const int64_t n = pos + 1;
  const int64_t nb = blocks_per_head(n, kv, omp_get_max_threads());
  const int64_t block = (n + nb - 1) / nb;
  // parts[(h * nb + b) * G + g]: query head h*G+g over block b of KV head h.
  std::vector<AttnPartial> parts((size_t)(kv * nb * G), AttnPartial(hd));
#pragma omp parallel
  {
    std::vector<float> s((size_t)kTile * G), sg((size_t)kTile * G), vt((size_t)kTile * hd);
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < kv * nb; ++task) {
      const int h = (int)(task / nb);
      const int64_t b0 = (task % nb) * block, b1 = std::min(n, b0 + block);
      const RowStore &keys = *heads[(size_t)h].k, &values = *heads[(size_t)h].v;
      const float* qg = q + (size_t)h * G * hd;  // the group's G query heads, contiguous
      AttnPartial* p = &parts[(size_t)task * G];
      // Spans never cross a store chunk, so rows of K and V are contiguous in them.
      keys.for_each_span(b0, b1, [&](int64_t first, int64_t m_span, const void*) {
        for (int64_t r0 = first; r0 < first + m_span; r0 += kTile) {
          const int64_t m = std::min(kTile, first + m_span - r0);
          dot_rows_multi(dtype_, keys.row(r0), (size_t)m, (size_t)hd, qg, (size_t)G, s.data());
          for (int64_t r = 0; r < m; ++r)
            for (int g = 0; g < G; ++g) sg[(size_t)g * kTile + r] = s[(size_t)r * G + g] * scale;
          to_f32(dtype_, values.row(r0), vt.data(), (size_t)m * hd);
          for (int g = 0; g < G; ++g) partial_add(p[g], sg.data() + (size_t)g * kTile, nullptr, vt.data(), m);
        }
      });
    }
  }
  for (int h = 0; h < kv; ++h)
    for (int g = 0; g < G; ++g) {
      AttnPartial& acc = parts[(size_t)(h * nb) * G + g];
      for (int64_t b = 1; b < nb; ++b) partial_merge(acc, parts[(size_t)(h * nb + b) * G + g]);
      partial_finish(acc, out + (size_t)(h * G + g) * hd);
    }
  stats_.attend_s += timer.seconds();
  if (layer == layers_.back()) ++stats_.steps;
}

}  // namespace topkv
