// Row tiles of the streamed ±1 couplings (host only), shared by the CPU streamed run
// (ext/cpu/ising/stream.cpp) and the GPU one's host-side producers (ext/cuda/ising/stream.cu).
// Layout: the `plus` words of IsingModel.coupling_arrays(): row i as W = ceil(n/32) little-endian
// u32 words, bit j set when J_ij = +1, diagonal and padding bits 0.
#pragma once
#include <cstdint>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace csk::dsb::tiles {

// Row i's words from plus(w) (any bits), then the padding and the diagonal cleared.
template <typename Plus>
inline void fill_row(std::uint32_t* row, int W, int n, int i, Plus plus) {
  for (int w = 0; w < W; ++w) row[w] = plus(w);
  if (n & 31) row[W - 1] &= (1u << (n & 31)) - 1u;
  row[i >> 5] &= ~(1u << (i & 31));
}

// The Mattis couplings J = xi xi^T: J_ij = +1 where xi_j = xi_i, so row i is the word vector of
// {j : xi_j = +1} when xi_i = +1 and its complement otherwise (one XOR per word).
class Mattis {
 public:
  Mattis(const std::int8_t* xi, int n) : xi_(xi), n_(n), W_((n + 31) / 32), bits_(W_, 0u) {
    for (int j = 0; j < n; ++j)
      if (xi[j] > 0) bits_[j >> 5] |= 1u << (j & 31);
  }
  // Rows r0 .. r0 + rows - 1 into out (rows x W words). nontemporal: the bulk of each row with
  // streaming stores (for buffers written once and read by the GPU's copy engine: no
  // read-for-ownership of lines that will not be read here), then a store fence.
  void rows(int r0, int rows, std::uint32_t* out, bool nontemporal = false) const {
    const std::uint32_t* bits = bits_.data();
    for (int r = 0; r < rows; ++r) {
      const int i = r0 + r;
      const std::uint32_t flip = xi_[i] > 0 ? 0u : ~0u;
      std::uint32_t* row = out + std::size_t(r) * W_;
#if defined(__SSE2__)
      if (nontemporal) {
        row_nontemporal(row, i, flip);
        continue;
      }
#endif
      fill_row(row, W_, n_, i, [bits, flip](int w) { return bits[w] ^ flip; });
    }
#if defined(__SSE2__)
    if (nontemporal) _mm_sfence();
#endif
  }

 private:
#if defined(__SSE2__)
  // Row i as fill_row writes it: 16-byte groups with _mm_stream_si128, the groups holding the
  // diagonal or the last word and the unaligned ends with plain stores.
  void row_nontemporal(std::uint32_t* row, int i, std::uint32_t flip) const {
    const std::uint32_t* bits = bits_.data();
    const int W = W_, n = n_, dw = i >> 5;
    auto word = [&](int w) {
      std::uint32_t x = bits[w] ^ flip;
      if (w == W - 1 && (n & 31)) x &= (1u << (n & 31)) - 1u;
      if (w == dw) x &= ~(1u << (i & 31));
      return x;
    };
    int w = 0;
    for (; w < W && (reinterpret_cast<std::uintptr_t>(row + w) & 15u); ++w) row[w] = word(w);
    const __m128i f = _mm_set1_epi32(static_cast<int>(flip));
    for (; w + 4 < W; w += 4) {
      if (dw >= w && dw < w + 4) {
        for (int k = 0; k < 4; ++k) row[w + k] = word(w + k);
      } else {
        const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(bits + w));
        _mm_stream_si128(reinterpret_cast<__m128i*>(row + w), _mm_xor_si128(b, f));
      }
    }
    for (; w < W; ++w) row[w] = word(w);
  }
#endif

  const std::int8_t* xi_;
  int n_, W_;
  std::vector<std::uint32_t> bits_;
};

// splitmix64 of the unordered pair and the seed: J_ij = J_ji = +1 when the low bit is set.
inline std::uint32_t pair_bit(std::uint64_t seed, std::uint64_t i, std::uint64_t j) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull *
                               (1 + (i < j ? i * 0x100000001B3ull + j : j * 0x100000001B3ull + i));
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return std::uint32_t((z ^ (z >> 31)) & 1u);
}

// A seeded random symmetric ±1 matrix: J_ij = +1 where pair_bit(seed, i, j) is 1.
struct Random {
  int n;
  std::uint64_t seed;
  void rows(int r0, int rows, std::uint32_t* out) const {
    const int W = (n + 31) / 32;
    for (int r = 0; r < rows; ++r) {
      const std::uint64_t i = std::uint64_t(r0 + r);
      fill_row(out + std::size_t(r) * W, W, n, int(i), [this, i](int w) {
        std::uint32_t word = 0;
        for (int bit = 0; bit < 32; ++bit)
          word |= pair_bit(seed, i, std::uint64_t(32 * w + bit)) << bit;
        return word;
      });
    }
  }
};

}  // namespace csk::dsb::tiles
