// Local-energy numerators: one warp per source sums H_xx' psi(x') over its coupled segment.
// Lanes stride the segment and a fixed shuffle tree reduces them, so the result does not
// depend on scheduling (no atomics): GPU runs are reproducible.
#include "api.hpp"
#include "common.cuh"

namespace csk::gpu {
namespace {

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

__global__ void local_energy_kernel(const i64* __restrict__ offsets, i64 n,
                                    const double* __restrict__ values,
                                    const i64* __restrict__ index, const double2* __restrict__ psi,
                                    const std::uint8_t* __restrict__ in_space,
                                    double2* __restrict__ num_c, double2* __restrict__ num_v) {
  const int lane = threadIdx.x & 31;
  const i64 warps = static_cast<i64>(gridDim.x) * (blockDim.x >> 5);
  for (i64 s = blockIdx.x * static_cast<i64>(blockDim.x >> 5) + (threadIdx.x >> 5); s < n;
       s += warps) {
    double cr = 0, ci = 0, vr = 0, vi = 0;
    for (i64 k = offsets[s] + lane; k < offsets[s + 1]; k += 32) {
      const i64 r = index[k];
      if (r < 0) continue;  // not in the unique set: cannot happen for a complete set
      const double h = values[k];
      const double2 p = psi[r];
      cr += h * p.x;
      ci += h * p.y;
      if (in_space[r]) {
        vr += h * p.x;
        vi += h * p.y;
      }
    }
    cr = warp_sum(cr);
    ci = warp_sum(ci);
    vr = warp_sum(vr);
    vi = warp_sum(vi);
    if (lane == 0) {
      num_c[s] = make_double2(cr, ci);
      num_v[s] = make_double2(vr, vi);
    }
  }
}

}  // namespace

void local_energy_sums(const i64* offsets, i64 n, const double* values, const i64* index,
                       const double* psi, const std::uint8_t* in_space, double* num_coupled,
                       double* num_variational, void* stream) {
  if (n <= 0) return;
  const unsigned grid = grid_for(n * 32, 256, 16 * sm_count());
  local_energy_kernel<<<grid, 256, 0, as_stream(stream)>>>(
      offsets, n, values, index, reinterpret_cast<const double2*>(psi), in_space,
      reinterpret_cast<double2*>(num_coupled), reinterpret_cast<double2*>(num_variational));
  CSK_CUDA_LAUNCHED();
}

}  // namespace csk::gpu
