// Decode products on quantised weights (MMVQ, after ggml-cuda's mmvq.cu):
//   quantize_q8_1_kernel  one warp per block of 32 activations: d = max|x|/127,
//                         q = round(x/d), s = d * sum(q); with two terms
//                         d = max|x|/32512 and q in two int8 halves (quant_units.h).
//   quant_gemv            the public launcher: checks the jobs, lays out the
//                         tiles (gpu/quant_gemv_args.cuh) and runs the kernel
//                         MmvqOptions names: the new one (gpu/kernels_mmvq.cu)
//                         or the old one below.
//   old_gemv_kernel       every output row of up to kQuantGroupMaxJobs
//                         matrices in one launch. A warp owns one tile of R
//                         rows of one job (its job and type are found from
//                         the warp index); lane l takes units l, l + 32, ... of
//                         the row (16 bytes of weight each, quant_units.h),
//                         with B units' loads issued before any is used, and
//                         adds unit.dot(activations) for every token (with
//                         S = 2 terms, both halves of its codes) into fp32
//                         partials; a butterfly reduces the lanes, lane 0
//                         applies the epilogue (bias, accumulate).
// Tiling of the old kernel by token count T: R rows share each activation
// load (the L1 traffic of the activations grows with T), B keeps loads in
// flight when R is small:
//   T = 1: R = 1, B = 2 (R = 2 for rows of <= 1024 values: a 640-wide row is
//          40 Q8_0 units, one round of loads, so the warp takes two; and
//          with two activation terms, whose loads two rows then share: four
//          were slower with session 16's first two-term format);
//   T = 2..4: R = 2, B = 1;  T = 5..8: R = 4, B = 1.
// Twins: qref::quantize_q8_1 and qref::mmvq (gpu/quant_matvec_ref.h), which
// sum in the same order, so the two agree to the last bit.
#include <cstdlib>
#include <cstring>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_quant.h"
#include "gpu/quant_gemv_args.cuh"
#include "gpu/quant_matvec_ref.h"

namespace topkv::cuda {
namespace {

using namespace qunits;

constexpr int kQuantizeThreads = 256;  // 8 blocks of 32 activations per CUDA block
constexpr int kGemvWarps = 4;

__global__ void __launch_bounds__(kQuantizeThreads)
    quantize_q8_1_kernel(const float* __restrict__ x, int64_t n_blocks, int64_t row_blocks, int terms,
                         int8_t* __restrict__ qs, Q8Scale* __restrict__ ds) {
  const int64_t blk = (int64_t)blockIdx.x * (kQuantizeThreads / 32) + threadIdx.x / 32;
  if (blk >= n_blocks) return;  // whole warps
  quantize_q8_1_warp(x[blk * 32 + threadIdx.x % 32], blk / row_blocks, blk % row_blocks, row_blocks, terms, qs, ds);
}

// The old kernel's tile: rows per warp R, unit rounds per load batch B.
struct Tile {
  int R, B;
};
Tile old_tile(int T, int64_t cols, int terms) {
  if (T == 1) return cols <= 1024 || terms == 2 ? Tile{2, 2} : Tile{1, 2};
  return T <= 4 ? Tile{2, 1} : Tile{4, 1};
}

template <class U, int NT, int R, int B, int S>
__device__ __forceinline__ void gemv_warp(const GemvJobDev& job, const GemvArgs& a, int64_t row0, int lane) {
  const int nb = (int)(a.cols / U::kValues), units = nb * U::kUnits;
  int64_t g0[R];  // first block of each row (past the last row: the last row, loaded and discarded)
#pragma unroll
  for (int r = 0; r < R; ++r) g0[r] = (row0 + r < job.rows ? row0 + r : job.rows - 1) * nb;
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;

  for (int u0 = lane; u0 < units; u0 += 32 * B) {
    typename U::Unit w[B][R];
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int u = min(u0 + 32 * i, units - 1);
      const int b = u / U::kUnits, k = u % U::kUnits;
#pragma unroll
      for (int r = 0; r < R; ++r) w[i][r] = U::load(job.w, g0[r] + b, k);
    }
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int u = u0 + 32 * i;
      if (u >= units) break;
      const int b = u / U::kUnits, k = u % U::kUnits;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const XUnit x = U::template load_x<S>(q8_row<S>(a, t), b, k);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] = fadd(acc[r][t], U::template dot<S>(w[i][r], x, k));
      }
    }
  }

#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      float s = warp_sum(acc[r][t]);
      const int64_t row = row0 + r;
      if (lane == 0 && row < job.rows) {
        if (job.bias) s = fadd(s, job.bias[row]);
        float* out = job.y + t * job.rows + row;
        *out = job.accumulate ? fadd(*out, s) : s;
      }
    }
}

// The arguments stay in the constant bank (__grid_constant__): a warp reads
// its job's fields there by index, without a copy in registers.
template <int NT, int R, int B, int S>
__global__ void __launch_bounds__(kGemvWarps * 32) old_gemv_kernel(const __grid_constant__ GemvArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t warp = (int64_t)blockIdx.x * kGemvWarps + threadIdx.x / 32;  // = its tile
  if (warp >= a.n_tiles) return;  // the grid's last warps
  const GemvJobDev& job = a.jobs[job_of(a, warp)];
  const int64_t row0 = (warp - job.tile0) * R;
  // A type without a device layout was refused on the host.
  with_unit_type((GgmlType)job.type, [&](auto u) { gemv_warp<decltype(u), NT, R, B, S>(job, a, row0, lane); });
}

}  // namespace

size_t q8_activation_bytes(int T, int64_t cols, int terms) {
  return align16((size_t)T * (size_t)terms * cols) + (size_t)T * (cols / 32) * sizeof(Q8Scale);
}

Q8DeviceActivations carve_q8_activations(void* workspace, int T, int64_t cols, int terms) {
  auto* base = static_cast<uint8_t*>(workspace);
  return {reinterpret_cast<int8_t*>(base),
          reinterpret_cast<Q8Scale*>(base + align16((size_t)T * (size_t)terms * cols))};
}

void quantize_q8_1(const float* x, int T, int64_t cols, void* workspace, cudaStream_t stream, int terms) {
  TOPKV_CHECK(cols > 0 && cols % 32 == 0, "q8_1 activations need a positive multiple of 32 columns, got {}", cols);
  qref::check_q8_terms(terms);
  const int64_t n_blocks = (int64_t)T * cols / 32;
  if (n_blocks <= 0) return;
  const Q8DeviceActivations q = carve_q8_activations(workspace, T, cols, terms);
  const int64_t per = kQuantizeThreads / 32;
  quantize_q8_1_kernel<<<(unsigned)((n_blocks + per - 1) / per), kQuantizeThreads, 0, stream>>>(
      x, n_blocks, cols / 32, terms, q.qs, q.ds);
  TOPKV_CUDA_CHECK_LAUNCH();
}

const char* mmvq_kernel_name(MmvqKernel k) {
  return k == MmvqKernel::Old ? "old" : k == MmvqKernel::New ? "new" : "auto";
}

MmvqKernel mmvq_auto_kernel(int T, int64_t cols) {
  return T <= 2 && cols >= 2048 ? MmvqKernel::Old : MmvqKernel::New;
}

MmvqKernel mmvq_kernel_from_env() {
  const char* env = std::getenv("TOPKV_MMVQ");
  if (!env || !*env || std::strcmp(env, "auto") == 0) return MmvqKernel::Auto;
  if (std::strcmp(env, "new") == 0) return MmvqKernel::New;
  if (std::strcmp(env, "old") == 0) return MmvqKernel::Old;
  fail("TOPKV_MMVQ={} names no MMVQ kernel: use 'auto' (the default), 'new' or 'old'", env);
}

int q8_terms_from_env() {
  const char* env = std::getenv("TOPKV_Q8_TERMS");
  if (!env || !*env || std::strcmp(env, "2") == 0) return 2;
  if (std::strcmp(env, "1") == 0) return 1;
  fail("TOPKV_Q8_TERMS={} is not a number of activation terms: use 2 (q8_1x2, the default) or 1 (q8_1)", env);
}

GemvArgs gemv_args(const QuantGemvJob* jobs, int n_jobs, int64_t cols, int T, int terms, const void* workspace,
                   int R) {
  qref::check_q8_terms(terms);
  TOPKV_CHECK(n_jobs >= 1 && n_jobs <= kQuantGroupMaxJobs, "quant_gemv takes 1..{} matrices per launch, got {}",
              kQuantGroupMaxJobs, n_jobs);
  TOPKV_CHECK(T >= 1 && T <= kQuantGemvMaxTokens, "quant_gemv runs 1..{} tokens, got {}", kQuantGemvMaxTokens, T);
  GemvArgs a{};
  int64_t tiles = 0;
  for (int j = 0; j < n_jobs; ++j) {
    const QuantGemvJob& s = jobs[j];
    TOPKV_CHECK(has_device_layout(s.type) && cols % block_values(s.type) == 0 && s.rows >= 0 && cols < INT32_MAX,
                "quant_gemv: a {} x {} matrix of {} has no device layout", s.rows, cols,
                ggml_type_name((uint32_t)s.type));
    TOPKV_CHECK(s.rows == 0 || reinterpret_cast<uintptr_t>(s.w) % 16 == 0,
                "quant_gemv: the {} weight at {} is not 16-byte aligned (the kernels read 16 bytes at a time)",
                ggml_type_name((uint32_t)s.type), static_cast<const void*>(s.w));
    GemvJobDev& d = a.jobs[j];
    d.w = quant_matrix(s.type, s.w, s.rows, cols);
    d.type = (int)s.type, d.accumulate = s.accumulate ? 1 : 0, d.rows = s.rows, d.y = s.y, d.bias = s.bias;
    d.tile0 = tiles;
    const PlaneBytes pb = plane_bytes(s.type);
    for (int p = 0; p < kMaxPlanes; ++p) d.row_bytes[p] = cols / block_values(s.type) * pb.b[p];
    tiles += (s.rows + R - 1) / R;
  }
  a.n_jobs = n_jobs, a.cols = cols, a.n_tiles = tiles;
  const Q8DeviceActivations q = carve_q8_activations(const_cast<void*>(workspace), T, cols, terms);
  a.qs = q.qs, a.ds = q.ds;
  return a;
}

void quant_gemv(const QuantGemvJob* jobs, int n_jobs, int64_t cols, int T, const void* workspace,
                cudaStream_t stream, const MmvqOptions& opt) {
  TOPKV_CHECK(opt.max_blocks >= 0, "quant_gemv: max_blocks {} (0 means as many as the device holds)", opt.max_blocks);
  const MmvqKernel kernel = opt.kernel == MmvqKernel::Auto ? mmvq_auto_kernel(T, cols) : opt.kernel;
  if (kernel == MmvqKernel::Old) {
    const GemvArgs a = gemv_args(jobs, n_jobs, cols, T, opt.terms, workspace, old_mmvq_rows_per_tile(T, cols, opt.terms));
    if (a.n_tiles > 0) launch_old_mmvq(a, T, opt.terms, stream);
  } else {
    const GemvArgs a = gemv_args(jobs, n_jobs, cols, T, opt.terms, workspace, new_mmvq_rows_per_tile(T, cols, opt.terms));
    if (a.n_tiles > 0) launch_new_mmvq(a, T, opt.terms, opt.max_blocks, stream);
  }
}

int old_mmvq_rows_per_tile(int T, int64_t cols, int terms) { return old_tile(T, cols, terms).R; }

namespace {
template <int S> void launch_old(const GemvArgs& a, int T, cudaStream_t stream) {
  const int R = old_tile(T, a.cols, S).R;
  const unsigned blocks = (unsigned)((a.n_tiles + kGemvWarps - 1) / kGemvWarps);
  const unsigned threads = kGemvWarps * 32;
  switch (T) {  // the instantiations old_tile picks from
    case 1:
      if (R == 2) {
        old_gemv_kernel<1, 2, 2, S><<<blocks, threads, 0, stream>>>(a);
      } else {
        if constexpr (S == 1)
          old_gemv_kernel<1, 1, 2, S><<<blocks, threads, 0, stream>>>(a);
        else  // old_tile gives two terms two rows
          fail("internal: MMVQ with two activation terms at T = 1 takes two rows a warp");
      }
      break;
    case 2: old_gemv_kernel<2, 2, 1, S><<<blocks, threads, 0, stream>>>(a); break;
    case 3: old_gemv_kernel<3, 2, 1, S><<<blocks, threads, 0, stream>>>(a); break;
    case 4: old_gemv_kernel<4, 2, 1, S><<<blocks, threads, 0, stream>>>(a); break;
    case 5: old_gemv_kernel<5, 4, 1, S><<<blocks, threads, 0, stream>>>(a); break;
    case 6: old_gemv_kernel<6, 4, 1, S><<<blocks, threads, 0, stream>>>(a); break;
    case 7: old_gemv_kernel<7, 4, 1, S><<<blocks, threads, 0, stream>>>(a); break;
    default: old_gemv_kernel<8, 4, 1, S><<<blocks, threads, 0, stream>>>(a); break;
  }
  TOPKV_CUDA_CHECK_LAUNCH();
}
}  // namespace

void launch_old_mmvq(const GemvArgs& a, int T, int terms, cudaStream_t stream) {
  qunits::with_q8_terms(terms, [&](auto s) { launch_old<decltype(s)::value>(a, T, stream); });
}

}  // namespace topkv::cuda
