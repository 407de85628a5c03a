#include <catch2/catch.hpp>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "bench/synthetic.h"
#include "src/common/error.h"

using namespace topkv;

namespace {

SyntheticConfig small_config() {
  SyntheticConfig c;
  c.n_keys = 20000;
  c.head_dim = 64;
  c.n_queries = 40;
  c.group = 2;
  c.dtype = DType::F32;
  c.seed = 42;
  return c;
}

// Keys as they were before RoPE (un-rotated by their position).
std::vector<float> raw_keys(const SyntheticConfig& c, const RowStore& K) {
  const int d = K.dim();
  std::vector<float> out((size_t)K.size() * d);
  for (int64_t t = 0; t < K.size(); ++t) {
    K.row_f32(t, &out[(size_t)t * d]);
    apply_rope(&out[(size_t)t * d], d, (double)t, c.rope_base, /*inverse=*/true);
  }
  return out;
}

// Softmax of scale * q·k over every key (reference attention weights).
std::vector<double> attention_weights(const float* q, const RowStore& K, float scale) {
  std::vector<double> s((size_t)K.size());
  double mx = -INFINITY, z = 0;
  for (int64_t i = 0; i < K.size(); ++i) mx = std::max(mx, s[(size_t)i] = scale * (double)K.dot(i, q));
  for (auto& x : s) z += (x = std::exp(x - mx));
  for (auto& x : s) x /= z;
  return s;
}

double l2(const float* a, const float* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
  return std::sqrt(s);
}

// Mean correlation of centred raw keys at the given lag, over positions `ts`.
double lag_correlation(const std::vector<float>& raw, const std::vector<double>& mean, int d,
                       const std::vector<int64_t>& ts, int64_t lag) {
  double sab = 0, saa = 0, sbb = 0;
  for (int64_t t : ts)
    for (int i = 0; i < d; ++i) {
      double a = raw[(size_t)t * d + i] - mean[i], b = raw[(size_t)(t + lag) * d + i] - mean[i];
      sab += a * b, saa += a * a, sbb += b * b;
    }
  return sab / std::sqrt(saa * sbb);
}

std::vector<double> column_mean(const std::vector<float>& raw, int d, int64_t from, int64_t to) {
  std::vector<double> m(d, 0.0);
  for (int64_t t = from; t < to; ++t)
    for (int i = 0; i < d; ++i) m[i] += raw[(size_t)t * d + i];
  for (auto& x : m) x /= (double)(to - from);
  return m;
}

}  // namespace

TEST_CASE("RoPE: inverse undoes it, norms are kept, scores depend on relative position only") {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int d : {4, 64, 128, 256}) {
    std::vector<float> q(d), k(d);
    for (auto& x : q) x = nd(rng);
    for (auto& x : k) x = nd(rng);
    auto x = q;
    apply_rope(x.data(), d, 123456.0, 10000.0);
    CHECK(l2(x.data(), std::vector<float>(d, 0.f).data(), d) == Approx(l2(q.data(), std::vector<float>(d, 0.f).data(), d)).epsilon(1e-5));
    apply_rope(x.data(), d, 123456.0, 10000.0, true);
    CHECK(l2(x.data(), q.data(), d) < 1e-3);
    auto score = [&](double pq, double pk) {
      auto a = q, b = k;
      apply_rope(a.data(), d, pq, 500000.0);
      apply_rope(b.data(), d, pk, 500000.0);
      return std::inner_product(a.begin(), a.end(), b.begin(), 0.0);
    };
    CHECK(score(1000, 990) == Approx(score(50, 40)).margin(1e-3));
    auto y = q;
    apply_rope(y.data(), d, 77.0, 0.0);  // base 0: no RoPE
    CHECK(y == q);
  }
}

TEST_CASE("synthetic keys carry the shared offset and uneven per-dimension variance") {
  auto c = small_config();
  auto with = generate_synthetic(c, 2);
  const int d = c.head_dim;
  auto raw = raw_keys(c, *with.data.heads[0].keys);
  auto mean = column_mean(raw, d, c.n_sinks, c.n_keys);
  double mnorm = std::sqrt(std::inner_product(mean.begin(), mean.end(), mean.begin(), 0.0));
  CHECK(mnorm == Approx(c.key_offset * std::sqrt(d)).epsilon(0.15));

  std::vector<double> var(d, 0.0);
  for (int64_t t = c.n_sinks; t < c.n_keys; ++t)
    for (int i = 0; i < d; ++i) var[i] += std::pow(raw[(size_t)t * d + i] - mean[i], 2);
  auto [lo, hi] = std::minmax_element(var.begin(), var.end());
  CHECK(*hi / *lo > c.dim_spread * c.dim_spread / 4);  // std ratio ~ dim_spread, variance ratio its square

  c.key_offset = 0;
  c.recency = 0;
  c.dim_spread = 1;
  auto without = generate_synthetic(c, 2);
  auto raw0 = raw_keys(c, *without.data.heads[0].keys);
  auto mean0 = column_mean(raw0, d, c.n_sinks, c.n_keys);
  CHECK(std::sqrt(std::inner_product(mean0.begin(), mean0.end(), mean0.begin(), 0.0)) < 0.3 * std::sqrt(d));
  std::vector<double> var0(d, 0.0);
  for (int64_t t = c.n_sinks; t < c.n_keys; ++t)
    for (int i = 0; i < d; ++i) var0[i] += std::pow(raw0[(size_t)t * d + i] - mean0[i], 2);
  auto [lo0, hi0] = std::minmax_element(var0.begin(), var0.end());
  CHECK(*hi0 / *lo0 < 2.0);
}

TEST_CASE("synthetic queries are out of distribution for the keys") {
  auto measure = [](double shift) {
    auto c = small_config();
    c.query_shift = shift;
    auto s = generate_synthetic(c, 2);
    const auto& h = s.data.heads[0];
    const int d = c.head_dim;
    std::vector<float> k(d), k2(d);
    // Distance from a query to its nearest key vs from a key to its nearest other key.
    double qd = 0, kd = 0, qk = 0, kk = 0;
    const int probes = 30;
    for (int p = 0; p < probes; ++p) {
      const float* q = h.queries.data() + (size_t)p * d;
      int64_t kt = 1000 + p * 500;
      h.keys->row_f32(kt, k.data());
      double best_q = INFINITY, best_k = INFINITY;
      for (int64_t i = c.n_sinks; i < c.n_keys; i += 3) {
        h.keys->row_f32(i, k2.data());
        best_q = std::min(best_q, l2(q, k2.data(), d));
        if (i != kt) best_k = std::min(best_k, l2(k.data(), k2.data(), d));
        qk += std::inner_product(q, q + d, k2.begin(), 0.0);
        kk += std::inner_product(k.begin(), k.end(), k2.begin(), 0.0);
      }
      qd += best_q, kd += best_k;
    }
    return std::array<double, 3>{qd / kd, qk, kk};
  };
  auto ood = measure(2.0), ind = measure(0.0);
  INFO("nearest-key distance ratio q/k: shifted " << ood[0] << ", unshifted " << ind[0]);
  // Queries lack the keys' offset, so even unshifted they sit apart; the shift adds to it.
  CHECK(ood[0] > 1.5);
  CHECK(ood[0] > 1.15 * ind[0]);
  // Mean q·k differs clearly from mean k·k (keys share the offset, queries do not).
  INFO("sum q.k " << ood[1] << " sum k.k " << ood[2]);
  CHECK(std::fabs(ood[1] - ood[2]) > 0.5 * std::fabs(ood[2]));
}

TEST_CASE("sinks get high attention mass, planted far keys are retrieved, attention is sparse") {
  auto c = small_config();
  c.n_queries = 60;
  c.head_dim = 128;  // at 64 dims a random key cannot stand out of 20000 by enough (see synthetic.h)
  auto s = generate_synthetic(c, 2);
  const auto& h = s.data.heads[0];
  const int nq = c.n_queries * c.group;
  double sink_hit = 0, sink_other = 0, retr = 0, top64 = 0;
  int n_hit = 0, n_other = 0, n_retr = 0, targets_in_top64 = 0, n_targets = 0;
  for (int i = 0; i < nq; ++i) {
    auto w = attention_weights(h.queries.data() + (size_t)i * c.head_dim, *h.keys, s.data.scale);
    double sink_mass = std::accumulate(w.begin(), w.begin() + c.n_sinks, 0.0);
    const auto& pl = s.planted[0][(size_t)i];
    (pl.sink ? sink_hit : sink_other) += sink_mass;
    (pl.sink ? n_hit : n_other)++;
    if (!pl.targets.empty()) {
      REQUIRE((int)pl.targets.size() == c.retrieval_targets);
      for (auto t : pl.targets) {
        REQUIRE(t >= c.n_sinks);
        REQUIRE(t < c.n_keys);
        retr += w[(size_t)t];
      }
      ++n_retr;
      auto sorted = w;
      std::nth_element(sorted.begin(), sorted.begin() + 63, sorted.end(), std::greater<>());
      for (auto t : pl.targets) targets_in_top64 += w[(size_t)t] >= sorted[63], ++n_targets;
    }
    std::nth_element(w.begin(), w.begin() + 64, w.end(), std::greater<>());
    top64 += std::accumulate(w.begin(), w.begin() + 64, 0.0);
  }
  REQUIRE(n_hit > 0);
  REQUIRE(n_other > 0);
  REQUIRE(n_retr > 0);
  INFO("sink mass when aimed " << sink_hit / n_hit << ", otherwise " << sink_other / n_other
                               << "; retrieval mass " << retr / n_retr << "; top-64 mass " << top64 / nq);
  CHECK(sink_hit / n_hit > 0.5 * c.sink_mass);
  CHECK(sink_hit / n_hit < 1.5 * c.sink_mass);
  CHECK(sink_other / n_other < 0.05);
  CHECK(retr / n_retr > 0.5 * c.retrieval_mass);
  CHECK(retr / n_retr < 1.5 * c.retrieval_mass);
  CHECK(double(targets_in_top64) / n_targets > 0.9);
  CHECK(top64 / nq > 0.4);   // sparse: 64 of 20000 keys hold a good share ...
  CHECK(top64 / nq < 0.98);  // ... but not all of it
}

TEST_CASE("neighbouring keys correlate through the topic, also across generation blocks") {
  auto c = small_config();
  c.n_keys = 70001;  // more than one 65536-row super-block, odd tail
  c.n_queries = 1;
  c.head_dim = 32;
  auto s = generate_synthetic(c, 2);
  const int d = c.head_dim;
  auto raw = raw_keys(c, *s.data.heads[0].keys);
  auto mean = column_mean(raw, d, c.n_sinks, c.n_keys);
  const double expect = c.topic_weight * std::exp(-1.0 / c.topic_len);
  std::vector<int64_t> inside, boundary, far;
  for (int64_t t = 100; t + 5000 < c.n_keys; t += 37) inside.push_back(t), far.push_back(t);
  for (int64_t t = 1023; t + 1 < c.n_keys; t += 1024) boundary.push_back(t);  // rows straddling random streams
  CHECK(lag_correlation(raw, mean, d, inside, 1) == Approx(expect).margin(0.05));
  CHECK(lag_correlation(raw, mean, d, boundary, 1) == Approx(expect).margin(0.05));
  CHECK(std::fabs(lag_correlation(raw, mean, d, far, 5000)) < 0.05);

  c.topic_len = 0;  // no local structure
  auto w = generate_synthetic(c, 2);
  auto raw0 = raw_keys(c, *w.data.heads[0].keys);
  auto mean0 = column_mean(raw0, d, c.n_sinks, c.n_keys);
  CHECK(std::fabs(lag_correlation(raw0, mean0, d, inside, 1)) < 0.05);
}

TEST_CASE("synthetic data is deterministic for a seed, whatever the thread count") {
  auto c = small_config();
  c.n_keys = 5000;
  c.kv_heads = 2;
  c.dtype = DType::F16;
  auto a = generate_synthetic(c, 1), b = generate_synthetic(c, 2);
  auto same_store = [](const RowStore& x, const RowStore& y) {
    if (x.size() != y.size()) return false;
    for (int64_t i = 0; i < x.size(); ++i)
      if (std::memcmp(x.row(i), y.row(i), x.row_bytes())) return false;
    return true;
  };
  for (int h = 0; h < 2; ++h) {
    CHECK(same_store(*a.data.heads[h].keys, *b.data.heads[h].keys));
    CHECK(same_store(*a.data.heads[h].values, *b.data.heads[h].values));
    CHECK(a.data.heads[h].queries == b.data.heads[h].queries);
  }
  CHECK_FALSE(same_store(*a.data.heads[0].keys, *a.data.heads[1].keys));  // heads are independent
  c.seed = 43;
  auto other = generate_synthetic(c, 2);
  CHECK_FALSE(same_store(*a.data.heads[0].keys, *other.data.heads[0].keys));
  CHECK(a.data.heads[0].queries != other.data.heads[0].queries);
}

TEST_CASE("synthetic shapes: awkward sizes, GQA groups, dtypes") {
  for (int d : {4, 64, 128, 256})
    for (int g : {1, 4, 8})
      for (int64_t n : {1, 5, 300, 1025}) {
        SyntheticConfig c;
        c.n_keys = n;
        c.head_dim = d;
        c.group = g;
        c.n_queries = 3;
        c.n_sinks = (int)std::min<int64_t>(n, 2);
        c.dtype = n % 2 ? DType::BF16 : DType::F16;
        auto s = generate_synthetic(c, 2);
        const auto& h = s.data.heads[0];
        REQUIRE(h.keys->size() == n);
        REQUIRE(h.values->size() == n);
        REQUIRE(h.keys->dtype() == c.dtype);
        REQUIRE(h.queries.size() == (size_t)3 * g * d);
        REQUIRE(h.group == g);
        REQUIRE(s.data.scale == Approx(1.0 / std::sqrt(d)));
        for (float x : h.queries) REQUIRE(std::isfinite(x));
        std::vector<float> row(d);
        for (int64_t i = 0; i < n; ++i) {
          h.keys->row_f32(i, row.data());
          for (float x : row) REQUIRE(std::isfinite(x));
        }
      }
}

TEST_CASE("synthetic config: every bad field is an Error naming it") {
  auto bad = [](auto mutate, const char* needle) {
    SyntheticConfig c;
    mutate(c);
    try {
      c.validate();
      FAIL("no error for " << needle);
    } catch (const Error& e) {
      INFO(e.what());
      CHECK(std::string(e.what()).find(needle) != std::string::npos);
    }
  };
  bad([](SyntheticConfig& c) { c.n_keys = 0; }, "n_keys");
  bad([](SyntheticConfig& c) { c.head_dim = 63; }, "head_dim");
  bad([](SyntheticConfig& c) { c.head_dim = 2; }, "head_dim");
  bad([](SyntheticConfig& c) { c.n_queries = 0; }, "n_queries");
  bad([](SyntheticConfig& c) { c.group = 0; }, "group");
  bad([](SyntheticConfig& c) { c.kv_heads = 0; }, "kv_heads");
  bad([](SyntheticConfig& c) { c.dim_spread = 0.5; }, "dim_spread");
  bad([](SyntheticConfig& c) { c.topic_weight = 1.5; }, "topic_weight");
  bad([](SyntheticConfig& c) { c.rope_base = 0.5; }, "rope_base");
  bad([](SyntheticConfig& c) { c.key_offset = 0; }, "recency");
  bad([](SyntheticConfig& c) { c.n_sinks = 200000; }, "n_sinks");
  bad([](SyntheticConfig& c) { c.sink_frac = 1.5; }, "sink_frac");
  bad([](SyntheticConfig& c) { c.sink_mass = 0.6; }, "sink_mass");
  bad([](SyntheticConfig& c) { c.retrieval_targets = -1; }, "retrieval_targets");
  CHECK_THROWS_AS(generate_synthetic([] { SyntheticConfig c; c.n_keys = -5; return c; }()), Error);
}
