#include "bench/synthetic.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <thread>

#include "bench/rng.h"
#include "bench/synthetic_plant.h"
#include "src/common/error.h"
#include "src/common/progress.h"
#include "src/common/vec_math.h"

namespace topkv {

namespace {

// Stream ids: each kind of draw has its own family of streams.
enum Stream : uint64_t { kConst = 1, kTopic = 2, kNoise = 3, kSample = 4, kQuery = 5 };

constexpr int64_t kSubBlock = 1024;         // rows per random stream
constexpr int64_t kSuperBlock = kSyntheticSuperBlock;  // rows generated before appending to the stores

float norm2(const std::vector<float>& v) { return std::sqrt(std::inner_product(v.begin(), v.end(), v.begin(), 0.f)); }

// Everything drawn once per KV head.
struct HeadModel {
  int d = 0, half = 0, quarter = 0;
  std::vector<float> sd;           // per-dimension std of the key noise, mean sd^2 = 1
  std::vector<float> offset;       // o, on offset pairs
  std::vector<float> sink_dir;     // u, unit, orthogonal to o
  std::vector<float> value_mean;   // mu_v
  std::vector<int> value_perm;     // which topic dimension each value dimension carries
  std::vector<std::vector<float>> query_mean;  // m_g per query head, on content pairs
  std::vector<float> topic_init;   // x_{-1}, stationary
  double rho = 0, recency_a = 0;
  float noise_scale = 0;           // per-dimension std of the query noise e (content dims)

  bool content_dim(int i) const { return (i % half) < quarter; }
};

HeadModel make_head_model(const SyntheticConfig& c, int head) {
  Rng r(c.seed, kConst, (uint64_t)head);
  HeadModel M;
  const int d = M.d = c.head_dim;
  M.half = d / 2;
  M.quarter = M.half / 2;
  M.sd.resize(d);
  double ms = 0;
  for (auto& s : M.sd) {
    s = (float)std::pow(c.dim_spread, r.uniform() - 0.5);
    ms += (double)s * s;
  }
  for (auto& s : M.sd) s /= (float)std::sqrt(ms / d);

  // Offset: heavier on lower frequencies (larger pair index), random signs.
  M.offset.assign(d, 0.f);
  for (int i = 0; i < d; ++i)
    if (!M.content_dim(i))
      M.offset[i] = (float)((i % M.half) - M.quarter + 1) * (r.uniform() < 0.5 ? -1.f : 1.f);
  float on = norm2(M.offset);
  for (auto& x : M.offset) x = on > 0 ? x * (float)(c.key_offset * std::sqrt(d)) / on : 0.f;

  // Sink direction: on the offset pairs (sinks are "massive" there too), so the
  // query noise and OOD mean, which live on content pairs, do not reach it.
  M.sink_dir.assign(d, 0.f);
  for (int i = 0; i < d; ++i)
    if (!M.content_dim(i)) M.sink_dir[i] = (float)r.normal();
  float oo = std::inner_product(M.offset.begin(), M.offset.end(), M.offset.begin(), 0.f);
  if (oo > 0) {
    float p = std::inner_product(M.sink_dir.begin(), M.sink_dir.end(), M.offset.begin(), 0.f) / oo;
    for (int i = 0; i < d; ++i) M.sink_dir[i] -= p * M.offset[i];
  }
  float un = norm2(M.sink_dir);
  for (auto& x : M.sink_dir) x /= un;

  M.value_mean.resize(d);
  for (auto& x : M.value_mean) x = 0.5f * (float)r.normal();
  M.value_perm.resize(d);
  std::iota(M.value_perm.begin(), M.value_perm.end(), 0);
  for (int i = d - 1; i > 0; --i) std::swap(M.value_perm[i], M.value_perm[r.below(i + 1)]);

  // OOD query means: content dims, weighted to dims where keys vary little.
  for (int g = 0; g < c.group; ++g) {
    std::vector<float> m(d, 0.f);
    for (int i = 0; i < d; ++i)
      if (M.content_dim(i)) m[i] = (float)r.normal() / (M.sd[i] * M.sd[i]);
    float mn = norm2(m);
    for (auto& x : m) x = mn > 0 ? x * (float)(c.query_shift * std::sqrt(d)) / mn : 0.f;
    M.query_mean.push_back(std::move(m));
  }
  M.topic_init.resize(d);
  for (auto& x : M.topic_init) x = (float)r.normal();

  M.rho = c.topic_len > 0 ? std::exp(-1.0 / c.topic_len) : 0.0;
  M.recency_a = oo > 0 ? c.recency * std::sqrt(d) / oo : 0.0;
  double content_var = 0;
  for (int i = 0; i < d; ++i)
    if (M.content_dim(i)) content_var += (double)M.sd[i] * M.sd[i];
  M.noise_scale = (float)(c.query_noise * std::sqrt(d / content_var));
  return M;
}

// Keys and values of rows [t0, t0 + rows) given the topic path x (rows x d).
void compose_rows(const SyntheticConfig& c, const HeadModel& M, int head, int64_t sub_block, int64_t t0,
                  int64_t rows, const float* x, float* keys, float* values) {
  const int d = M.d, half = M.half;
  const float ws = (float)std::sqrt(c.topic_weight), wn = (float)std::sqrt(1.0 - c.topic_weight);
  const float sink = (float)(c.sink_norm * std::sqrt(d));
  Rng r(c.seed, kNoise, (uint64_t)head, (uint64_t)sub_block);
  // RoPE angles advance by a fixed rotation per row: start from the exact
  // angle at t0 and multiply (error ~1e-13 over a sub-block, far below fp32).
  std::vector<double> cs(half, 1.0), sn(half, 0.0), step_cs(half, 1.0), step_sn(half, 0.0);
  if (c.rope_base > 0)
    for (int p = 0; p < half; ++p) {
      const double theta = std::pow(c.rope_base, -2.0 * p / d);
      cs[p] = std::cos((double)t0 * theta), sn[p] = std::sin((double)t0 * theta);
      step_cs[p] = std::cos(theta), step_sn[p] = std::sin(theta);
    }
  for (int64_t t = 0; t < rows; ++t) {
    const float* xt = x + t * d;
    float* k = keys + t * d;
    float* v = values + t * d;
    const bool is_sink = t0 + t < c.n_sinks;
    for (int i = 0; i < d; ++i) k[i] = M.offset[i] + M.sd[i] * (ws * xt[i] + wn * (float)r.normal());
    if (is_sink)
      for (int i = 0; i < d; ++i) k[i] += sink * M.sink_dir[i];
    for (int p = 0; p < half; ++p) {
      const double a = k[p], b = k[p + half];
      k[p] = (float)(a * cs[p] - b * sn[p]);
      k[p + half] = (float)(a * sn[p] + b * cs[p]);
      const double nc = cs[p] * step_cs[p] - sn[p] * step_sn[p];
      sn[p] = sn[p] * step_cs[p] + cs[p] * step_sn[p];
      cs[p] = nc;
    }
    for (int i = 0; i < d; ++i) {
      float xi = (float)r.normal();
      v[i] = is_sink ? 0.1f * xi : M.value_mean[i] + ws * xt[M.value_perm[i]] + wn * xi;
    }
  }
}

// Rows [t_begin, t_end) of one head, a super-block at a time:
// emit(t0, rows, keys, values) with fp32 [rows][d] each. The topic enters
// t_begin from `topic` (x_{t_begin - 1}) where it is given and not empty,
// else from its stationary distribution (topic_init), so a run from 0 is the
// full generation and a run from later is distributed like its rows. `topic`,
// where given, leaves as x_{t_end - 1}: runs that continue each other from
// super-block bounds are the full generation's rows, bit for bit.
void generate_rows(const SyntheticConfig& c, const HeadModel& M, int head, int64_t t_begin, int64_t t_end,
                   int threads, const std::function<void(int64_t, int64_t, const float*, const float*)>& emit,
                   std::vector<float>* topic = nullptr) {
  const int d = M.d;
  const float innov = (float)std::sqrt(1.0 - M.rho * M.rho), rho = (float)M.rho;
  // Buffers for one super-block, or for fewer rows when fewer are asked for
  // (a sliding window's ring: a few hundred rows, not 64K, many times over).
  const size_t rows_max = (size_t)std::min(kSuperBlock, std::max<int64_t>(0, t_end - t_begin));
  // Kept per thread across calls (a fill calls this once per layer and head):
  // fresh buffers of this size come from mmap, and faulting 96 MB of zeroed
  // pages in per call cost a long synthetic fill seconds (perf: the
  // kernel's clear_page). Every element is written before it is read. The
  // references are the calling thread's buffers: inside the parallel regions
  // below, the name of a thread_local would be each worker's own (empty) one.
  static thread_local std::vector<float> x_mine, kb_mine, vb_mine;
  std::vector<float>&x = x_mine, &kb = kb_mine, &vb = vb_mine;
  for (std::vector<float>* b : {&x, &kb, &vb})
    if (b->size() < rows_max * d) b->resize(rows_max * d);
  std::vector<float> carry = topic && !topic->empty() ? *topic : M.topic_init;  // x_{t0 - 1}
  TOPKV_CHECK(carry.size() == (size_t)d, "internal: a topic state of {} values for head_dim {}", carry.size(), d);
  std::vector<std::vector<float>> carry_in((size_t)(kSuperBlock / kSubBlock), std::vector<float>(d));
  for (int64_t t0 = t_begin; t0 < t_end; t0 += kSuperBlock) {
    const int64_t rows = std::min(kSuperBlock, t_end - t0);
    const int64_t n_sub = (rows + kSubBlock - 1) / kSubBlock;
    // Pass 1: each sub-block's AR(1) path started from zero (parallel).
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int64_t b = 0; b < n_sub; ++b) {
      const int64_t lo = b * kSubBlock, hi = std::min(rows, lo + kSubBlock);
      Rng r(c.seed, kTopic, (uint64_t)head, (uint64_t)((t0 + lo) / kSubBlock));
      for (int64_t t = lo; t < hi; ++t)
        for (int i = 0; i < d; ++i)
          x[t * d + i] = (t > lo ? rho * x[(t - 1) * d + i] : 0.f) + innov * (float)r.normal();
    }
    // Sequential: the true state entering each sub-block (x_t = path_t + rho^(t-lo+1) x_{lo-1}).
    for (int64_t b = 0; b < n_sub; ++b) {
      const int64_t lo = b * kSubBlock, hi = std::min(rows, lo + kSubBlock);
      carry_in[b] = carry;
      const float p = (float)std::pow(M.rho, (double)(hi - lo));
      for (int i = 0; i < d; ++i) carry[i] = x[(hi - 1) * d + i] + p * carry_in[b][i];
    }
    // Pass 2: add the carried state, draw the noise, compose keys and values (parallel).
#pragma omp parallel for num_threads(threads) schedule(dynamic)
    for (int64_t b = 0; b < n_sub; ++b) {
      const int64_t lo = b * kSubBlock, hi = std::min(rows, lo + kSubBlock);
      float p = 1.f;
      for (int64_t t = lo; t < hi; ++t) {
        p *= rho;
        for (int i = 0; i < d; ++i) x[t * d + i] += p * carry_in[b][i];
      }
      compose_rows(c, M, head, (t0 + lo) / kSubBlock, t0 + lo, hi - lo, &x[lo * d], &kb[lo * d], &vb[lo * d]);
    }
    emit(t0, rows, kb.data(), vb.data());
  }
  if (topic) *topic = carry;
}

void generate_keys_values(const SyntheticConfig& c, const HeadModel& M, int head, AttentionHead& out,
                          int threads, Progress& bar) {
  generate_rows(c, M, head, 0, c.n_keys, threads, [&](int64_t, int64_t rows, const float* k, const float* v) {
    out.keys->append_f32(k, rows);
    out.values->append_f32(v, rows);
    bar.add(rows);
  });
}

// One query head of one decode step: base query, then planted sink/retrieval hits.
void make_query(const SyntheticConfig& c, const HeadModel& M, const NormaliserSample& S, const RowStore& keys,
                int head, int j, int g, float* q, PlantedQuery& planted) {
  const int d = M.d;
  const int64_t n = keys.size();
  Rng r(c.seed, kQuery, (uint64_t)head, (uint64_t)j * (uint64_t)c.group + (uint64_t)g);
  for (int i = 0; i < d; ++i) {
    float e = M.content_dim(i) ? M.noise_scale * (float)r.normal() : 0.f;
    q[i] = M.query_mean[g][i] + (float)M.recency_a * M.offset[i] + e;
  }
  apply_rope(q, d, (double)(n + j), c.rope_base);

  // Planted groups: the sinks together (their keys are nearly parallel, so they
  // are calibrated as one), each far target on its own.
  std::vector<PlantGroup> groups;
  planted.sink = c.n_sinks > 0 && r.uniform() < c.sink_frac;
  if (planted.sink) {
    groups.emplace_back();
    for (int64_t t = 0; t < std::min<int64_t>(c.n_sinks, n); ++t) groups.back().keys.push_back(t);
    groups.back().share = c.sink_mass;
  }
  const int64_t far_lo = std::min<int64_t>(c.n_sinks, n), far_hi = std::max(far_lo, n - kNewestExact);
  if (r.uniform() < c.retrieval_frac && far_hi > far_lo) {
    const int64_t want = std::min<int64_t>(c.retrieval_targets, far_hi - far_lo);
    while ((int64_t)planted.targets.size() < want) {
      int64_t t = far_lo + r.below(far_hi - far_lo);
      if (std::find(planted.targets.begin(), planted.targets.end(), t) == planted.targets.end())
        planted.targets.push_back(t);
    }
    std::sort(planted.targets.begin(), planted.targets.end());
    for (int64_t t : planted.targets) groups.push_back({{t}, c.retrieval_mass / (double)want});
  }
  const int64_t neighbourhood = std::clamp<int64_t>((int64_t)(2 * c.topic_len), 16, 1024);
  plant_targets(S, keys, groups, c.n_sinks, neighbourhood, q);
}

}  // namespace

void apply_rope(float* x, int dim, double pos, double base, bool inverse) {
  if (base <= 0) return;
  const int half = dim / 2;
  for (int p = 0; p < half; ++p) {
    double a = pos * std::pow(base, -2.0 * p / dim) * (inverse ? -1.0 : 1.0);
    double cs = std::cos(a), sn = std::sin(a);
    double u = x[p], v = x[p + half];
    x[p] = (float)(u * cs - v * sn);
    x[p + half] = (float)(u * sn + v * cs);
  }
}

void SyntheticConfig::validate() const {
  TOPKV_CHECK(n_keys >= 1, "synthetic: n_keys must be at least 1 (got {})", n_keys);
  TOPKV_CHECK(head_dim >= 4 && head_dim % 2 == 0 && head_dim <= 4096,
              "synthetic: head_dim must be even and in 4..4096 (RoPE pairs dimensions; got {})", head_dim);
  TOPKV_CHECK(n_queries >= 1, "synthetic: n_queries must be at least 1 (got {})", n_queries);
  TOPKV_CHECK(group >= 1 && group <= 256, "synthetic: the GQA group must be in 1..256 (got {})", group);
  TOPKV_CHECK(kv_heads >= 1 && kv_heads <= 1024, "synthetic: kv_heads must be in 1..1024 (got {})", kv_heads);
  TOPKV_CHECK(key_offset >= 0, "synthetic: key_offset must be >= 0 (got {})", key_offset);
  TOPKV_CHECK(dim_spread >= 1, "synthetic: dim_spread is a max/min ratio and must be >= 1 (got {})", dim_spread);
  TOPKV_CHECK(topic_len >= 0, "synthetic: topic_len must be >= 0 (got {})", topic_len);
  TOPKV_CHECK(topic_weight >= 0 && topic_weight <= 1, "synthetic: topic_weight must be in [0, 1] (got {})",
              topic_weight);
  TOPKV_CHECK(rope_base == 0 || rope_base > 1, "synthetic: rope_base must be 0 (no RoPE) or > 1 (got {})",
              rope_base);
  TOPKV_CHECK(query_shift >= 0 && query_noise >= 0, "synthetic: query_shift and query_noise must be >= 0");
  TOPKV_CHECK(recency >= 0, "synthetic: recency must be >= 0 (got {})", recency);
  TOPKV_CHECK(recency == 0 || key_offset > 0,
              "synthetic: recency comes from the queries' alignment with the key offset; with key_offset 0 "
              "set recency 0");
  TOPKV_CHECK(n_sinks >= 0 && n_sinks <= n_keys, "synthetic: n_sinks must be in 0..n_keys (got {})", n_sinks);
  TOPKV_CHECK(sink_norm >= 0, "synthetic: sink_norm must be >= 0 (got {})", sink_norm);
  TOPKV_CHECK(sink_frac >= 0 && sink_frac <= 1 && retrieval_frac >= 0 && retrieval_frac <= 1,
              "synthetic: sink_frac and retrieval_frac are probabilities in [0, 1]");
  TOPKV_CHECK(sink_mass >= 0 && retrieval_mass >= 0 && sink_mass + retrieval_mass < 1,
              "synthetic: sink_mass + retrieval_mass must be in [0, 1) (got {} + {})", sink_mass,
              retrieval_mass);
  TOPKV_CHECK(retrieval_targets >= 0, "synthetic: retrieval_targets must be >= 0 (got {})", retrieval_targets);
}

std::string SyntheticConfig::describe() const {
  return fmt::format(
      "n_keys={} head_dim={} n_queries={} group={} kv_heads={} dtype={} seed={} key_offset={} dim_spread={} "
      "topic_len={} topic_weight={} rope_base={} query_shift={} query_noise={} recency={} n_sinks={} "
      "sink_norm={} sink_frac={} sink_mass={} retrieval_frac={} retrieval_targets={} retrieval_mass={}",
      n_keys, head_dim, n_queries, group, kv_heads, dtype_name(dtype), seed, key_offset, dim_spread, topic_len,
      topic_weight, rope_base, query_shift, query_noise, recency, n_sinks, sink_norm, sink_frac, sink_mass,
      retrieval_frac, retrieval_targets, retrieval_mass);
}

void synthetic_key_values(const SyntheticConfig& cfg, int head, int64_t t0, int64_t n, float* keys, float* values,
                          int n_threads, std::vector<float>* topic) {
  cfg.validate();
  TOPKV_CHECK(head >= 0 && head < cfg.kv_heads, "synthetic: head {} is not among the {} KV heads", head,
              cfg.kv_heads);
  TOPKV_CHECK(t0 >= 0 && n >= 0 && t0 + n <= cfg.n_keys, "synthetic: rows {}..{} are outside the {} keys", t0,
              t0 + n - 1, cfg.n_keys);
  const int threads = n_threads > 0 ? n_threads : std::max(1u, std::thread::hardware_concurrency());
  const HeadModel M = make_head_model(cfg, head);
  const size_t d = (size_t)cfg.head_dim;
  // The copy out of each super-block on every thread too (emit runs between
  // generate_rows' parallel passes): one thread copying 64 MB a super-block
  // was a serial share of a long fill.
  generate_rows(cfg, M, head, t0, t0 + n, threads, [&](int64_t t, int64_t rows, const float* k, const float* v) {
    constexpr int64_t kCopyRows = 1024;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t r = 0; r < rows; r += kCopyRows) {
      const size_t at = (size_t)r * d, len = (size_t)std::min(kCopyRows, rows - r) * d;
      std::copy_n(k + at, len, keys + (size_t)(t - t0) * d + at);
      std::copy_n(v + at, len, values + (size_t)(t - t0) * d + at);
    }
  }, topic);
}

SyntheticData generate_synthetic(const SyntheticConfig& cfg, int n_threads, bool progress) {
  cfg.validate();
  const int threads = n_threads > 0 ? n_threads : std::max(1u, std::thread::hardware_concurrency());
  SyntheticData out;
  out.data.scale = 1.f / std::sqrt((float)cfg.head_dim);
  out.data.source = "synthetic " + cfg.describe();
  Progress bar("synthetic keys", cfg.n_keys * cfg.kv_heads, "keys", progress);
  for (int h = 0; h < cfg.kv_heads; ++h) {
    const HeadModel M = make_head_model(cfg, h);
    AttentionHead head;
    head.keys = std::make_shared<RowStore>(cfg.head_dim, cfg.dtype);
    head.values = std::make_shared<RowStore>(cfg.head_dim, cfg.dtype);
    head.n_queries = cfg.n_queries;
    head.group = cfg.group;
    generate_keys_values(cfg, M, h, head, threads, bar);

    Rng sample_rng(cfg.seed, kSample, (uint64_t)h);
    const NormaliserSample S = make_normaliser_sample(*head.keys, cfg.n_sinks, sample_rng);
    const int64_t nq = (int64_t)cfg.n_queries * cfg.group;
    head.queries.resize((size_t)nq * cfg.head_dim);
    std::vector<PlantedQuery> planted((size_t)nq);
#pragma omp parallel for num_threads(threads) schedule(dynamic, 4)
    for (int64_t i = 0; i < nq; ++i)
      make_query(cfg, M, S, *head.keys, h, (int)(i / cfg.group), (int)(i % cfg.group),
                 &head.queries[(size_t)i * cfg.head_dim], planted[(size_t)i]);
    out.data.heads.push_back(std::move(head));
    out.planted.push_back(std::move(planted));
  }
  bar.finish();
  return out;
}

}  // namespace topkv
