#include "gpu/gpu_offload_runtime.h"

#include "src/common/error.h"

#ifndef TOPKV_HAVE_CUDA
namespace topkv {
std::unique_ptr<OffloadRuntime> make_gpu_offload_runtime(Backend& be, const ModelConfig&, const OffloadPolicy&,
                                                         bool) {
  fail("the CUDA offload runtime is not available for backend '{}': topkv was built without CUDA", be.name());
}
}  // namespace topkv
#else

#include <cuda_runtime.h>
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"
#include "src/common/timer.h"

namespace topkv {
namespace {

// Pinned, device-mapped chunks for the host stores: with unified addressing
// the host pointer is also the device pointer, which the row lists rely on.
RowStore::ChunkAllocator pinned_chunk_allocator() {
  return [](size_t bytes) {
    void* p = nullptr;
    TOPKV_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
    std::shared_ptr<uint8_t> chunk(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFreeHost(q); });
    void* dp = nullptr;
    TOPKV_CUDA_CHECK(cudaHostGetDevicePointer(&dp, p, 0));
    TOPKV_CHECK(dp == p, "this device maps pinned host memory at another address; run with stage_rows "
                "(--stage-rows) so retrieved rows are copied instead of read in place");
    return chunk;
  };
}

// A pinned host buffer that grows (contents are not kept).
struct PinnedBuffer {
  std::shared_ptr<uint8_t> mem;
  size_t bytes = 0;
  uint8_t* get(size_t need) {
    if (need > bytes) {
      void* p = nullptr;
      TOPKV_CUDA_CHECK(cudaHostAlloc(&p, need, cudaHostAllocDefault));
      mem.reset(static_cast<uint8_t*>(p), [](uint8_t* q) { cudaFreeHost(q); });
      bytes = need;
    }
    return mem.get();
  }
};

class GpuOffloadRuntime final : public OffloadRuntime {
 public:
  GpuOffloadRuntime(cuda::CudaBackend& be, const ModelConfig& cfg, const OffloadPolicy& policy, bool progress)
      : OffloadRuntime(cfg, policy, progress), be_(be) {
    TOPKV_CHECK(cuda::attention_head_dim_supported(cfg.head_dim) &&
                    (cfg.head_dim == 64 || cfg.head_dim == 128 || cfg.head_dim == 256),
                "the CUDA offload runtime supports head_dim 64, 128 and 256, not {}", cfg.head_dim);
    for (auto& e : ev_) TOPKV_CUDA_CHECK(cudaEventCreate(&e));
  }
  ~GpuOffloadRuntime() override {
    cudaStreamSynchronize(be_.stream());
    for (auto& e : ev_) cudaEventDestroy(e);
  }

  bool on_device() const override { return true; }
  void decode_attention(int layer, const float*, const float*, const float*, int64_t, float, float*) override {
    fail("internal: the CUDA offload runtime of layer {} takes device pointers (decode_attention_device)", layer);
  }
  void decode_attention_device(int layer, const float* q, const float* k, const float* v, int64_t pos, float scale,
                               float* out) override;

 protected:
  OffloadedLayer::Config layer_config(int i) const override {
    OffloadedLayer::Config c = OffloadRuntime::layer_config(i);
    if (!policy_.stage_rows) c.store_alloc = pinned_chunk_allocator();
    return c;
  }
  void on_layer_ready(int i) override;

 private:
  struct Mirror {
    KvLayerCache sinks, window;  // fp32 [n_kv][capacity][head_dim] on the device
  };
  void collect_timing();
  void ensure_capacity(int exact_rows, int max_ids);

  cuda::CudaBackend& be_;
  std::vector<Mirror> mirrors_;  // per retrieval layer
  // Device work space, sized by ensure_capacity: row pointer lists [2][n_kv][cap]
  // (0 = sinks + window, 1 = retrieved), counts [2][n_kv], partials, staged rows.
  Buffer lists_, parts_, staged_;
  int exact_cap_ = 0, ids_cap_ = 0, parts_cap_ = 0;
  PinnedBuffer host_lists_, host_qkv_, host_far_, host_rows_;
  std::vector<OffloadedLayer::Retrieved> found_;
  cudaEvent_t ev_[5] = {};
  bool timing_pending_ = false;
};

void GpuOffloadRuntime::on_layer_ready(int i) {
  const OffloadedLayer& L = *layers_[(size_t)i];
  const int nkv = cfg_.n_head_kv, d = cfg_.head_dim;
  if (mirrors_.size() < layers_.size()) mirrors_.resize(layers_.size());
  Mirror& m = mirrors_[(size_t)i];
  m.sinks = be_.alloc_kv(nkv, d, std::max(1, policy_.sinks), DType::F32);
  m.window = be_.alloc_kv(nkv, d, policy_.window, DType::F32);
  const size_t row = (size_t)d * sizeof(float);
  for (int h = 0; h < nkv; ++h) {
    if (L.n_sinks() > 0) {
      be_.from_host(L.sink_keys(h), m.sinks.k, h * m.sinks.head_stride() * 4, L.n_sinks() * row);
      be_.from_host(L.sink_values(h), m.sinks.v, h * m.sinks.head_stride() * 4, L.n_sinks() * row);
    }
    be_.from_host(L.window_keys(h), m.window.k, h * m.window.head_stride() * 4, policy_.window * row);
    be_.from_host(L.window_values(h), m.window.v, h * m.window.head_stride() * 4, policy_.window * row);
  }
}

// Grows the device lists / partials for `exact_rows` sinks + window rows and
// `max_ids` retrieved rows per KV head. Waits for queued work first: the old
// buffers may still be read.
void GpuOffloadRuntime::ensure_capacity(int exact_rows, int max_ids) {
  const int nkv = cfg_.n_head_kv, d = cfg_.head_dim, rows = cfg_.n_head;
  if (exact_rows <= exact_cap_ && max_ids <= ids_cap_ && parts_cap_ > 0) return;
  be_.synchronize();
  exact_cap_ = std::max(exact_cap_, exact_rows);
  if (max_ids > ids_cap_) ids_cap_ = std::max(64, max_ids + max_ids / 2);  // room to grow without a wait
  parts_cap_ = 64 + 8 + 1;  // the most splits ensure_capacity's callers use, plus the far part
  const size_t ptrs = (size_t)nkv * (exact_cap_ + ids_cap_) * 2;  // k and v pointers
  lists_ = be_.alloc(ptrs * sizeof(void*) + 2 * (size_t)nkv * sizeof(int32_t));
  parts_ = be_.alloc((size_t)rows * parts_cap_ * (2 + d) * sizeof(float));
  if (policy_.stage_rows)
    staged_ = be_.alloc((size_t)nkv * ids_cap_ * 2 * d * dtype_size(policy_.store_dtype));
}

void GpuOffloadRuntime::collect_timing() {
  if (!timing_pending_) return;
  float t01 = 0, t23 = 0, t34 = 0;
  TOPKV_CUDA_CHECK(cudaEventElapsedTime(&t01, ev_[0], ev_[1]));
  TOPKV_CUDA_CHECK(cudaEventElapsedTime(&t23, ev_[2], ev_[3]));
  TOPKV_CUDA_CHECK(cudaEventElapsedTime(&t34, ev_[3], ev_[4]));
  stats_.transfer_s += (t01 + t23) * 1e-3;
  stats_.gpu_s += t34 * 1e-3;
  timing_pending_ = false;
}

void GpuOffloadRuntime::decode_attention_device(int layer, const float* q, const float* k, const float* v,
                                                int64_t pos, float scale, float* out) {
  TOPKV_CHECK(!layers_.empty(), "decode on the offloaded runtime before take_prefill");
  const int slot = slot_[(size_t)layer];
  OffloadedLayer& L = *layers_[(size_t)slot];
  TOPKV_CHECK(pos == L.n_tokens(), "offloaded layer {} holds {} tokens but the model decodes position {}", layer,
              L.n_tokens(), pos);
  Mirror& mir = mirrors_[(size_t)slot];
  const cudaStream_t st = be_.stream();
  const int nh = cfg_.n_head, nkv = cfg_.n_head_kv, d = cfg_.head_dim, G = nh / nkv;
  const size_t qn = (size_t)nh * d, kn = (size_t)nkv * d;
  Timer t_all;

  // 1. q, k, v to the host: the step's one wait for the device.
  auto* hq = reinterpret_cast<float*>(host_qkv_.get((qn + 2 * kn) * sizeof(float)));
  float *hk = hq + qn, *hv = hk + kn;
  TOPKV_CUDA_CHECK(cudaEventRecord(ev_[0], st));
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(hq, q, qn * 4, cudaMemcpyDeviceToHost, st));
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(hk, k, kn * 4, cudaMemcpyDeviceToHost, st));
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(hv, v, kn * 4, cudaMemcpyDeviceToHost, st));
  TOPKV_CUDA_CHECK(cudaEventRecord(ev_[1], st));
  Timer t_wait;
  be_.synchronize();
  stats_.wait_s += t_wait.seconds();
  collect_timing();

  // 2. Host: append (the window's oldest token may move to the store and its
  // index), then search every retrieval head.
  const int sinks_before = L.n_sinks();
  L.append(hk, hv);
  L.retrieve(hq, scale, found_);
  int max_ids = 0;
  double search_max = 0;  // heads search in parallel: the step waits for the slowest
  for (auto& r : found_) {
    max_ids = std::max(max_ids, (int)r.ids.size());
    search_max = std::max(search_max, r.search_s);
    stats_.retrieved += (int64_t)r.ids.size();
    stats_.far_clusters += r.far_clusters;
  }
  stats_.search_s += search_max;
  const int n_sinks = L.n_sinks();
  const int64_t wlen = L.window_len(), wstart = L.window_start();
  stats_.exact += (int64_t)nkv * (n_sinks + wlen);
  const int exact_rows = n_sinks + (int)wlen;
  ensure_capacity(exact_rows, max_ids);

  // 3. The new token's k, v into the device mirror (where the host put it).
  const bool to_sink = n_sinks > sinks_before;
  KvLayerCache& dst = to_sink ? mir.sinks : mir.window;
  const int64_t dslot = to_sink ? n_sinks - 1 : pos % policy_.window;
  for (auto [src, buf] : {std::pair{k, &dst.k}, std::pair{v, &dst.v}})
    TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(buf->as<float>() + dslot * d, dst.head_stride() * 4, src, (size_t)d * 4,
                                       (size_t)d * 4, (size_t)nkv, cudaMemcpyDeviceToDevice, st));

  // 4. Row lists (and far partials, staged rows) in pinned memory, then one copy each.
  const int ec = exact_cap_, ic = ids_cap_;
  const size_t n_ptr = (size_t)nkv * (ec + ic);
  auto* hl = reinterpret_cast<const void**>(host_lists_.get(2 * n_ptr * sizeof(void*) + 2 * nkv * sizeof(int32_t)));
  const void** hk_exact = hl;                 // [nkv][ec]
  const void** hk_ids = hl + (size_t)nkv * ec;  // [nkv][ic]
  const void** hv_exact = hl + n_ptr;
  const void** hv_ids = hv_exact + (size_t)nkv * ec;
  auto* hcount = reinterpret_cast<int32_t*>(hl + 2 * n_ptr);  // [2][nkv]: exact, retrieved
  auto* dl = lists_.as<const void*>();
  const size_t row_bytes = (size_t)d * dtype_size(policy_.store_dtype);
  uint8_t* hrows = policy_.stage_rows ? host_rows_.get((size_t)nkv * ic * 2 * row_bytes) : nullptr;
  for (int h = 0; h < nkv; ++h) {
    int e = 0;
    const float* sk = mir.sinks.k.as<float>() + h * mir.sinks.head_stride();
    const float* sv = mir.sinks.v.as<float>() + h * mir.sinks.head_stride();
    for (int s = 0; s < n_sinks; ++s, ++e) hk_exact[(size_t)h * ec + e] = sk + (size_t)s * d, hv_exact[(size_t)h * ec + e] = sv + (size_t)s * d;
    const float* wk = mir.window.k.as<float>() + h * mir.window.head_stride();
    const float* wv = mir.window.v.as<float>() + h * mir.window.head_stride();
    for (int64_t p = wstart; p < wstart + wlen; ++p, ++e) {
      const size_t ws = (size_t)(p % policy_.window) * d;
      hk_exact[(size_t)h * ec + e] = wk + ws, hv_exact[(size_t)h * ec + e] = wv + ws;
    }
    hcount[h] = e;
    const auto& r = found_[(size_t)h];
    const int m = (int)r.ids.size();
    hcount[nkv + h] = m;
    if (m == 0) continue;
    const RowStore &ks = *L.key_store(h), &vs = *L.value_store(h);
    for (int j = 0; j < m; ++j) {
      if (hrows) {  // staged: rows into pinned staging, pointers into its device copy
        const size_t off = ((size_t)h * ic + j) * 2 * row_bytes;
        std::memcpy(hrows + off, ks.row(r.ids[(size_t)j]), row_bytes);
        std::memcpy(hrows + off + row_bytes, vs.row(r.ids[(size_t)j]), row_bytes);
        hk_ids[(size_t)h * ic + j] = staged_.as<uint8_t>() + off;
        hv_ids[(size_t)h * ic + j] = staged_.as<uint8_t>() + off + row_bytes;
      } else {
        hk_ids[(size_t)h * ic + j] = ks.row(r.ids[(size_t)j]);
        hv_ids[(size_t)h * ic + j] = vs.row(r.ids[(size_t)j]);
      }
    }
  }
  const int exact_splits = std::clamp((exact_rows + 63) / 64, 1, 8);
  const int ids_splits = std::clamp((max_ids + 31) / 32, 1, 64);
  const int parts = exact_splits + ids_splits + 1;
  float* pm = parts_.as<float>();
  float* pl = pm + (size_t)nh * parts;
  float* po = pl + (size_t)nh * parts;
  // The far part (slot parts-1): multipole's far clusters, or empty.
  auto* hfar = reinterpret_cast<float*>(host_far_.get((size_t)nh * (2 + d) * sizeof(float)));
  for (int h = 0; h < nkv; ++h)
    for (int g = 0; g < G; ++g) {
      const size_t row = (size_t)h * G + g;
      const auto& far = found_[(size_t)h].far;
      const bool has = !far.empty() && far[(size_t)g].l > 0.f;
      hfar[row] = has ? far[(size_t)g].m : -INFINITY;
      hfar[nh + row] = has ? far[(size_t)g].l : 0.f;
      float* fo = hfar + 2 * nh + row * d;
      if (has) std::copy(far[(size_t)g].o.begin(), far[(size_t)g].o.end(), fo);
      else std::fill(fo, fo + d, 0.f);
    }
  TOPKV_CUDA_CHECK(cudaEventRecord(ev_[2], st));
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(dl, hl, 2 * n_ptr * sizeof(void*) + 2 * nkv * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, st));
  if (hrows && max_ids > 0)
    TOPKV_CUDA_CHECK(cudaMemcpyAsync(staged_.mem.get(), hrows, (size_t)nkv * ic * 2 * row_bytes,
                                     cudaMemcpyHostToDevice, st));
  const int pf = parts - 1;
  TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(pm + pf, parts * 4, hfar, 4, 4, nh, cudaMemcpyHostToDevice, st));
  TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(pl + pf, parts * 4, hfar + nh, 4, 4, nh, cudaMemcpyHostToDevice, st));
  TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(po + (size_t)pf * d, (size_t)parts * d * 4, hfar + 2 * nh, (size_t)d * 4,
                                     (size_t)d * 4, nh, cudaMemcpyHostToDevice, st));
  TOPKV_CUDA_CHECK(cudaEventRecord(ev_[3], st));

  // 5. Partials over sinks + window and over the retrieved rows, then the merge.
  const auto* dcount = reinterpret_cast<const int32_t*>(dl + 2 * n_ptr);
  cuda::RowListArgs a;
  a.q = q, a.n_kv = nkv, a.group = G, a.head_dim = d, a.scale = scale;
  a.parts = parts, a.part_m = pm, a.part_l = pl, a.part_o = po;
  a.row_type = DType::F32, a.k_rows = dl, a.v_rows = dl + n_ptr, a.counts = dcount, a.max_rows = ec;
  a.n_splits = exact_splits, a.part0 = 0;
  cuda::row_list_attention(a, st);
  a.row_type = policy_.store_dtype, a.k_rows = dl + (size_t)nkv * ec, a.v_rows = dl + n_ptr + (size_t)nkv * ec;
  a.counts = dcount + nkv, a.max_rows = ic, a.n_splits = ids_splits, a.part0 = exact_splits;
  cuda::row_list_attention(a, st);
  cuda::merge_partials(pm, pl, po, nh, parts, d, out, st);
  TOPKV_CUDA_CHECK(cudaEventRecord(ev_[4], st));
  timing_pending_ = true;
  stats_.attend_s += t_all.seconds();
  if (layer == retrieval_layers_.back()) ++stats_.steps;
}

}  // namespace

std::unique_ptr<OffloadRuntime> make_gpu_offload_runtime(Backend& be, const ModelConfig& cfg,
                                                         const OffloadPolicy& policy, bool progress) {
  auto* cb = dynamic_cast<cuda::CudaBackend*>(&be);
  TOPKV_CHECK(cb, "the CUDA offload runtime needs the CUDA backend, not '{}'", be.name());
  return std::make_unique<GpuOffloadRuntime>(*cb, cfg, policy, progress);
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
