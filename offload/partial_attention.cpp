#include "offload/partial_attention.h"

#include <algorithm>
#include <cmath>

#include "src/common/error.h"
#include "src/common/vec_math.h"

namespace topkv {

namespace {
// Raises p.m to at least `m_new`, rescaling l and o; returns the new m.
float rescale_to(AttnPartial& p, float m_new) {
  if (m_new <= p.m) return p.m;
  if (p.l != 0.f) {
    float c = std::exp(p.m - m_new);
    p.l *= c;
    for (auto& x : p.o) x *= c;
  }
  p.m = m_new;
  return m_new;
}
}  // namespace

void partial_add(AttnPartial& p, const float* s, const float* logw, const float* v, int64_t n) {
  if (n <= 0) return;
  const size_t dv = p.o.size();
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, s[i] + (logw ? logw[i] : 0.f));
  float m = rescale_to(p, mx);
  for (int64_t i = 0; i < n; ++i) {
    float w = std::exp(s[i] + (logw ? logw[i] : 0.f) - m);
    p.l += w;
    axpy_f32(w, v + (size_t)i * dv, p.o.data(), dv);
  }
}

void partial_add_rows(AttnPartial& p, const float* s, const RowStore& values, const int64_t* ids, int64_t n) {
  if (n <= 0) return;
  TOPKV_CHECK((size_t)values.dim() == p.o.size(), "value dimension {} does not match the partial's {}",
              values.dim(), p.o.size());
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, s[i]);
  float m = rescale_to(p, mx);
  for (int64_t i = 0; i < n; ++i) {
    float w = std::exp(s[i] - m);
    p.l += w;
    axpy_row(values.dtype(), w, values.row(ids[i]), p.o.data(), p.o.size());
  }
}

void partial_add_gather(AttnPartial& p, const float* s, const float* logw, const float* rows, const int32_t* idx,
                        int64_t n) {
  if (n <= 0) return;
  const size_t dv = p.o.size();
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, s[i] + logw[i]);
  float m = rescale_to(p, mx);
  for (int64_t i = 0; i < n; ++i) {
    float w = std::exp(s[i] + logw[i] - m);
    p.l += w;
    axpy_f32(w, rows + (size_t)idx[i] * dv, p.o.data(), dv);
  }
}

void partial_merge(AttnPartial& a, const AttnPartial& b) {
  if (b.l == 0.f) return;
  if (a.l == 0.f) {
    a = b;
    return;
  }
  float m = std::max(a.m, b.m);
  float ca = std::exp(a.m - m), cb = std::exp(b.m - m);
  a.l = a.l * ca + b.l * cb;
  for (size_t j = 0; j < a.o.size(); ++j) a.o[j] = a.o[j] * ca + b.o[j] * cb;
  a.m = m;
}

void partial_finish(const AttnPartial& p, float* out) {
  for (size_t j = 0; j < p.o.size(); ++j) out[j] = p.l > 0.f ? p.o[j] / p.l : 0.f;
}

void partial_exact_group(const float* q, int G, float scale, const RowStore& keys, const RowStore& values, int64_t n,
                         std::vector<AttnPartial>& out, float* scores) {
  TOPKV_CHECK(n <= keys.size() && n <= values.size(), "attention over {} rows but the stores hold {} / {}", n,
              keys.size(), values.size());
  TOPKV_CHECK(G >= 1, "internal: a group of {} query heads", G);
  const size_t dv = (size_t)values.dim(), dk = (size_t)keys.dim();
  // Blocks of 4096 rows over the host's threads (a 16K-token head is four),
  // merged in block order: the result does not depend on the threads.
  constexpr int64_t kBlock = 4096;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  std::vector<AttnPartial> blocks((size_t)(nb * G), AttnPartial((int)dv));
#pragma omp parallel for schedule(dynamic, 1) if (nb > 1)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * kBlock, m = std::min(kBlock, n - lo);
    std::vector<float> s((size_t)(m * G)), v(dv);  // s[i * G + g]
    keys.for_each_span(lo, lo + m, [&](int64_t first, int64_t count, const void* rows) {
      dot_rows_multi(keys.dtype(), rows, (size_t)count, dk, q, (size_t)G, s.data() + (size_t)(first - lo) * G);
    });
    std::vector<float> mx((size_t)G, -std::numeric_limits<float>::infinity());
    for (int64_t i = 0; i < m; ++i)
      for (int g = 0; g < G; ++g) {
        float& x = s[(size_t)(i * G + g)];
        x *= scale;
        mx[(size_t)g] = std::max(mx[(size_t)g], x);
        if (scores) scores[(size_t)g * n + lo + i] = x;
      }
    AttnPartial* part = &blocks[(size_t)(b * G)];
    for (int g = 0; g < G; ++g) part[g].m = mx[(size_t)g];
    for (int64_t i = 0; i < m; ++i) {
      values.row_f32(lo + i, v.data());
      for (int g = 0; g < G; ++g) {
        const float w = std::exp(s[(size_t)(i * G + g)] - mx[(size_t)g]);
        part[g].l += w;
        axpy_f32(w, v.data(), part[g].o.data(), dv);
      }
    }
  }
  out.assign((size_t)G, AttnPartial((int)dv));
  for (int64_t b = 0; b < nb; ++b)
    for (int g = 0; g < G; ++g) partial_merge(out[(size_t)g], blocks[(size_t)(b * G + g)]);
}

AttnPartial partial_exact(const float* q, float scale, const RowStore& keys, const RowStore& values, int64_t n,
                          float* scores) {
  std::vector<AttnPartial> one;
  partial_exact_group(q, 1, scale, keys, values, n, one, scores);
  return std::move(one[0]);
}

void attention_exact(const float* q, float scale, const RowStore& keys, const RowStore& values, int64_t n,
                     float* out) {
  partial_finish(partial_exact(q, scale, keys, values, n), out);
}

}  // namespace topkv
