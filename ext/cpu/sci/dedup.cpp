// Local de-duplication: LSD radix sort of multi-word keys carrying their original positions,
// then one pass that keeps the first of each run and writes the inverse index.
#include <algorithm>
#include <array>
#include <cstring>
#include <stdexcept>

#include "cuscikit/dispatch.hpp"
#include "kernels.hpp"

namespace csk {

namespace {

template <int W>
struct Item {
  std::uint64_t k[W];
  std::int64_t pos;
};

constexpr int kDigitBits = 16;
constexpr int kBuckets = 1 << kDigitBits;

// One stable counting-sort pass on the digit at bit offset `shift` of word `w`, parallel over
// contiguous blocks (block t's items go before block t+1's within every bucket: stable).
// Returns false (and moves nothing) when every item has the same digit.
template <int W>
bool radix_pass(const Item<W>* in, Item<W>* out, std::int64_t n, int w, int shift) {
  const int nt = std::max(1, std::min<int>(max_threads(), static_cast<int>(n / 65536) + 1));
  std::vector<std::int64_t> hist(static_cast<std::size_t>(nt) * kBuckets, 0);
  auto digit = [&](const Item<W>& it) { return (it.k[w] >> shift) & (kBuckets - 1); };
#pragma omp parallel num_threads(nt)
  {
    const int t = thread_id();
    const std::int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    std::int64_t* h = hist.data() + static_cast<std::size_t>(t) * kBuckets;
    for (std::int64_t r = lo; r < hi; ++r) ++h[digit(in[r])];
  }
  // Skip the pass if a single bucket holds everything.
  for (int b = 0; b < kBuckets; ++b) {
    std::int64_t s = 0;
    for (int t = 0; t < nt; ++t) s += hist[static_cast<std::size_t>(t) * kBuckets + b];
    if (s == n) return false;
    if (s != 0) break;
  }
  std::int64_t run = 0;
  for (int b = 0; b < kBuckets; ++b)
    for (int t = 0; t < nt; ++t) {
      std::int64_t& h = hist[static_cast<std::size_t>(t) * kBuckets + b];
      const std::int64_t c = h;
      h = run;
      run += c;
    }
#pragma omp parallel num_threads(nt)
  {
    const int t = thread_id();
    const std::int64_t lo = n * t / nt, hi = n * (t + 1) / nt;
    std::int64_t* h = hist.data() + static_cast<std::size_t>(t) * kBuckets;
    for (std::int64_t r = lo; r < hi; ++r) out[h[digit(in[r])]++] = in[r];
  }
  return true;
}

template <int W>
UniqueResult unique_impl(const std::uint64_t* keys, std::int64_t n) {
  std::vector<Item<W>> a(n), b(n);
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < n; ++r) {
    std::memcpy(a[r].k, keys + r * W, sizeof(std::uint64_t) * W);
    a[r].pos = r;
  }
  Item<W>* src = a.data();
  Item<W>* dst = b.data();
  for (int w = 0; w < W; ++w)  // least significant word first: LSD order
    for (int shift = 0; shift < 64; shift += kDigitBits)
      if (radix_pass<W>(src, dst, n, w, shift)) std::swap(src, dst);

  UniqueResult res;
  res.inverse.resize(n);
  std::int64_t u = -1;
  for (std::int64_t r = 0; r < n; ++r) {
    if (r == 0 || std::memcmp(src[r].k, src[r - 1].k, sizeof(std::uint64_t) * W) != 0) {
      ++u;
      res.keys.insert(res.keys.end(), src[r].k, src[r].k + W);
      res.counts.push_back(0);
    }
    res.inverse[src[r].pos] = u;
    ++res.counts[u];
  }
  return res;
}

inline std::uint64_t mix64(std::uint64_t z) {  // splitmix64 finaliser
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline std::uint64_t hash_key(const std::uint64_t* k, int nw) {
  std::uint64_t h = 0x9e3779b97f4a7c15ULL;
  for (int w = 0; w < nw; ++w) h = mix64(h ^ k[w]);
  return h;
}

}  // namespace

UniqueResult unique_keys(const std::uint64_t* keys, std::int64_t n, int nwords) {
  return with_words(nwords, [&](auto W) { return unique_impl<W.value>(keys, n); });
}

KeyIndex::KeyIndex(const std::uint64_t* keys, std::int64_t n, int nwords)
    : keys_(keys), nwords_(nwords) {
  std::uint64_t cap = 16;
  while (cap < 2 * static_cast<std::uint64_t>(n)) cap <<= 1;
  mask_ = cap - 1;
  slots_.assign(cap, -1);
  for (std::int64_t r = 0; r < n; ++r) {
    const std::uint64_t* k = keys + r * nwords;
    std::uint64_t s = hash_key(k, nwords) & mask_;
    while (slots_[s] >= 0) {
      if (std::memcmp(keys + slots_[s] * nwords, k, sizeof(std::uint64_t) * nwords) == 0) {
        duplicates_ = true;
        break;
      }
      s = (s + 1) & mask_;
    }
    if (slots_[s] < 0) slots_[s] = r;
  }
}

std::int64_t KeyIndex::find(const std::uint64_t* q) const {
  std::uint64_t s = hash_key(q, nwords_) & mask_;
  while (true) {
    const std::int64_t r = slots_[s];
    if (r < 0) return -1;
    if (std::memcmp(keys_ + r * nwords_, q, sizeof(std::uint64_t) * nwords_) == 0) return r;
    s = (s + 1) & mask_;
  }
}

void lookup_keys(const KeyIndex& index, const std::uint64_t* queries, std::int64_t n, int nwords,
                 std::int64_t* out) {
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < n; ++r) out[r] = index.find(queries + r * nwords);
}

}  // namespace csk
