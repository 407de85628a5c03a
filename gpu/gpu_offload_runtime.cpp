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

// Splits of a head's row list over blocks: enough blocks to keep reads over
// PCIe in flight for the retrieved rows, fewer for the device-resident window.
constexpr int kIdsRowsPerSplit = 32, kMaxIdsSplits = 64, kExactRowsPerSplit = 64, kMaxExactSplits = 8;
constexpr int kMaxParts = kMaxExactSplits + kMaxIdsSplits + 1;  // + the far-field part
int splits_for(int rows, int per_split, int max_splits) {
  return std::clamp((rows + per_split - 1) / per_split, 1, max_splits);
}

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
    // Row pointers of sinks + window: [2][n_kv][sinks + window] (k, then v),
    // then [n_kv] int32 counts. They change only while sinks and window fill
    // (a full window's ring is every slot), so they are uploaded only when
    // `exact_key` (what they were built for) changes.
    Buffer exact_lists;
    int64_t exact_key = -1;
  };
  void collect_timing();
  void ensure_capacity(int max_ids);
  void update_exact_lists(int slot, const OffloadedLayer& L);

  cuda::CudaBackend& be_;
  std::vector<Mirror> mirrors_;  // per retrieval layer
  // Device work space, sized by ensure_capacity: the retrieved rows' pointer
  // lists [2][n_kv][ids_cap_] (k, then v) and counts [n_kv]; partials
  // [n_head][kMaxParts] (m, l, then o x head_dim); staged rows.
  Buffer lists_, parts_, staged_;
  int ids_cap_ = 0;
  PinnedBuffer host_lists_, host_exact_, host_qkv_, host_far_, host_rows_;
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
  const size_t cap = (size_t)policy_.sinks + policy_.window;
  m.exact_lists = be_.alloc(2 * nkv * cap * sizeof(void*) + nkv * sizeof(int32_t));
  m.exact_key = -1;
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

// Grows the retrieved rows' device lists for `max_ids` rows per KV head (and
// allocates the partials once). Waits for queued work first: the old buffers
// may still be read.
void GpuOffloadRuntime::ensure_capacity(int max_ids) {
  if (parts_.bytes > 0 && max_ids <= ids_cap_) return;
  be_.synchronize();
  const int nkv = cfg_.n_head_kv, d = cfg_.head_dim;
  if (parts_.bytes == 0) parts_ = be_.alloc((size_t)cfg_.n_head * kMaxParts * (2 + d) * sizeof(float));
  ids_cap_ = std::max({ids_cap_, 64, max_ids + max_ids / 2});  // room to grow without a wait
  lists_ = be_.alloc(2 * (size_t)nkv * ids_cap_ * sizeof(void*) + (size_t)nkv * sizeof(int32_t));
  if (policy_.stage_rows) staged_ = be_.alloc((size_t)nkv * ids_cap_ * 2 * d * dtype_size(policy_.store_dtype));
}

// Rebuilds layer `slot`'s sinks + window pointer lists when what they cover
// changed since the last upload (only while sinks and window fill).
void GpuOffloadRuntime::update_exact_lists(int slot, const OffloadedLayer& L) {
  Mirror& mir = mirrors_[(size_t)slot];
  const int nkv = cfg_.n_head_kv, d = cfg_.head_dim, W = policy_.window, n_sinks = L.n_sinks();
  const int64_t wlen = L.window_len(), first = wlen < W ? L.window_start() % W : 0;
  const int64_t key = ((int64_t)n_sinks * (W + 1) + wlen) * W + first;
  if (key == mir.exact_key) return;
  const size_t cap = (size_t)policy_.sinks + W, n_ptr = (size_t)nkv * cap;
  auto* hl = reinterpret_cast<const void**>(host_exact_.get(2 * n_ptr * sizeof(void*) + nkv * sizeof(int32_t)));
  auto* counts = reinterpret_cast<int32_t*>(hl + 2 * n_ptr);
  for (int h = 0; h < nkv; ++h) {
    const void** kp = hl + h * cap;
    const void** vp = hl + n_ptr + h * cap;
    int e = 0;
    for (const KvLayerCache* c : {&mir.sinks, &mir.window}) {
      const int64_t n = c == &mir.sinks ? n_sinks : wlen, start = c == &mir.sinks ? 0 : first;
      const float* kb = c->k.as<float>() + h * c->head_stride();
      const float* vb = c->v.as<float>() + h * c->head_stride();
      for (int64_t i = 0; i < n; ++i, ++e) {
        const size_t row = (size_t)((start + i) % c->capacity) * d;  // ring slot
        kp[e] = kb + row, vp[e] = vb + row;
      }
    }
    counts[h] = e;
  }
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(mir.exact_lists.mem.get(), hl, 2 * n_ptr * sizeof(void*) + nkv * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, be_.stream()));
  mir.exact_key = key;
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
  const int64_t wlen = L.window_len();
  stats_.exact += (int64_t)nkv * (n_sinks + wlen);
  const int exact_rows = n_sinks + (int)wlen;
  ensure_capacity(max_ids);
  update_exact_lists(slot, L);

  // 3. The new token's k, v into the device mirror (where the host put it).
  const bool to_sink = n_sinks > sinks_before;
  KvLayerCache& dst = to_sink ? mir.sinks : mir.window;
  const int64_t dslot = to_sink ? n_sinks - 1 : pos % policy_.window;
  for (auto [src, buf] : {std::pair{k, &dst.k}, std::pair{v, &dst.v}})
    TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(buf->as<float>() + dslot * d, dst.head_stride() * 4, src, (size_t)d * 4,
                                       (size_t)d * 4, (size_t)nkv, cudaMemcpyDeviceToDevice, st));

  // 4. Retrieved rows' pointer lists (and far partials, staged rows) in
  // pinned memory, then one copy each.
  const int ic = ids_cap_;
  const size_t n_ptr = (size_t)nkv * ic;
  auto* hl = reinterpret_cast<const void**>(host_lists_.get(2 * n_ptr * sizeof(void*) + nkv * sizeof(int32_t)));
  auto* hcount = reinterpret_cast<int32_t*>(hl + 2 * n_ptr);
  auto* dl = lists_.as<const void*>();
  const size_t row_bytes = (size_t)d * dtype_size(policy_.store_dtype);
  uint8_t* hrows = policy_.stage_rows ? host_rows_.get((size_t)nkv * ic * 2 * row_bytes) : nullptr;
  for (int h = 0; h < nkv; ++h) {
    const auto& r = found_[(size_t)h];
    const int m = (int)r.ids.size();
    hcount[h] = m;
    const void** kp = hl + (size_t)h * ic;
    const void** vp = hl + n_ptr + (size_t)h * ic;
    for (int j = 0; j < m; ++j) {
      const void* kr = L.key_store(h)->row(r.ids[(size_t)j]);
      const void* vr = L.value_store(h)->row(r.ids[(size_t)j]);
      if (hrows) {  // staged: rows into pinned staging, pointers into its device copy
        const size_t off = ((size_t)h * ic + j) * 2 * row_bytes;
        std::memcpy(hrows + off, kr, row_bytes);
        std::memcpy(hrows + off + row_bytes, vr, row_bytes);
        kr = staged_.as<uint8_t>() + off, vr = staged_.as<uint8_t>() + off + row_bytes;
      }
      kp[j] = kr, vp[j] = vr;
    }
  }
  const int exact_splits = splits_for(exact_rows, kExactRowsPerSplit, kMaxExactSplits);
  const int ids_splits = splits_for(max_ids, kIdsRowsPerSplit, kMaxIdsSplits);
  const int parts = exact_splits + ids_splits + 1;
  float *pm, *pl, *po;
  cuda::carve_partials(parts_.mem.get(), (size_t)nh * parts, pm, pl, po);
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
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(dl, hl, 2 * n_ptr * sizeof(void*) + nkv * sizeof(int32_t),
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
  const size_t exact_cap = (size_t)policy_.sinks + policy_.window, exact_ptr = (size_t)nkv * exact_cap;
  const auto* de = mir.exact_lists.as<const void*>();
  cuda::RowListArgs a;
  a.q = q, a.n_kv = nkv, a.group = G, a.head_dim = d, a.scale = scale;
  a.parts = parts, a.part_m = pm, a.part_l = pl, a.part_o = po;
  a.row_type = DType::F32, a.k_rows = de, a.v_rows = de + exact_ptr;
  a.counts = reinterpret_cast<const int32_t*>(de + 2 * exact_ptr), a.max_rows = (int)exact_cap;
  a.n_splits = exact_splits, a.part0 = 0;
  cuda::row_list_attention(a, st);
  a.row_type = policy_.store_dtype, a.k_rows = dl, a.v_rows = dl + n_ptr;
  a.counts = reinterpret_cast<const int32_t*>(dl + 2 * n_ptr), a.max_rows = ic;
  a.n_splits = ids_splits, a.part0 = exact_splits;
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
