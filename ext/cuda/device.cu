#include "common.cuh"
#include "device.hpp"

namespace csk::gpu {

void use_device(int device) {
  int current = -1;
  CSK_CUDA_CHECK(cudaGetDevice(&current));
  if (current != device) CSK_CUDA_CHECK(cudaSetDevice(device));
}

DeviceInfo device_info() {
  DeviceInfo d;
  CSK_CUDA_CHECK(cudaGetDevice(&d.device));
  cudaDeviceProp p{};
  CSK_CUDA_CHECK(cudaGetDeviceProperties(&p, d.device));
  d.sm_count = p.multiProcessorCount;
  d.major = p.major;
  d.minor = p.minor;
  CSK_CUDA_CHECK(cudaMemGetInfo(&d.free_bytes, &d.total_bytes));
  return d;
}

const char* build_arch() { return CSK_CUDA_ARCHS; }

}  // namespace csk::gpu
