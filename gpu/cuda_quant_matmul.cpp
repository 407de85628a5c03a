// The CUDA backend's products on quantised weights (the file's blocks in the
// device layout of gpu/quant_units.h), and its weight-memory arithmetic:
//   decode (T <= kQuantGemvMaxTokens): x quantised once to q8_1 (two terms,
//     a 16-bit code in int8 halves, unless --q8-terms 1), then one
//     quant_gemv launch per kQuantGroupMaxJobs matrices (q, k, v together;
//     gate and up together), the epilogue applied in the kernel; the MMVQ
//     kernel is picked per shape (mmvq_auto_kernel) unless TOPKV_MMVQ=old|new (read at construction);
//   prefill: x cast to fp16 once (the cuBLAS path of gpu/kernels_matmul.cu),
//     then per row tile of at most dequant_tile_bytes_ (256 MiB): the tile
//     dequantised to fp16 into the Dequant scratch, one cuBLAS GEMM into
//     y's rows; the bias (if any) is added once at the end.
#ifdef TOPKV_HAVE_CUDA
#include <algorithm>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"
#include "gpu/cuda_quant.h"
#include "gpu/quant_matvec_ref.h"

namespace topkv::cuda {

void CudaBackend::matmul_group(const MatmulInput& in, int T, std::span<const MatmulJob> jobs) {
  check_matmul_group(in, jobs);
  bool all_quant = true;
  for (const MatmulJob& j : jobs) {
    check_device_weight(*j.w, "matmul_group");
    epilogue_bias(*j.w, j.ep, "matmul_group");
    all_quant = all_quant && qunits::has_device_layout(j.w->type);
  }
  if (T <= 0) return;
  if (!all_quant || T > kQuantGemvMaxTokens) {  // formed by the separate ops, then each product
    Backend::matmul_group(in, T, jobs);
    return;
  }
  quant_gemv_group(in, T, jobs);
}

void CudaBackend::quant_gemv_group(const MatmulInput& in, int T, std::span<const MatmulJob> jobs) {
  const int64_t cols = jobs[0].w->cols;
  void* ws = scratch(Scratch::QuantX, q8_activation_bytes(T, cols, q8_terms_));
  if (in.add || in.norm || in.up) {
    const auto vec = [&](const Weight* w, const char* what) -> const float* {
      if (!w) return nullptr;
      TOPKV_CHECK(w->type == GgmlType::F32 && w->rows * w->cols == cols, "matmul_group: {} '{}' must be F32 of {} "
                  "values", what, w->name, cols);
      check_device_weight(*w, "matmul_group");
      return reinterpret_cast<const float*>(w->data);
    };
    FormQ8Args f;
    f.x = in.x, f.add = in.add, f.add_norm = vec(in.add_norm, "add_norm"), f.norm = vec(in.norm, "norm");
    f.up = in.up, f.glu = in.glu, f.eps = in.eps, f.T = T, f.cols = cols, f.terms = q8_terms_;
    form_q8_1(f, ws, stream_);
  } else {
    quantize_q8_1(in.x, T, cols, ws, stream_, q8_terms_);
  }
  for (size_t j0 = 0; j0 < jobs.size(); j0 += kQuantGroupMaxJobs) {
    QuantGemvJob g[kQuantGroupMaxJobs];
    const int n = (int)std::min<size_t>(kQuantGroupMaxJobs, jobs.size() - j0);
    for (int i = 0; i < n; ++i) {
      const MatmulJob& j = jobs[j0 + (size_t)i];
      g[i].type = j.w->type, g[i].w = j.w->data, g[i].rows = j.w->rows, g[i].y = j.y;
      g[i].bias = epilogue_bias(*j.w, j.ep, "matmul"), g[i].accumulate = j.ep.accumulate;
    }
    quant_gemv(g, n, cols, T, ws, stream_, MmvqOptions{mmvq_kernel_, 0, q8_terms_});
  }
}

void CudaBackend::quant_prefill(const float* x, const Weight& w, int T, float* y, const MatmulEpilogue& ep) {
  bool wide;
  {
    std::lock_guard<std::mutex> lock(wide_weights_->mu);
    wide = wide_weights_->set.count(w.data) != 0;
  }
  const DType wt = wide ? DType::BF16 : DType::F16;
  const size_t row16 = (size_t)w.cols * 2;
  const int64_t tile_rows = std::clamp<int64_t>((int64_t)(dequant_tile_bytes_ / row16), 1, w.rows);
  void* w16 = scratch(Scratch::Dequant, (size_t)tile_rows * row16);
  void* x16 = scratch(Scratch::Cast, gemm_workspace_bytes(w.cols, T));
  cast_activations_16bit(wt, x, T, w.cols, x16, scalars_, stream_);
  for (int64_t r0 = 0; r0 < w.rows; r0 += tile_rows) {
    const int64_t n = std::min(tile_rows, w.rows - r0);
    dequant_16bit(w.type, w.data, w.rows, w.cols, r0, n, wt, w16, stream_);
    gemm_16bit_cast(cublas_, wt, w16, n, w.cols, x16, T, y + r0, w.rows, scalars_, stream_, ep.accumulate);
  }
  if (const float* bias = epilogue_bias(w, ep, "matmul")) add_bias(y, bias, T, w.rows, stream_);
}

size_t CudaBackend::prepared_weight_bytes(const Weight& src, WeightMode mode) const {
  const size_t n = (size_t)src.rows * (size_t)src.cols;
  if (src.rows == 1) return n * sizeof(float);  // norms and biases stay fp32
  if (mode == WeightMode::Quant && qunits::has_device_layout(src.type))
    return qref::device_bytes(src.type, src.rows, src.cols);
  return n * 2;  // fp16 (bf16 for BF16 files and values beyond fp16)
}

WeightMode CudaBackend::other_weight_mode(WeightMode mode) const {
  return mode == WeightMode::Quant ? WeightMode::F16 : WeightMode::Quant;
}

}  // namespace topkv::cuda
#endif  // TOPKV_HAVE_CUDA
