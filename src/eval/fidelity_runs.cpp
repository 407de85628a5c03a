#include "src/eval/fidelity_runs.h"

#include <algorithm>
#include <cmath>

#include "src/common/error.h"
#include "src/common/timer.h"

namespace topkv {

int32_t argmax_token(const std::vector<float>& v) {
  return (int32_t)(std::max_element(v.begin(), v.end()) - v.begin());
}

std::vector<float> log_softmax(const std::vector<float>& z) {
  const double m = *std::max_element(z.begin(), z.end());
  double s = 0;
  for (float x : z) s += std::exp((double)x - m);
  const double lse = m + std::log(s);
  std::vector<float> out(z.size());
  for (size_t i = 0; i < z.size(); ++i) out[i] = (float)((double)z[i] - lse);
  return out;
}

double kl_divergence(const std::vector<float>& log_p, const std::vector<float>& zq) {
  TOPKV_CHECK(log_p.size() == zq.size(), "internal: KL of distributions over {} and {} tokens", log_p.size(),
              zq.size());
  const std::vector<float> log_q = log_softmax(zq);
  double d = 0;
  for (size_t i = 0; i < log_p.size(); ++i) {
    const double lp = log_p[i];
    if (lp > -80.0) d += std::exp(lp) * (lp - (double)log_q[i]);  // exp(-80) ~ 1e-35: nothing
  }
  return std::max(0.0, d);
}

DenseReference decode_reference(Model& model, std::vector<float> first, int steps, int keep) {
  TOPKV_CHECK(steps >= 1 && keep >= 0 && keep <= steps, "internal: a reference of {} steps keeping {}", steps, keep);
  DenseReference r;
  std::vector<float> z = std::move(first);
  for (int s = 0; s < steps; ++s) {
    if (s < keep) r.log_p.push_back(log_softmax(z));
    r.ids.push_back(argmax_token(z));
    if (s + 1 < steps) {
      Timer t;  // the model's step alone: the distributions kept above are evaluation work
      z = model.decode(r.ids.back());
      r.decode_s += t.seconds();
      ++r.decode_steps;
    }
  }
  return r;
}

GreedyRun greedy_run(Model& model, std::vector<float> first, int max_tokens, const Tokenizer* stop_tok) {
  GreedyRun r;
  std::vector<float> z = std::move(first);
  for (int s = 0; s < max_tokens; ++s) {
    const int32_t id = argmax_token(z);
    if (stop_tok && stop_tok->is_eog(id)) break;
    r.ids.push_back(id);
    if (s + 1 < max_tokens) {
      Timer t;  // timed as decode_reference times the dense steps
      z = model.decode(id);
      r.decode_s += t.seconds();
      ++r.decode_steps;
    }
  }
  return r;
}

ForcedRun teacher_forced_run(Model& model, std::vector<float> first, const DenseReference& ref, int steps,
                             const std::function<void(int)>& before_feed) {
  TOPKV_CHECK(steps >= 1 && steps <= (int)ref.log_p.size() && steps <= (int)ref.ids.size(),
              "internal: {} teacher-forced steps on a reference of {}", steps, ref.log_p.size());
  ForcedRun r;
  r.steps = steps;
  std::vector<float> z = std::move(first);
  int agree = 0;
  double kl_sum = 0;
  for (int s = 0; s < steps; ++s) {
    const int32_t pick = argmax_token(z), want = ref.ids[(size_t)s];
    const std::vector<float>& log_p = ref.log_p[(size_t)s];
    if (pick == want) {
      ++agree;
    } else {
      const double margin = (double)log_p[(size_t)want] - log_p[(size_t)pick];
      r.flip_margin_max = std::max(r.flip_margin_max, margin);
      if (r.first_flip_step < 0) r.first_flip_step = s, r.first_flip_margin = margin;
    }
    const double kl = kl_divergence(log_p, z);
    kl_sum += kl;
    r.kl_max = std::max(r.kl_max, kl);
    if (s + 1 < steps) {
      if (before_feed) before_feed(s);
      z = model.decode(ref.ids[(size_t)s]);
    }
  }
  r.agreement = (double)agree / steps;
  r.kl_mean = kl_sum / steps;
  return r;
}

std::vector<int32_t> answer_tokens(const std::vector<int32_t>& ids, int n, const Tokenizer& tok) {
  std::vector<int32_t> out;
  for (int32_t id : ids) {
    if ((int)out.size() >= n || tok.is_eog(id)) break;
    out.push_back(id);
  }
  return out;
}

}  // namespace topkv
