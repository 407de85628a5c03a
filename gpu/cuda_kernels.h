// Host launchers of the CUDA backend's kernels (gpu/kernels_*.cu). Every
// pointer is device memory unless it says host; every launch is queued on
// `stream` and checked. Each names its CPU twin, the function the tests
// compare it with. CUDA builds only (C++17).
//
// Expected bounds (H100 SXM: ~3.35 TB/s HBM3, ~60 TFLOP/s fp32 FMA, ~990
// TFLOP/s fp16 tensor; H200: ~4.8 TB/s), per call:
//   glu / add / rms_norm / rope / kv_write / embed / casts: memory, each
//     input read once and each output written once;
//   gemv: memory, rows*cols*2 bytes of weight (the activations stay in L1/L2);
//   gemm (cuBLAS): tensor cores, 2*T*rows*cols flops;
//   attention: fp32 FMA units (tensor cores for attention_tc), 4*head_dim
//     flops per (query head, visible key);
//     for decode (T=1) the cache read, 2*head_dim*elem bytes per visible key
//     and KV head, once the split-KV path has filled the device;
//   merge_partials: memory, parts*(dv+2)*4 bytes per row;
//   argmax / temperature sampling: memory, one or two passes over the logits.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "gpu/attention_tc_tiles.h"
#include "src/common/dtype.h"
#include "src/model/op_kinds.h"

namespace topkv::cuda {

// Throws Error when this build holds no kernels the current device (compute
// capability major.minor) can run, naming the architecture to build for.
void check_kernel_image(int major, int minor);

// ---- elementwise (kernels_elementwise.cu) ------------------------------------
// out[i] = act(gate[i]) * up[i]; out may alias gate or up. Twin: CpuBackend::glu.
void glu(GluKind kind, const float* gate, const float* up, int64_t n, float* out, cudaStream_t stream);
// y[i] += x[i]. Twin: CpuBackend::add.
void add(const float* x, int64_t n, float* y, cudaStream_t stream);
// out[t][:] = scale * table[ids[t]][:] for a table of `cols` columns of type
// `table_type`; ids are device values already checked against the table.
// Twin: CpuBackend::embed.
void embed_rows(DType table_type, const void* table, int64_t cols, const int32_t* ids, int T, float scale,
                float* out, cudaStream_t stream);
// Writes k, v [T][n_kv][head_dim] (fp32) of positions pos0.. into a cache
// [n_kv][capacity][head_dim] of `dtype`, slot = position % capacity. When
// T > capacity only the last `capacity` tokens are written (the earlier ones
// would be overwritten within the chunk anyway). Twin: CpuBackend::kv_write.
// dev_pos (recorded decode steps): when set, the position pos0 is read from
// this device address at run time instead.
void kv_write(DType dtype, void* k_cache, void* v_cache, int n_kv, int head_dim, int64_t capacity,
              const float* k, const float* v, int T, int64_t pos0, cudaStream_t stream,
              const int64_t* dev_pos = nullptr);

// dst[i] = src[i] for n elements, from any host store type (f32, f16, bf16,
// f8 E4M3, q8_0 blocks: n whole blocks) to f32/f16/bf16, through fp32: a prefill ring's past runs of
// another type than the cache's (gpu/cuda_streamed_attention.cpp). Twin:
// to_f32 then from_f32 (src/common/dtype.h).
void convert(DType from, const void* src, DType to, void* dst, int64_t n, cudaStream_t stream);

// ---- norms and RoPE (kernels_norm_rope.cu) -----------------------------------
// out = x / sqrt(mean(x^2) + eps) * w over `rows` rows of `dim`; out may
// alias x. Twin: CpuBackend::rms_norm.
void rms_norm(const float* x, const float* w, int64_t rows, int dim, float eps, float* out, cudaStream_t stream);
// In place on x[T][n_heads][head_dim], token t at position pos0 + t.
// inv_freq (host, n_rot/2 values, <= kMaxRopePairs) is the per-pair angle
// per position, computed in double by the caller exactly as the CPU does.
// Twin: CpuBackend::rope.
inline constexpr int kMaxRopePairs = 256;
// dev_pos as for kv_write.
void rope(float* x, int T, int n_heads, int head_dim, int64_t pos0, RopeStyle style, int n_rot,
          const double* inv_freq, cudaStream_t stream, const int64_t* dev_pos = nullptr);

// ---- attention prologue (kernels_attention_prologue.cu) ----------------------
// QK-norm (when q_norm / k_norm are set) and RoPE in place on q[T][n_head][hd]
// and k[T][n_kv][hd], and, when k_cache is set, the rotated k and v written
// into the cache [n_kv][capacity][hd] of cache_type at slot position %
// capacity: one kernel, one block per token. inv_freq (host, n_rot/2 values)
// as for rope. dev_pos as for kv_write. Twin: Backend::attention_prologue
// (rms_norm, rope and kv_write of the CPU backend).
struct AttentionPrologueArgs {
  float* q = nullptr;
  float* k = nullptr;
  const float* v = nullptr;
  int T = 0, n_head = 0, n_kv = 0, head_dim = 0;
  const float* q_norm = nullptr;  // device, head_dim values, or null
  const float* k_norm = nullptr;
  float eps = 0.f;
  int64_t pos0 = 0;
  const int64_t* dev_pos = nullptr;
  RopeStyle rope_style = RopeStyle::NeoX;
  int rope_n_rot = 0;
  const double* inv_freq = nullptr;  // host
  DType cache_type = DType::F32;
  void* k_cache = nullptr;           // null: no cache write
  void* v_cache = nullptr;
  int64_t capacity = 0;
};
void attention_prologue(const AttentionPrologueArgs& a, cudaStream_t stream);

// ---- matmul (kernels_matmul.cu) ----------------------------------------------
// Tokens up to which matmul runs the GEMV kernel instead of cuBLAS.
inline constexpr int kGemvMaxTokens = 4;
// y[T][rows] = x[T][cols] * W^T (+ bias[rows]) (+ y when accumulate) for W
// [rows][cols] of fp16/bf16/fp32, fp32 accumulation, T <= kGemvMaxTokens. One
// warp per output row streams it once; the epilogue is applied as each row's
// sum is stored. Twin: cpu::matmul with a MatmulEpilogue.
void gemv(DType w_type, const void* w, int64_t rows, int64_t cols, const float* x, int T, float* y,
          cudaStream_t stream, const float* bias = nullptr, bool accumulate = false);
// Work space gemm needs: the 16-bit copy of x (T*cols*2 bytes).
size_t gemm_workspace_bytes(int64_t cols, int T);
// The same product through cuBLAS for any T: x is cast to W's 16-bit type
// into `workspace` (fp16: times a power of two 2^-k chosen on the device so
// that max|x| 2^-k <= 2^15, undone exactly by alpha = 2^k), then
// cublasGemmEx with fp32 accumulation and output. `scalars` is 4 device
// floats of the backend's (absmax, alpha, beta = 0, one). fp32 weights go
// to cublasSgemm unconverted. The epilogue: accumulate is cuBLAS's beta = 1;
// a bias is one more pass over y (add_bias).
void gemm(cublasHandle_t handle, DType w_type, const void* w, int64_t rows, int64_t cols, const float* x, int T,
          float* y, void* workspace, float* scalars, cudaStream_t stream, const float* bias = nullptr,
          bool accumulate = false);
// gemm's two halves, for callers that multiply one cast of x by several
// 16-bit matrices (the quantised prefill: row tiles of a dequantised weight):
// x[T][cols] -> w_type (F16: times 2^-k, alpha = 2^k left in scalars[1];
// BF16: as is) in `workspace` (gemm_workspace_bytes), then
// y[t * ldy + r] = alpha sum_c w[r][c] x16[t][c] (+ y when accumulate), r < rows.
void cast_activations_16bit(DType w_type, const float* x, int T, int64_t cols, void* workspace, float* scalars,
                            cudaStream_t stream);
void gemm_16bit_cast(cublasHandle_t handle, DType w_type, const void* w, int64_t rows, int64_t cols, const void* x16,
                     int T, float* y, int64_t ldy, float* scalars, cudaStream_t stream, bool accumulate);
// y[t][r] += bias[r] for t < T, r < rows. Twin: cpu::matmul's bias epilogue.
void add_bias(float* y, const float* bias, int T, int64_t rows, cudaStream_t stream);

// ---- attention (kernels_attention.cu, kernels_partial_merge.cu) --------------
struct AttentionArgs {
  const float* q = nullptr;  // [T][n_head][head_dim]
  float* out = nullptr;      // [T][n_head][head_dim], not aliasing q
  DType kv_type = DType::F32;
  const void* k = nullptr;   // cache [n_kv][capacity][head_dim], position p at slot p % capacity
  const void* v = nullptr;
  int T = 0, n_head = 0, n_kv = 0, head_dim = 0;
  int64_t pos0 = 0, capacity = 0, window = 0;  // window 0 = no limit
  float scale = 1.f;
  // Key-range calls (the streamed prefill over a host-resident cache,
  // gpu/cuda_streamed_attention.cpp): only keys at positions in
  // [key_begin, key_end) are attended, besides the causal and window bounds
  // (key_end -1: no upper limit). The cache then needs slots for that range
  // only (position p at slot p % capacity). key_begin must be a multiple of
  // kKeyRangeAlign and key_end one too, or past the chunk's last position.
  int64_t key_begin = 0, key_end = -1;
  // With acc_m set the call writes no `out`: it merges its result into the
  // running partial (acc_m, acc_l [T*n_head], acc_o [T*n_head][head_dim],
  // row t*n_head + h) exactly (merge_partials_into); acc_l = 0 marks an
  // empty partial.
  float *acc_m = nullptr, *acc_l = nullptr, *acc_o = nullptr;
};
inline constexpr int64_t kKeyRangeAlign = 64;  // the tensor-core kernel's largest key tile
// The keys a call attends (tc_key_range, gpu/attention_tc_tiles.h).
inline void attention_key_range(const AttentionArgs& a, int64_t* first, int64_t* last) {
  tc_key_range(a.pos0, a.T, a.window, a.key_begin, a.key_end, first, last);
}
// Head dims with a compiled kernel.
bool attention_head_dim_supported(int head_dim);
// Plan of a call: how many key splits (flash-decoding) and the work space for
// their partials. n_splits == 1 writes `out` directly.
struct AttentionPlan {
  int n_splits = 1;
  int64_t split_keys = 0;  // keys per split
  size_t workspace_bytes = 0;
};
AttentionPlan plan_attention(const AttentionArgs& a, int sm_count);
// Causal (and sliding-window) attention of every query over the cache, GQA,
// online softmax in fp32, no T x N matrix. With plan.n_splits > 1 each split
// writes partials (m, l, o) to `workspace` and merge_partials combines them.
// Twin: CpuBackend::attention.
void attention(const AttentionArgs& a, const AttentionPlan& plan, void* workspace, cudaStream_t stream);

// ---- decode attention (kernels_attention_decode.cu) ---------------------------
// One query token (T = 1) over the cache: every query head of a KV head in
// one block (each K/V row read once), split-KV over the keys with a fixed
// plan per cache geometry, so the position may live in device memory
// (recorded decode steps) and each split finds its key range from it.
struct DecodeAttentionArgs {
  const float* q = nullptr;  // [n_head][head_dim]
  float* out = nullptr;      // [n_head][head_dim], not aliasing q
  DType kv_type = DType::F32;
  const void* k = nullptr;   // cache [n_kv][capacity][head_dim], position p at slot p % capacity
  const void* v = nullptr;
  int n_head = 0, n_kv = 0, head_dim = 0;
  int64_t pos = 0, capacity = 0, window = 0;  // the query's position; window 0 = no limit
  const int64_t* dev_pos = nullptr;           // when set, the position is read here (device) instead of pos
  float scale = 1.f;
};
// The two kernels (same contract, same results to fp32 rounding):
//   V2: one 16-warp block per SM (gpu/attention_decode_kernel.cuh);
//   V3: one wave of 4-warp blocks, 4 (R = 4) or 2 (R = 8) per SM, and a
//       parallel merge (gpu/attention_decode_v3_kernel.cuh). The default.
enum class DecodeKernel : int { V2 = 2, V3 = 3 };
// TOPKV_DECODE_ATTN=v2|v3 (unset or empty: v3); anything else throws Error.
DecodeKernel decode_kernel_from_env();
const char* decode_kernel_name(DecodeKernel k);  // "v2", "v3"
struct DecodeAttentionPlan {
  DecodeKernel kernel = DecodeKernel::V3;
  int n_splits = 1;        // blocks per (KV head, row tile) over the keys
  int rows_per_block = 4;  // query heads a block holds (4 or 8)
  int row_tiles = 1;       // blocks per KV head over its query heads
  int blocks_per_sm = 1;   // resident blocks per SM the split count assumes (one wave)
  size_t workspace_bytes = 0;
};
// max_keys: the most keys a query can ever see in this cache (its capacity,
// or the window when that is smaller). The plan depends on nothing else, so
// one plan serves every position.
DecodeAttentionPlan plan_decode_attention(int n_head, int n_kv, int head_dim, int64_t max_keys, int sm_count,
                                          DecodeKernel kernel);
// Twin: CpuBackend::attention with T = 1. The caller has checked that the
// keys the query sees fit in the cache. With plan.n_splits > 1 the partials
// go to `workspace` and a second kernel merges them exactly.
void decode_attention(const DecodeAttentionArgs& a, const DecodeAttentionPlan& plan, void* workspace,
                      cudaStream_t stream);
// Blocks of the plan's kernel instantiation (cache type, head dim, rows)
// the device keeps resident per SM (cudaOccupancyMaxActiveBlocksPerMultiprocessor):
// below plan.blocks_per_sm the one wave becomes two (tests check it).
int decode_attention_resident_blocks(const DecodeAttentionPlan& plan, DType kv_type, int head_dim);
// Raises the decode kernels' shared-memory limits (v2 takes up to 192 KB; v3
// asks the largest carveout so its blocks fit 4 per SM); called once per
// device before the first launch (and before any capture).
void init_decode_attention();

// ---- tensor-core prefill attention (kernels_attention_tc.cu) -----------------
// The same attention for chunks of T >= kTcMinTokens (16) queries and head
// dims 64, 128, 256 (FlashAttention-2 forward: mma.sync m16n8k16 with 16-bit
// Q, K, V, P tiles and fp32 accumulators, online softmax in fp32). Twin:
// CpuBackend::attention. CudaBackend::attention sends a call here when
// attention_tc_supported says so, and to `attention` above otherwise (T < 16:
// decode, short chunks; head dims 32 and 96).
// Accuracy: Q * scale and P are rounded to fp16 (bf16 for a bf16 cache), K
// and V to fp16 when the cache is fp32 (fp16 / bf16 caches are used as
// stored), so the output is no longer the CPU's to ~1e-6. The worst row's
// relative L2 difference, emulated (tests/test_attention_tc_tiles.cpp) with
// scores of sd ~2: ~8e-4 for an fp16 cache, ~1.5e-3 for fp32 (tests allow
// 3e-3), ~8e-3 for bf16 (tests allow 2e-2); it grows with the score
// magnitude (the rounding of Q moves a score by ~|score| 2^-12): ~1e-2 at
// sd ~40 (tests allow 3e-2). fp32 caches must hold |k|, |v| < 65504.
// Bound: tensor cores, 4 * head_dim flops per (query head, visible key).
bool attention_tc_supported(const AttentionArgs& a);
// Splits of the key range (tile-aligned: split_keys is a multiple of the
// kernel's key tile, splits counted from the tile of the first key any query
// sees) so that the blocks fill the device; the work space holds the partials.
AttentionPlan plan_attention_tc(const AttentionArgs& a, int sm_count);
void attention_tc(const AttentionArgs& a, const AttentionPlan& plan, void* workspace, cudaStream_t stream);
// Calls of attention_tc so far in this process (tests: proof of the dispatch).
int64_t attention_tc_launches();

// The exact log-sum-exp merge of `parts` partial attentions per row, then the
// division by l: for row r,
//   M = max_p m[r][p] over parts with l > 0, L = sum_p l[r][p] e^(m[r][p]-M),
//   out[r][:] = sum_p o[r][p][:] e^(m[r][p]-M) / L   (zeros when every part is empty)
// Layout: m, l [rows][parts]; o [rows][parts][dv]; out [rows][dv].
// Twin: partial_merge + partial_finish (gpu/partial_attention.h).
void merge_partials(const float* m, const float* l, const float* o, int64_t rows, int parts, int dv, float* out,
                    cudaStream_t stream);
// The same merge with one more part, the running partial acc (m, l [rows],
// o [rows][dv]), which takes the merged (M, L, unnormalised O) in place of
// `out`: a streamed attention adds its key blocks one at a time.
// Twin: partial_merge (gpu/partial_attention.h).
void merge_partials_into(const float* m, const float* l, const float* o, int64_t rows, int parts, int dv,
                         float* acc_m, float* acc_l, float* acc_o, cudaStream_t stream);
// The three arrays merge_partials reads, carved from one work space of
// n = rows x parts partials: m [n], l [n], then o [n][dv].
inline void carve_partials(void* workspace, size_t n, float*& m, float*& l, float*& o) {
  m = static_cast<float*>(workspace);
  l = m + n;
  o = l + n;
}

// ---- attention over row lists (kernels_rows_attention.cu) ---------------------
// The offloaded decode's partials: for KV head h, the rows listed in
// k_rows/v_rows[h][0 .. counts[h]) (one device-visible pointer per row: device
// memory, or mapped pinned host memory read in place over PCIe), split into
// n_splits ranges; split s of query head h*group+g writes the partial
//   m = max_i s_i, l = sum_i e^(s_i - m), o = sum_i e^(s_i - m) v_i,  s_i = scale q.k_i
// into slot part0 + s of row h*group+g of part_m/l [rows][parts] and
// part_o [rows][parts][head_dim] (m = -inf, l = 0, o = 0 for an empty split),
// ready for merge_partials. Twin: partial_add over the same rows.
// Ring mode (k_ring set): KV head h's rows are instead the ring slots
// (ring_first[h] + r) % ring_cap, r < ring_count[h], of the contiguous rows
// k_ring/v_ring [n_kv][ring_cap][head_dim] — sinks and window on the device,
// whose ranges change every step, passed by value (no upload). With k_prefix
// set, the first prefix_count rows of KV head h come before its ring rows
// from k_prefix/v_prefix [n_kv][prefix_cap][head_dim] (the attention sinks:
// one launch for sinks and window).
constexpr int kMaxRingHeads = 64;
struct RowListArgs {
  const float* q = nullptr;  // [n_kv * group][head_dim], device
  DType row_type = DType::F16;
  const void* const* k_rows = nullptr;  // [n_kv][max_rows], device array of pointers
  const void* const* v_rows = nullptr;
  const int32_t* counts = nullptr;      // [n_kv], device; clamped to max_rows
  int n_kv = 0, group = 1, head_dim = 0, max_rows = 0;
  float scale = 1.f;
  int n_splits = 1, part0 = 0, parts = 1;
  float *part_m = nullptr, *part_l = nullptr, *part_o = nullptr;
  const void* k_ring = nullptr;
  const void* v_ring = nullptr;
  int ring_cap = 0;
  int32_t ring_first[kMaxRingHeads] = {}, ring_count[kMaxRingHeads] = {};
  const void* k_prefix = nullptr;
  const void* v_prefix = nullptr;
  int prefix_cap = 0, prefix_count = 0;
};
void row_list_attention(const RowListArgs& a, cudaStream_t stream);

// ---- search on the device (kernels_summary_search.cu) -------------------------
// The budget-mode search of a summary index (index/kv_index.h,
// SummaryTables), for every KV head of a layer at once, without the host:
//   1. score: x[h][g][j] = score of group j of head h for query head g
//      (centroid: q.C_j; page bounds: q+.M_j + q-.m_j, Quest);
//   2. threshold: per query head, groups by score, largest first, until k
//      tokens are covered. Scores are mapped to 24-bit keys
//      floor((x - lo) * (2^24 - 1) / (hi - lo)) (lo, hi: the head's min and
//      max score) and the cut is the largest key K with weight(key >= K) >= k
//      (all groups when the head holds fewer than k tokens), found by a
//      three-pass radix select; ties at K are all taken;
//   3. gather: a group is selected when any query head of its KV head takes
//      it; the selected groups' rows, in group order, become row pointers
//      (k_rows/v_rows [n_kv][cap], counts [n_kv]) into the host store's
//      pinned chunks. A group that no longer fits `cap` is left unselected;
//   3b. rerank (rerank_k > 0; the step 3 rows are candidates, in the work
//      space, cand_cap a head; k is their budget, R times the rows kept):
//      each candidate row's exact score q.k per query head, from the store
//      row itself, for the query heads whose cut took its group (others: not
//      a candidate for that head); per query head a cut of rerank_k rows as
//      in 2 (weight 1 each); the rows any query head keeps, in candidate
//      order, become the lists (at most cap), and a group counts as selected
//      when one of its rows is kept (the rest of its rows are dropped);
//   4. far (value means set, Multipole): every unselected group j as one
//      weighted row, logit scale.x + ln N_j, value V̄_j, into far_splits
//      partials per query head (part0 .., as row_list_attention). With a
//      spread term (spread > 0, key_var set) the logit gains
//      min(spread scale^2/2 q^2.var_j, ln spread_clip) (far_spread_logit,
//      index/kv_index.h). With far_dropped (and rerank), also the rows of
//      a selected group that 3b did not put in the lists, each as a row of
//      its own: logit scale.q.k (the candidate's exact score, taken for
//      every query head in 3b), value V̄_j of its group (multipole:rerank_far,
//      index/multipole_index.cpp).
// Twins: summary_scores_reference, summary_select_reference,
// summary_rerank_reference, summary_far_logit_reference and
// summary_dropped_reference (gpu/summary_search_ref.h); the far rows:
// partial_add_gather over the unselected groups with those logits (and the
// dropped rows with theirs).
constexpr int kStoreChunkShift = 16;  // RowStore::kChunkShift: row r is in chunk r >> 16 (checked where tables are built)
struct SummaryHead {
  const void* rows = nullptr;          // [n][row_len] of table_type
  const int32_t* counts = nullptr;     // [n]
  const int32_t* offsets = nullptr;    // [n + 1] (centroid); pages: null
  const int32_t* members = nullptr;    // store rows, group by group (centroid)
  const void* value_means = nullptr;   // [n][head_dim] of table_type, or null
  const void* key_var = nullptr;       // [n][head_dim] of table_type: per-dimension key variance (spread), or null
  const uint8_t* const* k_chunks = nullptr;  // the store's chunk pointers (RowStore layout)
  const uint8_t* const* v_chunks = nullptr;
  int32_t n = 0;                       // groups; 0: nothing to search (streaming head)
  int32_t page = 0;                    // page bounds: rows per page
  // Two levels (SummaryTables::coarse_level; SummarySearchArgs::coarse_k > 0):
  // coarse group c bounds the groups [c*coarse_ratio, (c+1)*coarse_ratio).
  const void* coarse_rows = nullptr;   // [coarse_n][row_len] of table_type
  const int32_t* coarse_counts = nullptr;  // [coarse_n] tokens
  int32_t coarse_n = 0, coarse_ratio = 0;
  // i8 tables (src/common/table_codes.h): each table's per-dimension scales,
  // [head_dim] fp32 (an element of dimension d is scale[d] * code; a page
  // bound's M and m share them); null for the other table types.
  const float* rows_scale = nullptr;
  const float* value_means_scale = nullptr;
  const float* key_var_scale = nullptr;
  const float* coarse_rows_scale = nullptr;
};
struct SummarySearchArgs {
  const SummaryHead* heads = nullptr;  // [n_kv], device
  int n_kv = 0, group = 1, head_dim = 0, max_n = 0;  // max_n: the most groups of any head
  bool page_bounds = false;
  DType table_type = DType::F16, store_type = DType::F16;
  const float* q = nullptr;            // [n_kv * group][head_dim]
  int64_t k = 64;                      // token budget per query head
  // Two levels: each query head's coarse cut covers coarse_k tokens, and
  // only the groups of coarse groups some head took are scored and cut at k
  // (no far rows, no rerank). 0: one level.
  int64_t coarse_k = 0;
  float scale = 1.f;                   // logit scale of the far rows
  float spread = 0.f, spread_clip = 1.f;  // the far rows' spread term (step 4); 0: none
  // Work space (summary_search_workspace_bytes): scores, keys' lo/scale, cuts, selection.
  void* workspace = nullptr;
  // Out: the rows to attend, and the far partials.
  const void** k_rows = nullptr;
  const void** v_rows = nullptr;
  int32_t* counts = nullptr;
  int cap = 0;
  // Rerank (3b): 0 off; else the rows each query head keeps of the
  // candidates (k is then the candidates' budget), cand_cap rows a head.
  int64_t rerank_k = 0;
  int cand_cap = 0;
  bool far_dropped = false;  // step 4: the rows 3b drops from selected groups are far rows (needs rerank)
  int far_splits = 0, part0 = 0, parts = 1;
  float *part_m = nullptr, *part_l = nullptr, *part_o = nullptr;
  // Which steps run (benchmarks time them cumulatively): all by default.
  unsigned phases = kSearchScore | kSearchCut | kSearchGather | kSearchFar;
  static constexpr unsigned kSearchScore = 1, kSearchCut = 2, kSearchGather = 4, kSearchFar = 8;
};
size_t summary_search_workspace_bytes(int n_kv, int group, int max_n, int cand_cap = 0, bool far_dropped = false);
// Two levels, for tests: the listed groups of each KV head, in order
// (list [n_kv][max_n], list_n [n_kv]); scores and selected then index them.
const int32_t* summary_listed(const SummarySearchArgs& a);
const int32_t* summary_listed_count(const SummarySearchArgs& a);
void summary_search(const SummarySearchArgs& a, cudaStream_t stream);
// The pieces, for tests: scores [n_kv][group][max_n] and selected [n_kv][max_n]
// inside a workspace laid out by summary_search.
const float* summary_scores(const SummarySearchArgs& a);
const uint8_t* summary_selected(const SummarySearchArgs& a);
// With rerank: row_scores [n_kv][group][cand_cap] (-inf: not a candidate of
// that query head) and the candidates per KV head [n_kv].
const float* summary_row_scores(const SummarySearchArgs& a);
// With far_dropped: each candidate's q.k for every query head
// [n_kv][group][cand_cap], and whether 3b put it in the lists [n_kv][cand_cap].
const float* summary_row_dots(const SummarySearchArgs& a);
const uint8_t* summary_candidate_listed(const SummarySearchArgs& a);
const int32_t* summary_candidate_counts(const SummarySearchArgs& a);

// ---- k-means (kernels_kmeans.cu; the products in cuBLAS, gpu/gpu_kmeans.cpp) --
// Twin of each: the step of LloydKMeans (index/kmeans.h) it names.
// labels[i] = argmax_j scores[i][j] over [n][k] scores, the lowest j on ties
// (kmeans_assign_reference's rule).
void kmeans_argmax_rows(const float* scores, int64_t n, int k, int32_t* labels, cudaStream_t stream);
// sums[j] = the sum of the rows of x [n][d] labelled j, in row order (the
// twin's: bit for bit), and counts[j] their number, for j < k; d <= 1024.
void kmeans_accumulate(const float* x, const int32_t* labels, int64_t n, int64_t k, int d, float* sums,
                       int32_t* counts, cudaStream_t stream);
// centroids[j] = sums[j] / |sums[j]| where the norm is positive; else unchanged (the Lloyd update).
void kmeans_normalise(const float* sums, int64_t k, int d, float* centroids, cudaStream_t stream);

// ---- Quest's page bounds (kernels_page_bounds.cu; gpu/gpu_page_bounds.cpp) --
// out [pages][max (d) | min (d)] of the pages of `page` rows over n_rows
// rows of store type `store` at `rows` ([n_rows][d] elements, back to back;
// the last page may be short). Twin: page_bounds_reference
// (index/page_bounds.h), bit for bit.
void page_bounds(DType store, const void* rows, int64_t n_rows, int d, int64_t page, float* out,
                 cudaStream_t stream);

// ---- sampling (kernels_sampling.cu) ------------------------------------------
// Work space (bytes) the two samplers need for n logits.
size_t sampling_workspace_bytes(int64_t n);
// *result = index of the largest logit (lowest on ties; NaN never wins).
// Twin: topkv::argmax.
void argmax(const float* logits, int64_t n, int32_t* result, void* workspace, cudaStream_t stream);
// *result = the first i with sum_{j<=i} w_j > u * sum_j w_j, where
// w_j = exp((logits[j] - max) / temperature) in double: the draw of
// Sampler::sample for plain temperature sampling given its uniform u; -1
// when rounding leaves no such i (the caller then takes the argmax, as the
// CPU does).
void sample_temperature(const float* logits, int64_t n, float temperature, double u, int32_t* result,
                        void* workspace, cudaStream_t stream);

}  // namespace topkv::cuda
