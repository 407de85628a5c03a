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

AttnPartial partial_exact(const float* q, float scale, const RowStore& keys, const RowStore& values, int64_t n,
                          float* scores) {
  TOPKV_CHECK(n <= keys.size() && n <= values.size(), "attention over {} rows but the stores hold {} / {}", n,
              keys.size(), values.size());
  // Blocks of rows over the host's threads (a 1M-row head is ~1 GFLOP per
  // query), merged in block order: the result does not depend on the threads.
  constexpr int64_t kBlock = 16384;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  std::vector<AttnPartial> blocks((size_t)nb, AttnPartial(values.dim()));
#pragma omp parallel for schedule(dynamic, 1) if (nb > 1)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * kBlock, m = std::min(kBlock, n - lo);
    std::vector<float> s((size_t)m);
    std::vector<int64_t> ids((size_t)m);
    for (int64_t i = 0; i < m; ++i) s[(size_t)i] = keys.dot(lo + i, q) * scale, ids[(size_t)i] = lo + i;
    if (scores) std::copy(s.begin(), s.end(), scores + lo);
    partial_add_rows(blocks[(size_t)b], s.data(), values, ids.data(), m);
  }
  AttnPartial p(values.dim());
  for (const AttnPartial& b : blocks) partial_merge(p, b);
  return p;
}

void attention_exact(const float* q, float scale, const RowStore& keys, const RowStore& values, int64_t n,
                     float* out) {
  partial_finish(partial_exact(q, scale, keys, values, n), out);
}

}  // namespace topkv
