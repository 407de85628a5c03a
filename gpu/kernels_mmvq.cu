// The decode GEMV on quantised weights, new kernel (MmvqKernel::New, the
// default; the old one is in gpu/kernels_quant_gemv.cu). Same arithmetic and
// order as the old kernel and the twin qref::mmvq: lane l of the warp that
// owns a row takes units l, l + 32, ... of it (quant_units.h), adds
// unit.dot(activations) per token into fp32 partials in that order, and the
// lanes are summed in warp_sum's butterfly tree. What changed is how the work
// meets the memory and the issue slots:
//
//   - Resident warps. The grid is at most what the device holds at once
//     (occupancy x SMs); warp w takes tiles w, w + W, w + 2W, ... of the
//     launch (W warps in all), so no wave of short-lived blocks starts late
//     and the job / type lookup is paid per tile, not per block launch.
//   - L2 prefetch one tile ahead. Before working on a tile the warp asks L2
//     for the bytes of its next tile (cp.async.bulk.prefetch.L2, one request
//     per plane of the rows; sm_90), so DRAM keeps streaming while the warp
//     computes, and the loads of the next tile find their lines in L2. Bytes
//     in flight no longer depend on registers: W x 2.3 KB for Q4_K rows of
//     4096 (~6 MB at W = 2640 on an H100), against the ~4.5 MB that 3 TB/s x
//     ~1.5 us of loaded latency needs.
//   - More loads before use: at T = 1 a lane issues all four units of a
//     4096-wide Q4_K row at once (B = 4, the old kernel 2); the lane's unit
//     within a block is fixed (32 is a multiple of the units per block), so
//     the loop advances one block index per round, with no division, and
//     each row's planes are addressed from its first block.
//   - Each unit is decoded once for all tokens (U::prep: codes, scales;
//     with q8_1x2 both halves of a token's codes meet it, quant_units.h), the
//     min terms of K-quants are a select, not a branch, and the R x NT sums
//     are reduced by recursive halving (reduce_scatter: N - 1 shuffles for N
//     sums, the butterfly's bits): ~31 instructions per row, unit and token at
//     T = 8 against ~55 in the old kernel (SASS, Q4_K).
//
// Tiles (R rows per warp share each activation load, B unit rounds per batch
// of loads), chosen as ggml's mmvq.cu does for its rows per block: one row at
// T = 1, two up to T = 8 there; four here at T = 5..8, where the activation
// loads and their L1 traffic (32 bytes of q8 + 16 of scales per unit and
// token) would otherwise exceed the weight stream:
//   T = 1:    R = 1, B = 4 (R = 2, B = 2 for rows of <= 1024 values: a
//             640-wide Q8_0 row is 40 units, 1.25 per lane; and with two
//             activation terms, whose loads two rows then share (four rows
//             were slower with session 16's first two-term format);
//   T = 2..4: R = 2, B = 2;   T = 5..8: R = 4, B = 1.
// Launch bounds (blocks of 4 warps per SM) keep every instantiation free of
// spills (ptxas, all eight types in one kernel): T = 1: 5 blocks (<= 102
// registers; 90-95 used), T = 2: 4 (<= 128), T = 3, 4: 3 (<= 168), T = 5..8:
// 2 (~200 used): 20 / 16 / 12 / 8 resident warps per SM. The prefetch, not
// the registers, keeps DRAM busy, so fewer warps at large T cost little;
// there the integer work per byte is what bounds the kernel.
#include <algorithm>
#include <atomic>

#include "gpu/cuda_common.cuh"
#include "gpu/cuda_quant.h"
#include "gpu/quant_gemv_args.cuh"

namespace topkv::cuda {
namespace {

using namespace qunits;

constexpr int kWarps = 4;  // per CUDA block

template <int NT> struct Config;
template <> struct Config<1> { static constexpr int kMinBlocks = 5; };
template <> struct Config<2> { static constexpr int kMinBlocks = 4; };
template <> struct Config<3> { static constexpr int kMinBlocks = 3; };
template <> struct Config<4> { static constexpr int kMinBlocks = 3; };
template <> struct Config<5> { static constexpr int kMinBlocks = 2; };
template <> struct Config<6> { static constexpr int kMinBlocks = 2; };
template <> struct Config<7> { static constexpr int kMinBlocks = 2; };
template <> struct Config<8> { static constexpr int kMinBlocks = 2; };

struct Tile {
  int R, B;
};
Tile new_tile(int T, int64_t cols, int terms) {
  if (T == 1) return cols <= 1024 || terms == 2 ? Tile{2, 2} : Tile{1, 4};
  return T <= 4 ? Tile{2, 2} : Tile{4, 1};
}

// Asks L2 for `bytes` (a multiple of 16) at p (16-byte aligned); a hint, no
// register waits for it.
__device__ __forceinline__ void l2_prefetch(const uint8_t* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes));
#else
  for (uint32_t o = 0; o < bytes; o += 32) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + o));
#endif
}

// Asks L2 for the bytes of the rows of `tile`, one request per plane (lane
// 0 only). The range is widened to 16-byte bounds inside the plane; the last
// few bytes of a plane that ends off a 16-byte bound are left out (a hint).
template <int R> __device__ __forceinline__ void prefetch_tile(const GemvArgs& a, int64_t tile) {
  const GemvJobDev& job = a.jobs[job_of(a, tile)];
  const int64_t r0 = (tile - job.tile0) * R, r1 = min(r0 + R, job.rows);
#pragma unroll
  for (int p = 0; p < kMaxPlanes; ++p) {
    const int64_t rb = job.row_bytes[p];
    if (rb == 0) break;  // planes come in order
    const int64_t end = (job.rows * rb) & ~int64_t{15};
    const int64_t lo = (r0 * rb) & ~int64_t{15}, hi = min((r1 * rb + 15) & ~int64_t{15}, end);
    if (hi > lo) l2_prefetch(job.w.plane[p] + lo, (uint32_t)(hi - lo));
  }
}

constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }

// The warp sums of v[0..N) (N a power of two <= 32), scattered over the lanes
// by recursive halving: at offset o = 16, 8, ... each lane keeps half of its
// values and adds its partner's copies of them; with one value left, the
// remaining offsets are a butterfly. Each sum is formed over the same pairs in
// the same tree as warp_sum's butterfly (the twin's order; a + b = b + a), so
// it is bit for bit the same, for N - 1 shuffles instead of 5 N. Returns the
// sum of value `index`, which lanes with (lane & (32 / N - 1)) == 0 own alone.
template <int n, int o, int N> __device__ __forceinline__ void halve(float (&v)[N], int lane, int& base) {
  if constexpr (n > 1) {
    const bool upper = (lane & o) != 0;
#pragma unroll
    for (int j = 0; j < n / 2; ++j) {
      const float keep = upper ? v[j + n / 2] : v[j], send = upper ? v[j] : v[j + n / 2];
      v[j] = fadd(keep, __shfl_xor_sync(0xffffffffu, send, o));
    }
    if (upper) base += n / 2;
    halve<n / 2, o / 2>(v, lane, base);
  }
}
template <int N> __device__ __forceinline__ float reduce_scatter(float (&v)[N], int lane, int& index) {
  static_assert(N >= 1 && N <= 32 && (N & (N - 1)) == 0, "1, 2, 4, .. 32 values");
  int base = 0;
  halve<N, 16>(v, lane, base);
#pragma unroll
  for (int o = 16 / N; o > 0; o >>= 1) v[0] = fadd(v[0], __shfl_xor_sync(0xffffffffu, v[0], o));
  index = base;
  return v[0];
}

// The rows row0 .. row0 + R - 1 of one job (rows past the job's last: the
// last row, loaded and discarded).
template <class U, int NT, int R, int B, int S>
__device__ __forceinline__ void tile_rows(const GemvJobDev& job, const GemvArgs& a, int64_t row0, int lane) {
  constexpr int kU = U::kUnits;    // 1, 2 or 8: divides 32
  constexpr int kStep = 32 / kU;   // blocks between a lane's units
  const int nb = (int)(a.cols / U::kValues);
  const int k = lane % kU;         // the lane's unit within every block it visits
  const PlaneBytes pb = plane_bytes(U::kType);
  QuantMatrix m[R];  // each row's planes from its first block
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t g0 = (row0 + r < job.rows ? row0 + r : job.rows - 1) * nb;
#pragma unroll
    for (int p = 0; p < kMaxPlanes; ++p) m[r].plane[p] = job.w.plane[p] + g0 * pb.b[p];
    m[r].rows = 1, m[r].cols = a.cols;
  }
  float acc[R][NT];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[r][t] = 0.f;

  // Lane l's units l + 32 j are blocks lane / kU + kStep j, unit k of each.
  for (int b0 = lane / kU; b0 < nb; b0 += B * kStep) {
    typename U::Unit w[B][R];
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int b = min(b0 + i * kStep, nb - 1);
#pragma unroll
      for (int r = 0; r < R; ++r) w[i][r] = U::load(m[r], b, k);
    }
#pragma unroll
    for (int i = 0; i < B; ++i) {
      const int b = b0 + i * kStep;
      if (b >= nb) break;
      typename U::Prep p[R];  // decoded once, used by every token
#pragma unroll
      for (int r = 0; r < R; ++r) p[r] = U::prep(w[i][r], k);
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const XUnit x = U::template load_x<S>(q8_row<S>(a, t), b, k);
#pragma unroll
        for (int r = 0; r < R; ++r) acc[r][t] = fadd(acc[r][t], U::template dot<S>(p[r], x));
      }
    }
  }

  constexpr int kN = pow2_at_least(R * NT);
  float v[kN];
#pragma unroll
  for (int i = 0; i < kN; ++i) v[i] = i < R * NT ? acc[i / NT][i % NT] : 0.f;
  int i = 0;
  float s = reduce_scatter<kN>(v, lane, i);
  const int64_t row = row0 + i / NT;
  if ((lane & (32 / kN - 1)) == 0 && i < R * NT && row < job.rows) {  // one lane per sum
    if (job.bias) s = fadd(s, job.bias[row]);
    float* out = job.y + (i % NT) * job.rows + row;
    *out = job.accumulate ? fadd(*out, s) : s;
  }
}

// The arguments stay in the constant bank (__grid_constant__): a warp reads
// its tile's job there by index.
template <int NT, int R, int B, int S>
__global__ void __launch_bounds__(kWarps * 32, Config<NT>::kMinBlocks) mmvq_kernel(const __grid_constant__ GemvArgs a) {
  const int lane = threadIdx.x % 32;
  const int64_t first = (int64_t)blockIdx.x * kWarps + threadIdx.x / 32, stride = (int64_t)gridDim.x * kWarps;
  if (lane == 0 && first < a.n_tiles) prefetch_tile<R>(a, first);
  for (int64_t tile = first; tile < a.n_tiles; tile += stride) {
    if (lane == 0 && tile + stride < a.n_tiles) prefetch_tile<R>(a, tile + stride);
    const GemvJobDev& job = a.jobs[job_of(a, tile)];
    const int64_t row0 = (tile - job.tile0) * R;
    // A type without a device layout was refused on the host.
    with_unit_type((GgmlType)job.type, [&](auto u) { tile_rows<decltype(u), NT, R, B, S>(job, a, row0, lane); });
  }
}

// Blocks of the instantiation one SM holds on the current device (asked once
// per device) and the device's SM count (device_shape).
struct Residency {
  int per_sm, sms;
};
template <int NT, int R, int B, int S> Residency residency() {
  static std::atomic<int> per_sm[64];  // static storage: zero-initialised
  int dev = 0;
  TOPKV_CUDA_CHECK(cudaGetDevice(&dev));
  const int sms = device_shape(dev).sms;
  if (dev < 64 && per_sm[dev].load(std::memory_order_relaxed) > 0)
    return {per_sm[dev].load(std::memory_order_relaxed), sms};
  int n = 0;
  TOPKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, mmvq_kernel<NT, R, B, S>, kWarps * 32, 0));
  TOPKV_CHECK(n > 0 && sms > 0, "the MMVQ kernel (T = {}) fits no SM of device {}", NT, dev);
  if (dev < 64) per_sm[dev].store(n, std::memory_order_relaxed);
  return {n, sms};
}

template <int NT, int R, int B, int S> void launch(const GemvArgs& a, int max_blocks, cudaStream_t stream) {
  const Residency res = residency<NT, R, B, S>();
  int64_t blocks = std::min<int64_t>((a.n_tiles + kWarps - 1) / kWarps, (int64_t)res.per_sm * res.sms);
  if (max_blocks > 0) blocks = std::min<int64_t>(blocks, max_blocks);
  mmvq_kernel<NT, R, B, S><<<(unsigned)blocks, kWarps * 32, 0, stream>>>(a);
  TOPKV_CUDA_CHECK_LAUNCH();
}

}  // namespace

int new_mmvq_rows_per_tile(int T, int64_t cols, int terms) { return new_tile(T, cols, terms).R; }

namespace {
template <int S> void launch_terms(const GemvArgs& a, int T, int max_blocks, cudaStream_t stream) {
  const Tile tile = new_tile(T, a.cols, S);
  switch (T) {  // the instantiations new_tile picks from
    case 1:
      if (tile.R == 2) {
        launch<1, 2, 2, S>(a, max_blocks, stream);
      } else {
        if constexpr (S == 1)
          launch<1, 1, 4, S>(a, max_blocks, stream);
        else  // new_tile gives two terms two rows
          fail("internal: MMVQ with two activation terms at T = 1 takes two rows a warp");
      }
      break;
    case 2: launch<2, 2, 2, S>(a, max_blocks, stream); break;
    case 3: launch<3, 2, 2, S>(a, max_blocks, stream); break;
    case 4: launch<4, 2, 2, S>(a, max_blocks, stream); break;
    case 5: launch<5, 4, 1, S>(a, max_blocks, stream); break;
    case 6: launch<6, 4, 1, S>(a, max_blocks, stream); break;
    case 7: launch<7, 4, 1, S>(a, max_blocks, stream); break;
    default: launch<8, 4, 1, S>(a, max_blocks, stream); break;
  }
}
}  // namespace

void launch_new_mmvq(const GemvArgs& a, int T, int terms, int max_blocks, cudaStream_t stream) {
  qunits::with_q8_terms(terms, [&](auto s) { launch_terms<decltype(s)::value>(a, T, max_blocks, stream); });
}

}  // namespace topkv::cuda
