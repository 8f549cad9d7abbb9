// nanobind bindings of the dSB kernel in `cuscikit._cuda.ising`: the signature and outputs of the
// C++ reference (`cuscikit._core.ising.run_exact`), host numpy arrays in and out; the model is
// copied to the current device for the run. `last_kernel_ms()` gives the last run's kernel time.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "../bindings.hpp"
#include "api.hpp"
#include "cuscikit/numpy_out.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using csk::to_numpy;

template <typename T>
using In = csk::HostVector<T>;
using csk::need;

float g_last_ms = 0.0f;

}  // namespace

void bind_ising(nb::module_& m) {
  m.def(
      "run_exact",
      [](int kind, int n, In<std::uint32_t> plus, In<std::uint32_t> minus, In<std::int32_t> degree,
         In<std::int8_t> j8, In<std::int32_t> h, int replicas, int steps, float dt, float a0,
         float c0, std::uint64_t seed, std::uint32_t request, int tile_replicas) {
        if (n < 1) throw std::invalid_argument("n must be >= 1");
        if (replicas < 1) throw std::invalid_argument("replicas must be >= 1");
        if (steps < 1) throw std::invalid_argument("steps must be >= 1");
        if (tile_replicas != 0 && tile_replicas != 64 && tile_replicas != 128)
          throw std::invalid_argument("tile_replicas must be 0, 64 or 128");
        csk::gpu::ising::RunArgs a;
        a.kind = kind;
        a.n = n;
        a.nwords = (n + 31) / 32;
        a.replicas = replicas;
        a.steps = steps;
        a.dt = dt;
        a.a0 = a0;
        a.c0 = c0;
        a.seed = seed;
        a.request = request;
        a.tile_replicas = tile_replicas;
        const size_t rows = size_t(n) * a.nwords;
        need(h.shape(0), size_t(n), "h");
        if (kind == 0) {
          need(plus.shape(0), rows, "plus");
        } else if (kind == 1) {
          need(plus.shape(0), rows, "plus");
          need(minus.shape(0), rows, "minus");
          need(degree.shape(0), size_t(n), "degree");
        } else if (kind == 2) {
          need(j8.shape(0), rows * 32, "j8");
        } else {
          throw std::invalid_argument("unknown coupling kind " + std::to_string(kind));
        }
        a.plus = plus.data();
        a.plus_len = plus.shape(0);
        a.minus = minus.data();
        a.minus_len = minus.shape(0);
        a.degree = degree.data();
        a.degree_len = degree.shape(0);
        a.j8 = j8.data();
        a.j8_len = j8.shape(0);
        a.h = h.data();
        const size_t P = size_t(steps) + 1, B = size_t(replicas), W = size_t(a.nwords);
        std::vector<std::int64_t> energy(P * B), best_energy(B);
        std::vector<std::uint64_t> checksum(P * B);
        std::vector<std::uint32_t> best_signs(B * W);
        std::vector<float> x(B * size_t(n)), y(B * size_t(n));
        const csk::gpu::ising::RunOut o{energy.data(),     checksum.data(), best_energy.data(),
                                        best_signs.data(), x.data(),        y.data()};
        {
          nb::gil_scoped_release release;
          g_last_ms = csk::gpu::ising::run_dsb(a, o);
        }
        return nb::make_tuple(
            to_numpy(std::move(energy), {P, B}), to_numpy(std::move(checksum), {P, B}),
            to_numpy(std::move(best_energy), {B}), to_numpy(std::move(best_signs), {B, W}),
            to_numpy(std::move(x), {B, size_t(n)}), to_numpy(std::move(y), {B, size_t(n)}));
      },
      "kind"_a, "n"_a, "plus"_a, "minus"_a, "degree"_a, "j8"_a, "h"_a, "replicas"_a, "steps"_a,
      "dt"_a, "a0"_a, "c0"_a, "seed"_a, "request"_a, "tile_replicas"_a = 0,
      "dSB on the GPU with exact integer couplings; the outputs of _core.ising.run_exact. "
      "tile_replicas: replicas per block tile (64 or 128; 0 picks from the sizes).");
  m.def(
      "last_kernel_ms", []() { return g_last_ms; },
      "Kernel time (ms, CUDA events) of the last run_exact.");
}
