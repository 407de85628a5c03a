// Matmul of activations by a (possibly quantised) weight on the CPU.
//   decode (T < kGemmMinTokens): each output row is dotted with each token in
//     place (dot_quant_row), rows split across OpenMP threads; the weight is
//     read once per call and never expanded.
//   prefill: the weight is cut into tiles of kTileRows rows; each thread
//     dequantises a tile into its own fp32 scratch and multiplies it with all T
//     tokens through BLAS sgemm (OpenBLAS via Faiss's link, declared here as
//     Faiss does), so dequantisation costs 1/T of the multiply.
#include <omp.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "src/common/vec_math.h"
#include "src/model/cpu_kernels.h"

extern "C" {
// Fortran BLAS, LP64 (Debian's OpenBLAS, linked through faiss).
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
            const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
            const float* beta, float* c, const int* ldc);
// OpenBLAS only; weak so that another BLAS still links.
void openblas_set_num_threads(int) __attribute__((weak));
}

namespace topkv::cpu {
namespace {

constexpr int64_t kTileRows = 64;
constexpr int64_t kParallelMacs = 1 << 18;

// Each OpenMP thread calls sgemm on its own tile, so BLAS must not start its
// own threads on top (2 cores shared: oversubscription halves throughput).
void blas_single_threaded_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (openblas_set_num_threads) openblas_set_num_threads(1);
  });
}

}  // namespace

// Column-major BLAS on row-major data: a row-major X[r][c] is the
// column-major X^T, so row-major C = B * op(A) is column-major C^T = op(A)^T * B^T.
void gemm_abt(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc, float beta) {
  blas_single_threaded_once();
  const float one = 1.f;
  // col-major C^T[m][n] = op(A)[m][k] * B^T[k][n], A^T stored as col-major k x m -> "T".
  sgemm_("T", "N", &m, &n, &k, &one, a, &lda, b, &ldb, &beta, c, &ldc);
}

void gemm_ab(int m, int n, int k, const float* a, int lda, const float* b, int ldb, float* c, int ldc, float beta) {
  blas_single_threaded_once();
  const float one = 1.f;
  // col-major C^T[m][n] = A^T[m][k] * B^T[k][n]; row-major A[k][m] is col-major A^T -> "N".
  sgemm_("N", "N", &m, &n, &k, &one, a, &lda, b, &ldb, &beta, c, &ldc);
}

void weight_row_f32(const Weight& w, int64_t r, float* dst) {
  if (w.type == GgmlType::F32)
    std::memcpy(dst, w.row(r), (size_t)w.cols * sizeof(float));
  else
    dequantize_row(w.type, w.row(r), dst, w.cols);
}

float weight_row_dot(const Weight& w, int64_t r, const float* x) {
  switch (w.type) {
    case GgmlType::F32: return dot_f32(reinterpret_cast<const float*>(w.row(r)), x, (size_t)w.cols);
    case GgmlType::F16: return dot_f16(reinterpret_cast<const uint16_t*>(w.row(r)), x, (size_t)w.cols);
    default: return dot_quant_row(w.type, w.row(r), x, w.cols);
  }
}

void matmul(const float* x, const Weight& w, int T, float* y, const MatmulEpilogue& ep) {
  const int64_t out = w.rows, in = w.cols;
  const float* bias = nullptr;
  if (ep.bias) {
    TOPKV_CHECK(ep.bias->type == GgmlType::F32 && ep.bias->rows * ep.bias->cols == out,
                "matmul by '{}': bias '{}' must be F32 with {} values (one per output row), got {} x {} {}", w.name,
                ep.bias->name, out, ep.bias->rows, ep.bias->cols, ggml_type_name((uint32_t)ep.bias->type));
    bias = reinterpret_cast<const float*>(ep.bias->data);
  }
  if (T < kGemmMinTokens) {
    // A small product runs on the calling thread: waking the team costs more.
#pragma omp parallel for schedule(static) if ((int64_t)T * out * in >= kParallelMacs)
    for (int64_t r = 0; r < out; ++r)
      for (int t = 0; t < T; ++t) {
        float& dst = y[(size_t)t * out + r];
        const float v = weight_row_dot(w, r, x + (size_t)t * in) + (bias ? bias[r] : 0.f);
        dst = ep.accumulate ? dst + v : v;
      }
    return;
  }
  const int64_t n_tiles = (out + kTileRows - 1) / kTileRows;
  const bool direct = w.type == GgmlType::F32;  // rows usable as they are
#pragma omp parallel
  {
    std::vector<float> tile;
    if (!direct) tile.resize((size_t)kTileRows * in);
#pragma omp for schedule(dynamic, 1)
    for (int64_t ti = 0; ti < n_tiles; ++ti) {
      const int64_t r0 = ti * kTileRows, nr = std::min(kTileRows, out - r0);
      const float* a;
      int lda;
      if (direct) {
        a = reinterpret_cast<const float*>(w.row(r0));
        lda = (int)(w.row_bytes / sizeof(float));
      } else {
        for (int64_t r = 0; r < nr; ++r) weight_row_f32(w, r0 + r, tile.data() + r * in);
        a = tile.data();
        lda = (int)in;
      }
      gemm_abt((int)nr, T, (int)in, a, lda, x, (int)in, y + r0, (int)out, ep.accumulate ? 1.f : 0.f);
      if (bias)
        for (int t = 0; t < T; ++t)
          for (int64_t r = 0; r < nr; ++r) y[(size_t)t * out + r0 + r] += bias[r0 + r];
    }
  }
}

}  // namespace topkv::cpu
