// Quest's page bounds on the device (`--build-on gpu`, and `auto` on the CUDA
// runtime): each call copies the store's rows of its pages up raw (pinned
// store chunks at the bus's rate; a heap store, `index build`'s, staged by
// the driver), bounds them there (cuda::page_bounds, gpu/kernels_page_bounds.cu)
// and hands the finished [M | m] rows back, so the host cores never decode a
// key for them. Blocks of 16,384 rows at a time; calls from the build
// threads take turns on one stream of its own, beside the prefill's. Device
// memory comes from `be` (counted against --gpu-mem-budget as "page bounds
// work space": a block's raw rows and its bounds). Twin: page_bounds_reference
// (index/page_bounds.h), bit for bit (tests/gpu/test_gpu_page_bounds.cpp).
#pragma once
#include <memory>

#include "index/page_bounds.h"
#include "src/model/backend.h"

namespace topkv {

// Throws Error in a build without CUDA, and when `be` is not a CUDA backend.
std::shared_ptr<const PageBoundsEngine> make_gpu_page_bounds(Backend& be);

}  // namespace topkv
