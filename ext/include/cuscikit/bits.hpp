// Bit operations on multi-word configurations. Spin orbital k lives in word k/64, bit k%64;
// word 0 is the least significant word (configurations compare as little-endian big integers).
#pragma once
#include "hd.hpp"

namespace csk {

CSK_HD int popcount64(csk_u64 v) {
#if defined(__CUDA_ARCH__)
  return __popcll(v);
#else
  return __builtin_popcountll(v);
#endif
}

CSK_HD int ctz64(csk_u64 v) {
#if defined(__CUDA_ARCH__)
  return __ffsll(static_cast<long long>(v)) - 1;
#else
  return __builtin_ctzll(v);
#endif
}

CSK_HD bool test_bit(const csk_u64* x, int k) { return (x[k >> 6] >> (k & 63)) & 1ULL; }
CSK_HD void flip_bit(csk_u64* x, int k) { x[k >> 6] ^= (1ULL << (k & 63)); }

// Number of set bits strictly below position k.
CSK_HD int count_below(const csk_u64* x, int k) {
  int w = k >> 6, n = 0;
  for (int i = 0; i < w; ++i) n += popcount64(x[i]);
  csk_u64 mask = (1ULL << (k & 63)) - 1ULL;
  return n + popcount64(x[w] & mask);
}

// Writes the sorted list of set bits into occ, returns their number.
CSK_HD int occupied_list(const csk_u64* x, int nwords, int* occ) {
  int n = 0;
  for (int w = 0; w < nwords; ++w) {
    csk_u64 v = x[w];
    while (v) {
      occ[n++] = (w << 6) + ctz64(v);
      v &= v - 1;
    }
  }
  return n;
}

// Lexicographic compare, most significant word (nwords-1) first: -1, 0, +1.
CSK_HD int compare_keys(const csk_u64* a, const csk_u64* b, int nwords) {
  for (int w = nwords - 1; w >= 0; --w) {
    if (a[w] < b[w]) return -1;
    if (a[w] > b[w]) return 1;
  }
  return 0;
}

}  // namespace csk
