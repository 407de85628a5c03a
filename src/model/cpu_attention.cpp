// Attention of a chunk of queries over one layer's KV cache on the CPU
// (contract in backend.h, Backend::attention).
//   decode and short chunks (T < kGemmMinTokens): one task per (token, KV
//     head, split of kSplitKeys keys); the group's query heads share each pass
//     over the keys (dot_rows_multi), V rows accumulate (axpy_row), and the
//     splits' partials merge exactly.
//   prefill chunks: one task per (KV head, query head, block of kQueryBlock
//     tokens), walking the keys in tiles of kKeyTile with the online softmax
//     (running max m, sum l, unnormalised output o, rescaled when m grows —
//     the partial-attention merge of DESIGN.md applied tile by tile), each
//     tile's scores and outputs by sgemm. Memory per task is one tile, not the
//     context, so it scales to long prompts; fp16 tiles convert to fp32.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "src/common/error.h"
#include "src/common/vec_math.h"
#include "src/model/cpu_kernels.h"

namespace topkv::cpu {
namespace {

constexpr int kQueryBlock = 64;
constexpr int64_t kKeyTile = 512;
constexpr int64_t kSplitKeys = 1024;  // decode: keys per split (per task)

// The slots holding positions [lo, lo + n) as at most two runs of consecutive
// slots (the ring wraps once at most, since n <= capacity).
struct SlotRuns {
  int64_t start[2], count[2];
  int n = 0;
};
SlotRuns slot_runs(int64_t lo, int64_t n, int64_t capacity) {
  SlotRuns s;
  const int64_t first = lo % capacity, c0 = std::min(n, capacity - first);
  s.start[s.n] = first, s.count[s.n++] = c0;
  if (c0 < n) s.start[s.n] = 0, s.count[s.n++] = n - c0;
  return s;
}

// Keys a query at position p sees: [lo, p].
int64_t first_visible(int64_t p, int64_t window) { return window > 0 ? std::max<int64_t>(0, p - window + 1) : 0; }

// Decode: one task per (token, KV head, split of the keys). The group's
// query heads share each pass over the keys (dot_rows_multi); a split keeps
// the partial (m, l, o) of DESIGN.md and the splits merge exactly afterwards,
// so one token over a long context still spreads over every thread
// (flash-decoding's split-K).
void attention_per_token(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& c, int64_t window,
                         float scale, float* out) {
  const int hd = c.head_dim, n_kv = c.n_kv_heads, group = n_head / n_kv;
  const size_t es = dtype_size(c.dtype);
  const int64_t most_keys = window > 0 ? std::min<int64_t>(window, pos0 + T) : pos0 + T;
  const int n_split = (int)((most_keys + kSplitKeys - 1) / kSplitKeys);
  // Partials [t][kh][split][g]: running max, sum, unnormalised output.
  const size_t n_part = (size_t)T * n_kv * n_split * group;
  std::vector<float> pm(n_part), pl(n_part), po(n_part * hd);
#pragma omp parallel if (T * n_kv * n_split > 1)
  {
    std::vector<float> scores;
#pragma omp for schedule(dynamic, 1) collapse(3)
    for (int t = 0; t < T; ++t)
      for (int kh = 0; kh < n_kv; ++kh)
        for (int sp = 0; sp < n_split; ++sp) {
          const int64_t p = pos0 + t, first = first_visible(p, window), len = p - first + 1;
          const int64_t lo = first + len * sp / n_split, n = first + len * (sp + 1) / n_split - lo;  // may be 0
          const size_t part = (((size_t)t * n_kv + kh) * n_split + sp) * group;
          float *m = pm.data() + part, *l = pl.data() + part, *o = po.data() + part * hd;
          std::fill(m, m + group, -INFINITY);
          std::fill(l, l + group, 0.f);
          std::fill(o, o + (size_t)group * hd, 0.f);
          if (n == 0) continue;
          const float* qg = q + ((size_t)t * n_head + (size_t)kh * group) * hd;
          scores.resize((size_t)n * group);
          const auto* kbase = c.k.as<uint8_t>() + kh * c.head_stride() * es;
          const auto* vbase = c.v.as<uint8_t>() + kh * c.head_stride() * es;
          const SlotRuns runs = slot_runs(lo, n, c.capacity);
          for (int s = 0, done = 0; s < runs.n; done += (int)runs.count[s], ++s)
            dot_rows_multi(c.dtype, kbase + runs.start[s] * hd * es, (size_t)runs.count[s], (size_t)hd, qg,
                           (size_t)group, scores.data() + (size_t)done * group);
          for (int64_t r = 0; r < n; ++r)
            for (int g = 0; g < group; ++g) m[g] = std::max(m[g], scores[r * group + g] * scale);
          for (int64_t r = 0; r < n; ++r)
            for (int g = 0; g < group; ++g) {
              float& e = scores[r * group + g];
              e = std::exp(e * scale - m[g]);
              l[g] += e;
            }
          int64_t r = 0;
          for (int s = 0; s < runs.n; ++s)
            for (int64_t i = 0; i < runs.count[s]; ++i, ++r) {
              const uint8_t* vrow = vbase + (runs.start[s] + i) * hd * es;
              for (int g = 0; g < group; ++g) axpy_row(c.dtype, scores[r * group + g], vrow, o + g * hd, hd);
            }
        }
  }
  // Merge the splits: m = max m_s, l = sum l_s e^(m_s - m), o = sum o_s e^(m_s - m); out = o / l.
  for (int t = 0; t < T; ++t)
    for (int kh = 0; kh < n_kv; ++kh)
      for (int g = 0; g < group; ++g) {
        const size_t base = ((size_t)t * n_kv + kh) * n_split * group + g;
        float mx = -INFINITY;
        for (int sp = 0; sp < n_split; ++sp) mx = std::max(mx, pm[base + (size_t)sp * group]);
        float* og = out + ((size_t)t * n_head + (size_t)kh * group + g) * hd;
        std::fill(og, og + hd, 0.f);
        float sum = 0.f;
        for (int sp = 0; sp < n_split; ++sp) {
          const size_t i = base + (size_t)sp * group;
          if (pl[i] == 0.f) continue;  // an empty split
          const float w = std::exp(pm[i] - mx);
          sum += pl[i] * w;
          axpy_f32(w, po.data() + i * hd, og, hd);
        }
        const float inv = 1.f / sum;
        for (int d = 0; d < hd; ++d) og[d] *= inv;
      }
}

// Rows [slot, slot + n) of one KV head as fp32: a pointer into an fp32
// cache, else converted into `scratch`.
const float* rows_f32(const KvLayerCache& c, const Buffer& buf, int kh, int64_t slot, int64_t n,
                      std::vector<float>& scratch) {
  const size_t es = dtype_size(c.dtype);
  const uint8_t* src = buf.as<uint8_t>() + (kh * c.head_stride() + (size_t)slot * c.head_dim) * es;
  if (c.dtype == DType::F32) return reinterpret_cast<const float*>(src);
  scratch.resize((size_t)n * c.head_dim);
  to_f32(c.dtype, src, scratch.data(), (size_t)n * c.head_dim);
  return scratch.data();
}

void attention_blocked(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& c, int64_t window,
                       float scale, float* out) {
  const int hd = c.head_dim, n_kv = c.n_kv_heads, group = n_head / n_kv;
  const int n_blocks = (T + kQueryBlock - 1) / kQueryBlock;
  const int ld = n_head * hd;  // between tokens in q and out
#pragma omp parallel
  {
    std::vector<float> kbuf, vbuf, s((size_t)kQueryBlock * kKeyTile), m(kQueryBlock), l(kQueryBlock);
#pragma omp for schedule(dynamic, 1) collapse(3)
    for (int kh = 0; kh < n_kv; ++kh)
      for (int j = 0; j < group; ++j)
        for (int b = 0; b < n_blocks; ++b) {
          const int t0 = b * kQueryBlock, tb = std::min(kQueryBlock, T - t0);
          const int64_t p_first = pos0 + t0, p_last = p_first + tb - 1;
          const size_t head = (size_t)t0 * ld + (size_t)(kh * group + j) * hd;
          const float* qb = q + head;
          float* ob = out + head;
          std::fill(m.begin(), m.end(), -INFINITY);
          std::fill(l.begin(), l.end(), 0.f);
          for (int t = 0; t < tb; ++t) std::memset(ob + (size_t)t * ld, 0, hd * sizeof(float));
          // Key tiles over [first visible of the block's first query, its last
          // query], each within one run of slots.
          for (int64_t k0 = first_visible(p_first, window); k0 <= p_last;) {
            const int64_t slot = k0 % c.capacity;
            const int64_t nk = std::min({kKeyTile, p_last - k0 + 1, c.capacity - slot});
            const float* kt = rows_f32(c, c.k, kh, slot, nk, kbuf);
            const float* vt = rows_f32(c, c.v, kh, slot, nk, vbuf);
            gemm_abt((int)nk, tb, hd, kt, hd, qb, ld, s.data(), (int)nk);  // s[t][i] = q_t . k_i
            for (int t = 0; t < tb; ++t) {
              const int64_t p = p_first + t;
              // Visible part of this tile for query t: [a, e).
              const int64_t a = std::clamp<int64_t>(first_visible(p, window) - k0, 0, nk);
              const int64_t e = std::clamp<int64_t>(p + 1 - k0, 0, nk);
              float* st = s.data() + (size_t)t * nk;
              float tile_max = -INFINITY;
              for (int64_t i = a; i < e; ++i) tile_max = std::max(tile_max, st[i] * scale);
              const float m_new = std::max(m[t], tile_max);
              float tile_sum = 0.f;
              for (int64_t i = 0; i < nk; ++i) {
                st[i] = i >= a && i < e ? std::exp(st[i] * scale - m_new) : 0.f;
                tile_sum += st[i];
              }
              if (m_new != -INFINITY && m[t] != m_new) {  // rescale what was summed under the old max
                const float corr = std::exp(m[t] - m_new);
                l[t] *= corr;
                for (int i = 0; i < hd; ++i) ob[(size_t)t * ld + i] *= corr;
                m[t] = m_new;
              }
              l[t] += tile_sum;
            }
            gemm_ab(hd, tb, (int)nk, vt, hd, s.data(), (int)nk, ob, ld, 1.f);  // o_t += sum_i p_ti v_i
            k0 += nk;
          }
          for (int t = 0; t < tb; ++t) {
            const float inv = 1.f / l[t];
            for (int i = 0; i < hd; ++i) ob[(size_t)t * ld + i] *= inv;
          }
        }
  }
}

}  // namespace

void attention(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& c, int64_t window, float scale,
               float* out) {
  const int n_kv = c.n_kv_heads, group = n_head / n_kv;
  TOPKV_CHECK(group * n_kv == n_head, "{} query heads do not split over {} KV heads", n_head, n_kv);
  // Every position from the first query's oldest key to the last query must
  // still be in the cache (a ring overwrites the oldest).
  const int64_t first_key = first_visible(pos0, window), span = pos0 + T - first_key;
  TOPKV_CHECK(span <= c.capacity, "attention over positions {}..{} needs {} cache slots but the cache keeps {}",
              first_key, pos0 + T - 1, span, c.capacity);
  if (T < kGemmMinTokens)
    attention_per_token(q, T, n_head, pos0, c, window, scale, out);
  else
    attention_blocked(q, T, n_head, pos0, c, window, scale, out);
}

}  // namespace topkv::cpu
