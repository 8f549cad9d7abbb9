// Host arrays across the Python boundary: 1-D inputs from NumPy, their size checks, and a
// std::vector handed back as a NumPy array that owns it (no copy). Host-only (nanobind);
// shared by the bindings of every system, CPU and CUDA alike.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace csk {

template <typename T>
using HostVector =
    nanobind::ndarray<const T, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;

// Throws std::invalid_argument (ValueError in Python) unless an input has the expected size.
inline void need(size_t have, size_t want, const char* what) {
  if (have != want)
    throw std::invalid_argument(std::string(what) + " has " + std::to_string(have) +
                                " entries, expected " + std::to_string(want));
}

template <typename T>
nanobind::ndarray<nanobind::numpy, T> to_numpy(std::vector<T>&& v,
                                               std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nanobind::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nanobind::ndarray<nanobind::numpy, T>(owned->data(), shape, owner);
}

}  // namespace csk
