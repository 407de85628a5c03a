// The tile loop of the tensor-core prefill attention (gpu/kernels_attention_tc.cu),
// emulated on the CPU with the kernel's own geometry (gpu/attention_tc_tiles.h):
// the split plan, each block's tile range, the masked / unmasked tiles, ring
// slots, zero-filled keys outside a block's range, the base-2 online softmax
// per tile and the exact merge of split partials. Without rounding it must
// equal CpuBackend::attention to fp32 accuracy (every visible key counted
// once, no other); with the kernel's 16-bit rounding of Q, K, V, P it shows
// the error the GPU tests allow for (tests/gpu/test_cuda_attention_tc.cpp).
// Fragment layouts and the copy pipeline need the GPU test.
#include <catch2/catch.hpp>

#include <cmath>
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gpu/attention_tc_tiles.h"
#include "offload/partial_attention.h"
#include "src/common/dtype.h"
#include "src/model/backend.h"
#include "tests/test_util.h"

using namespace topkv;
using namespace topkv::cuda;
using topkv::test::max_row_rel_err;

namespace {

float round_to(float x, DType tile) {
  return tile == DType::BF16 ? bf16_to_f32(f32_to_bf16(x)) : f16_to_f32(f32_to_f16(x));
}

float cache_at(const KvLayerCache& c, const Buffer& b, int kh, int64_t slot, int d) {
  const size_t i = ((size_t)kh * c.capacity + slot) * c.head_dim + d;
  switch (c.dtype) {
    case DType::F32: return b.as<float>()[i];
    case DType::F16: return f16_to_f32(b.as<uint16_t>()[i]);
    default: return bf16_to_f32(b.as<uint16_t>()[i]);
  }
}

struct EmuStats {
  int n_splits = 0;
  int64_t tiles = 0, masked = 0;
};

// attention_tc, block by block and row by row, on a CPU cache. `wave` stands
// for the resident blocks of the GPU (sm_count x blocks per SM) the plan
// fills; `round` applies the kernel's 16-bit rounding. A key-range call
// ([key_begin, key_end), AttentionArgs) merges its partials into `into`
// (one per output row [t][h]) instead of returning outputs.
struct KeyRange {
  int64_t begin = 0, end = -1;
  std::vector<AttnPartial>* into = nullptr;
};
std::vector<float> emulate(const std::vector<float>& q, int T, int n_head, int64_t pos0, const KvLayerCache& c,
                           int64_t window, float scale, int64_t wave, bool round, EmuStats* st,
                           const KeyRange& range = {}) {
  const int hd = c.head_dim, n_kv = c.n_kv_heads, group = n_head / n_kv, rows_total = T * group;
  const int bn = tc_tile_keys((int)dtype_size(c.dtype), hd);
  const DType tile = c.dtype == DType::BF16 ? DType::BF16 : DType::F16;
  int64_t key_first = 0, key_last = 0;
  tc_key_range(pos0, T, window, range.begin, range.end, &key_first, &key_last);
  const TcSplit sp = tc_plan_split(T, group, n_kv, key_first, key_last, bn, wave);
  st->n_splits = sp.n_splits;
  // Relative positions, as the kernel's launcher sets them up.
  const int64_t kb0 = sp.tile_lo * bn, pos0r = pos0 - kb0, slot0 = kb0 % c.capacity;
  const int64_t win = window > 0 && window < pos0 + T ? window : 0;
  const float q_mul = scale * 1.4426950408889634f;
  std::vector<float> out(q.size()), qr(hd), kt_rows((size_t)bn * hd), vt_rows((size_t)bn * hd), s(bn);
  for (int kh = 0; kh < n_kv; ++kh)
    for (int r0 = 0; r0 < rows_total; r0 += kTcRows) {
      TcBlockKeys b = tc_block_keys(pos0r, group, rows_total, r0, win);
      tc_clamp_keys(&b, key_first - kb0, key_last - kb0);
      std::vector<AttnPartial> acc;
      for (int row = r0; row < std::min(rows_total, r0 + kTcRows); ++row) acc.emplace_back(hd);
      for (int split = 0; split < sp.n_splits; ++split) {
        int64_t first, last;
        tc_block_tiles(b, bn, 0, sp.split_tiles, split, &first, &last);
        std::vector<float> m(acc.size(), -INFINITY), l(acc.size(), 0.f), o(acc.size() * hd, 0.f);
        for (int64_t ti = first; ti <= last; ++ti) {
          const int64_t kt = ti * bn, s0 = (slot0 + kt) % c.capacity;
          const bool full = tc_tile_full(b.p_first, b.p_last, kt, bn, win);
          ++st->tiles, st->masked += !full;
          for (int j = 0; j < bn; ++j) {  // the tile as shared memory holds it
            const bool ok = kt + j >= b.lo && kt + j <= b.hi;
            const int64_t slot = tc_slot(s0, j, c.capacity);
            for (int d = 0; d < hd; ++d) {
              float kv = ok ? cache_at(c, c.k, kh, slot, d) : 0.f, vv = ok ? cache_at(c, c.v, kh, slot, d) : 0.f;
              if (round && c.dtype == DType::F32) kv = round_to(kv, tile), vv = round_to(vv, tile);
              kt_rows[(size_t)j * hd + d] = kv, vt_rows[(size_t)j * hd + d] = vv;
            }
          }
          bool any_visible = false;
          for (size_t ri = 0; ri < acc.size(); ++ri) {
            const int row = r0 + (int)ri, t = row / group, h = kh * group + row % group;
            const int64_t p = pos0r + row / group;
            for (int d = 0; d < hd; ++d) {
              const float x = q[((size_t)t * n_head + h) * hd + d] * q_mul;
              qr[d] = round ? round_to(x, tile) : x;
            }
            int lo_r, hi_r;
            tc_row_bounds(p, kt, bn, win, &lo_r, &hi_r);
            if (full) REQUIRE((lo_r == 0 && hi_r >= bn - 1));  // an unmasked tile: every key visible
            float mx = m[ri];
            for (int j = 0; j < bn; ++j) {
              float acc_s = 0.f;
              for (int d = 0; d < hd; ++d) acc_s += qr[d] * kt_rows[(size_t)j * hd + d];
              s[j] = full || (j >= lo_r && j <= hi_r) ? acc_s : -INFINITY;
              any_visible |= s[j] != -INFINITY;
              mx = std::max(mx, s[j]);
            }
            const float base = mx == -INFINITY ? 0.f : mx, corr = std::exp2(m[ri] - base);
            float rs = 0.f;
            for (int j = 0; j < bn; ++j) s[j] = std::exp2(s[j] - base), rs += s[j];
            l[ri] = l[ri] * corr + rs, m[ri] = mx;
            float* orow = o.data() + ri * hd;
            for (int d = 0; d < hd; ++d) orow[d] *= corr;
            for (int j = 0; j < bn; ++j) {
              const float pj = round ? round_to(s[j], tile) : s[j];
              for (int d = 0; d < hd; ++d) orow[d] += pj * vt_rows[(size_t)j * hd + d];
            }
          }
          REQUIRE(any_visible);  // no walked tile is fully masked
        }
        for (size_t ri = 0; ri < acc.size(); ++ri) {
          AttnPartial part(hd);
          part.m = m[ri] * 0.6931471805599453f, part.l = l[ri];
          for (int d = 0; d < hd; ++d) part.o[d] = o[ri * hd + d];
          partial_merge(acc[ri], part);
        }
      }
      for (size_t ri = 0; ri < acc.size(); ++ri) {
        const int row = r0 + (int)ri, t = row / group, h = kh * group + row % group;
        if (range.into)
          partial_merge((*range.into)[(size_t)t * n_head + h], acc[ri]);
        else
          partial_finish(acc[ri], out.data() + ((size_t)t * n_head + h) * hd);
      }
    }
  return out;
}

struct Setup {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  KvLayerCache cache;
  std::vector<float> q;
};

// A cache holding positions 0 .. pos0 + T - 1 (the last `capacity` of them),
// random q of T tokens.
Setup make_setup(int T, int n_head, int n_kv, int hd, int64_t pos0, int64_t capacity, DType dt, float q_sd,
                 std::mt19937& rng) {
  Setup s;
  s.cache = s.cpu->alloc_kv(n_kv, hd, capacity, dt);
  const int64_t n = pos0 + T;
  std::normal_distribution<float> kd(0.2f, 1.f), vd(0.f, 1.f), qd(0.f, q_sd);
  std::vector<float> k((size_t)n * n_kv * hd), v(k.size());
  for (auto& x : k) x = kd(rng);
  for (auto& x : v) x = vd(rng);
  s.cpu->kv_write(s.cache, k.data(), v.data(), (int)n, 0);
  s.q.resize((size_t)T * n_head * hd);
  for (auto& x : s.q) x = qd(rng);
  return s;
}

}  // namespace

TEST_CASE("tensor-core attention tile loop, emulated: exact without rounding over windows, rings, splits") {
  std::mt19937 rng(71);
  struct Heads {
    int n_head, n_kv;
  };
  const Heads heads[] = {{4, 1}, {2, 2}, {6, 2}};  // GQA 4, none, 3 (rows of a token cross blocks)
  const DType types[] = {DType::F32, DType::F16, DType::BF16};
  int idx = 0, split_cases = 0;
  double worst = 0;
  for (int T : {16, 17, 64, 200})
    for (int64_t pos0 : {0, 1, 777})
      for (int64_t window : {0, 8, 100, 512}) {  // 8: a ring shorter than a key tile
        const Heads hh = heads[idx % 3];
        const DType dt = types[(idx / 3) % 3];
        const int hd = idx % 7 == 3 ? 128 : 64;  // 128 with fp32: 32-key tiles
        ++idx;
        // Sliding layers keep a ring of window + chunk - 1 slots; global ones the context.
        const int64_t capacity = window > 0 ? std::min(pos0 + T, window + T - 1) : pos0 + T;
        Setup s = make_setup(T, hh.n_head, hh.n_kv, hd, pos0, capacity, dt, 2.f, rng);
        std::vector<float> ref(s.q.size());
        const float scale = 1.f / std::sqrt((float)hd);
        s.cpu->attention(s.q.data(), T, hh.n_head, pos0, s.cache, window, scale, ref.data());
        for (int64_t wave : {int64_t{100000}, int64_t{4}}) {  // one split; as many as the plan allows
          CAPTURE(T, pos0, window, hh.n_head, hh.n_kv, hd, dtype_name(dt), capacity, wave);
          EmuStats st;
          const auto got = emulate(s.q, T, hh.n_head, pos0, s.cache, window, scale, wave, false, &st);
          split_cases += st.n_splits > 1;
          const double err = max_row_rel_err(got, ref, hd);
          worst = std::max(worst, err);
          CHECK(err < 2e-5);
        }
      }
  std::printf("SUMMARY %-34s cases %5d   max row rel err %.3e   (%d with splits)\n", "tc tile loop (no rounding)",
              2 * idx, worst, split_cases);
  CHECK(split_cases > 10);
}

// The streamed prefill (gpu/cuda_streamed_attention.cpp): a host-resident
// cache goes up in blocks of B keys into a staging cache of B slots; each
// block is a key-range call merging into one running partial per row. The
// union must be the whole attention, every key once, whatever the blocks'
// edges do to the chunk (blocks that end before it, that cut it, that hold
// all of it; rows that see nothing of a block).
TEST_CASE("tensor-core attention tile loop, emulated: key-range blocks merged equal the whole call") {
  std::mt19937 rng(73);
  struct Case {
    int T, n_head, n_kv, hd;
    int64_t pos0, block;
  };
  const Case cases[] = {{16, 4, 1, 64, 0, 64},      {17, 4, 1, 256, 100, 64},  {64, 2, 2, 128, 130, 128},
                        {200, 6, 2, 64, 700, 192},  {33, 8, 1, 64, 64, 64},    {129, 4, 1, 256, 1000, 256},
                        {40, 32, 8, 128, 300, 128}};
  const DType types[] = {DType::F16, DType::BF16, DType::F32};
  int idx = 0, blocks = 0;
  double worst = 0;
  for (const Case& cs : cases)
    for (DType dt : types) {
      ++idx;
      const int64_t n = cs.pos0 + cs.T;
      Setup s = make_setup(cs.T, cs.n_head, cs.n_kv, cs.hd, cs.pos0, n, dt, 2.f, rng);
      std::vector<float> ref(s.q.size());
      const float scale = 1.f / std::sqrt((float)cs.hd);
      s.cpu->attention(s.q.data(), cs.T, cs.n_head, cs.pos0, s.cache, 0, scale, ref.data());
      std::vector<AttnPartial> acc((size_t)cs.T * cs.n_head, AttnPartial(cs.hd));
      const size_t es = dtype_size(dt), row = (size_t)cs.hd * es;
      for (int64_t b0 = 0; b0 < n; b0 += cs.block, ++blocks) {
        const int64_t b1 = std::min(b0 + cs.block, n);
        KvLayerCache stage = s.cpu->alloc_kv(cs.n_kv, cs.hd, cs.block, dt);
        for (int kh = 0; kh < cs.n_kv; ++kh)
          for (int64_t p = b0; p < b1; ++p) {
            const size_t src = ((size_t)kh * s.cache.capacity + p) * row, dst = ((size_t)kh * cs.block + p % cs.block) * row;
            std::memcpy(stage.k.as<uint8_t>() + dst, s.cache.k.as<uint8_t>() + src, row);
            std::memcpy(stage.v.as<uint8_t>() + dst, s.cache.v.as<uint8_t>() + src, row);
          }
        EmuStats st;
        emulate(s.q, cs.T, cs.n_head, cs.pos0, stage, 0, scale, 4, false, &st, KeyRange{b0, b1, &acc});
      }
      std::vector<float> got(ref.size());
      for (size_t r = 0; r < acc.size(); ++r) partial_finish(acc[r], got.data() + r * cs.hd);
      CAPTURE(cs.T, cs.n_head, cs.n_kv, cs.hd, cs.pos0, cs.block, dtype_name(dt));
      const double err = max_row_rel_err(got, ref, cs.hd);
      worst = std::max(worst, err);
      CHECK(err < 2e-5);
    }
  std::printf("SUMMARY %-34s cases %5d   max row rel err %.3e   (%d blocks)\n", "tc key-range blocks (streamed)", idx,
              worst, blocks);
}

TEST_CASE("tensor-core attention tile loop, emulated with 16-bit rounding: error within the GPU tolerances") {
  std::mt19937 rng(73);
  struct Case {
    int T, n_head, n_kv, hd;
    int64_t pos0, window;
    DType dt;
    float q_sd, tol;  // the GPU test's tolerance for this kind of case
  };
  const Case cases[] = {
      {64, 4, 1, 256, 777, 0, DType::F32, 2.f, 3e-3f},   {64, 4, 1, 256, 777, 0, DType::F16, 2.f, 3e-3f},
      {64, 4, 1, 256, 777, 0, DType::BF16, 2.f, 2e-2f},  {64, 4, 1, 256, 777, 512, DType::F16, 2.f, 3e-3f},
      {100, 8, 2, 128, 500, 0, DType::F32, 2.f, 3e-3f},  {100, 8, 2, 64, 500, 100, DType::BF16, 2.f, 2e-2f},
      // large scores (|s| ~ 40): softmax stability, and the error grows with |s|
      {64, 4, 1, 256, 777, 0, DType::F16, 20.f, 3e-2f},  {64, 4, 1, 256, 777, 0, DType::F32, 20.f, 3e-2f},
      {64, 8, 2, 128, 3000, 0, DType::BF16, 2.f, 2e-2f},  // (bf16 at sd ~12 reaches 3.3e-2)
  };
  for (const Case& c : cases) {
    CAPTURE(c.T, c.n_head, c.n_kv, c.hd, c.pos0, c.window, dtype_name(c.dt), c.q_sd);
    const int64_t capacity = c.window > 0 ? c.window + c.T - 1 : c.pos0 + c.T;
    Setup s = make_setup(c.T, c.n_head, c.n_kv, c.hd, c.pos0, capacity, c.dt, c.q_sd, rng);
    std::vector<float> ref(s.q.size());
    const float scale = 1.f / std::sqrt((float)c.hd);
    s.cpu->attention(s.q.data(), c.T, c.n_head, c.pos0, s.cache, c.window, scale, ref.data());
    EmuStats st;
    const auto got = emulate(s.q, c.T, c.n_head, c.pos0, s.cache, c.window, scale, 8, true, &st);
    const double err = max_row_rel_err(got, ref, c.hd);
    std::printf("SUMMARY tc rounding hd %3d %-4s q_sd %4.1f window %3ld   max row rel err %.3e   (GPU tol %.1e)\n",
                c.hd, dtype_name(c.dt), c.q_sd, (long)c.window, err, c.tol);
    // The GPU adds its own summation order and ex2.approx: keep a 2x margin.
    CHECK(err < c.tol / 2);
  }
}
