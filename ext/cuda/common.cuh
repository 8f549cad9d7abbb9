// Shared helpers of the CUDA translation units of every system: error checks that throw, launch
// geometry, the word-count dispatch.
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include <cstdint>

#include "cuscikit/dispatch.hpp"

#define CSK_CUDA_CHECK(expr)                                                      \
  do {                                                                            \
    cudaError_t err_ = (expr);                                                    \
    if (err_ != cudaSuccess)                                                      \
      throw std::runtime_error(std::string("CUDA error in ") + #expr + ": " +     \
                               cudaGetErrorString(err_) + " (" + __FILE__ + ":" + \
                               std::to_string(__LINE__) + ")");                   \
  } while (0)

// After every launch: launch errors surface here instead of at some later call.
#define CSK_CUDA_LAUNCHED() CSK_CUDA_CHECK(cudaGetLastError())

namespace csk::gpu {

using u64 = std::uint64_t;
using i64 = std::int64_t;

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

inline int sm_count() {
  int dev = 0, n = 0;
  CSK_CUDA_CHECK(cudaGetDevice(&dev));
  CSK_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

inline unsigned grid_for(i64 n, int block, int max_blocks) {
  i64 g = (n + block - 1) / block;
  if (g > max_blocks) g = max_blocks;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}

}  // namespace csk::gpu
