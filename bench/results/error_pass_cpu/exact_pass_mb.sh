#!/usr/bin/env bash
# The microbenchmark of README.md: builds against build/libtopkv_core.a (from the repo root, after
# the CMake build) and runs it at the two geometries, 1 and 2 threads. The source is here, not
# as a .cpp file: CMake globs bench/ into the library.
set -eu
cd "$(dirname "$0")/../../.."
src=$(mktemp --suffix=.cpp)
cat > "$src" <<'CPP'
#include <chrono>
#include <cstdio>
#include <random>
#include "offload/partial_attention.h"
using namespace topkv;
// The exact pass before session 26 (partial_exact at 546d3c6), per query.
static AttnPartial old_exact(const float* q, float scale, const RowStore& keys, const RowStore& values, int64_t n, float* scores) {
  constexpr int64_t kBlock = 16384;
  const int64_t nb = (n + kBlock - 1) / kBlock;
  std::vector<AttnPartial> blocks((size_t)nb, AttnPartial(values.dim()));
#pragma omp parallel for schedule(dynamic, 1) if (nb > 1)
  for (int64_t b = 0; b < nb; ++b) {
    const int64_t lo = b * kBlock, m = std::min(kBlock, n - lo);
    std::vector<float> s((size_t)m); std::vector<int64_t> ids((size_t)m);
    for (int64_t i = 0; i < m; ++i) s[(size_t)i] = keys.dot(lo + i, q) * scale, ids[(size_t)i] = lo + i;
    if (scores) std::copy(s.begin(), s.end(), scores + lo);
    partial_add_rows(blocks[(size_t)b], s.data(), values, ids.data(), m);
  }
  AttnPartial p(values.dim());
  for (const AttnPartial& b : blocks) partial_merge(p, b);
  return p;
}
int main() {
  std::mt19937 rng(1); std::normal_distribution<float> nd;
  const int d = D, G = GG; const int64_t n = N;
  RowStore K(d, DType::F16), V(d, DType::F16);
  std::vector<float> rows((size_t)n * d); for (auto& x : rows) x = nd(rng);
  K.append_f32(rows.data(), n); for (auto& x : rows) x = nd(rng); V.append_f32(rows.data(), n);
  std::vector<float> q((size_t)G * d); for (auto& x : q) x = nd(rng);
  std::vector<float> sc((size_t)G * n);
  double best_old = 1e9, best_new = 1e9;
  for (int r = 0; r < 7; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    float sink = 0;
    for (int g = 0; g < G; ++g) { auto p = old_exact(q.data() + g * d, 0.088f, K, V, n, sc.data() + g * n); sink += p.l; }
    auto t1 = std::chrono::steady_clock::now();
    std::vector<AttnPartial> out; partial_exact_group(q.data(), G, 0.088f, K, V, n, out, sc.data());
    auto t2 = std::chrono::steady_clock::now();
    best_old = std::min(best_old, std::chrono::duration<double>(t1 - t0).count());
    best_new = std::min(best_new, std::chrono::duration<double>(t2 - t1).count());
    if (sink < 0) std::puts("x");
  }
  std::printf("G=%d d=%d n=%lld: per-query passes %.2f ms, one group pass %.2f ms (x%.2f)\n", G, d, (long long)n, best_old * 1e3, best_new * 1e3, best_old / best_new);
}
CPP
for geo in "-DD=128 -DGG=6 -DN=16384" "-DD=64 -DGG=7 -DN=32768"; do
  # shellcheck disable=SC2086
  g++ -O2 -std=c++20 -fopenmp -I. $geo "$src" build/libtopkv_core.a -lfmt -o "$src.bin"
  for t in 1 2; do OMP_NUM_THREADS=$t "$src.bin"; done
done
rm -f "$src" "$src.bin"
