// The offloaded layer must equal dense attention whenever the search returns
// every stored row, whatever the split into sinks / store / window, and keep
// finding tokens after they leave the window.
#include <catch2/catch.hpp>
#include <cmath>
#include <future>
#include <random>

#include "offload/partial_attention.h"
#include "offload/offloaded_layer.h"
#include "tests/test_util.h"

using namespace topkv;

namespace {

struct Kv {
  int n_heads, kv_heads, d;
  std::vector<float> k, v;  // [t][kv_heads][d]
};

Kv random_kv(int64_t n, int n_heads, int kv_heads, int d, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.f, 1.f);
  Kv kv{n_heads, kv_heads, d, std::vector<float>((size_t)n * kv_heads * d), std::vector<float>((size_t)n * kv_heads * d)};
  for (auto& x : kv.k) x = nd(rng) + 0.5f;
  for (auto& x : kv.v) x = nd(rng);
  return kv;
}

// Dense reference: each query head over all n tokens of its KV head.
std::vector<float> dense(const Kv& kv, int64_t n, const std::vector<float>& q, float scale) {
  const int G = kv.n_heads / kv.kv_heads, d = kv.d;
  std::vector<float> out((size_t)kv.n_heads * d);
  for (int h = 0; h < kv.n_heads; ++h) {
    int kh = h / G;
    RowStore K(d, DType::F32), V(d, DType::F32);
    for (int64_t t = 0; t < n; ++t) {
      K.append_f32(kv.k.data() + ((size_t)t * kv.kv_heads + kh) * d, 1);
      V.append_f32(kv.v.data() + ((size_t)t * kv.kv_heads + kh) * d, 1);
    }
    attention_exact(q.data() + (size_t)h * d, scale, K, V, n, out.data() + (size_t)h * d);
  }
  return out;
}

OffloadedLayer::Config config(int n_heads, int kv_heads, int d, int sinks, int window, int64_t k) {
  OffloadedLayer::Config c;
  c.n_heads = n_heads;
  c.kv_heads = kv_heads;
  c.head_dim = d;
  c.sinks = sinks;
  c.window = window;
  c.k = k;
  c.store_dtype = DType::F32;
  c.build.n_threads = 1;
  return c;
}

}  // namespace

TEST_CASE("offloaded layer with k >= context equals dense attention, through prefill and many appends") {
  std::mt19937 rng(42);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Case { int n_heads, kv_heads, d, sinks, window; int64_t prompt, gen; };
  for (Case c : {Case{4, 1, 64, 4, 16, 300, 40}, Case{8, 2, 128, 0, 8, 57, 30}, Case{8, 8, 64, 3, 5, 2, 20},
                 Case{4, 4, 256, 8, 32, 1, 50}, Case{8, 1, 64, 16, 4, 10, 12}}) {
    INFO("heads " << c.n_heads << "/" << c.kv_heads << " d " << c.d << " sinks " << c.sinks << " window " << c.window
                  << " prompt " << c.prompt);
    int64_t total = c.prompt + c.gen;
    Kv kv = random_kv(total, c.n_heads, c.kv_heads, c.d, rng);
    OffloadedLayer layer(config(c.n_heads, c.kv_heads, c.d, c.sinks, c.window, /*k=*/1 << 20));
    layer.prefill(kv.k.data(), kv.v.data(), c.prompt);
    const float scale = 1.f / std::sqrt((float)c.d);
    std::vector<float> q((size_t)c.n_heads * c.d), out(q.size());
    for (int64_t n = c.prompt; n <= total; ++n) {
      if (n > c.prompt) {
        size_t off = (size_t)(n - 1) * c.kv_heads * c.d;
        layer.append(kv.k.data() + off, kv.v.data() + off);
      }
      REQUIRE(layer.n_tokens() == n);
      for (auto& x : q) x = nd(rng);
      AttendStats st;
      layer.attend(q.data(), scale, out.data(), &st);
      auto ref = dense(kv, n, q, scale);
      for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == Approx(ref[i]).margin(2e-5));
      // every token counted exactly once
      REQUIRE(st.exact / c.kv_heads + st.retrieved / c.kv_heads == n);
    }
  }
}

// An 8-bit store (E4M3, or Q8_0's int8 blocks) through every index kind:
// with keys and values the store holds exactly and k covering the context,
// the layer equals dense attention (the store, its dot products, the value
// sums and each index's build and search run on the 8-bit rows), at head_dim
// 64/128/256 and GQA 1-4.
TEST_CASE("an 8-bit store (f8, q8_0) serves exact attention on the rows it represents, every index kind") {
  struct Case { const char* index; int H, KV, d, sinks, window; int64_t n; };
  const Case cases[] = {{"flat", 8, 2, 64, 4, 16, 300},         {"multipole", 8, 2, 64, 4, 16, 300},
                        {"quest:page=4", 8, 2, 64, 4, 16, 300}, {"hnswlib", 8, 2, 64, 4, 16, 300},
                        {"flat", 8, 2, 64, 3, 11, 211},         {"multipole", 4, 4, 128, 3, 11, 211},
                        {"quest:page=4", 6, 2, 256, 3, 11, 211}, {"hnswlib", 3, 1, 64, 3, 11, 211}};
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (DType t : {DType::F8E4M3, DType::Q8_0})
    for (const Case& cs : cases) {
      INFO(dtype_name(t) << " " << cs.index << " heads " << cs.H << "/" << cs.KV << " d " << cs.d);
      Kv kv = random_kv(cs.n, cs.H, cs.KV, cs.d, rng);
      for (auto* v : {&kv.k, &kv.v}) *v = test::through_store(t, v->data(), v->size() / cs.d, cs.d);
      OffloadedLayer::Config c = config(cs.H, cs.KV, cs.d, cs.sinks, cs.window, 1 << 20);
      c.index = cs.index, c.store_dtype = t;
      OffloadedLayer layer(c);
      layer.prefill(kv.k.data(), kv.v.data(), cs.n);
      std::vector<float> q((size_t)cs.H * cs.d), out(q.size());
      for (auto& x : q) x = nd(rng);
      layer.attend(q.data(), 0.125f, out.data(), nullptr);
      const auto ref = dense(kv, cs.n, q, 0.125f);
      for (size_t i = 0; i < out.size(); ++i) REQUIRE(out[i] == Approx(ref[i]).margin(2e-5));
    }
}

// With unrounded Gaussian rows and k covering them, each store's attention
// error against exact fp32 attention: 0.035% relative L2 for f16, 0.80% for
// Q8_0 (half a step of max / 127 per block), 4.1% for E4M3 (3 mantissa bits:
// up to 3.1% per element); the bounds leave room, not targets.
TEST_CASE("the store's rounding: f16 < q8_0 < f8 in attention error, each bounded") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int H = 4, KV = 1, d = 128;
  const int64_t n = 2000;
  Kv kv = random_kv(n, H, KV, d, rng);
  std::vector<float> q((size_t)H * d);
  for (auto& x : q) x = nd(rng);
  const auto ref = dense(kv, n, q, 0.09f);
  double err[3];
  const DType types[] = {DType::F16, DType::F8E4M3, DType::Q8_0};
  for (int ti = 0; ti < 3; ++ti) {
    OffloadedLayer::Config c = config(H, KV, d, 4, 16, 1 << 20);
    c.index = "flat", c.store_dtype = types[ti];
    OffloadedLayer layer(c);
    layer.prefill(kv.k.data(), kv.v.data(), n);
    std::vector<float> out(q.size());
    layer.attend(q.data(), 0.09f, out.data(), nullptr);
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) num += std::pow(out[i] - ref[i], 2), den += std::pow(ref[i], 2);
    err[ti] = std::sqrt(num / den);
  }
  INFO("relative L2 error: f16 store " << err[0] << ", f8 store " << err[1] << ", q8_0 store " << err[2]);
  CHECK(err[1] > err[0]);
  CHECK(err[1] < 0.06);
  CHECK(err[2] > err[0]);      // 8 bits of the block's largest lose more than f16's 11 of each
  CHECK(err[2] < err[1] / 4);  // but far less than E4M3's 3 mantissa bits
}

TEST_CASE("a token that leaves the window is found by later searches") {
  std::mt19937 rng(7);
  const int d = 64, window = 8;
  Kv kv = random_kv(200, 4, 1, d, rng);
  // Token 150 is a needle: its key is aligned with the query we will ask.
  std::vector<float> q(4 * d);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : q) x = nd(rng);
  for (int j = 0; j < d; ++j) kv.k[150 * d + j] = q[j] * 3.f;
  OffloadedLayer layer(config(4, 1, d, 2, window, /*k=*/4));
  layer.prefill(kv.k.data(), kv.v.data(), 100);
  for (int64_t t = 100; t < 200; ++t) layer.append(kv.k.data() + t * d, kv.v.data() + t * d);
  REQUIRE(layer.stored_rows(0) == 200 - 2 - window);
  std::vector<float> out(4 * d);
  AttendStats st;
  layer.attend(q.data(), 1.f / 8.f, out.data(), &st);
  // Query head 0 attends almost only to the needle: its output is the needle's value.
  for (int j = 0; j < d; ++j) REQUIRE(out[j] == Approx(kv.v[150 * d + j]).margin(0.05));
  CHECK(st.retrieved <= 16);
}

TEST_CASE("streaming heads attend to sinks and window only") {
  std::mt19937 rng(9);
  const int d = 64, sinks = 3, window = 10;
  const int64_t n = 120;
  Kv kv = random_kv(n, 2, 2, d, rng);
  auto c = config(2, 2, d, sinks, window, 1 << 20);
  c.streaming = {1, 0};
  OffloadedLayer layer(c);
  layer.prefill(kv.k.data(), kv.v.data(), n);
  CHECK(layer.stored_rows(0) == 0);
  CHECK(layer.index(0) == nullptr);
  CHECK(layer.stored_rows(1) == n - sinks - window);
  std::vector<float> q(2 * d), out(2 * d);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& x : q) x = nd(rng);
  layer.attend(q.data(), 0.125f, out.data());
  // Reference for head 0: sinks + last `window` tokens only.
  RowStore K(d, DType::F32), V(d, DType::F32);
  for (int64_t t = 0; t < n; ++t)
    if (t < sinks || t >= n - window) {
      K.append_f32(kv.k.data() + (t * 2) * d, 1);
      V.append_f32(kv.v.data() + (t * 2) * d, 1);
    }
  std::vector<float> ref(d);
  attention_exact(q.data(), 0.125f, K, V, K.size(), ref.data());
  for (int j = 0; j < d; ++j) REQUIRE(out[j] == Approx(ref[j]).margin(1e-5));
}

TEST_CASE("multipole far clusters make the offloaded layer closer to dense than centroid retrieval alone") {
  std::mt19937 rng(21);
  const int d = 64, n_heads = 4;
  const int64_t n = 3000;
  Kv kv = random_kv(n, n_heads, 1, d, rng);
  std::normal_distribution<float> nd(0.f, 1.f);
  double err_c = 0, err_m = 0, norm = 0;
  auto c = config(n_heads, 1, d, 4, 16, /*k=*/150);
  c.index = "centroid";
  OffloadedLayer centroid(c);
  c.index = "multipole";
  OffloadedLayer multipole(c);
  centroid.prefill(kv.k.data(), kv.v.data(), n);
  multipole.prefill(kv.k.data(), kv.v.data(), n);
  for (int trial = 0; trial < 8; ++trial) {
    std::vector<float> q((size_t)n_heads * d), oc(q.size()), om(q.size());
    for (auto& x : q) x = nd(rng);
    AttendStats sc, sm;
    centroid.attend(q.data(), 0.125f, oc.data(), &sc);
    multipole.attend(q.data(), 0.125f, om.data(), &sm);
    CHECK(sc.far_clusters == 0);
    CHECK(sm.far_clusters > 0);
    auto ref = dense(kv, n, q, 0.125f);
    for (size_t i = 0; i < ref.size(); ++i) {
      err_c += (oc[i] - ref[i]) * (oc[i] - ref[i]);
      err_m += (om[i] - ref[i]) * (om[i] - ref[i]);
      norm += ref[i] * ref[i];
    }
  }
  INFO("relative L2 error: centroid " << std::sqrt(err_c / norm) << ", multipole " << std::sqrt(err_m / norm));
  CHECK(err_m < 0.7 * err_c);
}

TEST_CASE("begin_append now, fill_appended a step later, equals append (the GPU runtime's deferred token)") {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto [sinks, window, n0] : {std::tuple{2, 5, 3}, std::tuple{0, 1, 0}, std::tuple{4, 8, 40}, std::tuple{3, 2, 1}}) {
    CAPTURE(sinks, window, n0);
    const int heads = 4, kvh = 2, d = 16, steps = 40;
    Kv kv = random_kv(n0 + steps, heads, kvh, d, rng);
    auto cfg = config(heads, kvh, d, sinks, window, 6);
    cfg.index = "multipole";
    cfg.fold_every = 3;
    OffloadedLayer now(cfg), late(cfg);
    if (n0 > 0) now.prefill(kv.k.data(), kv.v.data(), n0), late.prefill(kv.k.data(), kv.v.data(), n0);
    const size_t tok = (size_t)kvh * d;
    OffloadedLayer::Placement pending;
    for (int s = 0; s <= steps; ++s) {
      const int64_t t = n0 + s;
      // The previous token arrives (before this step's bookkeeping, as in the
      // runtime); then both layers hold the same tokens and attend alike.
      if (s > 0) late.fill_appended(pending, kv.k.data() + pending.pos * tok, kv.v.data() + pending.pos * tok);
      if (t > 0) {
        std::vector<float> q((size_t)heads * d), a(q.size()), b(q.size());
        for (auto& e : q) e = nd(rng);
        now.attend(q.data(), 0.25f, a.data());
        late.attend(q.data(), 0.25f, b.data());
        for (size_t i = 0; i < a.size(); ++i) REQUIRE(b[i] == a[i]);
      }
      if (s == steps) break;
      now.append(kv.k.data() + t * tok, kv.v.data() + t * tok);
      pending = late.begin_append();
      CHECK(pending.pos == t);
      REQUIRE(late.n_tokens() == now.n_tokens());
      REQUIRE(late.n_sinks() == now.n_sinks());
      REQUIRE(late.window_start() == now.window_start());
      REQUIRE(late.window_len() == now.window_len());
      for (int h = 0; h < kvh; ++h) {
        REQUIRE(late.stored_rows(h) == now.stored_rows(h));
        if (now.index(h)->attached()) REQUIRE(late.index(h)->indexed_rows() == now.index(h)->indexed_rows());
      }
    }
  }
}

// The GPU runtime's asynchronous folds (GpuOffloadRuntime::manage_folds): a
// host thread folds the rows stored at its start into the indexes and exports
// their tables while the decode thread goes on with begin_append /
// fill_appended. Run here on the CPU (and under ThreadSanitizer by
// scripts/sanitize.sh): each fold covers exactly its rows, and the layer then
// attends exactly like one that folded the same rows on the decode thread.
TEST_CASE("fold_pending on a host thread while the decode thread appends (the GPU runtime's async folds)") {
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.f, 1.f);
  // The backends with a device search (the only ones the GPU runtime folds
  // asynchronously).
  for (const char* index : {"multipole", "quest:page=4", "centroid:rerank=1"}) {
    CAPTURE(index);
    // The appends cross a store chunk while folds read the stores.
    const int heads = 4, kvh = 2, d = 16, steps = 90, fold_at = 12;
    const int64_t n0 = RowStore::kChunkRows - 40;
    Kv kv = random_kv(n0 + steps, heads, kvh, d, rng);
    auto cfg = config(heads, kvh, d, 2, 8, 24);
    cfg.index = index;
    cfg.fold_every = 1 << 30;  // out of reach: only the explicit folds below
    cfg.build.n_threads = 2;
    OffloadedLayer async(cfg), sync(cfg);
    async.prefill(kv.k.data(), kv.v.data(), n0), sync.prefill(kv.k.data(), kv.v.data(), n0);
    const size_t tok = (size_t)kvh * d;
    std::future<std::vector<SummaryTables>> fold;
    std::vector<int64_t> upto;
    OffloadedLayer::Placement pending;
    int folds = 0;
    for (int s = 0; s < steps; ++s) {
      const int64_t t = n0 + s;
      if (s > 0) async.fill_appended(pending, kv.k.data() + pending.pos * tok, kv.v.data() + pending.pos * tok);
      for (int h = 0; h < kvh; ++h)  // what the runtime's tail count reads while a fold may run (count_tail)
        REQUIRE(async.stored_rows(h) == sync.stored_rows(h));
      if (s % fold_at == fold_at / 2 && fold.valid()) {  // the fold lands, as manage_folds takes it
        const std::vector<SummaryTables> tables = fold.get();
        for (int h = 0; h < kvh; ++h) {
          REQUIRE(async.index(h)->indexed_rows() == upto[(size_t)h]);
          CHECK(tables[(size_t)h].covered == upto[(size_t)h]);  // what the device tables would cover
        }
        sync.fold_pending(upto);
        ++folds;
        std::vector<float> q((size_t)heads * d), a(q.size()), b(q.size());
        for (auto& e : q) e = nd(rng);
        async.attend(q.data(), 0.25f, a.data());
        sync.attend(q.data(), 0.25f, b.data());
        for (size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == b[i]);
      }
      if (s % fold_at == 0 && !fold.valid()) {  // a fold starts: the rows stored now
        upto.assign((size_t)kvh, 0);
        for (int h = 0; h < kvh; ++h) upto[(size_t)h] = async.stored_rows(h);
        fold = std::async(std::launch::async, [&async, upto, kvh] {
          async.fold_pending(upto);
          std::vector<SummaryTables> t((size_t)kvh);
          for (int h = 0; h < kvh; ++h) async.index(h)->export_summaries(t[(size_t)h]);
          return t;
        });
      }
      pending = async.begin_append();  // while the fold may run
      sync.append(kv.k.data() + t * tok, kv.v.data() + t * tok);
    }
    async.fill_appended(pending, kv.k.data() + pending.pos * tok, kv.v.data() + pending.pos * tok);
    if (fold.valid()) fold.get();
    CHECK(folds >= 5);
  }
}

// The oracle top-k mass (what eval ruler reports beside the attention error):
// against a brute-force softmax over every token, sinks and window always
// kept, the k best of the stored middle by score. Odd sizes, GQA groups,
// head dims 64/128/256, k from 0 to past the store.
TEST_CASE("oracle_topk_mass is the share of exact attention held by sinks, window and the k best stored keys") {
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Case { int n_heads, kv_heads, d, sinks, window; int64_t n; };
  for (Case c : {Case{4, 1, 64, 4, 16, 300}, Case{8, 2, 128, 0, 8, 57}, Case{6, 2, 256, 3, 5, 41},
                 Case{4, 4, 64, 4, 16, 1}, Case{8, 1, 64, 16, 4, 20}}) {
    Kv kv = random_kv(c.n, c.n_heads, c.kv_heads, c.d, rng);
    OffloadedLayer layer(config(c.n_heads, c.kv_heads, c.d, c.sinks, c.window, 64));
    layer.prefill(kv.k.data(), kv.v.data(), c.n);
    const float scale = 1.f / std::sqrt((float)c.d);
    std::vector<float> q((size_t)c.n_heads * c.d);
    for (auto& x : q) x = 2.f * nd(rng);
    const int G = c.n_heads / c.kv_heads;
    const int64_t sinks = std::min<int64_t>(c.sinks, c.n);
    const int64_t window = std::min<int64_t>(c.window, c.n - sinks), stored = c.n - sinks - window;
    for (int64_t k : {int64_t(0), int64_t(1), int64_t(7), stored, stored + 5}) {
      double want = 0;
      for (int h = 0; h < c.n_heads; ++h) {
        const int kh = h / G;
        std::vector<double> x((size_t)c.n);
        for (int64_t t = 0; t < c.n; ++t) {
          double s = 0;
          for (int i = 0; i < c.d; ++i)
            s += (double)q[(size_t)h * c.d + i] * kv.k[((size_t)t * c.kv_heads + kh) * c.d + i];
          x[(size_t)t] = scale * s;
        }
        const double top = *std::max_element(x.begin(), x.end());
        double all = 0, kept = 0;
        std::vector<double> middle;
        for (int64_t t = 0; t < c.n; ++t) {
          all += std::exp(x[(size_t)t] - top);
          if (t < sinks || t >= c.n - window) kept += std::exp(x[(size_t)t] - top);
          else middle.push_back(x[(size_t)t]);
        }
        std::sort(middle.begin(), middle.end(), std::greater<double>());
        for (int64_t i = 0; i < std::min<int64_t>(k, (int64_t)middle.size()); ++i) kept += std::exp(middle[(size_t)i] - top);
        want += kept / all / c.n_heads;
      }
      INFO("heads " << c.n_heads << "/" << c.kv_heads << " d " << c.d << " n " << c.n << " k " << k);
      std::vector<float> out((size_t)c.n_heads * c.d);
      const double got = layer.attend_exact_and_mass(q.data(), scale, out.data(), k);
      CHECK(got == Approx(want).margin(1e-5));
      if (k >= stored) CHECK(got == Approx(1.0).margin(1e-6));
    }
  }
}
