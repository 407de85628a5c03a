#include "bench/synthetic_plant.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "src/common/vec_math.h"

namespace topkv {

namespace {

constexpr int64_t kStrata = 4096;      // stratified sample of the older keys
constexpr int kCalibrationSteps = 20;  // damped Newton steps, each O(rest keys x groups)

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

RestSet rest_set(const NormaliserSample& S, const RowStore& keys, const std::vector<int64_t>& targets,
                 int64_t n_sinks, int64_t radius) {
  const int d = keys.dim();
  const int64_t n = keys.size();
  std::vector<int64_t> exact;
  for (int64_t t = 0; t < std::min(n_sinks, n); ++t) exact.push_back(t);  // targets are removed below
  for (int64_t t : targets)
    if (t >= n_sinks)
      for (int64_t u = std::max(n_sinks, t - radius); u <= std::min(n - 1, t + radius); ++u) exact.push_back(u);
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

}  // namespace

// The calibration: Newton steps on the small system F_G(delta) = log-mass gap
// of group G, whose Jacobian is the softmax-weighted response of each group's
// targets minus that of the rest to each direction (the directions lift the
// other keys too: cross-talk). Scores are linear in delta, so each step costs
// O(rest keys x groups), not O(keys x dim).
void plant_targets(const NormaliserSample& S, const RowStore& keys, const std::vector<PlantGroup>& groups,
                   int64_t n_sinks, int64_t neighbourhood, float* q) {
  std::vector<int64_t> tgt;                // every target key
  std::vector<std::vector<size_t>> group;  // indices into tgt
  std::vector<double> share;
  for (auto& g : groups) {
    group.emplace_back();
    for (int64_t k : g.keys) {
      group.back().push_back(tgt.size());
      tgt.push_back(k);
    }
    share.push_back(g.share);
  }
  if (tgt.empty() || S.pos.empty()) return;  // no target, or nothing else to share the attention with
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
  const RestSet R = rest_set(S, keys, tgt, n_sinks, neighbourhood);
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

NormaliserSample make_normaliser_sample(const RowStore& keys, int64_t n_sinks, Rng& r) {
  NormaliserSample S;
  const int64_t n = keys.size(), lo = std::min<int64_t>(n_sinks, n);
  const int64_t window_lo = std::max(lo, n - kNewestExact), span = window_lo - lo;
  const int64_t strata = std::min(kStrata, span);
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

}  // namespace topkv
