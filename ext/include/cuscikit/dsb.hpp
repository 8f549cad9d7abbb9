// The discrete simulated bifurcation (dSB) step, written once for the C++ reference and the CUDA
// kernel (Goto et al., "High-performance combinatorial optimization based on classical
// mechanics", Science Advances 7, eabe7953 (2021), DOI 10.1126/sciadv.abe7953).
//
// Bit reproducibility: the coupling sums are exact integers (any summation order gives the same
// int32), and every float operation is one correctly rounded IEEE binary32 operation in a fixed
// order, spelled out with the helpers below (on the device the `__f*_rn` intrinsics, which never
// contract into FMA; on the host plain operators, compiled with -ffp-contract=off). So the C++
// reference and the GPU produce the same bytes.
//
// Layout: spin j of a replica is bit j%32 of word j/32 (bit 1 = +1, x_j >= 0), rows padded with
// zeros to W = ceil(n/32) words.
#pragma once
#include <cstddef>
#include <cstdint>

#include "hd.hpp"
#include "philox.hpp"

namespace csk::dsb {

// ---- correctly rounded binary32 operations ----------------------------------------------------
CSK_HD float fmul(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
CSK_HD float fadd(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
CSK_HD float fsub(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
CSK_HD float fdiv(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
CSK_HD float i2f(std::int32_t a) {
#ifdef __CUDA_ARCH__
  return __int2float_rn(a);
#else
  return static_cast<float>(a);  // round to nearest even (the default rounding mode)
#endif
}
CSK_HD int popc(std::uint32_t w) {
#ifdef __CUDA_ARCH__
  return __popc(w);
#else
  return __builtin_popcount(w);
#endif
}

// ---- initial state ------------------------------------------------------------------------------
// A uniform value in [-0.01, 0.01): the top 24 bits of r, centred, times 2^-23 (exact), times 0.01
// (one rounding).
CSK_HD float init_value(std::uint32_t r) {
  const std::int32_t q = static_cast<std::int32_t>(r >> 8) - (1 << 23);
  return fmul(fmul(i2f(q), 1.0f / 8388608.0f), 0.01f);
}

// x and y of spin i of replica b: Philox4x32-10 with key (seed low 32 bits, seed high 32 bits)
// and counter (i, b, 0, request); x from output 0, y from output 1.
CSK_HD void init_spin(std::uint64_t seed, std::uint32_t i, std::uint32_t b, std::uint32_t request,
                      float& x, float& y) {
  philox::U4 c;
  c.v[0] = i;
  c.v[1] = b;
  c.v[2] = 0u;
  c.v[3] = request;
  const philox::U4 r = philox::philox4x32_10(c, static_cast<std::uint32_t>(seed),
                                             static_cast<std::uint32_t>(seed >> 32));
  x = init_value(r.v[0]);
  y = init_value(r.v[1]);
}

// ---- the step -----------------------------------------------------------------------------------
// Step k of S (k = 1..S): a0 - a(t) for the linear pump a(t) = a0 k/S, as a0 * ((S - k) / S).
CSK_HD float pump(int k, int steps, float a0) { return fmul(a0, fdiv(i2f(steps - k), i2f(steps))); }

// One spin's symplectic update from its field f = (J s + h)_i: kick y, then drift x, then the
// inelastic wall (|x| > 1: x = sgn x, y = 0). p = pump(k), dta0 = dt * a0.
CSK_HD void update(float& x, float& y, float f, float p, float c0, float dt, float dta0) {
  y = fadd(y, fmul(dt, fsub(fmul(c0, f), fmul(p, x))));
  x = fadd(x, fmul(dta0, y));
  if (x > 1.0f) {
    x = 1.0f;
    y = 0.0f;
  } else if (x < -1.0f) {
    x = -1.0f;
    y = 0.0f;
  }
}

CSK_HD int spin_of(const std::uint32_t* v, int i) {
  return ((v[i >> 5] >> (i & 31)) & 1u) ? 1 : -1;
}

// ---- checksum of a sign vector ------------------------------------------------------------------
// MurmurHash3's 64-bit finalizer.
CSK_HD std::uint64_t fmix64(std::uint64_t k) {
  k ^= k >> 33;
  k *= 0xff51afd7ed558ccdull;
  k ^= k >> 33;
  k *= 0xc4ceb9fe1a85ec53ull;
  k ^= k >> 33;
  return k;
}
// The checksum of all replicas' signs is the sum (mod 2^64) of these terms over replicas b and
// words w: order-free, so a parallel reduction gives the same value.
CSK_HD std::uint64_t checksum_term(std::uint32_t b, std::uint32_t nwords, std::uint32_t w,
                                   std::uint32_t word) {
  const std::uint64_t pos = static_cast<std::uint64_t>(b) * nwords + w;
  return fmix64((pos << 32) | word);
}

// ---- exact coupling sums ------------------------------------------------------------------------
enum Kind : int { kBinary = 0, kTernary = 1, kInt8 = 2 };

// The couplings of one model. binary: plus = bits of J_ij = +1 (every off-diagonal J_ij = +-1);
// ternary: plus/minus = bits of J_ij = +1 / -1, degree_i = |plus_i| - |minus_i|; int8: j8 = rows
// of 32 W signed bytes. Diagonal and padding are zero (0 bits, 0 bytes). h: the integer field.
struct Coupling {
  int kind;
  int n;
  int nwords;
  const std::uint32_t* plus;
  const std::uint32_t* minus;
  const std::int32_t* degree;
  const std::int8_t* j8;
  const std::int32_t* h;
};

// The contribution of word w of the signs (vw) to row i's sum, in the kind's own units.
template <int K>
CSK_HD std::int32_t word_sum_k(const Coupling& c, int i, int w, std::uint32_t vw) {
  const std::size_t at = static_cast<std::size_t>(i) * c.nwords + w;
  if (K == kBinary) return popc(c.plus[at] ^ vw);
  if (K == kTernary) return popc(c.plus[at] & vw) - popc(c.minus[at] & vw);
  const std::int8_t* row = c.j8 + at * 32;
  std::int32_t acc = 0;
  for (int bit = 0; bit < 32; ++bit) {
    const std::int32_t j = row[bit];
    acc += ((vw >> bit) & 1u) ? j : -j;
  }
  return acc;
}

CSK_HD std::int32_t word_sum(const Coupling& c, int i, int w, std::uint32_t vw) {
  if (c.kind == kBinary) return word_sum_k<kBinary>(c, i, w, vw);
  if (c.kind == kTernary) return word_sum_k<kTernary>(c, i, w, vw);
  return word_sum_k<kInt8>(c, i, w, vw);
}

// a_i = sum_{j != i} J_ij s_j + h_i from row i's summed word contributions.
//   binary: J_ij s_j = +1 where the bits agree: a = n - 2 popc(u_i ^ v) + s_i (u_ii = 0);
//   ternary: a = 2 (popc(P_i & v) - popc(M_i & v)) - (|P_i| - |M_i|); int8: the plain sum.
CSK_HD std::int32_t field(const Coupling& c, int i, std::int32_t acc, int s_i) {
  std::int32_t a;
  if (c.kind == kBinary) {
    a = c.n - 2 * acc + s_i;
  } else if (c.kind == kTernary) {
    a = 2 * acc - c.degree[i];
  } else {
    a = acc;
  }
  return a + c.h[i];
}

}  // namespace csk::dsb
