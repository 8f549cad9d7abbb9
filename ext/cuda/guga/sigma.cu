// GUGA CI on the GPU through the row functions of cuscikit/guga_loops.hpp. By default one CSF
// per thread: the gather sums the columns of one start orbital in the thread's slots of shared
// memory and stores each column of T once; sigma sums in a register. An optional order (a
// permutation of the CSFs that keeps every tile in place) gives the threads of a warp CSFs of
// similar work. The split variants run one CSF per warp: lane l takes the searches l, l + 32,
// ... (start orbital and direction), the gather keeps its two direction rows in shared memory
// (the lanes' columns never collide), sigma sums the lanes with a fixed shuffle tree. The exact
// diagonal runs one CSF per thread. Every output has one owner and a fixed order of summation:
// runs are reproducible bit for bit.
#include <vector>

#include "api.hpp"
#include "common.cuh"

namespace csk::gpu::guga {
namespace {

constexpr int kBlock = 128;
constexpr int kWarps = kBlock / 32;
constexpr std::size_t kMaxShared = 48 * 1024;  // without opting in to more

// Warps per block of the split gather for rows of ld doubles (two rows per warp), 0 if one
// warp's rows do not fit the shared memory.
int gather_warps(int ld) {
  const std::size_t per_warp = 2 * sizeof(double) * static_cast<std::size_t>(ld);
  const std::size_t w = kMaxShared / per_warp;
  return static_cast<int>(w < static_cast<std::size_t>(kWarps) ? w : kWarps);
}

template <int MaxOrb>
__global__ void gather_warp_kernel(DrtView d, i64 k0, i64 count,
                                   const std::int32_t* __restrict__ colmap, int ncol, int ld,
                                   const double* __restrict__ c, double* __restrict__ T) {
  extern __shared__ double rows[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const i64 k = static_cast<i64>(blockIdx.x) * (blockDim.x >> 5) + warp;
  if (k >= count) return;  // the whole warp
  double* r0 = rows + 2 * static_cast<std::size_t>(ld) * warp;
  double* r1 = r0 + ld;
  int steps[MaxOrb], verts[MaxOrb + 1];
  csk::guga::unrank_csf(d, k0 + k, steps, verts);
  const double ck = c[k0 + k];
  csk::guga::split_zero(r0, r1, ld, lane, 32);
  __syncwarp();
  csk::guga::split_diagonal(d.norb, steps, colmap, ck, r0, lane, 32);
  __syncwarp();
  const int parts = csk::guga::split_parts(d.norb);
  for (int j = lane; j < parts; j += 32)
    csk::guga::gather_part<MaxOrb>(d, steps, verts, k0 + k, j, colmap, c, (j & 1) ? r1 : r0);
  __syncwarp();
  csk::guga::split_finish(r0, r1, ld, ld > ncol ? ncol : -1, ck, T + k * ld, lane, 32);
}

template <int MaxOrb>
__global__ void __launch_bounds__(kBlock)
    sigma_warp_kernel(DrtView d, i64 m0, i64 count, const std::int32_t* __restrict__ symmap,
                      const double* __restrict__ G, int ldg, i64 g0, i64 gcount,
                      double* __restrict__ out, bool accumulate) {
  const int lane = threadIdx.x & 31;
  const i64 j = static_cast<i64>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (j >= count) return;  // the whole warp
  const i64 m = m0 + j;
  int steps[MaxOrb], verts[MaxOrb + 1];
  csk::guga::unrank_csf(d, m, steps, verts);
  double s =
      lane == 0 ? csk::guga::sigma_diagonal_part(d, steps, m, symmap, G, ldg, g0, gcount) : 0.0;
  const int parts = csk::guga::split_parts(d.norb);
  for (int p = lane; p < parts; p += 32)
    s += csk::guga::sigma_part<MaxOrb>(d, steps, verts, m, p, symmap, G, ldg, g0, gcount);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
  if (lane == 0) out[j] = accumulate ? out[j] + s : s;
}

// Threads per block of the per-thread gather: norb slots of shared memory each (2 norb for a
// map that is not symmetric), within the default 48 KiB (128 up to norb 24, 32 at norb 64).
int gather_threads(int slots) {
  const std::size_t per_thread = sizeof(double) * static_cast<std::size_t>(slots);
  const int t = static_cast<int>(kMaxShared / per_thread) / 32 * 32;
  return t < kBlock ? t : kBlock;
}

template <int MaxOrb>
__global__ void __launch_bounds__(kBlock)
    gather_kernel(DrtView d, i64 k0, i64 count, const std::int32_t* __restrict__ order,
                  const std::int32_t* __restrict__ colmap, int ncol, int ld,
                  const double* __restrict__ c, double* __restrict__ T, bool symmetric) {
  extern __shared__ double acc[];
  const i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const i64 k = order ? static_cast<i64>(order[k0 + j]) : k0 + j;
  csk::guga::gather_row<MaxOrb>(d, k, colmap, ncol, ld, c, T + (k - k0) * ld, acc + threadIdx.x,
                                blockDim.x, symmetric);
}

template <int MaxOrb>
__global__ void __launch_bounds__(kBlock)
    sigma_kernel(DrtView d, i64 m0, i64 count, const std::int32_t* __restrict__ order,
                 const std::int32_t* __restrict__ symmap, const double* __restrict__ G, int ldg,
                 i64 g0, i64 gcount, double* __restrict__ out, bool accumulate) {
  const i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const i64 m = order ? static_cast<i64>(order[m0 + j]) : m0 + j;
  const double s = csk::guga::sigma_row<MaxOrb>(d, m, symmap, G, ldg, g0, gcount);
  out[m - m0] = accumulate ? out[m - m0] + s : s;
}

template <int MaxOrb>
__global__ void __launch_bounds__(kBlock)
    count_kernel(DrtView d, i64 k0, i64 count, std::int32_t* __restrict__ out) {
  const i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  out[j] = csk::guga::coupling_count<MaxOrb>(d, k0 + j);
}

template <int MaxOrb>
__global__ void __launch_bounds__(kBlock)
    diagonal_kernel(DrtView d, i64 k0, i64 count, const double* __restrict__ hp,
                    const double* __restrict__ J, const double* __restrict__ K,
                    double* __restrict__ out) {
  const i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  out[j] = csk::guga::diagonal_row<MaxOrb>(d, k0 + j, hp, J, K);
}

// The scatter form of sigma for the kets k0 .. k0 + count - 1 (row j of G is ket k0 + j's):
// fixed-point sums with integer atomic reductions (the old value is never read, so the thread
// does not wait), the same bits in any order of arrival. acc: the lo words, then the hi words.
template <int MaxOrb>
__global__ void __launch_bounds__(kBlock)
    scatter_kernel(DrtView d, i64 k0, i64 count, const std::int32_t* __restrict__ symmap,
                   const double* __restrict__ G, int ldg, int e, csk_i64* __restrict__ acc) {
  const i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  csk::guga::scatter_row<MaxOrb>(
      d, k0 + j, symmap, G + j * ldg, e, acc, acc + d.ncsf, [](csk_i64* p, csk_i64 v) {
        atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
      });
}

__global__ void __launch_bounds__(kBlock)
    fixed_values_kernel(i64 count, const csk_i64* __restrict__ acc, int e,
                        double* __restrict__ out) {
  const i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  out[j] = csk::guga::fixed_value(acc[j], acc[count + j], e);
}

unsigned blocks_for(i64 n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }
unsigned warp_blocks_for(i64 n, int warps) {
  return static_cast<unsigned>((n + warps - 1) / warps);
}

}  // namespace

void upload_segments(double* seg, int bmax) {
  std::vector<double> host(csk::guga::segment_table_size(bmax));
  csk::guga::fill_segment_table(host.data(), bmax);
  CSK_CUDA_CHECK(
      cudaMemcpy(seg, host.data(), host.size() * sizeof(double), cudaMemcpyHostToDevice));
}

void gather(const DrtView& d, i64 k0, i64 count, const std::int32_t* colmap, int ncol, int ld,
            const double* c, double* T, bool split, const std::int32_t* order, bool symmetric,
            void* stream) {
  if (count <= 0) return;
  const int warps = split ? gather_warps(ld) : 0;
  const cudaStream_t st = as_stream(stream);
  if (warps > 0) {  // one CSF per warp, rows in shared memory
    const std::size_t shared = 2 * sizeof(double) * static_cast<std::size_t>(ld) * warps;
    if (d.norb <= 32)
      gather_warp_kernel<32><<<warp_blocks_for(count, warps), 32 * warps, shared, st>>>(
          d, k0, count, colmap, ncol, ld, c, T);
    else
      gather_warp_kernel<64><<<warp_blocks_for(count, warps), 32 * warps, shared, st>>>(
          d, k0, count, colmap, ncol, ld, c, T);
  } else {  // one CSF per thread (also where a warp's rows do not fit shared memory)
    const int slots = symmetric ? d.norb : 2 * d.norb;
    const int threads = gather_threads(slots);
    const unsigned grid = static_cast<unsigned>((count + threads - 1) / threads);
    const std::size_t shared = sizeof(double) * static_cast<std::size_t>(slots) * threads;
    if (d.norb <= 32)
      gather_kernel<32>
          <<<grid, threads, shared, st>>>(d, k0, count, order, colmap, ncol, ld, c, T, symmetric);
    else
      gather_kernel<64>
          <<<grid, threads, shared, st>>>(d, k0, count, order, colmap, ncol, ld, c, T, symmetric);
  }
  CSK_CUDA_LAUNCHED();
}

void sigma(const DrtView& d, i64 m0, i64 count, const std::int32_t* symmap, const double* G,
           int ldg, i64 g0, i64 gcount, double* out, bool accumulate, bool split,
           const std::int32_t* order, void* stream) {
  if (count <= 0) return;
  if (!split) {
    if (d.norb <= 32)
      sigma_kernel<32><<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(
          d, m0, count, order, symmap, G, ldg, g0, gcount, out, accumulate);
    else
      sigma_kernel<64><<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(
          d, m0, count, order, symmap, G, ldg, g0, gcount, out, accumulate);
    CSK_CUDA_LAUNCHED();
    return;
  }
  const unsigned grid = warp_blocks_for(count, kWarps);
  if (d.norb <= 32)
    sigma_warp_kernel<32><<<grid, kBlock, 0, as_stream(stream)>>>(d, m0, count, symmap, G, ldg, g0,
                                                                  gcount, out, accumulate);
  else
    sigma_warp_kernel<64><<<grid, kBlock, 0, as_stream(stream)>>>(d, m0, count, symmap, G, ldg, g0,
                                                                  gcount, out, accumulate);
  CSK_CUDA_LAUNCHED();
}

void scatter(const DrtView& d, i64 k0, i64 count, const std::int32_t* symmap, const double* G,
             int ldg, int e, std::int64_t* acc, void* stream) {
  if (count <= 0) return;
  csk_i64* words = reinterpret_cast<csk_i64*>(acc);
  if (d.norb <= 32)
    scatter_kernel<32><<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(d, k0, count, symmap, G,
                                                                            ldg, e, words);
  else
    scatter_kernel<64><<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(d, k0, count, symmap, G,
                                                                            ldg, e, words);
  CSK_CUDA_LAUNCHED();
}

void fixed_values(i64 count, const std::int64_t* acc, int e, double* out, void* stream) {
  if (count <= 0) return;
  fixed_values_kernel<<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(
      count, reinterpret_cast<const csk_i64*>(acc), e, out);
  CSK_CUDA_LAUNCHED();
}

void coupling_counts(const DrtView& d, i64 k0, i64 count, std::int32_t* out, void* stream) {
  if (count <= 0) return;
  if (d.norb <= 32)
    count_kernel<32><<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(d, k0, count, out);
  else
    count_kernel<64><<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(d, k0, count, out);
  CSK_CUDA_LAUNCHED();
}

void diagonal(const DrtView& d, i64 k0, i64 count, const double* hp, const double* J,
              const double* K, double* out, void* stream) {
  if (count <= 0) return;
  if (d.norb <= 32)
    diagonal_kernel<32>
        <<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(d, k0, count, hp, J, K, out);
  else
    diagonal_kernel<64>
        <<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(d, k0, count, hp, J, K, out);
  CSK_CUDA_LAUNCHED();
}

}  // namespace csk::gpu::guga
