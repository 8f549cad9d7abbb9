// Typed device arrays for the CUDA bindings: nanobind ndarrays (any DLPack producer: torch,
// CuPy) restricted to CUDA memory, with the checks every binding needs, written once.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "device.hpp"

namespace csk::gpu {

namespace nb = nanobind;

template <typename T, typename... Extra>
using DeviceArray = nb::ndarray<T, nb::device::cuda, nb::c_contig, Extra...>;
template <typename T>
using DeviceVector = DeviceArray<T, nb::ndim<1>>;
template <typename T>
using DeviceMatrix = DeviceArray<T, nb::ndim<2>>;

// A CUDA stream handle passed from Python (torch.cuda.Stream.cuda_stream); 0 is the legacy
// default stream.
inline void* stream_of(std::uintptr_t s) { return reinterpret_cast<void*>(s); }

// Checks that every array lives on one device, makes it current and returns its id.
template <typename... A>
int common_device(const char* what, const A&... arrays) {
  int dev = -1;
  bool ok = true;
  auto visit = [&](const auto& a) {
    if (a.size() == 0) return;  // empty arrays may come from any allocator
    const int d = static_cast<int>(a.device_id());
    if (dev < 0) dev = d;
    ok = ok && d == dev;
  };
  (visit(arrays), ...);
  if (!ok) throw std::invalid_argument(std::string(what) + ": arrays live on different GPUs");
  if (dev >= 0) use_device(dev);
  return dev;
}

inline void require(bool cond, const std::string& what) {
  if (!cond) throw std::invalid_argument(what);
}

}  // namespace csk::gpu
