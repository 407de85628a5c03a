// checksum64: a fast 64-bit checksum for large files (context packs, which
// generate verifies before any work). The bytes are cut into 1 MiB blocks;
// each block is hashed with the XXH64 round (Collet, xxHash, "XXH64
// algorithm": four lanes over 32-byte stripes, multiply-rotate-multiply, then
// the avalanche) seeded with its block number, blocks in parallel (OpenMP),
// and the block hashes are hashed again in order with the length as seed. So
// it runs at memory bandwidth on many cores and its value does not depend on
// the thread count. Not bit-compatible with XXH64; it catches truncation,
// reordering and bit rot, not an adversary.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>

namespace topkv {

struct ByteSpan {
  const void* data;
  size_t bytes;
};

// Of the concatenation of `parts` (a tensor kept in several chunks hashes as
// the same bytes in one buffer would).
uint64_t checksum64(std::span<const ByteSpan> parts);
inline uint64_t checksum64(const void* data, size_t n) {
  const ByteSpan s{data, n};
  return checksum64(std::span<const ByteSpan>(&s, 1));
}

}  // namespace topkv
