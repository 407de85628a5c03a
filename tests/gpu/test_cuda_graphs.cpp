// Recorded decode steps on the CUDA backend (Backend::begin_recording ...,
// gpu/cuda_graphs.cpp), op level: the ops that take a position or a token
// (embed, rope, kv_write, attention) are recorded once and replayed at many
// later positions (a sliding-window ring wrapping several times, a full cache
// crossing split boundaries); every replay must give the bits the same ops
// give run directly. Then what a recording refuses, and that the backend is
// usable after an aborted one.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>

#include "gpu/cuda_backend.h"
#include "src/common/error.h"
#include "src/model/backend.h"
#include "tests/gpu/cuda_test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

bool same_bits(Backend& be, const Buffer& a, const Buffer& b, size_t bytes) {
  std::vector<uint8_t> x(bytes), y(bytes);
  be.to_host(a, 0, x.data(), bytes);
  be.to_host(b, 0, y.data(), bytes);
  return std::memcmp(x.data(), y.data(), bytes) == 0;
}

Weight device_table(Backend& be, int64_t vocab, int64_t d, std::mt19937& rng, std::vector<float>& host) {
  host = randn((size_t)(vocab * d), rng);
  Weight w;
  w.name = "table", w.type = GgmlType::F32, w.rows = vocab, w.cols = d;
  w.data = reinterpret_cast<const uint8_t*>(host.data()), w.row_bytes = (size_t)d * sizeof(float);
  return be.prepare_weight(w, WeightMode::Quant);
}

}  // namespace

TEST_CASE("recorded step ops replay at new positions with the bits of the ops run directly") {
  auto& be = gpu();
  REQUIRE(be.can_record());  // TOPKV_CUDA_GRAPHS=0 must not be set for this test binary
  std::mt19937 rng(43);
  int steps = 0, equal = 0;
  double worst_att = 0;
  struct Case {
    int hd, n_kv, group;
    int64_t window, capacity, first, last;
    DType dt;
  };
  for (const Case& c : {Case{256, 1, 4, 24, 24 + 7, 0, 100, DType::F16},   // ring of 31 wraps three times
                        Case{64, 2, 4, 0, 600, 200, 560, DType::F32},      // 201..561 keys: 1 -> 3 splits
                        Case{128, 2, 8, 0, 300, 250, 262, DType::BF16}}) {  // 256 | 257 keys
    CAPTURE(c.hd, c.n_kv, c.group, c.window, c.capacity);
    const int nh = c.n_kv * c.group, d = 96, vocab = 50;
    std::vector<float> table_host;
    const Weight table = device_table(be, vocab, d, rng, table_host);
    RopeParams rp;
    rp.style = RopeStyle::NeoX, rp.n_rot = c.hd, rp.base = 1e6f;
    const size_t qn = (size_t)nh * c.hd, kn = (size_t)c.n_kv * c.hd;
    // A: recorded; B: the same ops run directly. Separate buffers and caches.
    Buffer xa = be.alloc(d * 4), xb = be.alloc(d * 4), qa = be.alloc(qn * 4), qb = be.alloc(qn * 4);
    Buffer ka = be.alloc(kn * 4), kb = be.alloc(kn * 4), va = be.alloc(kn * 4), vb = be.alloc(kn * 4);
    Buffer oa = be.alloc(qn * 4), ob = be.alloc(qn * 4);
    KvLayerCache ca = be.alloc_kv(c.n_kv, c.hd, c.capacity, c.dt), cb = be.alloc_kv(c.n_kv, c.hd, c.capacity, c.dt);
    const float scale = 0.07f;
    const int32_t tok0 = 7;
    be.begin_recording(c.first, tok0);
    be.embed(table, &tok0, 1, 1.5f, xa.f32());
    be.rope(qa.f32(), 1, nh, c.hd, c.first, rp);
    be.rope(ka.f32(), 1, c.n_kv, c.hd, c.first, rp);
    be.kv_write(ca, ka.f32(), va.f32(), 1, c.first);
    be.attention(qa.f32(), 1, nh, c.first, ca, c.window, scale, oa.f32());
    const std::unique_ptr<Backend::Recording> rec = be.end_recording();
    // Positions before `first` fill both caches directly (the recording starts mid-context).
    for (int64_t pos = 0; pos <= c.last; ++pos) {
      const auto q = randn(qn, rng, 2.f), k = randn(kn, rng, 1.f, 0.2f), v = randn(kn, rng);
      using Up = std::pair<const Buffer*, const std::vector<float>*>;
      for (const Up& u : {Up{&qa, &q}, Up{&qb, &q}, Up{&ka, &k}, Up{&kb, &k}, Up{&va, &v}, Up{&vb, &v}})
        be.from_host(u.second->data(), *u.first, 0, u.second->size() * 4);
      const int32_t tok = (int32_t)(rng() % vocab);
      if (pos >= c.first) {
        be.set_step(pos, tok);
        be.replay(*rec);
      } else {  // as B does: the key is roped before it is cached
        be.rope(ka.f32(), 1, c.n_kv, c.hd, pos, rp);
        be.kv_write(ca, ka.f32(), va.f32(), 1, pos);
      }
      be.embed(table, &tok, 1, 1.5f, xb.f32());
      be.rope(qb.f32(), 1, nh, c.hd, pos, rp);
      be.rope(kb.f32(), 1, c.n_kv, c.hd, pos, rp);
      be.kv_write(cb, kb.f32(), vb.f32(), 1, pos);
      be.attention(qb.f32(), 1, nh, pos, cb, c.window, scale, ob.f32());
      if (pos < c.first) continue;
      CAPTURE(pos);
      // Embedding, RoPE and the cache write must be bit-identical; attention
      // is compared bitwise and, failing that, within fp32 rounding (its split
      // partials may be merged in another order), reported apart.
      const bool exact_ops = same_bits(be, xa, xb, d * 4) && same_bits(be, qa, qb, qn * 4) &&
                             same_bits(be, ka, kb, kn * 4);
      CHECK(exact_ops);
      const bool att_bits = same_bits(be, oa, ob, qn * 4);
      const double att_err = att_bits ? 0.0 : rel_err(download(be, oa, qn), download(be, ob, qn));
      CHECK(att_err <= 1e-6);
      worst_att = std::max(worst_att, att_err);
      ++steps, equal += exact_ops && att_bits;
    }
    CHECK(same_bits(be, ca.k, cb.k, ca.k.bytes));
    CHECK(same_bits(be, ca.v, cb.v, ca.v.bytes));
  }
  std::printf("SUMMARY %-34s steps %5d   bitwise equal %5d   worst attention rel err %.2e   %s\n",
              "recorded ops replayed", steps, equal, worst_att, worst_att <= 1e-6 ? "ok" : "FAIL");
}

TEST_CASE("a recording refuses host copies, other shapes and positions, the backend is usable after") {
  auto& be = gpu();
  std::mt19937 rng(47);
  KvLayerCache c = be.alloc_kv(1, 64, 32, DType::F32);
  Buffer q = upload(be, randn(4 * 64, rng)), out = poisoned(be, 4 * 64);
  std::vector<float> host(4 * 64);
  const auto expect_refused = [&](auto&& op) {
    be.begin_recording(5, 1);
    REQUIRE_THROWS_AS(op(), Error);
    be.cancel_recording();
  };
  expect_refused([&] { be.to_host(q, 0, host.data(), host.size() * 4); });
  expect_refused([&] { be.from_host(host.data(), q, 0, host.size() * 4); });
  expect_refused([&] { be.attention(q.f32(), 1, 4, 6, c, 0, 0.1f, out.f32()); });   // not the recorded position
  expect_refused([&] { be.kv_write(c, q.f32(), q.f32(), 2, 5); });                   // two tokens
  expect_refused([&] { be.alloc_kv(1, 64, 8, DType::F32); });
  expect_refused([&] { be.begin_recording(5, 1); });                                   // one at a time
  expect_refused([&] { be.set_step(5, 1); });
  REQUIRE_THROWS_AS(be.end_recording(), Error);  // nothing open
  // Still usable: ops run, and a fresh recording replays.
  be.attention(q.f32(), 1, 4, 3, c, 0, 0.1f, out.f32());
  const auto direct = download(be, out, host.size());
  be.begin_recording(3, 0);
  be.attention(q.f32(), 1, 4, 3, c, 0, 0.1f, out.f32());
  auto rec = be.end_recording();
  be.from_host(std::vector<float>(host.size(), 0.f).data(), out, 0, host.size() * 4);
  be.set_step(3, 0);
  be.replay(*rec);
  CHECK(download(be, out, host.size()) == direct);

  // Another backend's recording is refused; the CPU backend records nothing.
  auto other = make_cuda_backend();
  Buffer ox = other->alloc(256 * 4), oy = other->alloc(256 * 4);
  other->begin_recording(0, 0);
  other->add(ox.f32(), 256, oy.f32());
  auto foreign = other->end_recording();
  REQUIRE_THROWS_AS(be.replay(*foreign), Error);
  auto cpu = make_cpu_backend();
  CHECK_FALSE(cpu->can_record());
  REQUIRE_THROWS_AS(cpu->begin_recording(0, 0), Error);

  // TOPKV_CUDA_GRAPHS=0 turns recording off for backends made after it is set.
  const char* old = std::getenv("TOPKV_CUDA_GRAPHS");
  const std::string saved = old ? old : "";
  setenv("TOPKV_CUDA_GRAPHS", "0", 1);
  auto off = make_cuda_backend();
  if (old)
    setenv("TOPKV_CUDA_GRAPHS", saved.c_str(), 1);
  else
    unsetenv("TOPKV_CUDA_GRAPHS");
  CHECK_FALSE(off->can_record());
  REQUIRE_THROWS_AS(off->begin_recording(0, 0), Error);
}
