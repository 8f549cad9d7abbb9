// Philox4x32-10, the counter-based generator of Salmon et al., "Parallel random numbers: as easy
// as 1, 2, 3" (SC11, DOI 10.1145/2063384.2063405): four 32-bit outputs are a pure function of a
// 128-bit counter and a 64-bit key, so every (seed, replica, spin) draws the same numbers on the
// CPU and on the GPU, whatever the thread layout. Integer operations only.
#pragma once
#include <cstdint>

#include "hd.hpp"

namespace csk::philox {

struct U4 {
  std::uint32_t v[4];
};

constexpr std::uint32_t kM0 = 0xD2511F53u;  // round multipliers
constexpr std::uint32_t kM1 = 0xCD9E8D57u;
constexpr std::uint32_t kW0 = 0x9E3779B9u;  // key schedule (Weyl) increments
constexpr std::uint32_t kW1 = 0xBB67AE85u;

CSK_HD void mulhilo(std::uint32_t a, std::uint32_t b, std::uint32_t& hi, std::uint32_t& lo) {
  const std::uint64_t p = static_cast<std::uint64_t>(a) * static_cast<std::uint64_t>(b);
  hi = static_cast<std::uint32_t>(p >> 32);
  lo = static_cast<std::uint32_t>(p);
}

// Philox4x32 with 10 rounds: counter (c0, c1, c2, c3), key (k0, k1).
CSK_HD U4 philox4x32_10(U4 c, std::uint32_t k0, std::uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += kW0;
      k1 += kW1;
    }
    std::uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kM0, c.v[0], hi0, lo0);
    mulhilo(kM1, c.v[2], hi1, lo1);
    U4 o;
    o.v[0] = hi1 ^ c.v[1] ^ k0;
    o.v[1] = lo1;
    o.v[2] = hi0 ^ c.v[3] ^ k1;
    o.v[3] = lo0;
    c = o;
  }
  return c;
}

}  // namespace csk::philox
