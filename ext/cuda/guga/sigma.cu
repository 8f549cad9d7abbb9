// GUGA CI on the GPU: one CSF per thread through the row functions of cuscikit/guga_loops.hpp
// (loop search, gather of E c, gather of sigma, exact diagonal). Every thread writes only its
// own outputs and sums in the order of its search: runs are reproducible bit for bit.
#include <vector>

#include "api.hpp"
#include "common.cuh"

namespace csk::gpu::guga {
namespace {

constexpr int kBlock = 128;

template <int MaxOrb>
__global__ void __launch_bounds__(kBlock)
    gather_kernel(DrtView d, i64 k0, i64 count, const std::int32_t* __restrict__ colmap, int ncol,
                  int ld, const double* __restrict__ c, double* __restrict__ T) {
  const i64 k = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (k >= count) return;
  csk::guga::gather_row<MaxOrb>(d, k0 + k, colmap, ncol, ld, c, T + k * ld);
}

template <int MaxOrb>
__global__ void __launch_bounds__(kBlock)
    sigma_kernel(DrtView d, i64 m0, i64 count, const std::int32_t* __restrict__ symmap,
                 const double* __restrict__ G, int ldg, i64 g0, i64 gcount,
                 double* __restrict__ out, bool accumulate) {
  const i64 j = static_cast<i64>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= count) return;
  const double s = csk::guga::sigma_row<MaxOrb>(d, m0 + j, symmap, G, ldg, g0, gcount);
  out[j] = accumulate ? out[j] + s : s;
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

unsigned blocks_for(i64 n) { return static_cast<unsigned>((n + kBlock - 1) / kBlock); }

}  // namespace

void upload_segments(double* seg, int bmax) {
  std::vector<double> host(csk::guga::segment_table_size(bmax));
  csk::guga::fill_segment_table(host.data(), bmax);
  CSK_CUDA_CHECK(
      cudaMemcpy(seg, host.data(), host.size() * sizeof(double), cudaMemcpyHostToDevice));
}

void gather(const DrtView& d, i64 k0, i64 count, const std::int32_t* colmap, int ncol, int ld,
            const double* c, double* T, void* stream) {
  if (count <= 0) return;
  if (d.norb <= 32)
    gather_kernel<32>
        <<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(d, k0, count, colmap, ncol, ld, c, T);
  else
    gather_kernel<64>
        <<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(d, k0, count, colmap, ncol, ld, c, T);
  CSK_CUDA_LAUNCHED();
}

void sigma(const DrtView& d, i64 m0, i64 count, const std::int32_t* symmap, const double* G,
           int ldg, i64 g0, i64 gcount, double* out, bool accumulate, void* stream) {
  if (count <= 0) return;
  if (d.norb <= 32)
    sigma_kernel<32><<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(
        d, m0, count, symmap, G, ldg, g0, gcount, out, accumulate);
  else
    sigma_kernel<64><<<blocks_for(count), kBlock, 0, as_stream(stream)>>>(
        d, m0, count, symmap, G, ldg, g0, gcount, out, accumulate);
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
