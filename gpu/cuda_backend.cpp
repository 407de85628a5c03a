// The CUDA backend's host side: device setup, memory, and every op's checks
// (the same as the CPU backend's, so both refuse the same bad calls) before
// its kernels are queued. Weight upload lives in gpu/cuda_weights.cpp, the
// kernels in gpu/kernels_*.cu.
#ifdef TOPKV_HAVE_CUDA
#include <algorithm>
#include <cmath>
#include <cstring>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"
#include "gpu/cuda_quant.h"
#include "gpu/quant_matvec_ref.h"

namespace topkv {

namespace cuda {

namespace {
DType device_dtype(const Weight& w, const char* op) {
  switch (w.type) {
    case GgmlType::F32: return DType::F32;
    case GgmlType::F16: return DType::F16;
    case GgmlType::BF16: return DType::BF16;
    default:
      fail("{}: weight '{}' has type {}; the CUDA backend multiplies only weights from its prepare_weight", op, w.name,
           ggml_type_name((uint32_t)w.type));
  }
}
}  // namespace

CudaBackend::CudaBackend(const CudaBackendOptions& opt) : device_(opt.device), mem_(opt.mem_budget) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    fail("no usable CUDA device: {} (is the NVIDIA driver loaded? run on the CPU backend otherwise)",
         cudaGetErrorString(e));
  }
  TOPKV_CHECK(n > 0, "no CUDA device found; run on the CPU backend");
  TOPKV_CHECK(opt.device >= 0 && opt.device < n, "CUDA device {} does not exist: this machine has {} (0..{})",
              opt.device, n, n - 1);
  TOPKV_CUDA_CHECK(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  TOPKV_CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
  device_name_ = prop.name;
  sm_count_ = prop.multiProcessorCount;
  check_kernel_image(prop.major, prop.minor);
  mmvq_kernel_ = mmvq_kernel_from_env();
  q8_terms_ = opt.q8_terms != 0 ? opt.q8_terms : q8_terms_from_env();
  qref::check_q8_terms(q8_terms_);
  try {
    TOPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    TOPKV_CUBLAS_CHECK(cublasCreate(&cublas_));
    TOPKV_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    scalars_mem_ = mem_.alloc(4 * sizeof(float), MemKind::Scratch, "cuBLAS scalars");
    scalars_ = static_cast<float*>(scalars_mem_.get());
    const float scalars_init[4] = {0.f, 0.f, 0.f, 1.f};  // absmax, alpha, beta = 0, beta = 1 (see cuda::gemm)
    TOPKV_CUDA_CHECK(cudaMemcpy(scalars_, scalars_init, sizeof scalars_init, cudaMemcpyHostToDevice));
    init_step_state();
    init_decode_attention();
    decode_kernel_ = decode_kernel_from_env();
  } catch (...) {
    if (step_uploaded_) cudaEventDestroy(step_uploaded_);
    if (cublas_) cublasDestroy(cublas_);
    if (stream_) cudaStreamDestroy(stream_);
    throw;
  }
}

CudaBackend::~CudaBackend() {
  cancel_recording();
  cudaStreamSynchronize(stream_);  // no throwing here; a fault would have surfaced at an earlier sync
  cudaEventDestroy(step_uploaded_);
  if (copy_stream_) cudaStreamSynchronize(copy_stream_), cudaStreamDestroy(copy_stream_);
  for (cudaEvent_t e : stream_ev_)
    if (e) cudaEventDestroy(e);
  cublasDestroy(cublas_);
  cudaStreamDestroy(stream_);
}

void CudaBackend::synchronize() {
  TOPKV_CHECK(!rec_, "synchronize while recording a decode step: a recorded step cannot wait for the device");
  TOPKV_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void* CudaBackend::scratch(Scratch which, size_t bytes) {
  if (rec_) {  // the recording's own region: no synchronising, never freed while the graph lives
    ScratchRegion& r = rec_->regions[(int)which];
    if (bytes > r.bytes || !r.mem) {
      r.mem = mem_.alloc(bytes, MemKind::Scratch, "recorded decode step work space");
      r.bytes = bytes;
      rec_->owned.push_back(r.mem);  // earlier recorded ops may still point into the smaller one
    }
    return r.mem.get();
  }
  ScratchRegion& r = scratch_[(int)which];
  if (bytes > r.bytes || !r.mem) {
    synchronize();  // queued kernels may still use the old region
    r.mem.reset();
    // The dequantised weight is sized once, to the largest matrix: no slack.
    const size_t grown = which == Scratch::Dequant ? bytes : std::max(bytes, r.bytes + r.bytes / 2);
    r.mem = mem_.alloc(grown, MemKind::Scratch, "backend work space");
    r.bytes = grown;
  }
  return r.mem.get();
}

Buffer CudaBackend::alloc(size_t bytes) { return Buffer{mem_.alloc(bytes, MemKind::Activations, "activations"), bytes}; }
Buffer CudaBackend::alloc(size_t bytes, MemKind kind, std::string_view what) {
  return Buffer{mem_.alloc(bytes, kind, what), bytes};
}

void CudaBackend::to_host(const Buffer& src, size_t off, void* dst, size_t bytes) {
  TOPKV_CHECK(off <= src.bytes && bytes <= src.bytes - off,
              "to_host of {} bytes at offset {} reads past a {}-byte device buffer", bytes, off, src.bytes);
  TOPKV_CHECK(!rec_, "to_host while recording a decode step: copies to the host cannot be recorded");
  if (bytes == 0) return;
  // Mid-sized copies into pageable memory (a step's logits: 0.5-1 MB) go
  // through a pinned buffer: one DMA at full PCIe rate and a host memcpy
  // instead of the driver's chunked pageable path.
  constexpr size_t kBounceMin = size_t{64} << 10, kBounceMax = size_t{8} << 20;
  if (bytes >= kBounceMin && bytes <= kBounceMax) {
    cudaPointerAttributes attr{};
    const bool pinned = cudaPointerGetAttributes(&attr, dst) == cudaSuccess && attr.type == cudaMemoryTypeHost;
    cudaGetLastError();  // an unregistered pointer may leave an error on older runtimes
    if (!pinned) {
      if (!bounce_) {
        void* p = nullptr;
        TOPKV_CUDA_CHECK(cudaMallocHost(&p, kBounceMax));
        bounce_ = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
      }
      TOPKV_CUDA_CHECK(cudaMemcpyAsync(bounce_.get(), src.as<uint8_t>() + off, bytes, cudaMemcpyDefault, stream_));
      synchronize();
      std::memcpy(dst, bounce_.get(), bytes);
      return;
    }
  }
  // cudaMemcpyDefault: src may be an in_host cache (pinned host memory, UVA).
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(dst, src.as<uint8_t>() + off, bytes, cudaMemcpyDefault, stream_));
  synchronize();
}

void CudaBackend::from_host(const void* src, const Buffer& dst, size_t off, size_t bytes) {
  TOPKV_CHECK(off <= dst.bytes && bytes <= dst.bytes - off,
              "from_host of {} bytes at offset {} writes past a {}-byte device buffer", bytes, off, dst.bytes);
  TOPKV_CHECK(!rec_, "from_host while recording a decode step: host copies cannot be recorded");
  if (bytes == 0) return;
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(dst.as<uint8_t>() + off, src, bytes, cudaMemcpyDefault, stream_));
  synchronize();  // src may be pinned: the caller may reuse it as soon as we return
}

KvLayerCache CudaBackend::alloc_kv(int n_kv_heads, int head_dim, int64_t capacity, DType dtype) {
  TOPKV_CHECK(!rec_, "alloc_kv while recording a decode step: allocate caches before recording");
  KvLayerCache c = kv_cache_shape(n_kv_heads, head_dim, capacity, dtype);
  const size_t half = c.bytes() / 2;
  c.k = Buffer{mem_.alloc(half, MemKind::KvCache, "KV cache keys"), half};
  c.v = Buffer{mem_.alloc(half, MemKind::KvCache, "KV cache values"), half};
  // Zeroed once: a slot is read only after it is written, but finite zeros
  // keep a bug from turning into NaN far away.
  TOPKV_CUDA_CHECK(cudaMemsetAsync(c.k.mem.get(), 0, half, stream_));
  TOPKV_CUDA_CHECK(cudaMemsetAsync(c.v.mem.get(), 0, half, stream_));
  return c;
}

void CudaBackend::check_device_weight(const Weight& w, const char* op) const {
  TOPKV_CHECK(w.data && mem_.owns(w.data, MemKind::Weights),
              "{}: weight '{}' is not in this CUDA backend's memory; prepare it with the backend's prepare_weight", op,
              w.name);
}

void CudaBackend::embed(const Weight& table, const int32_t* ids, int T, float scale, float* out) {
  check_device_weight(table, "embed");
  for (int t = 0; t < T; ++t)
    TOPKV_CHECK(ids[t] >= 0 && ids[t] < table.rows, "token id {} is outside the vocabulary (0..{})", ids[t],
                table.rows - 1);
  if (T <= 0) return;
  const int32_t* d_ids = nullptr;
  if (rec_) {  // recorded: the id comes from the step state at replay
    TOPKV_CHECK(T == 1 && ids[0] == rec_->token, "embed while recording a decode step must take the recorded token "
                "{}, got {} tokens starting with {}", rec_->token, T, ids[0]);
    d_ids = step_token_dev();
  } else {
    // Through a pageable copy: cudaMemcpyAsync from pageable memory has read
    // it when it returns, so the caller's ids (pinned or not) are free at once.
    ids_staging_.assign(ids, ids + T);
    auto* staged = static_cast<int32_t*>(scratch(Scratch::Ids, (size_t)T * sizeof(int32_t)));
    TOPKV_CUDA_CHECK(
        cudaMemcpyAsync(staged, ids_staging_.data(), (size_t)T * sizeof(int32_t), cudaMemcpyHostToDevice, stream_));
    d_ids = staged;
  }
  if (qunits::has_device_layout(table.type))  // a quantised table: its rows dequantised in place
    dequant_rows_f32(table.type, table.data, table.rows, table.cols, d_ids, T, scale, out, stream_);
  else
    embed_rows(device_dtype(table, "embed"), table.data, table.cols, d_ids, T, scale, out, stream_);
}

void CudaBackend::rms_norm(const float* x, const Weight& w, int64_t rows, int dim, float eps, float* out) {
  TOPKV_CHECK(w.type == GgmlType::F32 && w.rows * w.cols == dim, "norm weight {} must be F32 of {} values", w.name,
              dim);
  check_device_weight(w, "rms_norm");
  cuda::rms_norm(x, reinterpret_cast<const float*>(w.data), rows, dim, eps, out, stream_);
}

void CudaBackend::rope_inv_freq(const RopeParams& p, int head_dim, double* inv_freq) {
  TOPKV_CHECK(p.n_rot >= 0 && p.n_rot % 2 == 0 && p.n_rot <= head_dim,
              "RoPE rotates {} dims of a {}-dim head: needs an even count within the head", p.n_rot, head_dim);
  const int half = p.n_rot / 2;
  TOPKV_CHECK(half <= kMaxRopePairs, "RoPE over {} dims: the CUDA kernel rotates at most {}", p.n_rot,
              2 * kMaxRopePairs);
  for (int i = 0; i < half; ++i)
    inv_freq[i] = p.freq_scale * std::pow((double)p.base, -2.0 * i / p.n_rot) /
                  (p.freq_factors ? p.freq_factors[i] : 1.f);
}

void CudaBackend::rope(float* x, int T, int n_heads, int head_dim, int64_t pos0, const RopeParams& p) {
  double inv_freq[kMaxRopePairs];
  rope_inv_freq(p, head_dim, inv_freq);
  cuda::rope(x, T, n_heads, head_dim, pos0, p.style, p.n_rot, inv_freq, stream_, step_pos("rope", T, pos0));
}

void CudaBackend::attention_prologue(float* q, float* k, const float* v, int T, int n_head, int n_kv, int head_dim,
                                     const Weight* q_norm, const Weight* k_norm, float eps, int64_t pos0,
                                     const RopeParams& rope, KvLayerCache* cache) {
  if (cache && cache->in_host)  // the host-resident cache is written through its staging path
    return Backend::attention_prologue(q, k, v, T, n_head, n_kv, head_dim, q_norm, k_norm, eps, pos0, rope, cache);
  AttentionPrologueArgs a;
  a.q = q, a.k = k, a.v = v, a.T = T, a.n_head = n_head, a.n_kv = n_kv, a.head_dim = head_dim, a.eps = eps;
  for (auto [w, dst] : {std::pair{q_norm, &a.q_norm}, std::pair{k_norm, &a.k_norm}}) {
    if (!w) continue;
    TOPKV_CHECK(w->type == GgmlType::F32 && w->rows * w->cols == head_dim, "QK-norm weight {} must be F32 of {} "
                "values", w->name, head_dim);
    check_device_weight(*w, "attention_prologue");
    *dst = reinterpret_cast<const float*>(w->data);
  }
  double inv_freq[kMaxRopePairs];
  rope_inv_freq(rope, head_dim, inv_freq);
  a.rope_style = rope.style, a.rope_n_rot = rope.n_rot, a.inv_freq = inv_freq;
  a.pos0 = pos0;
  if (cache) {
    check_cache(*cache, "attention_prologue");
    TOPKV_CHECK(pos0 >= 0, "attention_prologue at negative position {}", pos0);
    TOPKV_CHECK(cache->n_kv_heads == n_kv && cache->head_dim == head_dim, "attention_prologue: the cache holds {} "
                "heads of {}, the keys are {} of {}", cache->n_kv_heads, cache->head_dim, n_kv, head_dim);
    a.cache_type = cache->dtype, a.k_cache = cache->k.mem.get(), a.v_cache = cache->v.mem.get();
    a.capacity = cache->capacity;
  }
  a.dev_pos = step_pos("attention_prologue", T, pos0);
  cuda::attention_prologue(a, stream_);
}

const float* CudaBackend::epilogue_bias(const Weight& w, const MatmulEpilogue& ep, const char* op) const {
  if (!ep.bias) return nullptr;
  TOPKV_CHECK(ep.bias->type == GgmlType::F32 && ep.bias->rows * ep.bias->cols == w.rows,
              "{} by '{}': bias '{}' must be F32 with {} values (one per output row)", op, w.name, ep.bias->name,
              w.rows);
  check_device_weight(*ep.bias, "matmul bias");
  return reinterpret_cast<const float*>(ep.bias->data);
}

void CudaBackend::matmul(const float* x, const Weight& w, int T, float* y, const MatmulEpilogue& ep) {
  check_device_weight(w, "matmul");
  const float* bias = epilogue_bias(w, ep, "matmul");
  if (qunits::has_device_layout(w.type)) {  // the file's blocks (gpu/cuda_quant_matmul.cpp)
    if (T <= 0) return;
    if (T <= kQuantGemvMaxTokens) {
      const MatmulJob job{&w, y, ep};
      quant_gemv_group(MatmulInput{const_cast<float*>(x)}, T, std::span<const MatmulJob>(&job, 1));
    } else {
      quant_prefill(x, w, T, y, ep);
    }
    return;
  }
  const DType wt = device_dtype(w, "matmul");
  if (T <= 0) return;
  if (T <= kGemvMaxTokens) {
    gemv(wt, w.data, w.rows, w.cols, x, T, y, stream_, bias, ep.accumulate);
    return;
  }
  void* ws = wt == DType::F32 ? nullptr : scratch(Scratch::Cast, gemm_workspace_bytes(w.cols, T));
  gemm(cublas_, wt, w.data, w.rows, w.cols, x, T, y, ws, scalars_, stream_, bias, ep.accumulate);
}

void CudaBackend::glu(GluKind kind, const float* gate, const float* up, int64_t n, float* out) {
  cuda::glu(kind, gate, up, n, out, stream_);
}

void CudaBackend::add(const float* x, int64_t n, float* y) { cuda::add(x, n, y, stream_); }

void CudaBackend::check_cache(const KvLayerCache& c, const char* op) const {
  if (c.in_host) {
    TOPKV_CHECK(c.k.mem && c.v.mem, "{}: the host-resident cache has no memory (released?)", op);
    return;  // alloc_kv_host's pinned memory; ops check rec_ and stream it
  }
  TOPKV_CHECK(c.k.mem && mem_.owns(c.k.mem.get(), MemKind::KvCache) && mem_.owns(c.v.mem.get(), MemKind::KvCache),
              "{}: the cache is not in this CUDA backend's memory; allocate it with its alloc_kv", op);
}

void CudaBackend::kv_write(KvLayerCache& c, const float* k, const float* v, int T, int64_t pos0) {
  check_cache(c, "kv_write");
  TOPKV_CHECK(pos0 >= 0, "kv_write at negative position {}", pos0);
  if (c.in_host) return kv_write_host(c, k, v, T, pos0);
  cuda::kv_write(c.dtype, c.k.mem.get(), c.v.mem.get(), c.n_kv_heads, c.head_dim, c.capacity, k, v, T, pos0,
                 stream_, step_pos("kv_write", T, pos0));
}

void CudaBackend::attention(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& c, int64_t window,
                            float scale, float* out) {
  const int n_kv = c.n_kv_heads, group = n_kv > 0 ? n_head / n_kv : 0;
  TOPKV_CHECK(group > 0 && group * n_kv == n_head, "{} query heads do not split over {} KV heads", n_head, n_kv);
  check_cache(c, "attention");
  if (c.in_host) return streamed_attention(q, T, n_head, pos0, c, window, scale, out);
  const int64_t first_key = window > 0 ? std::max<int64_t>(0, pos0 - window + 1) : 0;
  const int64_t span = pos0 + T - first_key;
  TOPKV_CHECK(span <= c.capacity, "attention over positions {}..{} needs {} cache slots but the cache keeps {}",
              first_key, pos0 + T - 1, span, c.capacity);
  TOPKV_CHECK(attention_head_dim_supported(c.head_dim),
              "the CUDA attention kernel has no head_dim {} (compiled: 32, 64, 96, 128, 256); use the CPU backend",
              c.head_dim);
  if (T <= 0) return;
  if (T == 1) {  // decode: one plan per cache geometry, so eager and recorded steps run the same kernels
    DecodeAttentionArgs d;
    d.q = q, d.out = out, d.kv_type = c.dtype, d.k = c.k.mem.get(), d.v = c.v.mem.get();
    d.n_head = n_head, d.n_kv = n_kv, d.head_dim = c.head_dim;
    d.pos = pos0, d.capacity = c.capacity, d.window = window, d.scale = scale;
    d.dev_pos = step_pos("attention", T, pos0);
    const int64_t max_keys = window > 0 ? std::min(window, c.capacity) : c.capacity;
    const DecodeAttentionPlan plan =
        plan_decode_attention(n_head, n_kv, c.head_dim, max_keys, sm_count_, decode_kernel_);
    void* ws = plan.workspace_bytes ? scratch(Scratch::Attention, plan.workspace_bytes) : nullptr;
    decode_attention(d, plan, ws, stream_);
    return;
  }
  AttentionArgs a;
  a.q = q, a.out = out, a.kv_type = c.dtype, a.k = c.k.mem.get(), a.v = c.v.mem.get();
  a.T = T, a.n_head = n_head, a.n_kv = n_kv, a.head_dim = c.head_dim;
  a.pos0 = pos0, a.capacity = c.capacity, a.window = window, a.scale = scale;
  // Prefill chunks on the tensor cores (fp16/bf16 tiles, ~1e-3 from the CPU),
  // decode and short chunks on the fp32 kernel.
  const bool tc = attention_tc_supported(a);
  const AttentionPlan plan = tc ? plan_attention_tc(a, sm_count_) : plan_attention(a, sm_count_);
  void* ws = plan.workspace_bytes ? scratch(Scratch::Attention, plan.workspace_bytes) : nullptr;
  if (tc)
    cuda::attention_tc(a, plan, ws, stream_);
  else
    cuda::attention(a, plan, ws, stream_);
}

}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& opt) {
  return std::make_unique<cuda::CudaBackend>(opt);
}

bool is_cuda_backend(const Backend& be) { return dynamic_cast<const cuda::CudaBackend*>(&be) != nullptr; }

uint64_t cuda_kernel_launches() { return cuda::launch_counter().load(std::memory_order_relaxed); }

cuda::CudaBackend& cuda::as_cuda_backend(Backend& be, const char* who) {
  auto* c = dynamic_cast<CudaBackend*>(&be);
  TOPKV_CHECK(c, "{} needs the CUDA backend: backend '{}' is not a CUDA backend (use --backend cuda)", who,
              be.name());
  return *c;
}

CudaMemoryUse cuda_memory_use(const Backend& be) {
  const auto* c = dynamic_cast<const cuda::CudaBackend*>(&be);
  TOPKV_CHECK(c, "cuda_memory_use: backend '{}' is not a CUDA backend", be.name());
  return c->memory_use();
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
