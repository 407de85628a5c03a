#include "src/common/checksum.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace topkv {

namespace {

constexpr uint64_t P1 = 0x9E3779B185EBCA87ull, P2 = 0xC2B2AE3D27D4EB4Full, P3 = 0x165667B19E3779F9ull,
                   P4 = 0x85EBCA77C2B2AE63ull, P5 = 0x27D4EB2F165667C5ull;
constexpr size_t kBlock = size_t(1) << 20;

inline uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }
inline uint64_t round(uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; }
inline uint64_t load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

uint64_t hash_block(const uint8_t* p, size_t n, uint64_t seed) {
  uint64_t a[4] = {seed + P1 + P2, seed + P2, seed, seed - P1};
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) a[l] = round(a[l], load64(p + i + 8 * l));
  uint64_t h = rotl(a[0], 1) + rotl(a[1], 7) + rotl(a[2], 12) + rotl(a[3], 18);
  for (uint64_t x : a) h = (h ^ round(0, x)) * P1 + P4;
  h += n;
  for (; i + 8 <= n; i += 8) h = rotl(h ^ round(0, load64(p + i)), 27) * P1 + P4;
  for (; i < n; ++i) h = rotl(h ^ (p[i] * P5), 11) * P1;
  h ^= h >> 33, h *= P2, h ^= h >> 29, h *= P3, h ^= h >> 32;
  return h;
}

}  // namespace

uint64_t checksum64(std::span<const ByteSpan> parts) {
  std::vector<size_t> start(parts.size() + 1, 0);  // start[i]: offset of part i in the concatenation
  for (size_t i = 0; i < parts.size(); ++i) start[i + 1] = start[i] + parts[i].bytes;
  const size_t n = start.back(), n_blocks = (n + kBlock - 1) / kBlock;
  std::vector<uint64_t> hashes(n_blocks);
#pragma omp parallel if (n_blocks > 1)
  {
    std::vector<uint8_t> gather;  // a block that spans parts is copied into one buffer
#pragma omp for schedule(static)
    for (size_t b = 0; b < n_blocks; ++b) {
      const size_t lo = b * kBlock, len = std::min(kBlock, n - lo);
      size_t i = (size_t)(std::upper_bound(start.begin(), start.end(), lo) - start.begin()) - 1;
      while (parts[i].bytes == 0) ++i;
      const auto* p = static_cast<const uint8_t*>(parts[i].data) + (lo - start[i]);
      if (lo + len > start[i + 1]) {
        gather.resize(len);
        for (size_t got = 0; got < len; ++i) {
          const size_t from = lo + got - start[i], take = std::min(len - got, parts[i].bytes - from);
          if (take) std::memcpy(gather.data() + got, static_cast<const uint8_t*>(parts[i].data) + from, take);
          got += take;
        }
        p = gather.data();
      }
      hashes[b] = hash_block(p, len, b);
    }
  }
  return hash_block(reinterpret_cast<const uint8_t*>(hashes.data()), hashes.size() * 8, n);
}

}  // namespace topkv
