// Tile geometry of the tensor-core prefill attention (gpu/kernels_attention_tc.cu):
// which key tiles a block walks, which need a mask, which keys a row sees.
// Plain integer code, compiled for the device by the kernel and for the host
// by the CPU test that emulates the kernel's tile loop
// (tests/test_attention_tc_tiles.cpp), so the logic is checked without a GPU.
//
// Terms (see AttentionArgs in gpu/cuda_kernels.h):
//   row     one (token, query head of the GQA group) pair of one KV head,
//           row = t * group + g; its query sits at position pos0 + row / group
//           and sees keys max(0, p - window + 1) .. p (window 0: 0 .. p);
//   block   kTcRows consecutive rows [r0, r0 + kTcRows) of one KV head and
//           one key split;
//   tile    bn consecutive key POSITIONS [i * bn, (i + 1) * bn), aligned to
//           absolute positions, not to ring slots (slot = position % capacity,
//           so a tile's slots may wrap past the end of the ring);
//   split   split_tiles consecutive tiles starting at tile_lo + s * split_tiles
//           (flash-decoding: blocks of one row range over disjoint key ranges,
//           merged exactly by merge_partials).
// Work: 4 * head_dim flops per (row, visible key).
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define TOPKV_HD __host__ __device__ __forceinline__
#else
#define TOPKV_HD inline
#endif

namespace topkv::cuda {

inline constexpr int kTcRows = 128;      // query rows per block: 8 warps x 16 (one m16 tile each)
inline constexpr int kTcWarps = 8;
inline constexpr int kTcMinTokens = 16;  // shorter chunks (decode) stay on the fp32 kernel

// Keys per tile: 64, or 32 for fp32 caches with head_dim >= 128, whose raw
// fp32 staging tiles would not fit beside the 16-bit ones in shared memory.
TOPKV_HD constexpr int tc_tile_keys(int kv_elem_bytes, int head_dim) {
  return kv_elem_bytes == 4 && head_dim >= 128 ? 32 : 64;
}

// The keys a call attends, [*first, *last] inclusive: the causal and window
// bounds of queries pos0 .. pos0 + T - 1, narrowed to [key_begin, key_end)
// (key_end < 0: no upper limit). Empty when first > last.
TOPKV_HD void tc_key_range(int64_t pos0, int T, int64_t window, int64_t key_begin, int64_t key_end, int64_t* first,
                           int64_t* last) {
  const int64_t lo = window > 0 && pos0 - window + 1 > 0 ? pos0 - window + 1 : 0;
  *first = lo > key_begin ? lo : key_begin;
  *last = pos0 + T - 1;
  if (key_end >= 0 && key_end - 1 < *last) *last = key_end - 1;
}

// The positions of a block's first and last real row (rows >= rows_total are
// padding: computed, never written) and the keys any of them sees.
struct TcBlockKeys {
  int64_t p_first, p_last;
  int64_t lo, hi;
};
TOPKV_HD TcBlockKeys tc_block_keys(int64_t pos0, int group, int rows_total, int r0, int64_t window) {
  const int last = (r0 + kTcRows < rows_total ? r0 + kTcRows : rows_total) - 1;
  TcBlockKeys b;
  b.p_first = pos0 + r0 / group;
  b.p_last = pos0 + last / group;
  const int64_t from = b.p_first - window + 1;
  b.lo = window > 0 && from > 0 ? from : 0;
  b.hi = b.p_last;
  return b;
}

// A key-range call (AttentionArgs::key_begin/key_end; positions relative to
// the call's first tile, like b's) narrows the block's keys to [key_lo,
// key_hi]. Both ends sit on tile edges (or past the block's last row), so a
// walked tile needs no mask for the range, only the causal and window ones.
// Rows before key_lo see nothing in this call: an empty partial.
TOPKV_HD void tc_clamp_keys(TcBlockKeys* b, int64_t key_lo, int64_t key_hi) {
  if (b->lo < key_lo) b->lo = key_lo;
  if (b->hi > key_hi) b->hi = key_hi;
}

// Tiles [*first, *last] (inclusive; empty when first > last) that block b
// walks within split `split`. The union of the rows' key ranges is the one
// interval [lo, hi], so every tile in it holds a key some row sees: no walked
// tile is fully masked.
TOPKV_HD void tc_block_tiles(const TcBlockKeys& b, int bn, int64_t tile_lo, int64_t split_tiles, int split,
                             int64_t* first, int64_t* last) {
  const int64_t s_first = tile_lo + (int64_t)split * split_tiles, s_last = s_first + split_tiles - 1;
  const int64_t b_first = b.lo / bn, b_last = b.hi / bn;
  *first = b_first > s_first ? b_first : s_first;
  *last = b_last < s_last ? b_last : s_last;
  if (b.lo > b.hi) *last = *first - 1;  // no key (hi may be negative: / rounds towards 0)
}

// True when every row of the block sees every key of the tile starting at
// kt: the tile needs no mask (and all its keys lie in [lo, hi]).
// (The kernel calls these with int positions relative to its first tile.)
template <class I> TOPKV_HD bool tc_tile_full(I p_first, I p_last, I kt, int bn, I window) {
  return kt + bn - 1 <= p_first && (window <= 0 || kt >= p_last - window + 1);
}

// The keys j (0 <= j < bn) of the tile starting at kt that the query at
// position p sees are lo_rel <= j <= hi_rel (empty when lo_rel > hi_rel);
// clamped to [-1, bn] so that they fit an int.
template <class I> TOPKV_HD void tc_row_bounds(I p, I kt, int bn, I window, int* lo_rel, int* hi_rel) {
  I hi = p - kt, lo = window > 0 ? p - window + 1 - kt : 0;
  hi = hi < -1 ? -1 : (hi > bn ? bn : hi);
  lo = lo < 0 ? 0 : (lo > bn ? bn : lo);
  *lo_rel = (int)lo, *hi_rel = (int)hi;
}

// Ring slot of position kt + j, given s0 = kt % capacity and 0 <= j < bn
// (a ring may be shorter than a tile: sliding layers of tiny windows).
template <class I> TOPKV_HD I tc_slot(I s0, int j, I capacity) {
  I s = s0 + j;
  while (s >= capacity) s -= capacity;
  return s;
}

// The key split of a call over keys [key_first, key_last] (attention_key_range):
// tiles from tile_lo, split_tiles per split. The host plans it
// (plan_attention_tc); the CPU emulation reuses it.
struct TcSplit {
  int64_t tile_lo = 0, split_tiles = 1;
  int n_splits = 1;
};
// Splits so that row_tiles * n_kv * n_splits blocks fill `wave` resident
// blocks about twice over when the rows alone do not fill one wave, each
// split at least kMinTiles tiles, at most kMaxSplits splits.
inline TcSplit tc_plan_split(int T, int group, int n_kv, int64_t key_first, int64_t key_last, int bn,
                             int64_t wave) {
  constexpr int64_t kMinTiles = 4, kMaxSplits = 64;
  TcSplit s;
  s.tile_lo = key_first / bn;
  const int64_t tiles = key_last >= key_first ? key_last / bn - s.tile_lo + 1 : 1;
  const int64_t row_tiles = ((int64_t)T * group + kTcRows - 1) / kTcRows, base = row_tiles * n_kv;
  int64_t want = 1;
  if (base < wave) {
    want = 2 * wave / base;
    const int64_t by_len = (tiles + kMinTiles - 1) / kMinTiles;
    if (want > by_len) want = by_len;
    if (want > kMaxSplits) want = kMaxSplits;
    if (want < 1) want = 1;
  }
  s.split_tiles = (tiles + want - 1) / want;
  s.n_splits = (int)((tiles + s.split_tiles - 1) / s.split_tiles);
  return s;
}

}  // namespace topkv::cuda
