// The CUDA kernels beyond the Backend interface, against their CPU twins:
// the exact partial-attention merge (offload/partial_attention.h), device
// sampling (src/model/sampler.h) and the element conversion of the prefill
// rings' past (cuda::convert against to_f32 + from_f32). One SUMMARY line per
// kernel.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_kernels.h"
#include "gpu/cuda_sampler.h"
#include "offload/partial_attention.h"
#include "src/common/error.h"
#include "src/model/sampler.h"
#include "tests/gpu/cuda_test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
}  // namespace

TEST_CASE("merge_partials equals partial_merge + partial_finish, empty parts skipped") {
  auto& be = cuda_be();
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> um(-8.f, 8.f), ul(0.5f, 20.f), u01(0.f, 1.f);
  OpSummary s("merge_partials", 1e-5);
  for (int64_t rows : {1, 37})
    for (int parts : {1, 2, 64, 300})
      for (int dv : {64, 100, 256}) {
        CAPTURE(rows, parts, dv);
        const size_t np = (size_t)rows * parts;
        std::vector<float> m(np), l(np), o(np * dv);
        std::vector<float> ref((size_t)rows * dv);
        for (int64_t r = 0; r < rows; ++r) {
          AttnPartial acc(dv);
          const bool all_empty = r == 1;  // one row with nothing in it: zeros out
          for (int p = 0; p < parts; ++p) {
            const size_t i = (size_t)r * parts + p;
            const bool empty = all_empty || u01(rng) < 0.2f;
            AttnPartial part(dv);
            if (empty) {  // an empty part's m and o are never read: make them poison
              m[i] = -INFINITY, l[i] = 0.f;
              for (int d = 0; d < dv; ++d) o[i * dv + d] = kNaN;
            } else {
              m[i] = um(rng), l[i] = ul(rng);
              part.m = m[i], part.l = l[i];
              for (int d = 0; d < dv; ++d) part.o[d] = o[i * dv + d] = um(rng) * l[i];
            }
            partial_merge(acc, part);
          }
          partial_finish(acc, ref.data() + r * dv);
        }
        Buffer dm = upload(be, m), dl = upload(be, l), dov = upload(be, o), dout = poisoned(be, ref.size());
        cuda::merge_partials(dm.f32(), dl.f32(), dov.f32(), rows, parts, dv, dout.f32(), be.stream());
        s.check(rel_err(download(be, dout, ref.size()), ref));
      }
}

// The streamed prefill's running merge (gpu/cuda_streamed_attention.cpp):
// merge_partials_into folds `parts` partials into an accumulator that may be
// empty, keeping it unnormalised. Twin: partial_merge. Compared as the
// finished output and the log-sum-exp m + ln l of each row.
TEST_CASE("merge_partials_into equals partial_merge into a running partial, empty ones included") {
  auto& be = cuda_be();
  std::mt19937 rng(27);
  std::uniform_real_distribution<float> um(-8.f, 8.f), ul(0.5f, 20.f), u01(0.f, 1.f);
  OpSummary s_out("merge_partials_into (output)", 1e-5), s_lse("merge_partials_into (log-sum-exp)", 1e-5);
  for (int parts : {1, 5, 300})
    for (int dv : {64, 256}) {
      CAPTURE(parts, dv);
      const int64_t rows = 37;
      const size_t np = (size_t)rows * parts;
      std::vector<float> m(np), l(np), o(np * dv), am(rows), al(rows), ao((size_t)rows * dv);
      std::vector<float> ref_out((size_t)rows * dv), ref_lse(rows);
      auto random_part = [&](float& pm, float& pl, float* po, AttnPartial& part, bool empty) {
        if (empty) {
          pm = -INFINITY, pl = 0.f;
          for (int d = 0; d < dv; ++d) po[d] = kNaN;  // never read
          return;
        }
        pm = um(rng), pl = ul(rng);
        part.m = pm, part.l = pl;
        for (int d = 0; d < dv; ++d) part.o[d] = po[d] = um(rng) * pl;
      };
      for (int64_t r = 0; r < rows; ++r) {
        AttnPartial acc(dv);
        random_part(am[r], al[r], ao.data() + r * dv, acc, /*empty=*/r % 3 == 0);  // some start empty
        for (int p = 0; p < parts; ++p) {
          const size_t i = (size_t)r * parts + p;
          AttnPartial part(dv);
          random_part(m[i], l[i], o.data() + i * dv, part, r == 1 || u01(rng) < 0.2f);  // row 1: all empty
          partial_merge(acc, part);
        }
        partial_finish(acc, ref_out.data() + r * dv);
        ref_lse[r] = acc.l > 0.f ? acc.m + std::log(acc.l) : -INFINITY;
      }
      Buffer dm = upload(be, m), dl = upload(be, l), dov = upload(be, o);
      Buffer dam = upload(be, am), dal = upload(be, al), dao = upload(be, ao);
      cuda::merge_partials_into(dm.f32(), dl.f32(), dov.f32(), rows, parts, dv, dam.f32(), dal.f32(), dao.f32(),
                                be.stream());
      const auto gm = download(be, dam, rows), gl = download(be, dal, rows), go = download(be, dao, ao.size());
      std::vector<float> got_out(ref_out.size()), got_lse(rows);
      for (int64_t r = 0; r < rows; ++r) {
        for (int d = 0; d < dv; ++d) got_out[r * dv + d] = gl[r] > 0.f ? go[r * dv + d] / gl[r] : 0.f;
        got_lse[r] = gl[r] > 0.f ? gm[r] + std::log(gl[r]) : -INFINITY;
      }
      s_out.check(rel_err(got_out, ref_out));
      for (int64_t r = 0; r < rows; ++r) {
        CAPTURE(r);
        if (std::isinf(ref_lse[r])) CHECK(std::isinf(got_lse[r]));  // nothing merged: stays empty
        else s_lse.check(std::abs(got_lse[r] - ref_lse[r]) / std::max(1.f, std::abs(ref_lse[r])));
      }
    }
}

TEST_CASE("argmax on the device: lowest index on ties, -inf entries, NaN never wins") {
  auto& be = gpu();
  std::mt19937 rng(29);
  int cases = 0, mismatches = 0;
  for (int64_t n : {1, 7, 1000, 262144, 300001}) {
    for (int variant = 0; variant < 4; ++variant) {
      auto l = randn((size_t)n, rng, 3.f);
      if (variant == 1 && n > 2) l[n / 3] = l[n - 1] = 50.f;           // tie: the lower index wins
      if (variant == 2) l[0] = -INFINITY, l[n - 1] = 40.f;              // -inf entries, max last
      if (variant == 3 && n > 1) l[n / 2] = kNaN, l[n / 2 + 1] = 45.f;  // NaN skipped
      const int32_t want = argmax(l);  // a NaN past index 0 never becomes std::max_element's pick either
      Buffer d = upload(be, l);
      const int32_t got = cuda_argmax(be, d.f32(), n);
      CAPTURE(n, variant, want, got);
      CHECK(got == want);
      ++cases, mismatches += got != want;
    }
  }
  std::printf("SUMMARY %-34s cases %5d   mismatches %d   %s\n", "argmax", cases, mismatches,
              mismatches ? "FAIL" : "ok");
}

TEST_CASE("CudaSampler draws Sampler's tokens for the same seed and logits") {
  auto& be = gpu();
  std::mt19937 rng(31);
  int draws = 0, mismatches = 0;
  struct Mode { float temperature; int top_k; float top_p; };
  for (const Mode md : {Mode{0.f, 0, 1.f}, Mode{0.3f, 0, 1.f}, Mode{1.f, 0, 1.f}, Mode{2.5f, 0, 1.f},
                        Mode{0.8f, 40, 1.f}, Mode{0.8f, 0, 0.9f}})
    for (int64_t n : {1000, 262144}) {
      SamplerParams p;
      p.temperature = md.temperature, p.top_k = md.top_k, p.top_p = md.top_p, p.seed = 1234 + n;
      Sampler host(p);
      CudaSampler dev(be, p);
      const int steps = n > 100000 ? 12 : 100;
      for (int step = 0; step < steps; ++step) {
        const auto l = randn((size_t)n, rng, 2.f);
        Buffer d = upload(be, l);
        const int32_t want = host.sample(l), got = dev.sample(d.f32(), n);
        CAPTURE(md.temperature, md.top_k, md.top_p, n, step);
        CHECK(got == want);
        ++draws, mismatches += got != want;
      }
    }
  std::printf("SUMMARY %-34s draws %5d   mismatches %d   %s\n", "sampling (greedy/temp/top-k/top-p)", draws,
              mismatches, mismatches ? "FAIL" : "ok");
  auto cpu = make_cpu_backend();
  REQUIRE_THROWS_AS(CudaSampler(*cpu, SamplerParams{}), Error);
  REQUIRE_THROWS_AS(CudaSampler(be, SamplerParams{-1.f}), Error);
  CudaSampler greedy(be, SamplerParams{});
  Buffer d = poisoned(be, 4);
  REQUIRE_THROWS_AS(greedy.sample(d.f32(), 0), Error);
}

TEST_CASE("convert on the device equals to_f32 then from_f32, every store type into every cache type") {
  auto& be = cuda_be();
  std::mt19937 rng(37);
  int cases = 0, mismatches = 0;
  for (DType from : {DType::F32, DType::F16, DType::BF16, DType::F8E4M3, DType::Q8_0})
    for (DType to : {DType::F32, DType::F16, DType::BF16})
      for (int64_t n0 : {1, 127, 100003}) {
        const int64_t n = dtype_blocked(from) ? (n0 + 31) / 32 * 32 : n0;  // whole blocks: 32, 128, 100,032
        CAPTURE(dtype_name(from), dtype_name(to), n);
        // Values over E4M3's range and past it (saturated when stored as f8), subnormals included.
        std::vector<float> x = randn((size_t)n, rng, 60.f);
        for (int64_t i = 0; i < n; i += 17) x[(size_t)i] *= 1e-4f;
        std::vector<uint8_t> src(dtype_bytes(from, (size_t)n)), want(dtype_bytes(to, (size_t)n));
        from_f32(from, x.data(), src.data(), (size_t)n);
        std::vector<float> back((size_t)n);
        to_f32(from, src.data(), back.data(), (size_t)n);
        from_f32(to, back.data(), want.data(), (size_t)n);
        Buffer d_src = be.alloc(src.size()), d_dst = be.alloc(want.size());
        be.from_host(src.data(), d_src, 0, src.size());
        cuda::convert(from, d_src.mem.get(), to, d_dst.mem.get(), n, be.stream());
        std::vector<uint8_t> got(want.size());
        be.to_host(d_dst, 0, got.data(), got.size());
        const bool same = std::memcmp(got.data(), want.data(), got.size()) == 0;
        CHECK(same);
        ++cases, mismatches += !same;
      }
  std::printf("SUMMARY %-34s cases %5d   mismatches %d   %s\n", "convert (store -> cache types)", cases,
              mismatches, mismatches ? "FAIL" : "ok");
}
