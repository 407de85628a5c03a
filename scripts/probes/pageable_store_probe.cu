// Can the GPU read a context pack's host store in place — rows of the pack's
// read-only file mapping — instead of from a pinned copy (issue 6)? The GPU
// runtime's kernels read the rows a search retrieved straight from host
// memory (gpu/kernels_rows_attention.cu). Registering the mapping with
// cudaHostRegister hung on the H200 host (bench/results/gpu_h100_session4/
// h200_tests/pack_registration_hang.log), so this asks the other way in:
// pageable memory access (HMM, or ATS), where a kernel dereferences any host
// pointer and the driver maps the pages on first touch.
//
// It writes a file of random rows (512 B: head_dim 256 in f16, Gemma 3's),
// maps it as a pack is mapped (PROT_READ, MAP_PRIVATE), and times one gather
// kernel (a warp per row sums its row) over the same random row sets read
// (a) from a pinned, device-mapped copy (what the runtime does now) and
// (b) from the file mapping: cold (pages never touched by the GPU), warm (the
// same sets again), and a sweep over every row. It checks both give the same
// sums and reports the device memory in use before and after (a driver that
// migrated the pages to the GPU would show it there).
//
// Build: nvcc -O2 -std=c++17 -arch=sm_90 -o pageable_store_probe scripts/probes/pageable_store_probe.cu
// Run:   pageable_store_probe [GiB=2] [rows per step=10368] [steps=20] [file=/tmp/pageable_probe.bin]
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

constexpr size_t kRowBytes = 512;

// One warp per row: 32 lanes x 16 bytes; the row's bytes summed as uint32.
__global__ void gather_sum(const uint8_t* base, const int64_t* rows, int n, uint32_t* out) {
  const int warp = (int)((blockIdx.x * blockDim.x + threadIdx.x) / 32), lane = threadIdx.x % 32;
  if (warp >= n) return;
  const uint4 v = reinterpret_cast<const uint4*>(base + (size_t)rows[warp] * kRowBytes)[lane];
  uint32_t s = 0;
  for (uint32_t w : {v.x, v.y, v.z, v.w}) s += (w & 0xff) + (w >> 8 & 0xff) + (w >> 16 & 0xff) + (w >> 24);
  for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
  if (lane == 0) out[warp] = s;
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Timing {
  double ms;
  std::vector<uint32_t> sums;
};

Timing run(const uint8_t* base, const std::vector<int64_t>& rows, int64_t* d_rows, uint32_t* d_out) {
  const int n = (int)rows.size();
  CK(cudaMemcpy(d_rows, rows.data(), rows.size() * sizeof(int64_t), cudaMemcpyHostToDevice));
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  CK(cudaEventRecord(a));
  gather_sum<<<(n * 32 + 255) / 256, 256>>>(base, d_rows, n, d_out);
  CK(cudaEventRecord(b));
  CK(cudaEventSynchronize(b));
  CK(cudaGetLastError());
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, a, b));
  Timing t{ms, std::vector<uint32_t>((size_t)n)};
  CK(cudaMemcpy(t.sums.data(), d_out, (size_t)n * sizeof(uint32_t), cudaMemcpyDeviceToHost));
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return t;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

size_t used_mib() {
  size_t free = 0, total = 0;
  CK(cudaMemGetInfo(&free, &total));
  return (total - free) >> 20;
}

int main(int argc, char** argv) {
  const double gib = argc > 1 ? std::atof(argv[1]) : 2.0;
  const int per_step = argc > 2 ? std::atoi(argv[2]) : 3 * 3456;  // Gemma 1M: 3 layers x ~3456 rows
  const int steps = argc > 3 ? std::atoi(argv[3]) : 20;
  const std::string path = argc > 4 ? argv[4] : "/tmp/pageable_probe.bin";
  const size_t bytes = (size_t)(gib * (1ull << 30)) / kRowBytes * kRowBytes;
  const int64_t n_rows = (int64_t)(bytes / kRowBytes);

  int dev = 0, pageable = 0, host_tables = 0, managed = 0, reg = 0, reg_ro = 0;
  CK(cudaGetDevice(&dev));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, dev));
  CK(cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, dev));
  CK(cudaDeviceGetAttribute(&host_tables, cudaDevAttrPageableMemoryAccessUsesHostPageTables, dev));
  CK(cudaDeviceGetAttribute(&managed, cudaDevAttrConcurrentManagedAccess, dev));
  CK(cudaDeviceGetAttribute(&reg, cudaDevAttrHostRegisterSupported, dev));
  CK(cudaDeviceGetAttribute(&reg_ro, cudaDevAttrHostRegisterReadOnlySupported, dev));
  int driver = 0;
  CK(cudaDriverGetVersion(&driver));
  std::printf("device %s, driver %d\n", prop.name, driver);
  std::printf("pageableMemoryAccess %d, usesHostPageTables (ATS) %d, concurrentManagedAccess %d, hostRegister %d, "
              "hostRegisterReadOnly %d\n", pageable, host_tables, managed, reg, reg_ro);

  // The file: random bytes, written once (it is then in the page cache, as a
  // pack is after `generate` verified its checksums).
  double t0 = now();
  {
    const int fd = ::open(path.c_str(), O_CREAT | O_TRUNC | O_WRONLY, 0644);
    if (fd < 0) return std::perror("open"), 1;
    std::vector<uint64_t> block((64u << 20) / 8);
    std::mt19937_64 rng(7);
    for (size_t done = 0; done < bytes;) {
      for (auto& x : block) x = rng();
      const size_t m = std::min(bytes - done, block.size() * 8);
      if (::write(fd, block.data(), m) != (ssize_t)m) return std::perror("write"), 1;
      done += m;
    }
    ::close(fd);
  }
  std::printf("wrote %.2f GiB in %.2f s\n", bytes / double(1ull << 30), now() - t0);
  const int fd = ::open(path.c_str(), O_RDONLY);
  auto* map = static_cast<const uint8_t*>(::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0));
  if (map == MAP_FAILED) return std::perror("mmap"), 1;

  const size_t used0 = used_mib();
  // (a) the runtime's way: a pinned, device-mapped copy.
  uint8_t* pinned = nullptr;
  t0 = now();
  CK(cudaHostAlloc(&pinned, bytes, cudaHostAllocMapped | cudaHostAllocPortable));
  const double alloc_s = now() - t0;
  t0 = now();
  std::memcpy(pinned, map, bytes);
  const double copy_s = now() - t0;
  std::printf("pinned copy: cudaHostAlloc %.3f s + memcpy %.3f s (%.1f GB/s)\n", alloc_s, copy_s,
              bytes / copy_s / 1e9);

  int64_t* d_rows = nullptr;
  uint32_t* d_out = nullptr;
  const int cap = (int)std::min<int64_t>(n_rows, std::max<int64_t>(per_step, 1 << 20));
  CK(cudaMalloc(&d_rows, (size_t)cap * sizeof(int64_t)));
  CK(cudaMalloc(&d_out, (size_t)cap * sizeof(uint32_t)));
  std::mt19937_64 rng(11);
  std::vector<std::vector<int64_t>> sets((size_t)steps);
  for (auto& s : sets) {
    s.resize((size_t)per_step);
    for (auto& r : s) r = (int64_t)(rng() % (uint64_t)n_rows);
  }
  std::vector<double> pinned_ms, cold_ms, warm_ms;
  for (auto& s : sets) pinned_ms.push_back(run(pinned, s, d_rows, d_out).ms);
  const double mb = per_step * kRowBytes / 1e6;
  std::printf("(a) pinned copy:   median %.3f ms per step of %d rows (%.2f MB, %.1f GB/s)\n", median(pinned_ms),
              per_step, mb, mb / median(pinned_ms));
  if (!pageable) {
    std::printf("(b) file mapping:  not possible: this device has no pageable memory access\n");
    return 0;
  }
  bool same = true;
  for (auto& s : sets) {
    Timing t = run(map, s, d_rows, d_out);
    same = same && t.sums == run(pinned, s, d_rows, d_out).sums;
    cold_ms.push_back(t.ms);
  }
  for (auto& s : sets) warm_ms.push_back(run(map, s, d_rows, d_out).ms);
  std::printf("(b) file mapping:  cold median %.3f ms (first %.3f), warm median %.3f ms; sums %s\n",
              median(cold_ms), cold_ms[0], median(warm_ms), same ? "equal" : "DIFFER");
  // Every row once, in blocks: the whole store's first touch.
  t0 = now();
  std::vector<int64_t> all;
  for (int64_t lo = 0; lo < n_rows; lo += cap) {
    all.resize((size_t)std::min<int64_t>(cap, n_rows - lo));
    for (size_t i = 0; i < all.size(); ++i) all[i] = lo + (int64_t)i;
    run(map, all, d_rows, d_out);
  }
  const double sweep_s = now() - t0;
  std::printf("(b) sweep of every row from the mapping: %.3f s (%.1f GB/s)\n", sweep_s, bytes / sweep_s / 1e9);
  std::vector<double> after_ms;
  for (auto& s : sets) after_ms.push_back(run(map, s, d_rows, d_out).ms);
  std::printf("(b) after the sweep: median %.3f ms per step\n", median(after_ms));
  std::printf("device memory in use: %zu MiB before, %zu MiB after (pinned copy is host memory)\n", used0,
              used_mib());
  std::printf("SUMMARY pinned %.3f ms | mapped cold %.3f ms warm %.3f ms after-sweep %.3f ms | sweep %.2f s | copy "
              "%.2f s | sums %s\n", median(pinned_ms), median(cold_ms), median(warm_ms), median(after_ms), sweep_s,
              alloc_s + copy_s, same ? "equal" : "DIFFER");
  return 0;
}
