// Host arrays handed to Python: a std::vector becomes a NumPy array that owns it (no copy).
// Host-only (nanobind); shared by the bindings of every system, CPU and CUDA alike.
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <initializer_list>
#include <utility>
#include <vector>

namespace csk {

template <typename T>
nanobind::ndarray<nanobind::numpy, T> to_numpy(std::vector<T>&& v,
                                               std::initializer_list<size_t> shape) {
  auto* owned = new std::vector<T>(std::move(v));
  nanobind::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nanobind::ndarray<nanobind::numpy, T>(owned->data(), shape, owner);
}

}  // namespace csk
