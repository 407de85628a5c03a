// GpuOffloadRuntime (gpu/gpu_offload_runtime.h; class in
// gpu/gpu_offload_runtime_impl.h): set-up, the device mirrors of sinks and
// window, their exact partials, and the step with the search on the host.
// The step with the search on the device: gpu/gpu_offload_device_search.cpp.
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

#include <omp.h>

#include <cstring>

#include "gpu/gpu_offload_runtime_impl.h"
#include "src/common/buffer_pool.h"
#include "src/common/timer.h"

namespace topkv {
namespace gpu_offload {

// The pinned chunks come from one pool for the process (src/common/buffer_pool.h):
// cudaHostAlloc pins all of a chunk's pages (16 MiB at head_dim 128, f16) as it
// is made, and a runtime restored from a context pack for each method of an
// evaluation made all of them again. Up to kPinnedPoolBytes of released chunks
// wait for the next runtime. The pool is never destroyed: its chunks are freed
// by the driver at exit, not by cudaFreeHost after the CUDA runtime unloads.
constexpr size_t kPinnedPoolBytes = size_t(8) << 30;

RowStore::ChunkAllocator pinned_chunk_allocator() {
  static BufferPool* const pool = new BufferPool(
      [](size_t bytes) {
        void* p = nullptr;
        TOPKV_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
        void* dp = nullptr;
        if (cudaHostGetDevicePointer(&dp, p, 0) != cudaSuccess || dp != p) {
          cudaGetLastError();  // not sticky: clear it before the next call reports it as its own
          cudaFreeHost(p);
          fail("this device does not map pinned host memory at its host address; run with --stage-rows so "
               "retrieved rows are copied instead of read in place");
        }
        return p;
      },
      [](void* p) { cudaFreeHost(p); }, kPinnedPoolBytes);
  return [](size_t bytes) { return pool->get(bytes); };
}

double device_rerank(const OffloadPolicy& p) {
  return KvIndex::create(p.index)->rerank_of(p.search);
}

bool wants_device_search(const OffloadPolicy& p) {
  if (p.search_on == SearchOn::Host) return false;
  // Rerank runs on the device too (cuda_kernels.h, summary_search step 3b),
  // reading the candidates' keys in place: not with --stage-rows, where the
  // device cannot read the store.
  const bool supported = DeviceSearchTables::backend_supported(p.index);
  const bool rerank = supported && device_rerank(p) > 1.0;
  const bool able = p.search.threshold == 0.0 && p.search.gqa == GqaMode::Union && supported && !(rerank && p.stage_rows);
  TOPKV_CHECK(able || p.search_on == SearchOn::Auto,
              "--search-on gpu runs the budget-mode search of multipole, centroid and quest indexes with GQA "
              "union (rerank: not with --stage-rows; multipole's far_mass=oracle is host-search only); this "
              "run has index '{}'{}{}{}: use --search-on host", p.index,
              p.search.threshold != 0.0 ? ", --threshold" : "", p.search.gqa != GqaMode::Union ? ", --gqa mean" : "",
              rerank && p.stage_rows ? ", rerank (the default of one-level centroid/multipole; --rerank 1 turns "
                                       "it off) with --stage-rows" : "");
  return able;
}

void GpuOffloadRuntime::on_layer_ready(int i) {
  const OffloadedLayer& L = *layers_[(size_t)i];
  const int nkv = cfg_.n_head_kv, d = cfg_.head_dim, W = policy_.window, R = ring_capacity();
  if (mirrors_.size() < layers_.size()) mirrors_.resize(layers_.size());
  Mirror& m = mirrors_[(size_t)i];
  m.sinks = be_.alloc_kv(nkv, d, std::max(1, policy_.sinks), DType::F32);
  m.ring = be_.alloc_kv(nkv, d, R, DType::F32);
  const size_t row = (size_t)d * sizeof(float);
  std::vector<float> ring_k((size_t)nkv * R * d, 0.f), ring_v(ring_k.size(), 0.f);
  for (int h = 0; h < nkv; ++h) {
    if (L.n_sinks() > 0) {
      be_.from_host(L.sink_keys(h), m.sinks.k, h * m.sinks.head_stride() * 4, L.n_sinks() * row);
      be_.from_host(L.sink_values(h), m.sinks.v, h * m.sinks.head_stride() * 4, L.n_sinks() * row);
    }
    for (int64_t p = L.window_start(); p < L.window_start() + L.window_len(); ++p) {
      const size_t src = (size_t)(p % W) * d, dst = ((size_t)h * R + (size_t)(p % R)) * d;
      std::copy_n(L.window_keys(h) + src, d, ring_k.begin() + (ptrdiff_t)dst);
      std::copy_n(L.window_values(h) + src, d, ring_v.begin() + (ptrdiff_t)dst);
    }
  }
  be_.from_host(ring_k.data(), m.ring.k, 0, ring_k.size() * 4);
  be_.from_host(ring_v.data(), m.ring.v, 0, ring_v.size() * 4);
  if (!device_search_) return;  // (the constructor checked that the policy's index has a device search)
  if (tables_.size() < layers_.size())
    tables_.resize(layers_.size()), pending_.resize(layers_.size()), folds_.resize(layers_.size());
  tables_[(size_t)i].upload(be_, L, device_tables());
  Pending& pd = pending_[(size_t)i];
  for (auto& e : pd.ev)
    if (!e) TOPKV_CUDA_CHECK(cudaEventCreate(&e));
  if (pd.dev_counts.bytes == 0) pd.dev_counts = be_.alloc((size_t)nkv * sizeof(int32_t));
  if (!copy_stream_) TOPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
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
  if (policy_.stage_rows) {
    size_t row = dtype_bytes(policy_.store_dtype, (size_t)d);  // the widest store type of any layer
    for (const auto& [il, type] : policy_.store_dtype_at) row = std::max(row, dtype_bytes(type, (size_t)d));
    staged_ = be_.alloc((size_t)nkv * ids_cap_ * 2 * row);
  }
}

void GpuOffloadRuntime::write_mirror(Mirror& mir, const OffloadedLayer::Placement& at, const float* k,
                                     const float* v) {
  const auto [dst, slot] = mirror_slot(mir, at);
  // One kernel for k and v (two 2-D device copies cost the stream more).
  cuda::kv_write(DType::F32, dst->k.mem.get(), dst->v.mem.get(), cfg_.n_head_kv, cfg_.head_dim, dst->capacity, k, v,
                 /*T=*/1, slot, be_.stream());
}

void GpuOffloadRuntime::attend_exact(const Mirror& mir, const OffloadedLayer& L, const std::vector<int64_t>& tail,
                                    cuda::RowListArgs a) {
  const int nkv = cfg_.n_head_kv;
  const int64_t R = mir.ring.capacity;
  // One launch: the sinks as the prefix of each head's ring rows, over the
  // exact_parts slots (which count one for the sinks).
  a.row_type = DType::F32, a.k_rows = a.v_rows = nullptr, a.counts = nullptr, a.max_rows = 0;
  a.k_prefix = mir.sinks.k.mem.get(), a.v_prefix = mir.sinks.v.mem.get(), a.prefix_cap = (int)mir.sinks.capacity;
  a.prefix_count = L.n_sinks();
  for (int h = 0; h < nkv; ++h) {
    const int64_t first = L.window_start() - tail[(size_t)h], count = tail[(size_t)h] + L.window_len();
    TOPKV_CHECK(count <= R, "internal: layer needs {} recent rows on the device, its ring holds {}", count, R);
    a.ring_first[h] = (int32_t)(first % R), a.ring_count[h] = (int32_t)count;
    stats_.exact += L.n_sinks() + count;
  }
  a.k_ring = mir.ring.k.mem.get(), a.v_ring = mir.ring.v.mem.get(), a.ring_cap = (int)R;
  a.n_splits = exact_parts(L, tail), a.part0 = 0;
  cuda::row_list_attention(a, be_.stream());
}

void GpuOffloadRuntime::attend_parts(const Mirror& mir, const OffloadedLayer& L, const float* q, float scale,
                                     int parts, int n_exact, int ids_splits, int stride, const int32_t* counts,
                                     float* out) {
  const int nh = cfg_.n_head, nkv = cfg_.n_head_kv, d = cfg_.head_dim;
  cuda::RowListArgs a;
  a.q = q, a.n_kv = nkv, a.group = nh / nkv, a.head_dim = d, a.scale = scale, a.parts = parts;
  cuda::carve_partials(parts_.mem.get(), (size_t)nh * parts, a.part_m, a.part_l, a.part_o);
  attend_exact(mir, L, tail_, a);
  const auto* dl = lists_.as<const void*>();
  const size_t n_ptr = (size_t)nkv * stride;
  a.row_type = L.config().store_dtype, a.k_rows = dl, a.v_rows = dl + n_ptr;
  a.counts = counts, a.max_rows = stride;
  a.n_splits = ids_splits, a.part0 = n_exact;
  cuda::row_list_attention(a, be_.stream());
  cuda::merge_partials(a.part_m, a.part_l, a.part_o, nh, parts, d, out, be_.stream());
}

void GpuOffloadRuntime::stage_listed_rows(const OffloadedLayer& L, const void** hl, const int32_t* hcount,
                                          int stride) {
  const int nkv = cfg_.n_head_kv;
  const size_t n_ptr = (size_t)nkv * stride, row_bytes = dtype_bytes(L.config().store_dtype, (size_t)cfg_.head_dim);
  uint8_t* hrows = host_rows_.get(n_ptr * 2 * row_bytes);
  uint8_t* drows = staged_.as<uint8_t>();
  int64_t total = 0;
  for (int h = 0; h < nkv; ++h) total += std::clamp(hcount[h], 0, stride);
  const int threads = (int)std::clamp<int64_t>(total / 512, 1, 8);  // ~0.5 MB of rows per thread at least
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (threads > 1)
  for (int h = 0; h < nkv; ++h)
    for (int j = 0; j < stride; ++j) {
      if (j >= hcount[h]) continue;
      const size_t at = (size_t)h * stride + j, off = at * 2 * row_bytes;
      std::memcpy(hrows + off, hl[at], row_bytes);
      std::memcpy(hrows + off + row_bytes, hl[n_ptr + at], row_bytes);
      hl[at] = drows + off, hl[n_ptr + at] = drows + off + row_bytes;
    }
  for (int h = 0; h < nkv; ++h) {
    const size_t off = (size_t)h * stride * 2 * row_bytes;
    const size_t bytes = (size_t)std::clamp(hcount[h], 0, stride) * 2 * row_bytes;
    if (bytes) TOPKV_CUDA_CHECK(cudaMemcpyAsync(drows + off, hrows + off, bytes, cudaMemcpyHostToDevice, be_.stream()));
  }
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
  const OffloadedLayer& L = *layers_[(size_t)slot];
  TOPKV_CHECK(pos == L.n_tokens(), "offloaded layer {} holds {} tokens but the model decodes position {}", layer,
              L.n_tokens(), pos);
  Timer t_all;
  if (device_search_) decode_device_search(slot, q, k, v, scale, out);
  else decode_host_search(slot, q, k, v, scale, out);
  stats_.attend_s += t_all.seconds();
  if (measure_error_) measure_step(slot, q, scale, out);
  if (layer == retrieval_layers_.back()) ++stats_.steps;
}

// The host searches: q, k, v go to the host (the step's one wait per layer),
// the host appends and searches, row pointers and far partials come back.
void GpuOffloadRuntime::decode_host_search(int slot, const float* q, const float* k, const float* v, float scale,
                                           float* out) {
  OffloadedLayer& L = *layers_[(size_t)slot];
  Mirror& mir = mirrors_[(size_t)slot];
  const cudaStream_t st = be_.stream();
  const int nh = cfg_.n_head, nkv = cfg_.n_head_kv, d = cfg_.head_dim, G = nh / nkv;
  const size_t qn = (size_t)nh * d, kn = (size_t)nkv * d;

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
  const OffloadedLayer::Placement at = L.begin_append();
  L.fill_appended(at, hk, hv);
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
  ensure_capacity(max_ids);

  // 3. The new token's k, v into the device mirror (where the host put it).
  write_mirror(mir, at, k, v);

  // 4. Retrieved rows' pointer lists (and far partials, staged rows) in
  // pinned memory, then one copy each.
  const int ic = ids_cap_;
  const size_t n_ptr = (size_t)nkv * ic;
  auto* hl = reinterpret_cast<const void**>(host_lists_.get(2 * n_ptr * sizeof(void*) + nkv * sizeof(int32_t)));
  auto* hcount = reinterpret_cast<int32_t*>(hl + 2 * n_ptr);
  auto* dl = lists_.as<const void*>();
  for (int h = 0; h < nkv; ++h) {
    const auto& r = found_[(size_t)h];
    const int m = (int)r.ids.size();
    hcount[h] = m;
    const void** kp = hl + (size_t)h * ic;
    const void** vp = hl + n_ptr + (size_t)h * ic;
    for (int j = 0; j < m; ++j)
      kp[j] = L.key_store(h)->row(r.ids[(size_t)j]), vp[j] = L.value_store(h)->row(r.ids[(size_t)j]);
  }
  if (policy_.stage_rows) stage_listed_rows(L, hl, hcount, ic);
  tail_.assign((size_t)nkv, 0);  // the host's search covers the unfolded rows
  const int n_exact = exact_parts(L, tail_);
  const int ids_splits = splits_for(max_ids, kIdsRowsPerSplit, kMaxIdsSplits);
  const int parts = n_exact + ids_splits + 1;
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
  const int pf = parts - 1;
  TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(pm + pf, parts * 4, hfar, 4, 4, nh, cudaMemcpyHostToDevice, st));
  TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(pl + pf, parts * 4, hfar + nh, 4, 4, nh, cudaMemcpyHostToDevice, st));
  TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(po + (size_t)pf * d, (size_t)parts * d * 4, hfar + 2 * nh, (size_t)d * 4,
                                     (size_t)d * 4, nh, cudaMemcpyHostToDevice, st));
  TOPKV_CUDA_CHECK(cudaEventRecord(ev_[3], st));

  // 5. Partials over sinks + window and over the retrieved rows, then the merge.
  attend_parts(mir, L, q, scale, parts, n_exact, ids_splits, ic, reinterpret_cast<const int32_t*>(dl + 2 * n_ptr), out);
  TOPKV_CUDA_CHECK(cudaEventRecord(ev_[4], st));
  timing_pending_ = true;
}

}  // namespace gpu_offload

std::unique_ptr<OffloadRuntime> make_gpu_offload_runtime(Backend& be, const ModelConfig& cfg,
                                                         const OffloadPolicy& policy, bool progress) {
  return std::make_unique<gpu_offload::GpuOffloadRuntime>(cuda::as_cuda_backend(be, "the CUDA offload runtime"),
                                                         cfg, policy, progress);
}

}  // namespace topkv
#endif  // TOPKV_HAVE_CUDA
