// The merge loop both tokenizers share. A word is a row of adjacent symbols
// (spans of one string); repeatedly the adjacent pair with the highest
// priority is fused into one symbol, leftmost first on ties, until no
// adjacent pair can be fused. SentencePiece BPE ranks a pair by the score of
// the piece it forms; byte-level BPE by the rank of its merge rule (priority
// = -rank). Both are exactly this loop.
//
// GreedyMerger is the fast version (a heap of candidate pairs with lazy
// deletion, O(n log n); after llama.cpp's llm_tokenizer_spm_session and
// llm_tokenizer_bpe_session). merge_reference is the plain O(n^2) version it
// is tested against: scan every pair, fuse the best, repeat.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

namespace topkv {

struct MergeSymbol {
  uint32_t begin, len;  // bytes of the underlying string; len 0 = absorbed
  int32_t prev, next;   // neighbours in the row (-1 at the ends)
  int32_t id;           // token this span is, or -1 when it is none
};

// What fusing two adjacent symbols would give: the token `id` with the
// priority `priority`; id < 0 when the pair cannot be fused.
struct MergeCandidate {
  double priority;
  int32_t id;
};

// Links `syms` into a row (prev/next) in index order.
inline void link_symbols(std::vector<MergeSymbol>& syms) {
  const int32_t n = (int32_t)syms.size();
  for (int32_t i = 0; i < n; ++i) {
    syms[i].prev = i - 1;
    syms[i].next = i + 1 < n ? i + 1 : -1;
  }
}

inline void fuse(std::vector<MergeSymbol>& syms, int32_t left, int32_t id) {
  MergeSymbol& l = syms[left];
  MergeSymbol& r = syms[l.next];
  l.len += r.len;
  l.id = id;
  r.len = 0;
  l.next = r.next;
  if (r.next >= 0) syms[r.next].prev = left;
}

class GreedyMerger {
 public:
  // pair(const MergeSymbol& left, const MergeSymbol& right) -> MergeCandidate.
  // Reusable: keeps its heap's memory between calls.
  template <class PairFn>
  void run(std::vector<MergeSymbol>& syms, PairFn&& pair) {
    heap_.clear();
    for (int32_t i = 0; i + 1 < (int32_t)syms.size(); ++i) push(syms, i, pair);
    while (!heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), Lower{});
      const Item it = heap_.back();
      heap_.pop_back();
      const MergeSymbol& l = syms[it.left];
      // Stale: the left symbol was absorbed, or either side grew since the
      // pair was queued (spans only ever grow, so equal total size means the
      // very same two spans; the right one starts where the left one ends).
      if (l.len == 0 || l.next < 0 || l.len + syms[l.next].len != it.size) continue;
      fuse(syms, it.left, it.id);
      if (syms[it.left].prev >= 0) push(syms, syms[it.left].prev, pair);
      push(syms, it.left, pair);
    }
  }

 private:
  struct Item {
    double priority;
    int32_t left;
    uint32_t size;
    int32_t id;
  };
  // Max-heap order: higher priority first, then the leftmost.
  struct Lower {
    bool operator()(const Item& a, const Item& b) const {
      return a.priority < b.priority || (a.priority == b.priority && a.left > b.left);
    }
  };
  template <class PairFn>
  void push(const std::vector<MergeSymbol>& syms, int32_t left, PairFn& pair) {
    const MergeSymbol& l = syms[left];
    if (l.next < 0) return;
    const MergeSymbol& r = syms[l.next];
    const MergeCandidate c = pair(l, r);
    if (c.id < 0) return;
    heap_.push_back({c.priority, left, l.len + r.len, c.id});
    std::push_heap(heap_.begin(), heap_.end(), Lower{});
  }
  std::vector<Item> heap_;
};

// The plain reference: O(n^2), obviously the rule stated at the top.
template <class PairFn>
void merge_reference(std::vector<MergeSymbol>& syms, PairFn&& pair) {
  if (syms.empty()) return;
  for (;;) {
    int32_t best = -1;
    MergeCandidate best_c{0, -1};
    for (int32_t i = 0; syms[i].next >= 0; i = syms[i].next) {
      const MergeCandidate c = pair(syms[i], syms[syms[i].next]);
      if (c.id >= 0 && (best < 0 || c.priority > best_c.priority)) best = i, best_c = c;
    }
    if (best < 0) return;
    fuse(syms, best, best_c.id);
  }
}

}  // namespace topkv
