// Streamed dSB on the CPU (`cuscikit._core.ising.StreamRun`): the replicas' state stays put while
// the ±1 couplings arrive as 1-bit row tiles (the `plus` layout of IsingModel.coupling_arrays():
// bit j of word j/32 of row i set when J_ij = +1, diagonal and padding 0), each tile used for
// every replica before the next one comes. A pass accumulates popc(u_i ^ v_b) for all rows and
// replicas; then every replica makes the step of ising/reference.hpp with those sums, so the
// records equal those of the resident run on the same matrix, byte for byte. K steps take K + 1
// passes (the last one scores the final signs; 0 steps: one pass scoring the initial signs). Tile
// generators (Mattis, seeded random; cuscikit/ising_tiles.hpp) fill tiles on the OpenMP threads.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("popcnt")
#endif
#include "cuscikit/ising_tiles.hpp"
#include "cuscikit/numpy_out.hpp"
#include "ising/reference.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using csk::dsb::ref::Options;
using csk::dsb::ref::Replica;
using csk::dsb::ref::ReplicaOut;

class StreamRun {
 public:
  StreamRun(int n, const std::int32_t* h, int replicas, int steps, float dt, float a0, float c0,
            std::uint64_t seed, std::uint32_t request)
      : o_{n, (n + 31) / 32, replicas, steps, dt, a0, c0, seed, request},
        h_(h, h + n),
        acc_(std::size_t(replicas) * n, 0),
        energy_(std::size_t(steps + 1) * replicas),
        checksum_(std::size_t(steps + 1) * replicas),
        best_signs_(std::size_t(replicas) * o_.nwords),
        x_(std::size_t(replicas) * n),
        y_(std::size_t(replicas) * n) {
    for (int b = 0; b < replicas; ++b)
      reps_.emplace_back(std::make_unique<Replica<std::int64_t>>(
          o_, b, x_.data() + std::size_t(b) * n, y_.data() + std::size_t(b) * n));
  }

  StreamRun(const StreamRun&) = delete;
  StreamRun& operator=(const StreamRun&) = delete;

  int passes_done() const { return pass_; }
  int passes() const { return o_.steps + 1; }

  // Adds rows r0 .. r0 + rows - 1 of the current pass (rows x W words).
  void add_tile(int r0, const std::uint32_t* bits, int rows) {
    if (pass_ >= passes()) throw std::logic_error("every pass is done");
    if (r0 != next_row_) throw std::invalid_argument("tiles must come in row order, without gaps");
    if (rows < 0 || r0 + rows > o_.n) throw std::invalid_argument("tile rows out of range");
    const int W = o_.nwords, B = o_.replicas, n = o_.n;
    {
      nb::gil_scoped_release release;
#ifdef CSK_HAVE_OPENMP
#pragma omp parallel for schedule(static)
#endif
      for (int r = 0; r < rows; ++r) {
        const std::uint32_t* u = bits + std::size_t(r) * W;
        for (int b = 0; b < B; ++b) {
          const std::uint32_t* v = reps_[b]->v.data();
          std::int32_t acc = 0;
          for (int w = 0; w < W; ++w) acc += csk::dsb::popc(u[w] ^ v[w]);
          acc_[std::size_t(b) * n + r0 + r] = acc;
        }
      }
    }
    next_row_ += rows;
  }

  // Once all n rows of the pass came: every replica's step with the accumulated sums.
  void end_pass() {
    if (next_row_ != o_.n)
      throw std::logic_error("a pass needs all " + std::to_string(o_.n) + " rows, got " +
                             std::to_string(next_row_));
    const int B = o_.replicas, n = o_.n, k = pass_ + 1;
    const csk::dsb::Coupling c{csk::dsb::kBinary, n,       o_.nwords, nullptr,
                               nullptr,           nullptr, nullptr,   h_.data()};
    {
      nb::gil_scoped_release release;
#ifdef CSK_HAVE_OPENMP
#pragma omp parallel for schedule(dynamic, 1)
#endif
      for (int b = 0; b < B; ++b) {
        const std::int32_t* acc = acc_.data() + std::size_t(b) * n;
        auto field_of = [&c, acc](int i, const std::uint32_t*, const std::int8_t*, int s) {
          return csk::dsb::field(c, i, acc[i], s);
        };
        const std::int32_t* hp = h_.data();
        auto h_of = [hp](int i) { return hp[i]; };
        const ReplicaOut<std::int64_t> out{reps_[b]->x,
                                           reps_[b]->y,
                                           best_signs_.data() + std::size_t(b) * o_.nwords,
                                           energy_.data() + b,
                                           checksum_.data() + b,
                                           std::size_t(B)};
        reps_[b]->pass(k, field_of, h_of, out);
      }
    }
    ++pass_;
    next_row_ = 0;
  }

  nb::tuple result() const {
    if (pass_ != passes()) throw std::logic_error("the run is not finished");
    const std::size_t P = std::size_t(passes()), B = std::size_t(o_.replicas);
    std::vector<std::int64_t> best(B);
    for (std::size_t b = 0; b < B; ++b) best[b] = reps_[b]->best;
    return nb::make_tuple(
        csk::to_numpy(std::vector<std::int64_t>(energy_), {P, B}),
        csk::to_numpy(std::vector<std::uint64_t>(checksum_), {P, B}),
        csk::to_numpy(std::move(best), {B}),
        csk::to_numpy(std::vector<std::uint32_t>(best_signs_), {B, std::size_t(o_.nwords)}),
        csk::to_numpy(std::vector<float>(x_), {B, std::size_t(o_.n)}),
        csk::to_numpy(std::vector<float>(y_), {B, std::size_t(o_.n)}));
  }

 private:
  Options o_;
  std::vector<std::int32_t> h_;
  std::vector<std::int32_t> acc_;
  std::vector<std::int64_t> energy_;
  std::vector<std::uint64_t> checksum_;
  std::vector<std::uint32_t> best_signs_;
  std::vector<float> x_, y_;
  std::vector<std::unique_ptr<Replica<std::int64_t>>> reps_;
  int pass_ = 0, next_row_ = 0;
};

// Rows r0 .. r0 + rows - 1 of an n x n ±1 matrix as a (rows, W) numpy array of 1-bit words from
// a generator of ising_tiles.hpp (fill(i, k, out): rows i .. i + k - 1), the rows split over the
// OpenMP threads.
template <typename Fill>
auto make_tile(int n, int r0, int rows, const Fill& fill) {
  const int W = (n + 31) / 32;
  if (n < 2 || r0 < 0 || rows < 0 || r0 + rows > n)
    throw std::invalid_argument("rows out of range");
  std::vector<std::uint32_t> out(std::size_t(rows) * W);
  {
    nb::gil_scoped_release release;
#ifdef CSK_HAVE_OPENMP
#pragma omp parallel for schedule(static)
#endif
    for (int r = 0; r < rows; ++r) fill(r0 + r, 1, out.data() + std::size_t(r) * W);
  }
  return csk::to_numpy(std::move(out), {std::size_t(rows), std::size_t(W)});
}

}  // namespace

void bind_ising_stream(nb::module_& m) {
  nb::class_<StreamRun>(m, "StreamRun")
      .def(
          "__init__",
          [](StreamRun* self, int n, csk::HostVector<std::int32_t> h, int replicas, int steps,
             float dt, float a0, float c0, std::uint64_t seed, std::uint32_t request) {
            if (n < 2) throw std::invalid_argument("n must be >= 2");
            if (replicas < 1 || steps < 0)
              throw std::invalid_argument("replicas must be >= 1 and steps >= 0");
            csk::need(h.shape(0), std::size_t(n), "h");
            new (self) StreamRun(n, h.data(), replicas, steps, dt, a0, c0, seed, request);
          },
          "n"_a, "h"_a, "replicas"_a, "steps"_a, "dt"_a, "a0"_a, "c0"_a, "seed"_a, "request"_a)
      .def(
          "add_tile",
          [](StreamRun& s, int r0,
             nb::ndarray<const std::uint32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu> bits) {
            s.add_tile(r0, bits.data(), int(bits.shape(0)));
          },
          "r0"_a, "bits"_a)
      .def("end_pass", &StreamRun::end_pass)
      .def_prop_ro("passes_done", &StreamRun::passes_done)
      .def_prop_ro("passes", &StreamRun::passes)
      .def("result", &StreamRun::result,
           "(energy[S+1, B], checksum[S+1, B], best_energy[B], best_signs[B, W], x, y)");

  m.def(
      "mattis_tile",
      [](csk::HostVector<std::int8_t> xi, int r0, int rows, bool streaming_stores) {
        const int n = int(xi.shape(0));
        const csk::dsb::tiles::Mattis gen(xi.data(), n);
        return make_tile(n, r0, rows, [&](int i, int k, std::uint32_t* out) {
          gen.rows(i, k, out, streaming_stores);
        });
      },
      "xi"_a, "r0"_a, "rows"_a, "streaming_stores"_a = false,
      "Rows r0.. of the Mattis couplings J = xi xi^T as 1-bit words (streaming_stores: written "
      "with non-temporal stores, as the GPU path's producers may).");

  m.def(
      "random_tile",
      [](int n, std::uint64_t seed, int r0, int rows) {
        const csk::dsb::tiles::Random gen{n, seed};
        return make_tile(n, r0, rows,
                         [&](int i, int k, std::uint32_t* out) { gen.rows(i, k, out); });
      },
      "n"_a, "seed"_a, "r0"_a, "rows"_a,
      "Rows r0.. of a seeded random symmetric +-1 matrix (splitmix64 of the pair) as 1-bit "
      "words.");
}
