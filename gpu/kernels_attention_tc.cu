// Host side of the tensor-core prefill attention (kernel and algorithm:
// gpu/attention_tc_kernel.cuh; tile geometry: gpu/attention_tc_tiles.h):
// which calls it takes, the key-split plan, the launch, the merge of split
// partials. Twin: CpuBackend::attention.
#include <algorithm>
#include <atomic>
#include <type_traits>

#include "gpu/attention_tc_kernel.cuh"
#include "gpu/cuda_kernels.h"

namespace topkv::cuda {
namespace {

using tc::attention_tc_kernel;
using tc::kLog2e;
using tc::kThreads;
using tc::Tc;
using tc::TcArgs;

std::atomic<int64_t> g_tc_launches{0};

// Raises the kernel's dynamic shared-memory limit on the current device (once
// per device) and returns how many of its blocks one SM holds.
template <class KV, int HD> int prepare_kernel() {
  static std::atomic<int> per_sm[64];  // static storage: zero-initialised
  int dev = 0;
  TOPKV_CUDA_CHECK(cudaGetDevice(&dev));
  if (dev < 64 && per_sm[dev].load(std::memory_order_relaxed) > 0) return per_sm[dev].load();
  constexpr int bytes = Tc<KV, HD>::bytes;
  TOPKV_CUDA_CHECK(cudaFuncSetAttribute(attention_tc_kernel<KV, HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  int n = 0;
  TOPKV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attention_tc_kernel<KV, HD>, kThreads, bytes));
  TOPKV_CHECK(n > 0, "the tensor-core attention kernel (head_dim {}, {} bytes of shared memory) fits no SM", HD, bytes);
  if (dev < 64) per_sm[dev].store(n);
  return n;
}

// Calls f(KV{}, std::integral_constant<int, HD>{}) for the call's cache type and head dim.
template <class F> void with_tc_kernel(const AttentionArgs& a, F&& f) {
  with_elem_type(a.kv_type, [&](auto e) {
    switch (a.head_dim) {
      case 64: f(e, std::integral_constant<int, 64>{}); return;
      case 128: f(e, std::integral_constant<int, 128>{}); return;
      case 256: f(e, std::integral_constant<int, 256>{}); return;
      default: fail("no tensor-core attention kernel for head_dim {} (compiled: 64, 128, 256)", a.head_dim);
    }
  });
}

}  // namespace

bool attention_tc_supported(const AttentionArgs& a) {
  return a.T >= kTcMinTokens && (a.head_dim == 64 || a.head_dim == 128 || a.head_dim == 256);
}

int64_t attention_tc_launches() { return g_tc_launches.load(); }

AttentionPlan plan_attention_tc(const AttentionArgs& a, int sm_count) {
  TOPKV_CHECK(attention_tc_supported(a), "tensor-core attention needs T >= {} and head_dim 64/128/256, got T={} hd={}",
              kTcMinTokens, a.T, a.head_dim);
  int per_sm = 1;
  with_tc_kernel(a, [&](auto e, auto hd) { per_sm = prepare_kernel<decltype(e), decltype(hd)::value>(); });
  const int bn = tc_tile_keys((int)dtype_size(a.kv_type), a.head_dim);
  int64_t key_first = 0, key_last = 0;
  attention_key_range(a, &key_first, &key_last);
  const TcSplit sp = tc_plan_split(a.T, a.n_head / a.n_kv, a.n_kv, key_first, key_last, bn,
                                   (int64_t)std::max(sm_count, 1) * per_sm);
  AttentionPlan p;
  p.n_splits = sp.n_splits;
  p.split_keys = sp.split_tiles * bn;
  if (p.n_splits > 1 || a.acc_m)
    p.workspace_bytes = (size_t)a.T * a.n_head * p.n_splits * (size_t)(a.head_dim + 2) * sizeof(float);
  return p;
}

void attention_tc(const AttentionArgs& a, const AttentionPlan& plan, void* workspace, cudaStream_t stream) {
  TOPKV_CHECK(attention_tc_supported(a), "tensor-core attention needs T >= {} and head_dim 64/128/256, got T={} hd={}",
              kTcMinTokens, a.T, a.head_dim);
  TOPKV_CHECK(a.n_kv > 0 && a.n_head % a.n_kv == 0, "{} query heads do not split over {} KV heads", a.n_head, a.n_kv);
  const int group = a.n_head / a.n_kv, bn = tc_tile_keys((int)dtype_size(a.kv_type), a.head_dim);
  TOPKV_CHECK(plan.split_keys > 0 && plan.split_keys % bn == 0, "attention_tc: plan from plan_attention_tc expected");
  TOPKV_CHECK((int64_t)a.T * group < INT32_MAX - kTcRows, "attention_tc: {} rows do not fit an int", (int64_t)a.T * group);
  TcArgs ka{};
  ka.q = a.q, ka.out = a.out, ka.k = a.k, ka.v = a.v;
  ka.T = a.T, ka.n_head = a.n_head, ka.group = group, ka.rows_total = a.T * group;
  int64_t key_lo = 0, key_last = 0;
  attention_key_range(a, &key_lo, &key_last);
  const int64_t kb0 = key_lo / bn * bn;
  TOPKV_CHECK(a.capacity > 0 && a.capacity < (int64_t{1} << 30) && a.pos0 >= 0 && key_last - key_lo + 1 <= a.capacity &&
              a.pos0 + a.T - kb0 < (int64_t{1} << 30),
              "attention_tc: positions {}..{} do not fit a cache of {} slots (the kernel takes < 2^30)", key_lo,
              key_last, a.capacity);
  TOPKV_CHECK(a.key_begin % kKeyRangeAlign == 0 && (a.key_end < 0 || a.key_end % kKeyRangeAlign == 0 ||
                                                     a.key_end >= a.pos0 + a.T),
              "attention_tc: key range {}..{} must start on a multiple of {} and end on one or past the chunk",
              a.key_begin, a.key_end, kKeyRangeAlign);
  ka.pos0r = (int)(a.pos0 - kb0), ka.capacity = (int)a.capacity, ka.slot0 = (int)(kb0 % a.capacity);
  ka.key_lo = (int)(key_lo - kb0), ka.key_hi = (int)(key_last - kb0);
  ka.to_parts = a.acc_m != nullptr;
  ka.window = a.window > 0 && a.window < a.pos0 + a.T ? (int)a.window : 0;  // a longer window limits nothing
  ka.q_mul = a.scale * kLog2e;
  ka.split_tiles = (int)(plan.split_keys / bn), ka.n_splits = plan.n_splits;
  const int64_t tiles = key_last / bn - key_lo / bn + 1;
  TOPKV_CHECK(plan.n_splits >= 1 && (int64_t)plan.n_splits * ka.split_tiles >= tiles,
              "attention_tc: {} splits of {} keys do not cover the {} key tiles of {}", plan.n_splits,
              plan.split_keys, tiles, bn);
  const size_t n_part = (size_t)a.T * a.n_head * plan.n_splits;
  if (plan.n_splits > 1 || ka.to_parts) {
    TOPKV_CHECK(workspace, "split attention needs {} bytes of work space", plan.workspace_bytes);
    carve_partials(workspace, n_part, ka.part_m, ka.part_l, ka.part_o);
  }
  const int64_t row_tiles = ((int64_t)a.T * group + kTcRows - 1) / kTcRows;
  TOPKV_CHECK(a.n_kv <= 65535 && plan.n_splits <= 65535, "attention grid {} x {} x {} is too large", row_tiles,
              a.n_kv, plan.n_splits);
  const dim3 grid((unsigned)row_tiles, (unsigned)a.n_kv, (unsigned)plan.n_splits);
  with_tc_kernel(a, [&](auto e, auto hd) {
    using KV = decltype(e);
    constexpr int HD = decltype(hd)::value;
    prepare_kernel<KV, HD>();
    attention_tc_kernel<KV, HD><<<grid, kThreads, Tc<KV, HD>::bytes, stream>>>(ka);
    TOPKV_CUDA_CHECK_LAUNCH();
  });
  g_tc_launches.fetch_add(1);
  if (ka.to_parts)
    merge_partials_into(ka.part_m, ka.part_l, ka.part_o, (int64_t)a.T * a.n_head, plan.n_splits, a.head_dim,
                        a.acc_m, a.acc_l, a.acc_o, stream);
  else if (plan.n_splits > 1)
    merge_partials(ka.part_m, ka.part_l, ka.part_o, (int64_t)a.T * a.n_head, plan.n_splits, a.head_dim, a.out,
                   stream);
}

}  // namespace topkv::cuda
