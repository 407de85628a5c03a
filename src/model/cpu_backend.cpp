// The CPU backend: every op of backend.h on host memory, parallel with
// OpenMP. Plain-loop twins of these ops live in src/model/reference.cpp and
// tests/test_cpu_ops.cpp compares the two.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "src/common/limits.h"
#include "src/common/error.h"
#include "src/common/vec_math.h"
#include "src/model/backend.h"
#include "src/model/cpu_kernels.h"

namespace topkv {

WeightMode parse_weight_mode(const std::string& s) {
  if (s == "quant") return WeightMode::Quant;
  if (s == "f16") return WeightMode::F16;
  if (s == "f32") return WeightMode::F32;
  fail("unknown weight mode '{}': use 'quant' (keep the file's quantised rows), 'f16' (dequantise to fp16 at load: "
       "the CUDA backend) or 'f32' (dequantise to fp32 at load: the CPU backend)", s);
}

const char* weight_mode_name(WeightMode m) {
  return m == WeightMode::Quant ? "quant" : m == WeightMode::F16 ? "f16" : "f32";
}

void check_matmul_group(const MatmulInput& in, std::span<const MatmulJob> jobs) {
  TOPKV_CHECK(!jobs.empty(), "matmul_group: no products");
  TOPKV_CHECK(in.x, "matmul_group: no input");
  for (const MatmulJob& j : jobs) {
    TOPKV_CHECK(j.w && j.y, "matmul_group: a job without a weight or an output");
    TOPKV_CHECK(j.w->cols == jobs[0].w->cols, "matmul_group: '{}' has {} columns but '{}' has {}; the jobs of a "
                "group multiply the same x", j.w->name, j.w->cols, jobs[0].w->name, jobs[0].w->cols);
  }
  TOPKV_CHECK(!(in.norm && in.up), "matmul_group: an input is a pre-norm or a GLU, not both");
  TOPKV_CHECK(in.formed || !(in.add_norm || in.norm || in.up), "matmul_group: a formed input needs `formed` scratch");
  TOPKV_CHECK(!in.add_norm || in.add, "matmul_group: add_norm without add");
}

void Backend::matmul_group(const MatmulInput& in, int T, std::span<const MatmulJob> jobs) {
  check_matmul_group(in, jobs);
  const int64_t cols = jobs[0].w->cols, n = (int64_t)T * cols;
  if (T <= 0) return;
  if (in.add) {
    const float* a = in.add;
    if (in.add_norm) {
      rms_norm(in.add, *in.add_norm, T, (int)cols, in.eps, in.formed);
      a = in.formed;
    }
    add(a, n, in.x);
  }
  const float* x = in.x;
  if (in.norm) {
    rms_norm(in.x, *in.norm, T, (int)cols, in.eps, in.formed);
    x = in.formed;
  } else if (in.up) {
    glu(in.glu, in.x, in.up, n, in.formed);
    x = in.formed;
  }
  for (const MatmulJob& j : jobs) matmul(x, *j.w, T, j.y, j.ep);
}

size_t Backend::prepared_weight_bytes(const Weight& src, WeightMode mode) const {
  if (mode == WeightMode::F32) return (size_t)src.rows * (size_t)src.cols * sizeof(float);
  return src.bytes();
}
WeightMode Backend::other_weight_mode(WeightMode mode) const {
  return mode == WeightMode::Quant ? WeightMode::F32 : WeightMode::Quant;
}

void check_weight_mode(WeightMode m, bool cuda) {
  TOPKV_CHECK(!(cuda && m == WeightMode::F32), "--weights f32 is for the CPU backend; on the CUDA backend use quant "
              "(the file's quantised blocks on the GPU, the default) or f16 (dequantised to fp16 at load)");
  TOPKV_CHECK(cuda || m != WeightMode::F16, "--weights f16 is for the CUDA backend; on the CPU backend use quant "
              "(the mapped file's quantised rows, the default) or f32 (dequantised to fp32 at load)");
}

// Backends that cannot record (the CPU one) run every op as it is called;
// the model asks can_record() first, so reaching these is a caller's bug.
void Backend::attention_prologue(float* q, float* k, const float* v, int T, int n_head, int n_kv, int head_dim,
                                 const Weight* q_norm, const Weight* k_norm, float eps, int64_t pos0,
                                 const RopeParams& rope_p, KvLayerCache* cache) {
  if (q_norm) rms_norm(q, *q_norm, (int64_t)T * n_head, head_dim, eps, q);
  if (k_norm) rms_norm(k, *k_norm, (int64_t)T * n_kv, head_dim, eps, k);
  rope(q, T, n_head, head_dim, pos0, rope_p);
  rope(k, T, n_kv, head_dim, pos0, rope_p);
  if (cache) kv_write(*cache, k, v, T, pos0);
}

void check_ring_past(const KvLayerCache& c, int64_t pos0) {
  TOPKV_CHECK(c.past, "layer {} keeps only the chunk being prefilled (its past lives in the top-k runtime's host "
              "stores), and no runtime serves that past now: prefill it through the runtime that takes the chunks "
              "(OffloadRuntime::begin_context), or give the model full caches (--prefill-kv host-copy)", c.layer);
  const int64_t held = c.past->past_end(c.layer);
  TOPKV_CHECK(held >= pos0, "internal: the chunk at position {} of layer {} attends every position before it, but "
              "the runtime's stores hold {} (absorb each chunk before the next)", pos0, c.layer, held);
}

void Backend::begin_recording(int64_t, int32_t) {
  fail("backend '{}' cannot record decode steps (can_record() is false); run the ops directly", name());
}
std::unique_ptr<Backend::Recording> Backend::end_recording() {
  fail("backend '{}' cannot record decode steps (can_record() is false)", name());
}
void Backend::set_step(int64_t, int32_t) {
  fail("backend '{}' cannot record decode steps (can_record() is false)", name());
}
void Backend::replay(const Recording&) {
  fail("backend '{}' cannot record decode steps (can_record() is false)", name());
}

namespace {

constexpr size_t kAlign = 64;

Buffer host_alloc(size_t bytes) {
  void* p = std::aligned_alloc(kAlign, std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign));
  TOPKV_CHECK(p, "out of host memory allocating {} bytes", bytes);
  return Buffer{std::shared_ptr<void>(p, std::free), bytes};
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const CpuBackendOptions& opt) {
    check_thread_count(opt.threads, "the CPU thread count");
    if (opt.threads > 0) omp_set_num_threads(opt.threads);
  }
  std::string name() const override { return "cpu"; }

  Buffer alloc(size_t bytes) override { return host_alloc(bytes); }
  void to_host(const Buffer& src, size_t off, void* dst, size_t bytes) override {
    std::memcpy(dst, src.as<uint8_t>() + off, bytes);
  }
  void from_host(const void* src, const Buffer& dst, size_t off, size_t bytes) override {
    std::memcpy(dst.as<uint8_t>() + off, src, bytes);
  }

  Weight prepare_weight(const Weight& src, WeightMode mode) override {
    TOPKV_CHECK(mode != WeightMode::F16, "--weights f16 is for the CUDA backend; the CPU backend keeps the file's "
                "quantised rows (quant) or dequantises them to fp32 (f32)");
    if (mode == WeightMode::Quant || src.type == GgmlType::F32) return src;
    Weight w = src;
    Buffer buf = host_alloc((size_t)src.rows * src.cols * sizeof(float));
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < src.rows; ++r) cpu::weight_row_f32(src, r, buf.f32() + (size_t)r * src.cols);
    w.type = GgmlType::F32;
    w.row_bytes = (size_t)src.cols * sizeof(float);
    w.data = buf.as<uint8_t>();
    w.owned = buf.mem;
    return w;
  }

  KvLayerCache alloc_kv(int n_kv_heads, int head_dim, int64_t capacity, DType dtype) override {
    KvLayerCache c = kv_cache_shape(n_kv_heads, head_dim, capacity, dtype);
    const size_t half = c.bytes() / 2;
    c.k = host_alloc(half);
    c.v = host_alloc(half);
    return c;
  }

  void embed(const Weight& table, const int32_t* ids, int T, float scale, float* out) override {
    for (int t = 0; t < T; ++t)
      TOPKV_CHECK(ids[t] >= 0 && ids[t] < table.rows, "token id {} is outside the vocabulary (0..{})", ids[t],
                  table.rows - 1);
#pragma omp parallel for schedule(static) if (T > 1)
    for (int t = 0; t < T; ++t) {
      float* o = out + (size_t)t * table.cols;
      cpu::weight_row_f32(table, ids[t], o);
      if (scale != 1.f)
        for (int64_t i = 0; i < table.cols; ++i) o[i] *= scale;
    }
  }

  void rms_norm(const float* x, const Weight& w, int64_t rows, int dim, float eps, float* out) override {
    TOPKV_CHECK(w.type == GgmlType::F32 && w.rows * w.cols == dim, "norm weight {} must be F32 of {} values",
                w.name, dim);
    const float* g = reinterpret_cast<const float*>(w.data);
#pragma omp parallel for schedule(static) if (rows * dim > 16384)
    for (int64_t r = 0; r < rows; ++r) {
      const float* xr = x + (size_t)r * dim;
      float* o = out + (size_t)r * dim;
      const float inv = 1.f / std::sqrt(dot_f32(xr, xr, (size_t)dim) / (float)dim + eps);
      for (int i = 0; i < dim; ++i) o[i] = xr[i] * inv * g[i];
    }
  }

  void rope(float* x, int T, int n_heads, int head_dim, int64_t pos0, const RopeParams& p) override {
    const int half = p.n_rot / 2;
    std::vector<double> inv_freq(half);
    for (int i = 0; i < half; ++i)
      inv_freq[i] = p.freq_scale * std::pow((double)p.base, -2.0 * i / p.n_rot) /
                    (p.freq_factors ? p.freq_factors[i] : 1.f);
#pragma omp parallel for schedule(static) if (T > 1)
    for (int t = 0; t < T; ++t) {
      std::vector<float> cs(half), sn(half);
      const double pos = (double)(pos0 + t);
      for (int i = 0; i < half; ++i) {
        const double th = pos * inv_freq[i];
        cs[i] = (float)std::cos(th), sn[i] = (float)std::sin(th);
      }
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + ((size_t)t * n_heads + h) * head_dim;
        const int stride = p.style == RopeStyle::NeoX ? 1 : 2, other = p.style == RopeStyle::NeoX ? half : 1;
        for (int i = 0; i < half; ++i) {
          float& a = v[i * stride];
          float& b = v[i * stride + other];
          const float a0 = a, b0 = b;
          a = a0 * cs[i] - b0 * sn[i];
          b = a0 * sn[i] + b0 * cs[i];
        }
      }
    }
  }

  using Backend::matmul;
  void matmul(const float* x, const Weight& w, int T, float* y, const MatmulEpilogue& ep) override {
    cpu::matmul(x, w, T, y, ep);
  }

  void glu(GluKind kind, const float* gate, const float* up, int64_t n, float* out) override {
    if (kind == GluKind::SiLU) {
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) out[i] = gate[i] / (1.f + std::exp(-gate[i])) * up[i];
    } else {
      constexpr float kC = 0.7978845608028654f;  // sqrt(2/pi)
#pragma omp parallel for schedule(static) if (n > 65536)
      for (int64_t i = 0; i < n; ++i) {
        const float g = gate[i];
        out[i] = 0.5f * g * (1.f + std::tanh(kC * (g + 0.044715f * g * g * g))) * up[i];
      }
    }
  }

  void add(const float* x, int64_t n, float* y) override {
    for (int64_t i = 0; i < n; ++i) y[i] += x[i];
  }

  void kv_write(KvLayerCache& c, const float* k, const float* v, int T, int64_t pos0) override {
    const size_t es = dtype_size(c.dtype), row = (size_t)c.head_dim;
    for (int t = 0; t < T; ++t) {
      const int64_t slot = (pos0 + t) % c.capacity;
      for (int h = 0; h < c.n_kv_heads; ++h) {
        const size_t src = ((size_t)t * c.n_kv_heads + h) * row, dst = (h * c.head_stride() + slot * row) * es;
        from_f32(c.dtype, k + src, c.k.as<uint8_t>() + dst, row);
        from_f32(c.dtype, v + src, c.v.as<uint8_t>() + dst, row);
      }
    }
  }

  void attention(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& c, int64_t window,
                 float scale, float* out) override {
    if (c.ring && pos0 > 0) {
      const KvLayerCache whole = with_past(c, pos0, T);
      cpu::attention(q, T, n_head, pos0, whole, window, scale, out);
      return;
    }
    cpu::attention(q, T, n_head, pos0, c, window, scale, out);
  }

 private:
  // A prefill ring's positions [0, pos0 + T) as one cache of that many slots:
  // the past's runs converted to the cache's type, then the chunk from the
  // ring. The plain reference of the CUDA backend's streamed attention over a
  // ring (gpu/cuda_streamed_attention.cpp), and on the CPU the ring's cost:
  // one layer's context at a time instead of every layer's for the prefill.
  static KvLayerCache with_past(const KvLayerCache& c, int64_t pos0, int T) {
    check_ring_past(c, pos0);
    TOPKV_CHECK(T <= c.capacity, "a chunk of {} tokens does not fit layer {}'s prefill ring of {}", T, c.layer,
                c.capacity);
    KvLayerCache w = kv_cache_shape(c.n_kv_heads, c.head_dim, pos0 + T, c.dtype);
    const size_t es = dtype_size(c.dtype), hd = (size_t)c.head_dim;
    w.k = host_alloc(w.bytes() / 2), w.v = host_alloc(w.bytes() / 2);
    std::vector<float> tmp;
    for (int h = 0; h < c.n_kv_heads; ++h)
      for (int kv = 0; kv < 2; ++kv) {
        uint8_t* dst = (kv ? w.v : w.k).as<uint8_t>() + (size_t)h * w.head_stride() * es;
        c.past->past_runs(c.layer, h, kv == 1, 0, pos0, [&](const KvPastRun& r) {
          const size_t n = (size_t)r.n * hd;
          if (r.dtype == c.dtype) {
            std::memcpy(dst + (size_t)r.pos * hd * es, r.rows, n * es);
            return;
          }
          tmp.resize(n);
          to_f32(r.dtype, r.rows, tmp.data(), n);
          from_f32(c.dtype, tmp.data(), dst + (size_t)r.pos * hd * es, n);
        });
        const uint8_t* ring = (kv ? c.v : c.k).as<uint8_t>() + (size_t)h * c.head_stride() * es;
        for (int t = 0; t < T; ++t)
          std::memcpy(dst + (size_t)(pos0 + t) * hd * es, ring + (size_t)((pos0 + t) % c.capacity) * hd * es, hd * es);
      }
    return w;
  }
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(const CpuBackendOptions& opt) {
  return std::make_unique<CpuBackend>(opt);
}

}  // namespace topkv
