// Host-side helpers shared by the CUDA bindings of every system: device selection and the
// device's properties. Plain C++ (no CUDA headers), so nanobind code compiles with the host
// compiler.
#pragma once
#include <cstddef>

namespace csk::gpu {

// Make `device` current for the calling thread (a no-op when it already is).
void use_device(int device);

struct DeviceInfo {
  int device = 0;
  int sm_count = 0;
  int major = 0, minor = 0;
  std::size_t free_bytes = 0, total_bytes = 0;
};
// Properties of the current device (for batch sizing and `cuscikit info`).
DeviceInfo device_info();
const char* build_arch();

}  // namespace csk::gpu
