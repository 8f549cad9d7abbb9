// Slater-Condon rules for interleaved spin orbitals (bit 2p = orbital p alpha, 2p+1 = p beta).
//
// H = sum_pq h_pq a+_p a_q + 1/2 sum_pqrs (pq|rs) a+_p a+_r a_s a_q + E_core, chemists' notation.
// Determinants are ordered products of creation operators in increasing spin-orbital index, so
// a_k acting on |x> gives (-1)^(number of occupied orbitals below k).
#pragma once
#include "bits.hpp"

namespace csk {

// A read-only view of the spatial-orbital integrals: h1 is norb*norb, eri the full norb^4 array.
struct HamiltonianView {
  int norb;
  const double* h1;
  const double* eri;
  double e_core;

  CSK_HD double h(int p, int q) const { return h1[p * norb + q]; }
  CSK_HD double g(int p, int q, int r, int s) const {
    return eri[((static_cast<csk_i64>(p) * norb + q) * norb + r) * norb + s];
  }
  // Antisymmetrised spin-orbital integral <ab||ij> = <ab|ij> - <ab|ji>, <ab|ij> = (ai|bj).
  CSK_HD double antisym(int a, int b, int i, int j) const {
    double v = 0.0;
    if (((a ^ i) & 1) == 0 && ((b ^ j) & 1) == 0) v += g(a >> 1, i >> 1, b >> 1, j >> 1);
    if (((a ^ j) & 1) == 0 && ((b ^ i) & 1) == 0) v -= g(a >> 1, j >> 1, b >> 1, i >> 1);
    return v;
  }
};

// <x|H|x> including E_core; occ holds the n occupied spin orbitals of x.
CSK_HD double diagonal_element(const HamiltonianView& H, const int* occ, int n) {
  double e = H.e_core;
  for (int u = 0; u < n; ++u) {
    int i = occ[u], pi = i >> 1;
    e += H.h(pi, pi);
    for (int v = 0; v < u; ++v) {
      int j = occ[v], pj = j >> 1;
      e += H.g(pi, pi, pj, pj);
      if (((i ^ j) & 1) == 0) e -= H.g(pi, pj, pj, pi);
    }
  }
  return e;
}

// Sign of a+_a a_i |x> (i occupied, a empty in x).
CSK_HD double single_sign(const csk_u64* x, int i, int a) {
  int n = count_below(x, i) + count_below(x, a);
  if (i < a) n -= 1;  // i itself was removed before a+_a counts the orbitals below a
  return (n & 1) ? -1.0 : 1.0;
}

// Sign of a+_a a+_b a_j a_i |x> (i<j occupied, a<b empty; all four distinct).
CSK_HD double double_sign(const csk_u64* x, int i, int j, int a, int b) {
  int n = count_below(x, i) + count_below(x, j) - 1;  // after a_i, j sees one fewer below
  // After removing i and j: orbitals below b, then below a with b present.
  int nb = count_below(x, b) - (i < b) - (j < b);
  int na = count_below(x, a) - (i < a) - (j < a) + (b < a);
  n += nb + na;
  return (n & 1) ? -1.0 : 1.0;
}

// <x'|H|x> for x' = a+_a a_i x (same spin, i occupied, a empty); occ = occupied list of x.
CSK_HD double single_element(const HamiltonianView& H, const csk_u64* x, const int* occ, int n,
                             int i, int a) {
  int pi = i >> 1, pa = a >> 1;
  double v = H.h(pa, pi);
  for (int u = 0; u < n; ++u) {
    int j = occ[u];
    if (j == i) continue;
    int pj = j >> 1;
    v += H.g(pa, pi, pj, pj);
    if (((j ^ i) & 1) == 0) v -= H.g(pa, pj, pj, pi);
  }
  return single_sign(x, i, a) * v;
}

// <x'|H|x> for x' = a+_a a+_b a_j a_i x.
CSK_HD double double_element(const HamiltonianView& H, const csk_u64* x, int i, int j, int a,
                             int b) {
  return double_sign(x, i, j, a, b) * H.antisym(a, b, i, j);
}

}  // namespace csk

namespace csk {

// <y|H|x> for any two configurations with the same electron count: 0 beyond double excitations.
CSK_HD double matrix_element(const HamiltonianView& H, const csk_u64* y, const csk_u64* x,
                             int nwords) {
  int holes[2], parts[2], nh = 0, np = 0, ndiff = 0;
  for (int w = 0; w < nwords; ++w) ndiff += popcount64(x[w] ^ y[w]);
  if (ndiff > 4) return 0.0;
  if (ndiff == 0) {
    int occ[64 * kMaxWords];
    int n = occupied_list(x, nwords, occ);
    return diagonal_element(H, occ, n);
  }
  for (int w = 0; w < nwords; ++w) {
    csk_u64 h = x[w] & ~y[w], p = y[w] & ~x[w];
    while (h) {
      if (nh < 2) holes[nh] = (w << 6) + ctz64(h);
      ++nh;
      h &= h - 1;
    }
    while (p) {
      if (np < 2) parts[np] = (w << 6) + ctz64(p);
      ++np;
      p &= p - 1;
    }
  }
  if (nh != np) return 0.0;
  if (nh == 1) {
    if ((holes[0] ^ parts[0]) & 1) return 0.0;
    int occ[64 * kMaxWords];
    int n = occupied_list(x, nwords, occ);
    return single_element(H, x, occ, n, holes[0], parts[0]);
  }
  return double_element(H, x, holes[0], holes[1], parts[0], parts[1]);
}

}  // namespace csk
