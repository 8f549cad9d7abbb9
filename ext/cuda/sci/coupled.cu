// Coupled-configuration generation on the GPU (the NNQS-SCI paper's Algorithm 1;
// docs/nnqs_sci.md).
//
// One block per source (a persistent, grid-stride loop over sources). The block's threads run
// over a virtual space of candidate excitations: singles (occupied i x same-spin target), then,
// per occupied pair (i<j), the leading `cut[pair]` entries of its double table, i.e. those with
// |<ab||ij>| > eps. A candidate is valid when its targets are empty (singles: also |H| > eps).
// Each tile of blockDim candidates takes a block-wide prefix sum over the validity mask and
// writes its valid configurations contiguously. Output slabs come from a counting pass and a
// prefix sum over sources (instead of one atomic per block): the output is then deterministic
// and in the CPU kernel's order, which keeps GPU runs reproducible and comparable bit for bit.
// Matrix elements come from the shared Slater-Condon header, as on the CPU.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include "api.hpp"
#include "common.cuh"
#include "cuscikit/slater_condon.hpp"

namespace csk::gpu {
namespace {

constexpr int kBlock = 256;

// Shared per-source state: the configuration, its occupied list and the occupied pairs with
// the prefix sum of their screened table lengths.
template <int NW>
struct SourceState {
  u64 x[NW];
  int occ[64 * NW];
  int n_occ;
};

// Fills pair_start[0..npo] (exclusive prefix of cut over occupied pairs, in CPU order
// p = u(u-1)/2 + v for occ[v] < occ[u]) and pair_ij[p] = i | j << 16. Returns the total.
template <class Scan>
__device__ int build_pairs(const Tables& T, const int* occ, int npo, int* pair_start, int* pair_ij,
                           typename Scan::TempStorage& tmp) {
  int running = 0;
  for (int base = 0; base < npo; base += kBlock) {
    const int p = base + threadIdx.x;
    int c = 0;
    if (p < npo) {
      int u = static_cast<int>((1.0 + sqrt(1.0 + 8.0 * p)) * 0.5);
      while (u * (u - 1) / 2 > p) --u;
      while ((u + 1) * u / 2 <= p) ++u;
      const int v = p - u * (u - 1) / 2;
      const int i = occ[v], j = occ[u];
      c = T.cut[static_cast<i64>(j) * (j - 1) / 2 + i];
      pair_ij[p] = i | (j << 16);
    }
    int excl, total;
    Scan(tmp).ExclusiveSum(c, excl, total);
    if (p < npo) pair_start[p] = running + excl;
    running += total;
    __syncthreads();  // the scan's temporary storage is reused
  }
  if (threadIdx.x == 0) pair_start[npo] = running;
  __syncthreads();
  return running;
}

// Bit k of a configuration as word w's mask (0 when k lives in another word). With w a
// compile-time constant this keeps y in registers, where a run-time index would spill it.
__device__ __forceinline__ u64 bit_in_word(int k, int w) {
  return (k >> 6) == w ? (1ULL << (k & 63)) : 0ULL;
}

// Evaluates virtual candidate v of the source: returns validity; with WRITE also y and value.
template <int NW, bool WRITE>
__device__ bool candidate(const Tables& T, const HamiltonianView& H, const u64* x, const int* occ,
                          int ne, int n_single, int npo, const int* pair_start, const int* pair_ij,
                          double eps, int v, u64* y, double* value) {
  if (v < n_single) {
    const int u = v / T.norb, k = v - u * T.norb;
    const int i = occ[u], a = 2 * k + (i & 1);
    if (a == i || test_bit(x, a)) return false;
    const double h = single_element(H, x, occ, ne, i, a);
    if (!(fabs(h) > eps)) return false;
    if (WRITE) {
#pragma unroll
      for (int w = 0; w < NW; ++w) y[w] = x[w] ^ bit_in_word(i, w) ^ bit_in_word(a, w);
      *value = h;
    }
    return true;
  }
  const int d = v - n_single;
  int lo = 0, hi = npo;  // the last pair whose range starts at or before d
  while (hi - lo > 1) {
    const int mid = (lo + hi) >> 1;
    if (pair_start[mid] <= d)
      lo = mid;
    else
      hi = mid;
  }
  const int i = pair_ij[lo] & 0xFFFF, j = pair_ij[lo] >> 16;
  const i64 k = T.offsets[static_cast<i64>(j) * (j - 1) / 2 + i] + (d - pair_start[lo]);
  const int t = T.targets[k], a = t & 0xFFFF, b = t >> 16;
  if (test_bit(x, a) || test_bit(x, b)) return false;
  if (WRITE) {
#pragma unroll
    for (int w = 0; w < NW; ++w)
      y[w] = x[w] ^ bit_in_word(i, w) ^ bit_in_word(j, w) ^ bit_in_word(a, w) ^ bit_in_word(b, w);
    *value = double_sign(x, i, j, a, b) * T.values[k];
  }
  return true;
}

template <int NW, bool WRITE>
__global__ void __launch_bounds__(kBlock)
    coupled_kernel(Tables T, const u64* __restrict__ configs, i64 n, int ne, double eps,
                   i64* __restrict__ counts, const i64* __restrict__ offsets,
                   u64* __restrict__ out_configs, double* __restrict__ out_values) {
  using Scan = cub::BlockScan<int, kBlock>;
  using Reduce = cub::BlockReduce<int, kBlock>;
  __shared__ union {
    typename Scan::TempStorage scan;
    typename Reduce::TempStorage reduce;
  } tmp;
  __shared__ SourceState<NW> st;
  extern __shared__ int dyn[];
  const int npo = ne * (ne - 1) / 2;
  int* pair_start = dyn;
  int* pair_ij = dyn + npo + 1;
  const HamiltonianView H{T.norb, T.h1, T.eri, T.e_core};
  const int n_single = ne * T.norb;

  for (i64 s = blockIdx.x; s < n; s += gridDim.x) {
    if (threadIdx.x < NW) st.x[threadIdx.x] = configs[s * NW + threadIdx.x];
    __syncthreads();
    if (threadIdx.x == 0) st.n_occ = occupied_list(st.x, NW, st.occ);
    __syncthreads();
    const u64* x = st.x;  // read from shared memory: bit tests index words at run time
    const int n_double = build_pairs<Scan>(T, st.occ, npo, pair_start, pair_ij, tmp.scan);
    const int n_virtual = n_single + n_double;

    if (!WRITE) {
      int mine = 0;
      for (int v = threadIdx.x; v < n_virtual; v += kBlock)
        mine += candidate<NW, false>(T, H, x, st.occ, ne, n_single, npo, pair_start, pair_ij, eps,
                                     v, nullptr, nullptr);
      const int total = Reduce(tmp.reduce).Sum(mine);
      if (threadIdx.x == 0) counts[s] = total;
    } else {
      i64 out = offsets[s];
      for (int base = 0; base < n_virtual; base += kBlock) {
        u64 y[NW];
        double h = 0.0;
        const int v = base + threadIdx.x;
        const bool ok = v < n_virtual && candidate<NW, true>(T, H, x, st.occ, ne, n_single, npo,
                                                             pair_start, pair_ij, eps, v, y, &h);
        int pos, total;
        Scan(tmp.scan).ExclusiveSum(ok ? 1 : 0, pos, total);
        if (ok) {
          const i64 o = out + pos;
#pragma unroll
          for (int w = 0; w < NW; ++w) out_configs[o * NW + w] = y[w];
          out_values[o] = h;
        }
        out += total;
        __syncthreads();
      }
    }
    __syncthreads();  // shared state is rewritten for the next source
  }
}

template <int NW>
__global__ void diagonal_kernel(Tables T, const u64* __restrict__ configs, i64 n,
                                double* __restrict__ out) {
  const HamiltonianView H{T.norb, T.h1, T.eri, T.e_core};
  for (i64 r = blockIdx.x * static_cast<i64>(blockDim.x) + threadIdx.x; r < n;
       r += static_cast<i64>(gridDim.x) * blockDim.x) {
    u64 x[NW];
#pragma unroll
    for (int w = 0; w < NW; ++w) x[w] = configs[r * NW + w];
    int occ[64 * NW];
    const int ne = occupied_list(x, NW, occ);
    out[r] = diagonal_element(H, occ, ne);
  }
}

template <int NW, bool WRITE>
void launch(const Tables& T, const u64* configs, i64 n, int ne, double eps, i64* counts,
            const i64* offsets, u64* out_configs, double* out_values, cudaStream_t stream) {
  if (n <= 0) return;
  const int npo = ne * (ne - 1) / 2;
  const std::size_t dyn = static_cast<std::size_t>(2 * npo + 1) * sizeof(int);
  auto kernel = coupled_kernel<NW, WRITE>;
  if (dyn > 48 * 1024)
    CSK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(dyn)));
  int per_sm = 0;
  CSK_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kBlock, dyn));
  if (per_sm < 1)
    throw std::runtime_error(
        "coupled generation: too many electrons for one block's shared memory");
  const i64 blocks = std::min<i64>(n, static_cast<i64>(per_sm) * sm_count());
  kernel<<<static_cast<unsigned>(blocks), kBlock, dyn, stream>>>(T, configs, n, ne, eps, counts,
                                                                 offsets, out_configs, out_values);
  CSK_CUDA_LAUNCHED();
}

template <bool WRITE>
void dispatch(const Tables& T, const u64* configs, i64 n, int ne, double eps, i64* counts,
              const i64* offsets, u64* out_configs, double* out_values, void* stream) {
  if (ne < 0 || ne > 64 * T.nwords) throw std::invalid_argument("bad electron count");
  auto s = as_stream(stream);
  with_words(T.nwords, [&](auto W) {
    launch<W.value, WRITE>(T, configs, n, ne, eps, counts, offsets, out_configs, out_values, s);
  });
}

}  // namespace

void coupled_counts(const Tables& T, const u64* configs, i64 n, int n_elec, double eps, i64* counts,
                    void* stream) {
  dispatch<false>(T, configs, n, n_elec, eps, counts, nullptr, nullptr, nullptr, stream);
}

void coupled_write(const Tables& T, const u64* configs, i64 n, int n_elec, double eps,
                   const i64* offsets, u64* out_configs, double* out_values, void* stream) {
  dispatch<true>(T, configs, n, n_elec, eps, nullptr, offsets, out_configs, out_values, stream);
}

void diagonal(const Tables& T, const u64* configs, i64 n, double* out, void* stream) {
  if (n <= 0) return;
  auto s = as_stream(stream);
  const unsigned grid = grid_for(n, 128, 8 * sm_count());
  with_words(T.nwords,
             [&](auto W) { diagonal_kernel<W.value><<<grid, 128, 0, s>>>(T, configs, n, out); });
  CSK_CUDA_LAUNCHED();
}

}  // namespace csk::gpu
