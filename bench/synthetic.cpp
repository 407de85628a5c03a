#include "bench/synthetic.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <thread>

#include "src/common/error.h"
#include "src/common/progress.h"
#include "src/common/vec_math.h"

namespace topkv {

namespace {

// ---- random numbers: counter-seeded streams, so results do not depend on threads

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman & Vigna) seeded through splitmix64 from (seed, a, b, c).
class Rng {
 public:
  Rng(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
    uint64_t s = seed;
    for (uint64_t x : {a, b, c}) {
      s ^= x + 0x632be59bd9b4e019ull + (s << 6) + (s >> 2);
      splitmix64(s);
    }
    for (auto& w : s_) w = splitmix64(s);
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int64_t below(int64_t n) { return (int64_t)(uniform() * (double)n); }
  // Marsaglia's polar method (no trigonometry); the second value of each pair
  // is kept for the next call.
  double normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * f;
    have_spare_ = true;
    return u * f;
  }
 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  double spare_ = 0;
  bool have_spare_ = false;
};

// Stream ids: each kind of draw has its own family of streams.
enum Stream : uint64_t { kConst = 1, kTopic = 2, kNoise = 3, kSample = 4, kQuery = 5 };

constexpr int64_t kSubBlock = 1024;         // rows per random stream
constexpr int64_t kSuperBlock = 64 * 1024;  // rows generated before appending to the stores
constexpr int64_t kWindow = 256;            // newest keys scored exactly when calibrating
constexpr int64_t kStrata = 4096;           // stratified sample of the older keys
constexpr int kCalibrationSteps = 20;  // damped Newton steps, each O(rest keys x groups)

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

void generate_keys_values(const SyntheticConfig& c, const HeadModel& M, int head, AttentionHead& out,
                          int threads, Progress& bar) {
  const int d = M.d;
  const float innov = (float)std::sqrt(1.0 - M.rho * M.rho), rho = (float)M.rho;
  std::vector<float> x((size_t)kSuperBlock * d), kb((size_t)kSuperBlock * d), vb((size_t)kSuperBlock * d);
  std::vector<float> carry = M.topic_init;  // x_{t0 - 1}
  std::vector<std::vector<float>> carry_in((size_t)(kSuperBlock / kSubBlock), std::vector<float>(d));
  for (int64_t t0 = 0; t0 < c.n_keys; t0 += kSuperBlock) {
    const int64_t rows = std::min(kSuperBlock, c.n_keys - t0);
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
    out.keys->append_f32(kb.data(), rows);
    out.values->append_f32(vb.data(), rows);
    bar.add(rows);
  }
}

// Stratified sample of the keys a query's softmax normaliser is estimated from:
// the newest kWindow keys exactly (recency makes them peaky), one random key
// per stratum of the older ones, each standing for its stratum. Sinks are
// excluded: they are only ever planted targets.
struct NormaliserSample {
  std::vector<int64_t> pos;
  std::vector<float> log_weight;  // ln(stratum size)
  std::vector<float> rows;        // fp32 keys as stored
  std::vector<float> mean, inv_var;  // per-dimension key statistics, for whitening target directions
};

NormaliserSample make_sample(const SyntheticConfig& c, const RowStore& keys, int head) {
  NormaliserSample S;
  const int64_t n = keys.size(), lo = std::min<int64_t>(c.n_sinks, n);
  const int64_t window_lo = std::max(lo, n - kWindow), span = window_lo - lo;
  const int64_t strata = std::min(kStrata, span);
  Rng r(c.seed, kSample, (uint64_t)head);
  for (int64_t s = 0; s < strata; ++s) {
    int64_t a = lo + span * s / strata, b = lo + span * (s + 1) / strata;
    S.pos.push_back(a + r.below(b - a));
    S.log_weight.push_back((float)std::log((double)(b - a)));
  }
  for (int64_t t = window_lo; t < n; ++t) {
    S.pos.push_back(t);
    S.log_weight.push_back(0.f);
  }
  const int d = keys.dim();
  S.rows.resize(S.pos.size() * d);
  for (size_t i = 0; i < S.pos.size(); ++i) keys.row_f32(S.pos[i], &S.rows[i * d]);
  S.mean.assign(d, 0.f);
  S.inv_var.assign(d, 1.f);
  if (S.pos.empty()) return S;
  std::vector<double> m(d, 0.0), v(d, 0.0);
  for (size_t i = 0; i < S.pos.size(); ++i)
    for (int j = 0; j < d; ++j) m[j] += S.rows[i * d + j];
  for (auto& x : m) x /= (double)S.pos.size();
  for (size_t i = 0; i < S.pos.size(); ++i)
    for (int j = 0; j < d; ++j) v[j] += (S.rows[i * d + j] - m[j]) * (S.rows[i * d + j] - m[j]);
  for (int j = 0; j < d; ++j) {
    S.mean[j] = (float)m[j];
    double var = S.pos.size() > 1 ? v[j] / (double)(S.pos.size() - 1) : 1.0;
    S.inv_var[j] = (float)(1.0 / std::max(var, 1e-6));
  }
  return S;
}

// The query direction that adds exactly one (scaled) logit to key k and as
// little as it can to the others: c = sqrt(d) w / (w·k), w = (k - mean) / var
// made orthogonal to the mean (what every key shares). Dividing by the
// variance whitens it: the least cross-talk per logit gained. Cross-talk
// cannot vanish: for keys this random the best other key gains about
// sqrt(2 ln n / d) of what the target gains, which the calibration absorbs.
std::vector<float> target_direction(const float* k, const NormaliserSample& S, int d) {
  const float* ref = S.mean.data();
  std::vector<float> w(d);
  double wr = 0, rr = 0, kk = 0;
  for (int i = 0; i < d; ++i) {
    w[i] = (k[i] - ref[i]) * S.inv_var[i];
    wr += (double)w[i] * ref[i];
    rr += (double)ref[i] * ref[i];
    kk += (double)k[i] * k[i];
  }
  double wk = 0, spread = 0;
  for (int i = 0; i < d; ++i) {
    if (rr > 0) w[i] -= (float)(wr / rr) * ref[i];
    wk += (double)w[i] * k[i];
    spread += (double)(k[i] - ref[i]) * (k[i] - ref[i]) * S.inv_var[i];
  }
  // A key at the mean has nothing of its own to aim at: fall back to the
  // plain direction of k, which is never degenerate.
  if (!(wk > 0.25 * spread) || !(spread > 0)) {
    for (int i = 0; i < d; ++i) w[i] = k[i];
    wk = kk > 0 ? kk : 1.0;
  }
  for (auto& x : w) x = (float)(std::sqrt((double)d) * x / wk);
  return w;
}

// Solves A x = b (n x n, row-major) by Gaussian elimination with partial
// pivoting; false if singular.
bool solve_linear(std::vector<double> A, std::vector<double>& b) {
  const size_t n = b.size();
  for (size_t c = 0; c < n; ++c) {
    size_t piv = c;
    for (size_t r = c + 1; r < n; ++r)
      if (std::fabs(A[r * n + c]) > std::fabs(A[piv * n + c])) piv = r;
    if (!(std::fabs(A[piv * n + c]) > 1e-9)) return false;
    for (size_t k = 0; k < n; ++k) std::swap(A[c * n + k], A[piv * n + k]);
    std::swap(b[c], b[piv]);
    for (size_t r = c + 1; r < n; ++r) {
      double f = A[r * n + c] / A[c * n + c];
      for (size_t k = c; k < n; ++k) A[r * n + k] -= f * A[c * n + k];
      b[r] -= f * b[c];
    }
  }
  for (size_t c = n; c-- > 0;) {
    for (size_t k = c + 1; k < n; ++k) b[c] -= A[c * n + k] * b[k];
    b[c] /= A[c * n + c];
  }
  return true;
}

// The keys a planted query's softmax normaliser is estimated over, apart from
// its targets: the stratified sample, the sinks when they are not targets, and
// exactly the neighbourhood of every far target (its passage shares the
// target's topic, so it gains with it; sampling it would miss that).
struct RestSet {
  std::vector<const float*> rows;
  std::vector<float> log_weight;
  std::vector<float> storage;  // rows not in the sample
};

RestSet rest_set(const SyntheticConfig& c, const NormaliserSample& S, const RowStore& keys,
                 const std::vector<int64_t>& targets, const std::vector<int64_t>& far_targets) {
  const int d = keys.dim();
  const int64_t n = keys.size(), radius = std::clamp<int64_t>((int64_t)(2 * c.topic_len), 16, 1024);
  std::vector<int64_t> exact;
  if (far_targets.empty() || targets.front() != 0)  // sinks not planted: part of the rest
    for (int64_t t = 0; t < std::min<int64_t>(c.n_sinks, n); ++t) exact.push_back(t);
  for (int64_t t : far_targets)
    for (int64_t u = std::max<int64_t>(c.n_sinks, t - radius); u <= std::min(n - 1, t + radius); ++u)
      exact.push_back(u);
  std::sort(exact.begin(), exact.end());
  exact.erase(std::unique(exact.begin(), exact.end()), exact.end());
  std::vector<int64_t> sorted_targets = targets;
  std::sort(sorted_targets.begin(), sorted_targets.end());
  auto is_target = [&](int64_t u) { return std::binary_search(sorted_targets.begin(), sorted_targets.end(), u); };
  exact.erase(std::remove_if(exact.begin(), exact.end(), is_target), exact.end());

  RestSet R;
  R.storage.resize(exact.size() * d);
  for (size_t i = 0; i < exact.size(); ++i) {
    keys.row_f32(exact[i], &R.storage[i * d]);
    R.rows.push_back(&R.storage[i * d]);
    R.log_weight.push_back(0.f);
  }
  for (size_t i = 0; i < S.pos.size(); ++i) {
    if (is_target(S.pos[i]) || std::binary_search(exact.begin(), exact.end(), S.pos[i])) continue;
    R.rows.push_back(&S.rows[i * d]);
    R.log_weight.push_back(S.log_weight[i]);
  }
  return R;
}

// Adds sum_G delta_G c_G to the query q (post-RoPE), with c_G the mean target
// direction of group G, choosing delta so that each group's log-sum-exp of
// scores reaches ln(share_G / (1 - total share)) + ln Z_rest: then the groups
// hold about their shares of the softmax. Newton steps on the small system
// F_G(delta) = log-mass gap, whose Jacobian is the softmax-weighted response of
// each group's targets minus that of the rest to each direction (the
// directions lift the other keys too: cross-talk).
void plant(const SyntheticConfig& c, const NormaliserSample& S, const std::vector<int64_t>& tgt,
           const std::vector<std::vector<size_t>>& group, const std::vector<double>& share,
           const std::vector<int64_t>& far_targets, const RowStore& keys, float* q) {
  const int d = keys.dim();
  const size_t ng = group.size(), nt = tgt.size();
  const float inv_sqrt_d = 1.f / std::sqrt((float)d);
  std::vector<float> krows(nt * d), dirs(ng * d, 0.f);
  for (size_t t = 0; t < nt; ++t) keys.row_f32(tgt[t], &krows[t * d]);
  for (size_t g = 0; g < ng; ++g)
    for (size_t t : group[g]) {
      auto w = target_direction(&krows[t * d], S, d);
      axpy_f32(1.f / (float)group[g].size(), w.data(), &dirs[g * d], (size_t)d);
    }
  const RestSet R = rest_set(c, S, keys, tgt, far_targets);
  const size_t nr = R.rows.size();
  if (nr == 0) return;
  // resp[t][g] / rresp[i][g]: logits direction g adds to target t / rest row i per unit delta.
  std::vector<double> resp(nt * ng), rresp(nr * ng);
  for (size_t t = 0; t < nt; ++t)
    for (size_t g = 0; g < ng; ++g) resp[t * ng + g] = dot_f32(&krows[t * d], &dirs[g * d], (size_t)d) * inv_sqrt_d;
  for (size_t i = 0; i < nr; ++i)
    for (size_t g = 0; g < ng; ++g) rresp[i * ng + g] = dot_f32(R.rows[i], &dirs[g * d], (size_t)d) * inv_sqrt_d;
  const double log_other = std::log(1.0 - std::accumulate(share.begin(), share.end(), 0.0));

  // Scores are linear in delta: s(delta) = s(0) + sum_g delta_g resp[.][g].
  std::vector<double> rest0(nr), tgt0(nt);
  for (size_t i = 0; i < nr; ++i) rest0[i] = dot_f32(R.rows[i], q, (size_t)d) * inv_sqrt_d + R.log_weight[i];
  for (size_t t = 0; t < nt; ++t) tgt0[t] = dot_f32(&krows[t * d], q, (size_t)d) * inv_sqrt_d;

  struct Eval {
    std::vector<double> residual, J;  // residual[g]: wanted minus current log-mass gap; J = d gap / d delta
    double norm2 = 0;
  };
  std::vector<double> ls(nr), score(nt);
  auto evaluate = [&](const std::vector<double>& delta) {
    Eval e;
    e.residual.resize(ng);
    e.J.assign(ng * ng, 0.0);
    double mx = -INFINITY, z = 0;
    for (size_t i = 0; i < nr; ++i) {
      ls[i] = rest0[i];
      for (size_t g = 0; g < ng; ++g) ls[i] += delta[g] * rresp[i * ng + g];
      mx = std::max(mx, ls[i]);
    }
    for (double x : ls) z += std::exp(x - mx);
    const double log_rest = mx + std::log(z);
    std::vector<double> rest_grad(ng, 0.0);
    for (size_t i = 0; i < nr; ++i) {
      double p = std::exp(ls[i] - log_rest);
      for (size_t h = 0; h < ng; ++h) rest_grad[h] += p * rresp[i * ng + h];
    }
    for (size_t t = 0; t < nt; ++t) {
      score[t] = tgt0[t];
      for (size_t g = 0; g < ng; ++g) score[t] += delta[g] * resp[t * ng + g];
    }
    for (size_t g = 0; g < ng; ++g) {
      double m = -INFINITY, zg = 0;
      for (size_t t : group[g]) m = std::max(m, score[t]);
      for (size_t t : group[g]) zg += std::exp(score[t] - m);
      e.residual[g] = std::log(share[g]) - log_other + log_rest - (m + std::log(zg));
      e.norm2 += e.residual[g] * e.residual[g];
      for (size_t h = 0; h < ng; ++h) e.J[g * ng + h] = -rest_grad[h];
      for (size_t t : group[g]) {
        double p = std::exp(score[t] - m) / zg;
        for (size_t h = 0; h < ng; ++h) e.J[g * ng + h] += p * resp[t * ng + h];
      }
    }
    return e;
  };
  // Damped Newton: halve the step until the residual shrinks. Where no delta
  // reaches the shares (cross-talk lifting some other key as fast as the
  // target), this stops at the best it found.
  std::vector<double> delta(ng, 0.0);
  Eval cur = evaluate(delta);
  for (int step = 0; step < kCalibrationSteps && cur.norm2 > 1e-4; ++step) {
    std::vector<double> dir = cur.residual;
    bool ok = solve_linear(cur.J, dir);
    for (double x : dir) ok = ok && std::isfinite(x);
    if (!ok) dir = cur.residual;
    bool improved = false;
    for (double alpha = 1.0; alpha > 1e-3 && !improved; alpha *= 0.5) {
      std::vector<double> trial = delta;
      for (size_t g = 0; g < ng; ++g) trial[g] += alpha * std::clamp(dir[g], -30.0, 30.0);
      Eval e = evaluate(trial);
      if (e.norm2 < cur.norm2) {
        delta = std::move(trial);
        cur = std::move(e);
        improved = true;
      }
    }
    if (!improved) break;
  }
  for (size_t g = 0; g < ng; ++g) axpy_f32((float)delta[g], &dirs[g * d], q, (size_t)d);
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
  std::vector<int64_t> tgt;               // target key positions
  std::vector<std::vector<size_t>> group;  // indices into tgt
  std::vector<double> share;              // attention share each group should get
  planted.sink = c.n_sinks > 0 && r.uniform() < c.sink_frac;
  if (planted.sink) {
    group.emplace_back();
    for (int64_t t = 0; t < std::min<int64_t>(c.n_sinks, n); ++t) {
      group.back().push_back(tgt.size());
      tgt.push_back(t);
    }
    share.push_back(c.sink_mass);
  }
  const int64_t far_lo = std::min<int64_t>(c.n_sinks, n), far_hi = std::max(far_lo, n - kWindow);
  if (r.uniform() < c.retrieval_frac && far_hi > far_lo) {
    const int64_t want = std::min<int64_t>(c.retrieval_targets, far_hi - far_lo);
    while ((int64_t)planted.targets.size() < want) {
      int64_t t = far_lo + r.below(far_hi - far_lo);
      if (std::find(planted.targets.begin(), planted.targets.end(), t) == planted.targets.end())
        planted.targets.push_back(t);
    }
    std::sort(planted.targets.begin(), planted.targets.end());
    for (int64_t t : planted.targets) {
      group.push_back({tgt.size()});
      tgt.push_back(t);
      share.push_back(c.retrieval_mass / (double)want);
    }
  }
  // Nothing else to share the attention with (every key a target): no calibration needed.
  if (tgt.empty() || S.pos.empty()) return;
  plant(c, S, tgt, group, share, planted.targets, keys, q);
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

    const NormaliserSample S = make_sample(cfg, *head.keys, h);
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
