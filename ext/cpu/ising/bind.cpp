// The C++ reference of the dSB Ising solver (`cuscikit._core.ising`): OpenMP over replicas, each
// replica a plain loop over its spins with the shared step of cuscikit/dsb.hpp. Exact integer
// couplings (binary, ternary, int8) give the bytes the CUDA kernel gives; float32 couplings are a
// CPU-only convenience without that guarantee.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>

#include <cfloat>
#include <cstdint>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "../bindings.hpp"

// The plane sums are popcounts: use the instruction (every x86-64 CPU since about 2008 has it)
// rather than libgcc's routine, for this file's code only.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("popcnt")
#endif
#include "cuscikit/numpy_out.hpp"
#include "ising/reference.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using csk::to_numpy;

template <typename T>
using In = csk::HostVector<T>;
using csk::need;

using csk::dsb::ref::Options;

// Per pass p = 0..S (pass p scores the signs s^(p)) and replica b: energy[p B + b] and
// checksum[p B + b]; per replica its best energy and signs; the final x and y.
template <typename E>
struct Output {
  std::vector<E> energy;
  std::vector<std::uint64_t> checksum;
  std::vector<E> best_energy;
  std::vector<std::uint32_t> best_signs;
  std::vector<float> x, y;
  Output(const Options& o)
      : energy(size_t(o.steps + 1) * o.replicas),
        checksum(size_t(o.steps + 1) * o.replicas),
        best_energy(o.replicas),
        best_signs(size_t(o.replicas) * o.nwords),
        x(size_t(o.replicas) * o.n),
        y(size_t(o.replicas) * o.n) {}
};

// Replica b of the run, every pass recorded.
template <typename E, typename Field, typename H>
void run_replica(const Options& o, int b, Field field_of, H h_of, Output<E>& out) {
  csk::dsb::ref::ReplicaOut<E> to{out.x.data() + size_t(b) * o.n,
                                  out.y.data() + size_t(b) * o.n,
                                  out.best_signs.data() + size_t(b) * o.nwords,
                                  out.energy.data() + b,
                                  out.checksum.data() + b,
                                  size_t(o.replicas)};
  out.best_energy[b] = csk::dsb::ref::run_replica<E>(o, b, field_of, h_of, to);
}

template <typename E, typename Field, typename H>
Output<E> run_all(const Options& o, Field field_of, H h_of) {
  Output<E> out(o);
  {
    nb::gil_scoped_release release;
#ifdef CSK_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
    for (int b = 0; b < o.replicas; ++b) run_replica<E>(o, b, field_of, h_of, out);
  }
  return out;
}

template <typename E>
nb::tuple to_python(Output<E>&& out, const Options& o) {
  const size_t P = size_t(o.steps + 1), B = size_t(o.replicas);
  return nb::make_tuple(
      to_numpy(std::move(out.energy), {P, B}), to_numpy(std::move(out.checksum), {P, B}),
      to_numpy(std::move(out.best_energy), {B}),
      to_numpy(std::move(out.best_signs), {B, size_t(o.nwords)}),
      to_numpy(std::move(out.x), {B, size_t(o.n)}), to_numpy(std::move(out.y), {B, size_t(o.n)}));
}

Options check(int n, int replicas, int steps, float dt, float a0, float c0, std::uint64_t seed,
              std::uint32_t request) {
  if (n < 1) throw std::invalid_argument("n must be >= 1");
  if (replicas < 1) throw std::invalid_argument("replicas must be >= 1");
  if (steps < 1) throw std::invalid_argument("steps must be >= 1");
  return Options{n, (n + 31) / 32, replicas, steps, dt, a0, c0, seed, request};
}

}  // namespace

#ifdef __linux__
void bind_ising_service(nb::module_& m);  // service.cpp (Linux sockets)
#endif
void bind_ising_stream(nb::module_& m);  // stream.cpp

void bind_ising(nb::module_& m) {
#ifdef __linux__
  bind_ising_service(m);
#endif
  bind_ising_stream(m);
  m.def(
      "run_exact",
      [](int kind, int n, In<std::uint32_t> plus, In<std::uint32_t> minus, In<std::int32_t> degree,
         In<std::int8_t> j8, In<std::int32_t> h, int replicas, int steps, float dt, float a0,
         float c0, std::uint64_t seed, std::uint32_t request) {
        const Options o = check(n, replicas, steps, dt, a0, c0, seed, request);
        const size_t rows = size_t(n) * o.nwords;
        need(h.shape(0), size_t(n), "h");
        if (kind == csk::dsb::kBinary) {
          need(plus.shape(0), rows, "plus");
        } else if (kind == csk::dsb::kTernary) {
          need(plus.shape(0), rows, "plus");
          need(minus.shape(0), rows, "minus");
          need(degree.shape(0), size_t(n), "degree");
        } else if (kind == csk::dsb::kInt8) {
          need(j8.shape(0), rows * 32, "j8");
        } else {
          throw std::invalid_argument("unknown coupling kind " + std::to_string(kind));
        }
        const csk::dsb::Coupling c{kind,          n,         o.nwords, plus.data(), minus.data(),
                                   degree.data(), j8.data(), h.data()};
        const std::int32_t* hp = h.data();
        auto h_of = [hp](int i) { return hp[i]; };
        return csk::dsb::ref::with_exact_field(c, [&](auto field_of) {
          return to_python(run_all<std::int64_t>(o, field_of, h_of), o);
        });
      },
      "kind"_a, "n"_a, "plus"_a, "minus"_a, "degree"_a, "j8"_a, "h"_a, "replicas"_a, "steps"_a,
      "dt"_a, "a0"_a, "c0"_a, "seed"_a, "request"_a,
      "dSB with exact integer couplings: (energy[S+1, B], checksum[S+1, B], best_energy[B], "
      "best_signs[B, W], x[B, n], y[B, n]).");

  m.def(
      "run_float",
      [](int n, In<float> jf, In<float> h, int replicas, int steps, float dt, float a0, float c0,
         std::uint64_t seed, std::uint32_t request) {
        const Options o = check(n, replicas, steps, dt, a0, c0, seed, request);
        need(jf.shape(0), size_t(n) * n, "J");
        need(h.shape(0), size_t(n), "h");
        const float* J = jf.data();
        const float* hp = h.data();
        auto field_of = [J, hp, n](int i, const std::uint32_t* v, const std::int8_t*, int) {
          float acc = 0.0f;
          const float* row = J + size_t(i) * n;
          for (int j = 0; j < n; ++j) acc += csk::dsb::spin_of(v, j) > 0 ? row[j] : -row[j];
          return acc + hp[i];
        };
        auto h_of = [hp](int i) { return double(hp[i]); };
        return to_python(run_all<double>(o, field_of, h_of), o);
      },
      "n"_a, "J"_a, "h"_a, "replicas"_a, "steps"_a, "dt"_a, "a0"_a, "c0"_a, "seed"_a, "request"_a,
      "dSB with float32 couplings (dense n x n): same outputs, float64 energies.");

  m.def(
      "philox4x32_10",
      [](std::uint32_t c0, std::uint32_t c1, std::uint32_t c2, std::uint32_t c3, std::uint32_t k0,
         std::uint32_t k1) {
        csk::philox::U4 c{{c0, c1, c2, c3}};
        const csk::philox::U4 r = csk::philox::philox4x32_10(c, k0, k1);
        return nb::make_tuple(r.v[0], r.v[1], r.v[2], r.v[3]);
      },
      "c0"_a, "c1"_a, "c2"_a, "c3"_a, "k0"_a, "k1"_a, "Philox4x32-10 of one counter and key.");
}
