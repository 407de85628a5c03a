// GpuOffloadRuntime's step with the search on the device (RetroInfer-style;
// docs/AS_BUILT.md): the summary tables are on the GPU, cuda::summary_search
// scores, cuts, gathers and adds the far rows, and nothing waits for the host,
// whose layer trails by one token. The class: gpu/gpu_offload_runtime_impl.h.
// CUDA builds only: the file is empty without CUDA.
#ifdef TOPKV_HAVE_CUDA
#include "gpu/gpu_offload_runtime_impl.h"

#include <algorithm>
#include <cmath>

#include "src/common/timer.h"

namespace topkv::gpu_offload {

// The previous step's token of layer `slot` reaches the host layer; its
// kernels' times and row counts are added to the statistics.
void GpuOffloadRuntime::finish_pending(int slot) {
  Pending& pd = pending_[(size_t)slot];
  if (!pd.waiting) return;
  Timer t_wait;
  TOPKV_CUDA_CHECK(cudaEventSynchronize(pd.ev[3]));
  stats_.wait_s += t_wait.seconds();
  const int nkv = cfg_.n_head_kv, d = cfg_.head_dim;
  const auto* kv = reinterpret_cast<const float*>(pd.kv.mem.get());
  layers_[(size_t)slot]->fill_appended(pd.at, kv, kv + (size_t)nkv * d);
  const auto* counts = reinterpret_cast<const int32_t*>(pd.counts.mem.get());
  for (int h = 0; h < nkv; ++h) stats_.retrieved += counts[h];
  float search = 0, attend = 0;
  TOPKV_CUDA_CHECK(cudaEventElapsedTime(&search, pd.ev[0], pd.ev[1]));
  TOPKV_CUDA_CHECK(cudaEventElapsedTime(&attend, pd.ev[1], pd.ev[2]));
  stats_.search_s += search * 1e-3;
  stats_.gpu_s += (search + attend) * 1e-3;
  pd.waiting = false;
}

void GpuOffloadRuntime::measure_step(int slot, const float* q, float scale, const float* out) {
  if (device_search_) finish_pending(slot);  // the token's k, v into the host layer now
  const size_t n = (size_t)cfg_.n_head * cfg_.head_dim;
  std::vector<float> hq(n), hout(n);
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(hq.data(), q, n * sizeof(float), cudaMemcpyDeviceToHost, be_.stream()));
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(hout.data(), out, n * sizeof(float), cudaMemcpyDeviceToHost, be_.stream()));
  be_.synchronize();
  record_error(slot, hq.data(), scale, hout.data());
}

// Folds off the decode path: the device attends the rows its tables do not
// cover exactly from its ring (room for two folds' worth), so a fold may take
// as long as the next device_fold steps do (~3 s at 1024) without a wait;
// one still running when the ring would overflow is waited for. At 1M a fold
// of 1024 rows took ~0.7 s on the decode path (assignment to 65,536
// clusters, export, conversion; bench/results/gpu_h100_session4/).
int64_t GpuOffloadRuntime::count_tail(int slot) {
  const OffloadedLayer& L = *layers_[(size_t)slot];
  const DeviceSearchTables& tab = tables_[(size_t)slot];
  tail_.resize((size_t)cfg_.n_head_kv);
  int64_t most = 0;
  for (int h = 0; h < cfg_.n_head_kv; ++h) {
    tail_[(size_t)h] = L.stored_rows(h) - tab.covered(h);
    most = std::max(most, tail_[(size_t)h]);
  }
  return most;
}

size_t GpuOffloadRuntime::search_workspace_bytes(const KvIndex& index, int64_t n) const {
  const int G = cfg_.n_head / cfg_.n_head_kv;
  const double per_key = index.summary_groups_per_key();
  if (per_key <= 0.0 || n <= 0) return 0;
  // Groups a head: n / (keys per group), and a partial group per k-means block.
  const int64_t max_n = (int64_t)std::ceil((double)n * per_key) + 64;
  const std::vector<int64_t> ks = k_for_context(n);
  const int64_t k = ks.empty() ? policy_.search.k : *std::max_element(ks.begin(), ks.end());
  // DeviceSearchTables::row_cap at R*k, with twice the mean group for its largest.
  int64_t cand_cap = 0;
  if (rerank_ > 1.0)
    cand_cap = std::min<int64_t>(n, (int64_t)(rerank_ * (double)k + 2.0 / per_key) * G);
  // An index with a far field may keep the rows rerank drops as far rows
  // (SummaryTables::far_dropped): planned as if it does.
  return cuda::summary_search_workspace_bytes(cfg_.n_head_kv, G, (int)std::min<int64_t>(max_n, INT32_MAX),
                                              (int)std::min<int64_t>(cand_cap, INT32_MAX), index.needs_values());
}

void GpuOffloadRuntime::manage_folds(int slot) {
  OffloadedLayer& L = *layers_[(size_t)slot];
  DeviceSearchTables& tab = tables_[(size_t)slot];
  std::future<DeviceSearchTables::Staged>& fold = folds_[(size_t)slot];
  // The tables again, from the layer's indexes (sync_folds: it folded rows
  // in; or an index was built since, over the store's first rows) or from
  // what a fold staged. Timed as a copy.
  const auto upload = [&](auto&& source) {
    Timer t;
    tab.upload(be_, L, source, store_cache());
    stats_.transfer_s += t.seconds();
    if (store_cache()) count_store_cache();
    count_tail(slot);
  };
  const int64_t uncovered = count_tail(slot);  // most over the heads
  if (policy_.sync_folds) {
    if (tab.stale(L)) upload(device_tables());
    return;
  }
  if (fold.valid()) {
    // A fold lands at a fixed step, device_fold / 4 rows after it started
    // (waiting for it if it has not finished), never "as soon as it is
    // ready": which rows the search can pick, and which the ring attends
    // exactly, must not depend on the host thread's timing, or a greedy run
    // would not repeat itself (the GPU soak of real Gemma caught two runs
    // drifting apart). The ring holds twice device_fold, so this fits.
    const int64_t due = (int64_t)policy_.device_fold + policy_.device_fold / 4;
    if (uncovered < due) return;
    Timer t;
    const DeviceSearchTables::Staged staged = fold.get();  // rethrows what the fold threw
    stats_.wait_s += t.seconds();                          // ~0 unless the fold took longer than due
    upload(staged);
    return;
  }
  if (uncovered < policy_.device_fold) {
    if (tab.stale(L)) upload(device_tables());
    return;
  }
  const DeviceTableChoice tables = device_tables();
  // The rows stored now, not those stored by the time the thread runs.
  std::vector<int64_t> upto((size_t)cfg_.n_head_kv);
  for (int h = 0; h < cfg_.n_head_kv; ++h) upto[(size_t)h] = L.stored_rows(h);
  fold = std::async(std::launch::async, [&L, tables, upto = std::move(upto)] {
    L.fold_pending(upto);
    return DeviceSearchTables::stage(L, tables);
  });
}

// Every layer's chunk tables again, through the cache, which copies the rows
// the tables cover while there is room: once, on the decode path (16 GiB at
// 128K tokens of Llama-3-8B's geometry; not timed on its own, it is in
// transfer_s of the step that starts it).
void GpuOffloadRuntime::start_store_cache() {
  store_cache_started_ = true;
  Timer t;
  for (size_t i = 0; i < tables_.size(); ++i) tables_[i].refresh_chunks(be_, *layers_[i], *store_cache_);
  be_.synchronize();
  stats_.transfer_s += t.seconds();
  count_store_cache();
}

void GpuOffloadRuntime::count_store_cache() {
  int64_t readable = 0;  // keys and values the tables cover
  for (const DeviceSearchTables& tab : tables_)
    for (int h = 0; h < cfg_.n_head_kv; ++h) readable += 2 * tab.covered(h);
  stats_.device_store_bytes = store_cache_->bytes();
  stats_.device_store_rows = store_cache_->rows_cached();
  stats_.device_store_share = readable ? std::min(1.0, (double)stats_.device_store_rows / (double)readable) : 0.0;
}

// The device searches: nothing waits for the host. The host's layer trails
// by one token: the new token's bookkeeping (eviction, folds) happens now,
// its data arrives with the next step (OffloadedLayer::begin_append).
void GpuOffloadRuntime::decode_device_search(int slot, const float* q, const float* k, const float* v, float scale,
                                             float* out) {
  OffloadedLayer& L = *layers_[(size_t)slot];
  Mirror& mir = mirrors_[(size_t)slot];
  DeviceSearchTables& tab = tables_[(size_t)slot];
  Pending& pd = pending_[(size_t)slot];
  const cudaStream_t st = be_.stream();
  const int nh = cfg_.n_head, nkv = cfg_.n_head_kv, d = cfg_.head_dim, G = nh / nkv;

  if (store_cache_ && !store_cache_started_ && stats_.steps >= kStoreCacheAfterSteps) start_store_cache();
  finish_pending(slot);
  pd.at = L.begin_append();
  manage_folds(slot);
  // Rerank: clusters until R·k tokens are candidates, k rows a query head kept.
  const int64_t budget = k_[(size_t)slot];
  const int64_t cand_k = rerank_ > 1.0 ? (int64_t)std::min(rerank_ * (double)budget, 2.0e9) : 0;
  const int cap = tab.row_cap(budget, G), cand_cap = cand_k ? tab.row_cap(cand_k, G) : 0;
  ensure_capacity(cap);
  const bool far_dropped = cand_cap > 0 && tab.far_dropped();  // staged only with value means (a far field)
  const size_t ws = cuda::summary_search_workspace_bytes(nkv, G, tab.max_n(), cand_cap, far_dropped);
  if (search_ws_.bytes < ws) be_.synchronize(), search_ws_ = be_.alloc(ws);

  // The new token: into the device mirror now (to the host after the step).
  write_mirror(mir, pd.at, k, v);

  // Partial slots: sinks, ring (tail_: manage_folds), retrieved rows, far rows.
  const int n_exact = exact_parts(L, tail_);
  const int ids_splits = splits_for(cap, kIdsRowsPerSplit, kMaxIdsSplits);
  // Far splits: one per kFarGroupsPerSplit groups; with far_dropped the far
  // kernel also walks the candidates (thousands a KV head), so one per as
  // many of those too. (With splits by groups alone, 8 at 16K, rerank_far's
  // step was 22% slower than the default's: bench/results/gpu_session15/.)
  const int64_t far_items = std::max<int64_t>(tab.max_n(), far_dropped ? cand_cap : 0);
  const int far_splits = tab.far_field() ? splits_for(far_items, kFarGroupsPerSplit, kMaxFarSplits) : 0;
  const int parts = n_exact + ids_splits + far_splits;
  float *pm, *pl, *po;
  cuda::carve_partials(parts_.mem.get(), (size_t)nh * parts, pm, pl, po);
  const size_t n_ptr = (size_t)nkv * cap;
  auto* dl = lists_.as<const void*>();
  auto* dcounts = pd.dev_counts.as<int32_t>();

  TOPKV_CUDA_CHECK(cudaEventRecord(pd.ev[0], st));
  cuda::SummarySearchArgs s;
  s.heads = tab.heads(), s.n_kv = nkv, s.group = G, s.head_dim = d, s.max_n = tab.max_n();
  s.page_bounds = tab.page_bounds(), s.table_type = device_tables().type, s.store_type = L.config().store_dtype;
  s.q = q, s.k = cand_k ? cand_k : budget, s.scale = scale, s.workspace = search_ws_.mem.get();
  s.coarse_k = tab.coarse_budget(budget);
  s.spread = tab.spread(), s.spread_clip = tab.spread_clip();
  s.rerank_k = cand_k ? budget : 0, s.cand_cap = cand_cap, s.far_dropped = far_dropped;
  s.k_rows = const_cast<const void**>(dl), s.v_rows = const_cast<const void**>(dl + n_ptr), s.counts = dcounts;
  s.cap = cap;
  s.far_splits = far_splits, s.part0 = n_exact + ids_splits, s.parts = parts;
  s.part_m = pm, s.part_l = pl, s.part_o = po;
  cuda::summary_search(s, st);
  TOPKV_CUDA_CHECK(cudaEventRecord(pd.ev[1], st));
  if (policy_.stage_rows) stage_searched_rows(L, cap, dcounts);

  attend_parts(mir, L, q, scale, parts, n_exact, ids_splits, cap, dcounts, out);
  TOPKV_CUDA_CHECK(cudaEventRecord(pd.ev[2], st));
  // To the host, off the compute stream: the token's k, v from its mirror
  // slot, and the counts (finish_pending waits for ev[3] at the next step).
  TOPKV_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, pd.ev[2], 0));
  auto* hkv = reinterpret_cast<float*>(pd.kv.get(2 * (size_t)nkv * d * sizeof(float)));
  const auto [mc, slot_at] = mirror_slot(mir, pd.at);
  for (auto [buf, dst] : {std::pair{&mc->k, hkv}, std::pair{&mc->v, hkv + (size_t)nkv * d}})
    TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)d * 4, buf->as<float>() + slot_at * d, mc->head_stride() * 4,
                                       (size_t)d * 4, (size_t)nkv, cudaMemcpyDeviceToHost, copy_stream_));
  auto* hcounts = pd.counts.get((size_t)nkv * sizeof(int32_t));
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(hcounts, dcounts, (size_t)nkv * sizeof(int32_t), cudaMemcpyDeviceToHost,
                                   copy_stream_));
  TOPKV_CUDA_CHECK(cudaEventRecord(pd.ev[3], copy_stream_));
  pd.waiting = true;
}

// --stage-rows with the search on the device: the store is not pinned (a
// context pack's store used in place, say) and no kernel may read it. The
// search's pointer lists — host addresses of store rows, computed from the
// tables' chunk pointers, never dereferenced on the device — come back to
// the host (one wait per layer), stage_listed_rows copies those rows and
// points the lists at their device copy. Rows the ring holds are not in the
// lists: they are on the device already.
void GpuOffloadRuntime::stage_searched_rows(const OffloadedLayer& L, int cap, const int32_t* dcounts) {
  const cudaStream_t st = be_.stream();
  const int nkv = cfg_.n_head_kv;
  const size_t n_ptr = (size_t)nkv * cap;
  const size_t list_bytes = 2 * n_ptr * sizeof(void*) + (size_t)nkv * sizeof(int32_t);
  auto* hl = reinterpret_cast<const void**>(host_lists_.get(list_bytes));
  auto* dl = lists_.as<const void*>();
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(hl, dl, 2 * n_ptr * sizeof(void*), cudaMemcpyDeviceToHost, st));
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(hl + 2 * n_ptr, dcounts, (size_t)nkv * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
  Timer t_wait;
  be_.synchronize();  // also ends every earlier copy out of host_lists_ / host_rows_
  stats_.wait_s += t_wait.seconds();
  Timer t_copy;
  stage_listed_rows(L, hl, reinterpret_cast<const int32_t*>(hl + 2 * n_ptr), cap);
  TOPKV_CUDA_CHECK(cudaMemcpyAsync(dl, hl, 2 * n_ptr * sizeof(void*), cudaMemcpyHostToDevice, st));
  stats_.transfer_s += t_copy.seconds();
}

}  // namespace topkv::gpu_offload
#endif  // TOPKV_HAVE_CUDA
