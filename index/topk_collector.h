// TopKCollector: keeps the k largest (score, id) pairs seen, in amortised O(1)
// per push: a buffer of up to 2k entries is cut back to k with nth_element
// whenever it fills, and pushes below the current k-th score are dropped.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

namespace topkv {

class TopKCollector {
 public:
  explicit TopKCollector(int64_t k = 0) { reset(k); }
  void reset(int64_t k) {
    k_ = std::max<int64_t>(k, 0);
    buf_.clear();
    buf_.reserve((size_t)std::min<int64_t>(2 * k_, 1 << 20));
    floor_ = -std::numeric_limits<float>::infinity();
  }
  void push(float score, int64_t id) {
    if (k_ == 0 || score < floor_) return;
    buf_.emplace_back(score, id);
    if ((int64_t)buf_.size() >= 2 * k_) shrink();
  }
  void merge(const TopKCollector& o) {
    for (auto& e : o.buf_) push(e.first, e.second);
  }
  float floor() const { return floor_; }
  // The k best, by score descending (ties: smaller id first).
  std::vector<std::pair<float, int64_t>> take_sorted() {
    shrink();
    std::sort(buf_.begin(), buf_.end(), better);
    return std::move(buf_);
  }

 private:
  static bool better(const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  }
  void shrink() {
    if ((int64_t)buf_.size() <= k_) return;
    std::nth_element(buf_.begin(), buf_.begin() + (k_ - 1), buf_.end(), better);
    // After nth_element the k-th best sits at k-1: nothing below it can enter.
    floor_ = buf_[(size_t)k_ - 1].first;
    buf_.resize((size_t)k_);
  }
  int64_t k_ = 0;
  std::vector<std::pair<float, int64_t>> buf_;
  float floor_;
};

}  // namespace topkv
