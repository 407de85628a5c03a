// The new MMVQ kernel (gpu/kernels_mmvq.cu) where it differs from the old
// one: its warps stay resident and walk tile after tile, crossing from one
// job of a group to the next (with another type, another epilogue) and
// prefetching the next tile into L2. Grids capped to 1..7 blocks make every
// warp walk many tiles; a matrix of 40000 rows does so at the full grid. Each
// job must equal its CPU twin (qref::mmvq, the same arithmetic in the same
// order: checked to 1e-5 relative) and the old kernel exactly. The sweep of
// every type, T = 1..8, odd row counts and the epilogues on single matrices
// is in tests/gpu/test_cuda_quant.cpp (it runs the new kernel, the default).
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gpu/cuda_quant.h"
#include "gpu/quant_matvec_ref.h"
#include "tests/gpu/cuda_test_util.h"
#include "tests/quant_test_util.h"

using namespace topkv;
using namespace topkv::test;

namespace {

const char* tname(GgmlType t) { return ggml_type_name((uint32_t)t).data(); }

// One job of a group: its matrix (device layout, host and device), epilogue
// and initial output.
struct Job {
  GgmlType type;
  int64_t rows;
  bool bias, accumulate;
  std::vector<uint8_t> dev;
  std::vector<float> b, y0;
  Buffer dw, db;
};

Job make_job(Backend& be, GgmlType t, int64_t rows, int64_t cols, bool bias, bool accumulate, int T,
             std::mt19937& rng) {
  Job j{t, rows, bias, accumulate, {}, randn((size_t)rows, rng), randn((size_t)T * rows, rng), {}, {}};
  const std::vector<uint8_t> file = random_quant_row(t, rows * cols, rng);
  j.dev.resize(qref::device_bytes(t, rows, cols));
  qref::repack(t, file.data(), rows, cols, j.dev.data());
  j.dw = be.alloc(j.dev.size());
  be.from_host(j.dev.data(), j.dw, 0, j.dev.size());
  j.db = upload(be, j.b);
  return j;
}

// Runs the group on the device with `opt` and returns each job's output.
std::vector<std::vector<float>> run(Backend& be, std::vector<Job>& jobs, int64_t cols, int T, const Buffer& ws,
                                    const cuda::MmvqOptions& opt) {
  std::vector<Buffer> ys;
  cuda::QuantGemvJob g[cuda::kQuantGroupMaxJobs];
  for (size_t i = 0; i < jobs.size(); ++i) {
    Job& j = jobs[i];
    ys.push_back(j.rows == 0 ? Buffer{} : j.accumulate ? upload(be, j.y0) : poisoned(be, j.y0.size()));
    g[i].type = j.type, g[i].w = j.dw.as<uint8_t>(), g[i].rows = j.rows;
    g[i].y = j.rows == 0 ? nullptr : ys.back().f32();
    g[i].bias = j.bias ? j.db.f32() : nullptr, g[i].accumulate = j.accumulate;
  }
  cuda::quant_gemv(g, (int)jobs.size(), cols, T, ws.mem.get(), cuda_be().stream(), opt);
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < jobs.size(); ++i)
    out.push_back(jobs[i].rows == 0 ? std::vector<float>{} : download(be, ys[i], jobs[i].y0.size()));
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) {
      std::printf("old vs new: first difference at %zu of %zu: old %.9g, new %.9g\n", i, a.size(), a[i], b[i]);
      return false;
    }
  return true;
}

// The group against the twin (new kernel, each grid cap) and the old kernel,
// with one activation term and with two (quant_units.h).
void check_group(Backend& be, std::vector<Job>& jobs, int64_t cols, int T, std::mt19937& rng, OpSummary& s_twin,
                 OpSummary& s_old, std::initializer_list<int> caps) {
  const auto x = randn((size_t)T * cols, rng, 2.f);
  for (int terms = 1; terms <= qunits::kQ8MaxTerms; ++terms) {
    CAPTURE(terms);
    const qref::Q8Activations a = qref::quantize_q8_1(x.data(), T, cols, terms);
    Buffer dx = upload(be, x), ws = be.alloc(cuda::q8_activation_bytes(T, cols, terms));
    cuda::quantize_q8_1(dx.f32(), T, cols, ws.mem.get(), cuda_be().stream(), terms);
    std::vector<std::vector<float>> want;
    for (Job& j : jobs) {
      want.push_back(j.y0);
      if (j.rows > 0)
        qref::mmvq(j.type, j.dev.data(), j.rows, cols, a, want.back().data(), j.bias ? j.b.data() : nullptr,
                   j.accumulate);
    }
    const auto old = run(be, jobs, cols, T, ws, cuda::MmvqOptions{cuda::MmvqKernel::Old, 0, terms});
    for (int cap : caps) {
      CAPTURE(cap);
      const auto got = run(be, jobs, cols, T, ws, cuda::MmvqOptions{cuda::MmvqKernel::New, cap, terms});
      for (size_t i = 0; i < jobs.size(); ++i) {
        if (jobs[i].rows == 0) continue;  // nothing to write (its tiles are none)
        CAPTURE(i, tname(jobs[i].type), jobs[i].rows);
        s_twin.check(rel_err(got[i], want[i]));
        s_old.check(same_bits(old[i], got[i]) ? 0.0 : 1.0);
      }
    }
  }
}

}  // namespace

TEST_CASE("quant: the new MMVQ kernel walks tiles across the jobs of mixed-type groups, capped grids, T = 1..8") {
  auto& be = cuda_be();
  std::mt19937 rng(31);
  OpSummary s_twin("MMVQ new, groups, capped grids vs twin", 1e-5), s_old("MMVQ new vs old, groups (differing)", 0);
  // 512 columns: every type's blocks divide it (two K super-blocks, 16 legacy blocks).
  const int64_t cols = 512;
  const GgmlType mix[][4] = {{GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::Q5_0},
                             {GgmlType::Q5_K, GgmlType::Q4_0, GgmlType::Q5_1, GgmlType::Q4_1},
                             {GgmlType::Q6_K, GgmlType::Q6_K, GgmlType::Q4_K, GgmlType::Q8_0}};
  const int64_t rows[][4] = {{130, 1, 77, 33}, {5, 300, 2, 64}, {1, 129, 3, 257}};
  for (int T = 1; T <= cuda::kQuantGemvMaxTokens; ++T)
    for (int m = 0; m < 3; ++m) {
      CAPTURE(T, m);
      std::vector<Job> jobs;
      for (int i = 0; i < 4; ++i)  // epilogues: plain, bias, accumulate, both, rotating with m
        jobs.push_back(make_job(be, mix[m][i], rows[m][i], cols, ((i + m) & 1) != 0, ((i + m) & 2) != 0, T, rng));
      check_group(be, jobs, cols, T, rng, s_twin, s_old, {1, 3, 7, 0});
    }
  // A job with no rows between two others, and a single job.
  for (int T : {1, 4, 8}) {
    CAPTURE(T);
    std::vector<Job> jobs;
    jobs.push_back(make_job(be, GgmlType::Q4_K, 65, cols, true, false, T, rng));
    jobs.push_back(make_job(be, GgmlType::Q8_0, 1, cols, false, false, T, rng));
    jobs.back().rows = 0, jobs.back().y0.clear();
    jobs.push_back(make_job(be, GgmlType::Q6_K, 19, cols, false, true, T, rng));
    check_group(be, jobs, cols, T, rng, s_twin, s_old, {1, 2, 0});
  }
}

TEST_CASE("quant: the new MMVQ kernel on 40000 rows: every warp walks many tiles at the full grid") {
  auto& be = cuda_be();
  std::mt19937 rng(32);
  OpSummary s_twin("MMVQ new, 40000 rows vs twin", 1e-5), s_old("MMVQ new vs old, 40000 rows (differing)", 0);
  for (GgmlType t : {GgmlType::Q4_0, GgmlType::Q8_0, GgmlType::Q4_K})
    for (int T : {1, 3, 8}) {
      CAPTURE(tname(t), T);
      const int64_t cols = ggml_type_info(t).block_elems == 32 ? 64 : 256;
      std::vector<Job> jobs;
      jobs.push_back(make_job(be, t, 40001, cols, T == 3, T == 8, T, rng));
      check_group(be, jobs, cols, T, rng, s_twin, s_old, {0});
    }
}
