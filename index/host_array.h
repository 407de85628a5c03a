// HostArray<T>: one of an index's large arrays (centroids, counts, member
// lists, page bounds). It either owns its elements (an index built here, or
// loaded from a standalone index file) or lives in place in a context pack:
// a private, writable mapping of the pack's tensor
// (SafetensorsReader::map_copy_on_write). Reading such an array reads the
// page cache; the first write to a page (a decode step folding a key into a
// cluster: its count and running means) gives this process its own copy of
// that one page, and the file never changes (issue 6: "the index structures
// are used in place, not copied").
//
// The size of a mapped array is fixed. Code that must grow or reshape an
// array (a build) calls vec(), which turns a mapped array into an owned copy
// first; decode paths never do.
#pragma once
#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

namespace topkv {

template <typename T>
class HostArray {
 public:
  HostArray() = default;
  HostArray(std::vector<T> v) : own_(std::move(v)) {}  // NOLINT: an owned array converts implicitly
  HostArray(std::initializer_list<T> l) : own_(l) {}
  // `n` elements at `data`, kept alive (and unmapped at the end) by `owner`.
  static HostArray mapped(T* data, size_t n, std::shared_ptr<void> owner) {
    HostArray a;
    if (n == 0) return a;
    a.view_ = data, a.n_ = n, a.owner_ = std::move(owner);
    return a;
  }

  size_t size() const { return view_ ? n_ : own_.size(); }
  bool empty() const { return size() == 0; }
  T* data() { return view_ ? view_ : own_.data(); }
  const T* data() const { return view_ ? view_ : own_.data(); }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T* begin() { return data(); }
  T* end() { return data() + size(); }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size(); }

  size_t owned_bytes() const { return own_.capacity() * sizeof(T); }
  size_t mapped_bytes() const { return view_ ? n_ * sizeof(T) : 0; }

  // The elements as a vector to grow or reshape (build paths): a mapped array
  // is copied into memory first and no longer uses the mapping.
  std::vector<T>& vec() {
    if (view_) {
      own_.assign(view_, view_ + n_);
      view_ = nullptr, n_ = 0, owner_.reset();
    }
    return own_;
  }

  friend bool operator==(const HostArray& a, const HostArray& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  std::vector<T> own_;
  T* view_ = nullptr;  // mapped elements, or null when owned
  size_t n_ = 0;
  std::shared_ptr<void> owner_;
};

}  // namespace topkv
