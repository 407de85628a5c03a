// Prefill over a KV cache that lives in host memory (KvLayerCache::in_host):
// a retrieval layer whose keys do not fit the GPU budget. The design's
// "when the KV of a retrieval layer does not fit the budget, prefill streams
// it from host memory" (issue 5; docs/AS_BUILT.md).
//
//   kv_write   the chunk's k, v are converted on the device into a staging
//              cache of T slots, then copied down into their slots of the
//              pinned host cache (two 2-D copies per tensor at most: a ring
//              may wrap);
//   attention  the keys a chunk sees go up in blocks of B keys
//              (stream_block_keys: ~64 MiB of K and V) on a copy stream into
//              one of two device stages, B slots each (position p at slot
//              p % B). The compute stream waits for a block, runs the usual
//              kernel as a key-range call (AttentionArgs::key_begin/key_end)
//              that merges into one running partial (m, l, o) per row
//              (merge_partials_into), and releases the stage; the next
//              block's copy overlaps it. A final merge writes o / l.
//   rings      a prefill ring (KvLayerCache::ring, ModelOptions::host_kv_past)
//              holds only the chunk; a block's positions before it come from
//              the ring's past source (the top-k runtime's stores: sinks,
//              store chunks, window; src/model/kv_past.h), one copy per run
//              and head into the stage, or for a run of another type (8-bit
//              store rows, fp32 sinks and window) a raw copy converted on the
//              copy stream (cuda::convert). No second host copy of the past.
// The union of the blocks is every key once, so the result is the
// in-device attention's up to summation order (the CPU emulation of the
// tensor-core tile loop checks the key-range blocks against the whole call:
// tests/test_attention_tc_tiles.cpp; tests/gpu/test_cuda_streamed.cpp runs
// both on the GPU).
//
// Cost: every chunk reads the whole past over the bus, ~2 x head_dim x
// elem bytes per key and KV head: at 55 GB/s (DESIGN.md's pinned copy) a
// 1M-token Gemma 3 layer (1 KV head, 256, f16: 1 GiB) takes ~20 ms per
// chunk, against ~1 ms when it sits in device memory. Larger chunks
// (--chunk) amortise it.
//
// CUDA builds only.
#ifdef TOPKV_HAVE_CUDA
#include <algorithm>

#include "gpu/cuda_backend_impl.h"
#include "gpu/cuda_check.h"
#include "gpu/cuda_kernels.h"
#include "src/common/options.h"
#include "src/model/kv_past.h"

namespace topkv::cuda {

KvLayerCache CudaBackend::alloc_kv_host(int n_kv_heads, int head_dim, int64_t capacity, DType dtype) {
  TOPKV_CHECK(!rec_, "alloc_kv_host while recording a decode step: allocate caches before recording");
  KvLayerCache c = kv_cache_shape(n_kv_heads, head_dim, capacity, dtype);
  c.in_host = true;
  const size_t half = c.bytes() / 2;
  auto pinned = [&](const char* what) {
    void* p = nullptr;
    const cudaError_t e = cudaMallocHost(&p, half);
    if (e != cudaSuccess) {
      cudaGetLastError();
      fail("pinning {} of host memory for the KV cache {} (a prefill streamed from host memory) failed: {}. Lower "
           "the context, use --kv-type f16, or raise --gpu-mem-budget so the cache fits the GPU",
           format_bytes((double)half), what, cudaGetErrorString(e));
    }
    return std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  };
  // Not zeroed: a streamed attention copies up only the positions the model
  // has written (its key range), never a slot before its kv_write.
  c.k = Buffer{pinned("keys"), half};
  c.v = Buffer{pinned("values"), half};
  return c;
}

int64_t CudaBackend::memory_left() const {
  const CudaMemoryUse u = mem_.use();
  size_t free_b = 0, total_b = 0;
  TOPKV_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  int64_t left = (int64_t)free_b;
  if (u.budget) left = std::min<int64_t>(left, (int64_t)u.budget - (int64_t)u.total());
  return std::max<int64_t>(left, 0);
}

int64_t CudaBackend::stream_block_keys(const KvLayerCache& c) const {
  const size_t row = (size_t)c.head_dim * dtype_size(c.dtype);
  int64_t b = (int64_t)(stream_stage_bytes_ / (2 * (size_t)c.n_kv_heads * row)) / kKeyRangeAlign * kKeyRangeAlign;
  const int64_t whole = (c.capacity + kKeyRangeAlign - 1) / kKeyRangeAlign * kKeyRangeAlign;
  return std::clamp<int64_t>(b, kKeyRangeAlign, whole);
}

void CudaBackend::kv_write_host(KvLayerCache& c, const float* k, const float* v, int T, int64_t pos0) {
  TOPKV_CHECK(!rec_, "kv_write into a host-resident cache cannot be recorded (a decode step over a streamed layer)");
  if (T <= 0) return;
  const size_t row = (size_t)c.head_dim * dtype_size(c.dtype), plane = (size_t)c.n_kv_heads * T * row;
  uint8_t* stage = static_cast<uint8_t*>(scratch(Scratch::KvStage, 2 * plane));
  // [n_kv][T][head_dim] of the cache's type: positions 0..T-1 of a T-slot cache.
  cuda::kv_write(c.dtype, stage, stage + plane, c.n_kv_heads, c.head_dim, T, k, v, T, 0, stream_);
  for (int64_t t = std::max<int64_t>(0, T - c.capacity); t < T;) {  // runs of slots up to the ring's end
    const int64_t slot = (pos0 + t) % c.capacity, n = std::min<int64_t>(T - t, c.capacity - slot);
    for (int kv = 0; kv < 2; ++kv) {
      uint8_t* dst = (kv ? c.v : c.k).as<uint8_t>() + (size_t)slot * row;
      TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)c.capacity * row, stage + kv * plane + (size_t)t * row,
                                         (size_t)T * row, (size_t)n * row, (size_t)c.n_kv_heads, cudaMemcpyDefault,
                                         stream_));
    }
    t += n;
  }
}

void CudaBackend::streamed_attention(const float* q, int T, int n_head, int64_t pos0, const KvLayerCache& c,
                                     int64_t window, float scale, float* out) {
  TOPKV_CHECK(!rec_, "attention over a host-resident cache cannot be recorded (a decode step over a streamed "
              "layer): its blocks are copied on a second stream");
  if (T <= 0) return;
  const int n_kv = c.n_kv_heads, hd = c.head_dim;
  int64_t first = 0, last = 0;
  tc_key_range(pos0, T, window, 0, -1, &first, &last);
  // A prefill ring holds the chunk [pos0, pos0 + T); its past's runs come from
  // c.past (the runtime's stores), each copied to its place in the stage, or
  // (another element type: an 8-bit store, the fp32 sinks and window) copied raw
  // into `raw` and converted there.
  const int64_t in_ring = c.ring ? pos0 : first;  // positions from here on are in the cache's slots
  if (c.ring && first < pos0) check_ring_past(c, pos0);
  TOPKV_CHECK(last - std::max(first, in_ring) + 1 <= c.capacity, "attention over positions {}..{} needs {} cache "
              "slots but the cache keeps {}", std::max(first, in_ring), last, last - std::max(first, in_ring) + 1,
              c.capacity);
  const size_t row = (size_t)hd * dtype_size(c.dtype);
  const int64_t B = stream_block_keys(c), rows = (int64_t)T * n_head;
  const size_t plane = (size_t)n_kv * B * row, stage_bytes = 2 * plane;
  const size_t raw_bytes = c.ring ? (size_t)B * hd * sizeof(float) : 0;  // one run of the widest type
  uint8_t* base = static_cast<uint8_t*>(
      scratch(Scratch::Stream, 2 * stage_bytes + raw_bytes + (size_t)rows * (hd + 2) * 4));
  uint8_t* raw = base + 2 * stage_bytes;
  float* acc_m = reinterpret_cast<float*>(raw + raw_bytes);
  float *acc_l = acc_m + rows, *acc_o = acc_l + rows;
  TOPKV_CUDA_CHECK(cudaMemsetAsync(acc_l, 0, (size_t)rows * sizeof(float), stream_));  // l = 0: empty

  if (!copy_stream_) {
    TOPKV_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    for (cudaEvent_t& e : stream_ev_) TOPKV_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  }
  cudaEvent_t ready = stream_ev_[0], *copied = stream_ev_ + 1, *consumed = stream_ev_ + 3;
  TOPKV_CUDA_CHECK(cudaEventRecord(ready, stream_));  // the chunk's kv_write has reached the host cache
  TOPKV_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, ready, 0));

  int b = 0;
  for (int64_t k0 = first / B * B; k0 <= last; k0 += B, ++b) {
    const int s = b & 1;
    uint8_t* sk = base + s * stage_bytes;
    const int64_t lo = std::max(k0, first), hi = std::min(k0 + B - 1, last);
    if (b >= 2) TOPKV_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, consumed[s], 0));  // block b-2 is done with it
    if (lo < in_ring) {  // the ring's past, head by head, run by run
      const int64_t end = std::min(hi + 1, in_ring);
      for (int h = 0; h < n_kv; ++h)
        for (int kv = 0; kv < 2; ++kv)
          c.past->past_runs(c.layer, h, kv == 1, lo, end, [&](const KvPastRun& r) {
            uint8_t* dst = sk + kv * plane + ((size_t)h * B + (size_t)(r.pos - k0)) * row;
            const size_t n = (size_t)r.n * hd;
            if (r.dtype == c.dtype) {
              TOPKV_CUDA_CHECK(cudaMemcpyAsync(dst, r.rows, (size_t)r.n * row, cudaMemcpyDefault, copy_stream_));
              return;
            }
            TOPKV_CUDA_CHECK(cudaMemcpyAsync(raw, r.rows, dtype_bytes(r.dtype, n), cudaMemcpyDefault, copy_stream_));
            cuda::convert(r.dtype, raw, c.dtype, dst, (int64_t)n, copy_stream_);  // `raw` reused in stream order
          });
    }
    for (int64_t p = std::max(lo, in_ring); p <= hi;) {  // runs up to the host ring's end
      const int64_t slot = p % c.capacity, n = std::min(hi - p + 1, c.capacity - slot);
      for (int kv = 0; kv < 2; ++kv)
        TOPKV_CUDA_CHECK(cudaMemcpy2DAsync(sk + kv * plane + (size_t)(p - k0) * row, (size_t)B * row,
                                           (kv ? c.v : c.k).as<uint8_t>() + (size_t)slot * row,
                                           (size_t)c.capacity * row, (size_t)n * row, (size_t)n_kv,
                                           cudaMemcpyDefault, copy_stream_));
      p += n;
    }
    TOPKV_CUDA_CHECK(cudaEventRecord(copied[s], copy_stream_));
    TOPKV_CUDA_CHECK(cudaStreamWaitEvent(stream_, copied[s], 0));

    AttentionArgs a;
    a.q = q, a.kv_type = c.dtype, a.k = sk, a.v = sk + plane;
    a.T = T, a.n_head = n_head, a.n_kv = n_kv, a.head_dim = hd;
    a.pos0 = pos0, a.capacity = B, a.window = window, a.scale = scale;
    a.key_begin = k0, a.key_end = hi + 1;
    a.acc_m = acc_m, a.acc_l = acc_l, a.acc_o = acc_o;
    const bool tc = attention_tc_supported(a);
    const AttentionPlan plan = tc ? plan_attention_tc(a, sm_count_) : plan_attention(a, sm_count_);
    void* ws = scratch(Scratch::Attention, plan.workspace_bytes);
    if (tc)
      attention_tc(a, plan, ws, stream_);
    else
      cuda::attention(a, plan, ws, stream_);
    TOPKV_CUDA_CHECK(cudaEventRecord(consumed[s], stream_));
  }
  merge_partials(acc_m, acc_l, acc_o, rows, 1, hd, out, stream_);  // o / l
}

}  // namespace topkv::cuda
#endif  // TOPKV_HAVE_CUDA
