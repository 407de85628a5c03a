// Counter-seeded random streams for the synthetic data generator: every
// block of rows and every query draws from its own stream, seeded from
// (seed, stream kind, index...), so results do not depend on how work is
// split between threads. xoshiro256** (Blackman & Vigna, 2018) seeded through
// splitmix64; normals by Marsaglia's polar method. Self-contained, so the data
// is the same with any standard library.
#pragma once
#include <cmath>
#include <cstdint>

namespace topkv {

inline uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// xoshiro256** (Blackman & Vigna) seeded through splitmix64 from (seed, a, b, c).
class Rng {
 public:
  Rng(uint64_t seed, uint64_t a, uint64_t b = 0, uint64_t c = 0) {
    uint64_t s = seed;
    for (uint64_t x : {a, b, c}) {
      s ^= x + 0x632be59bd9b4e019ull + (s << 6) + (s >> 2);
      splitmix64(s);
    }
    for (auto& w : s_) w = splitmix64(s);
  }
  uint64_t next() {
    const uint64_t r = rotl(s_[1] * 5, 7) * 9, t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return r;
  }
  double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  int64_t below(int64_t n) { return (int64_t)(uniform() * (double)n); }
  // Marsaglia's polar method (no trigonometry); the second value of each pair
  // is kept for the next call.
  double normal() {
    if (have_spare_) {
      have_spare_ = false;
      return spare_;
    }
    double u, v, s;
    do {
      u = 2.0 * uniform() - 1.0;
      v = 2.0 * uniform() - 1.0;
      s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    const double f = std::sqrt(-2.0 * std::log(s) / s);
    spare_ = v * f;
    have_spare_ = true;
    return u * f;
  }
 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
  double spare_ = 0;
  bool have_spare_ = false;
};

}  // namespace topkv
