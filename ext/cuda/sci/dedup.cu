// GPU de-duplication of multi-word keys: CUB radix sort (keys with their original positions),
// then unique flags, an inclusive scan and one scatter that writes the unique keys and the
// inverse index. Also the binary search that rebuilds a reverse index against a sorted set.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda/std/tuple>

#include <algorithm>
#include <type_traits>

#include "api.hpp"
#include "common.cuh"
#include "cuscikit/bits.hpp"

namespace csk::gpu {
namespace {

template <int NW>
struct Key {
  u64 w[NW];
};

// CUB sorts a multi-word key through a decomposer; the leftmost tuple element is the most
// significant, so word NW-1 comes first.
struct Decompose2 {
  __host__ __device__::cuda::std::tuple<u64&, u64&> operator()(Key<2>& k) const {
    return {k.w[1], k.w[0]};
  }
};
struct Decompose3 {
  __host__ __device__::cuda::std::tuple<u64&, u64&, u64&> operator()(Key<3>& k) const {
    return {k.w[2], k.w[1], k.w[0]};
  }
};
struct Decompose4 {
  __host__ __device__::cuda::std::tuple<u64&, u64&, u64&, u64&> operator()(Key<4>& k) const {
    return {k.w[3], k.w[2], k.w[1], k.w[0]};
  }
};

template <int NW>
cudaError_t radix_sort(void* tmp, std::size_t& bytes, const u64* keys_in, u64* keys_out,
                       const std::uint32_t* vals_in, std::uint32_t* vals_out, i64 n, int end_bit,
                       cudaStream_t s) {
  if constexpr (NW == 1) {
    if (vals_in == nullptr)
      return cub::DeviceRadixSort::SortKeys(tmp, bytes, keys_in, keys_out, n, 0, end_bit, s);
    return cub::DeviceRadixSort::SortPairs(tmp, bytes, keys_in, keys_out, vals_in, vals_out, n, 0,
                                           end_bit, s);
  } else {
    using K = Key<NW>;
    using D = std::conditional_t<NW == 2, Decompose2,
                                 std::conditional_t<NW == 3, Decompose3, Decompose4>>;
    auto ki = reinterpret_cast<const K*>(keys_in);
    auto ko = reinterpret_cast<K*>(keys_out);
    if (vals_in == nullptr)
      return cub::DeviceRadixSort::SortKeys(tmp, bytes, ki, ko, n, D{}, 0, end_bit, s);
    return cub::DeviceRadixSort::SortPairs(tmp, bytes, ki, ko, vals_in, vals_out, n, D{}, 0,
                                           end_bit, s);
  }
}

// flags[k] = 1 where sorted key k differs from key k-1.
template <int NW>
__global__ void head_flags(const u64* __restrict__ keys, i64 n, std::uint32_t* __restrict__ flags) {
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<i64>(gridDim.x) * blockDim.x) {
    std::uint32_t f = k == 0;
    if (k > 0) {
#pragma unroll
      for (int w = 0; w < NW; ++w) f |= keys[k * NW + w] != keys[(k - 1) * NW + w];
    }
    flags[k] = f;
  }
}

// ids holds the inclusive scan of the flags: unique row of sorted key k is ids[k] - 1.
template <int NW>
__global__ void scatter_unique(const u64* __restrict__ keys, const std::uint32_t* __restrict__ ids,
                               const std::uint32_t* __restrict__ perm, i64 n,
                               u64* __restrict__ unique, i64* __restrict__ inverse) {
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<i64>(gridDim.x) * blockDim.x) {
    const std::uint32_t id = ids[k];
    const bool head = k == 0 || ids[k - 1] != id;
    if (head) {
#pragma unroll
      for (int w = 0; w < NW; ++w) unique[static_cast<i64>(id - 1) * NW + w] = keys[k * NW + w];
    }
    if (inverse != nullptr) inverse[perm[k]] = static_cast<i64>(id) - 1;
  }
}

__global__ void iota_u32(std::uint32_t* out, i64 n) {
  for (i64 k = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; k < n;
       k += static_cast<i64>(gridDim.x) * blockDim.x)
    out[k] = static_cast<std::uint32_t>(k);
}

template <int NW>
__global__ void search_kernel(const u64* __restrict__ sorted, i64 n_sorted,
                              const u64* __restrict__ queries, i64 nq, i64* __restrict__ out) {
  for (i64 q = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; q < nq;
       q += static_cast<i64>(gridDim.x) * blockDim.x) {
    u64 key[NW];
#pragma unroll
    for (int w = 0; w < NW; ++w) key[w] = queries[q * NW + w];
    i64 lo = 0, hi = n_sorted;  // lower bound
    while (lo < hi) {
      const i64 mid = (lo + hi) >> 1;
      int c = 0;
#pragma unroll
      for (int w = NW - 1; w >= 0; --w) {
        const u64 a = sorted[mid * NW + w];
        if (c == 0) c = a < key[w] ? -1 : (a > key[w] ? 1 : 0);
      }
      if (c < 0)
        lo = mid + 1;
      else
        hi = mid;
    }
    bool found = lo < n_sorted;
    if (found) {
#pragma unroll
      for (int w = 0; w < NW; ++w) found = found && sorted[lo * NW + w] == key[w];
    }
    out[q] = found ? lo : -1;
  }
}

std::size_t align_up(std::size_t b) { return (b + 255) & ~static_cast<std::size_t>(255); }

// Workspace layout: sorted keys | perm in | perm out | flags/ids | CUB temporary storage.
struct Layout {
  std::size_t keys, perm_in, perm_out, ids, cub, total;
};

template <int NW>
Layout layout(i64 n, bool with_inverse) {
  Layout L{};
  std::size_t cub_bytes = 0;
  CSK_CUDA_CHECK(radix_sort<NW>(nullptr, cub_bytes, nullptr, nullptr,
                                with_inverse ? reinterpret_cast<std::uint32_t*>(1) : nullptr,
                                nullptr, n, 64 * NW, nullptr));
  std::size_t scan_bytes = 0;
  CSK_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes,
                                               static_cast<std::uint32_t*>(nullptr),
                                               static_cast<std::uint32_t*>(nullptr), n, nullptr));
  cub_bytes = std::max(cub_bytes, scan_bytes);
  L.keys = 0;
  L.perm_in = L.keys + align_up(sizeof(u64) * NW * n);
  const std::size_t perm = with_inverse ? align_up(sizeof(std::uint32_t) * n) : 0;
  L.perm_out = L.perm_in + perm;
  L.ids = L.perm_out + perm;
  L.cub = L.ids + align_up(sizeof(std::uint32_t) * n);
  L.total = L.cub + align_up(cub_bytes);
  return L;
}

template <int NW>
i64 sort_unique_impl(const u64* keys, i64 n, int end_bit, u64* unique, i64* inverse, void* ws,
                     std::size_t ws_bytes, cudaStream_t s) {
  const bool with_inverse = inverse != nullptr;
  const Layout L = layout<NW>(n, with_inverse);
  if (ws_bytes < L.total) throw std::invalid_argument("sort_unique: workspace too small");
  auto base = static_cast<char*>(ws);
  auto sorted = reinterpret_cast<u64*>(base + L.keys);
  auto perm_in = with_inverse ? reinterpret_cast<std::uint32_t*>(base + L.perm_in) : nullptr;
  auto perm_out = with_inverse ? reinterpret_cast<std::uint32_t*>(base + L.perm_out) : nullptr;
  auto ids = reinterpret_cast<std::uint32_t*>(base + L.ids);
  const int grid = 8 * sm_count();
  if (with_inverse) {
    iota_u32<<<grid_for(n, 256, grid), 256, 0, s>>>(perm_in, n);
    CSK_CUDA_LAUNCHED();
  }
  std::size_t cub_bytes = L.total - L.cub;
  CSK_CUDA_CHECK(
      radix_sort<NW>(base + L.cub, cub_bytes, keys, sorted, perm_in, perm_out, n, end_bit, s));
  head_flags<NW><<<grid_for(n, 256, grid), 256, 0, s>>>(sorted, n, ids);
  CSK_CUDA_LAUNCHED();
  // The flags are scanned in place; CUB's scan storage reuses the sort's (the sort is done).
  std::size_t scan_bytes = 0;
  CSK_CUDA_CHECK(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, ids, ids, n, s));
  if (scan_bytes > L.total - L.cub) throw std::runtime_error("sort_unique: scan storage");
  CSK_CUDA_CHECK(cub::DeviceScan::InclusiveSum(base + L.cub, scan_bytes, ids, ids, n, s));
  scatter_unique<NW>
      <<<grid_for(n, 256, grid), 256, 0, s>>>(sorted, ids, perm_out, n, unique, inverse);
  CSK_CUDA_LAUNCHED();
  std::uint32_t n_unique = 0;
  CSK_CUDA_CHECK(
      cudaMemcpyAsync(&n_unique, ids + (n - 1), sizeof(n_unique), cudaMemcpyDeviceToHost, s));
  CSK_CUDA_CHECK(cudaStreamSynchronize(s));
  return static_cast<i64>(n_unique);
}

void check_sort_args(i64 n, int words) {
  if (words < 1 || words > 4) throw std::invalid_argument("keys must have 1..4 words");
  if (n >= (static_cast<i64>(1) << 32) - 1)
    throw std::invalid_argument("sort_unique: at most 2^32 - 2 keys per call (split the input)");
}

}  // namespace

std::size_t sort_unique_workspace(i64 n, int words, bool with_inverse) {
  check_sort_args(n, words);
  if (n == 0) return 0;
  return with_words(words, [&](auto W) { return layout<W.value>(n, with_inverse).total; });
}

i64 sort_unique(const u64* keys, i64 n, int words, int end_bit, u64* unique, i64* inverse,
                void* workspace, std::size_t workspace_bytes, void* stream) {
  check_sort_args(n, words);
  if (n == 0) return 0;
  if (end_bit < 1 || end_bit > 64 * words) end_bit = 64 * words;
  auto s = as_stream(stream);
  return with_words(words, [&](auto W) {
    return sort_unique_impl<W.value>(keys, n, end_bit, unique, inverse, workspace, workspace_bytes,
                                     s);
  });
}

void search_keys(const u64* sorted, i64 n_sorted, const u64* queries, i64 n_queries, int words,
                 i64* out, void* stream) {
  if (n_queries <= 0) return;
  auto s = as_stream(stream);
  const unsigned grid = grid_for(n_queries, 256, 16 * sm_count());
  with_words(words, [&](auto W) {
    search_kernel<W.value><<<grid, 256, 0, s>>>(sorted, n_sorted, queries, n_queries, out);
  });
  CSK_CUDA_LAUNCHED();
}

}  // namespace csk::gpu
