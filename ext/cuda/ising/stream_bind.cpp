// nanobind bindings of the streamed GPU run in `cuscikit._cuda.ising`: `stream_run` (a Mattis,
// seeded random or host-array source; outputs as run_exact's plus a dict of stream statistics)
// and `h2d_rate` (the pinned host -> device copy ceiling).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "../bindings.hpp"
#include "cuscikit/ising_tiles.hpp"
#include "cuscikit/numpy_out.hpp"
#include "stream.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using Rows = nb::ndarray<const std::uint32_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

}  // namespace

void bind_ising_stream_gpu(nb::module_& m) {
  m.def(
      "stream_run",
      [](const std::string& source, int n, csk::HostVector<std::int8_t> xi,
         std::uint64_t matrix_seed, Rows rows, csk::HostVector<std::int32_t> h, int replicas,
         int steps, float dt, float a0, float c0, std::uint64_t seed, std::uint32_t request,
         int tile_rows, int slots, int device_buffers, int threads, double time_limit_s,
         bool streaming_stores) {
        if (n < 2) throw std::invalid_argument("n must be >= 2");
        if (replicas < 1 || steps < 0)
          throw std::invalid_argument("replicas must be >= 1 and steps >= 0");
        if (tile_rows < 1 || slots < 2 || device_buffers < 2 || threads < 0)
          throw std::invalid_argument(
              "tile_rows must be >= 1, slots and device_buffers >= 2, threads >= 0");
        csk::need(h.shape(0), std::size_t(n), "h");
        const int W = (n + 31) / 32;
        csk::gpu::ising::FillRows fill;
        std::unique_ptr<csk::dsb::tiles::Mattis> mattis;
        if (source == "mattis") {
          csk::need(xi.shape(0), std::size_t(n), "xi");
          mattis = std::make_unique<csk::dsb::tiles::Mattis>(xi.data(), n);
          fill = [&mattis, streaming_stores](int r0, int k, std::uint32_t* out) {
            mattis->rows(r0, k, out, streaming_stores);
          };
        } else if (source == "random") {
          const csk::dsb::tiles::Random gen{n, matrix_seed};
          fill = [gen](int r0, int k, std::uint32_t* out) { gen.rows(r0, k, out); };
        } else if (source == "rows") {
          if (rows.shape(0) != std::size_t(n) || rows.shape(1) != std::size_t(W))
            throw std::invalid_argument("rows must have shape (n, ceil(n/32))");
          const std::uint32_t* p = rows.data();
          fill = [p, W](int r0, int k, std::uint32_t* out) {
            std::memcpy(out, p + std::size_t(r0) * W, sizeof(std::uint32_t) * W * std::size_t(k));
          };
        } else {
          throw std::invalid_argument("source must be 'mattis', 'random' or 'rows', got '" +
                                      source + "'");
        }
        csk::gpu::ising::StreamArgs a;
        a.n = n;
        a.replicas = replicas;
        a.steps = steps;
        a.dt = dt;
        a.a0 = a0;
        a.c0 = c0;
        a.seed = seed;
        a.request = request;
        a.h = h.data();
        a.tile_rows = tile_rows;
        a.slots = slots;
        a.device_buffers = device_buffers;
        a.threads = threads;
        a.time_limit_s = time_limit_s;
        const std::size_t P = std::size_t(steps) + 1, B = std::size_t(replicas);
        std::vector<std::int64_t> energy(P * B), best_energy(B);
        std::vector<std::uint64_t> checksum(P * B);
        std::vector<std::uint32_t> best_signs(B * W);
        std::vector<float> x(B * std::size_t(n)), y(B * std::size_t(n));
        const csk::gpu::ising::RunOut o{energy.data(),     checksum.data(), best_energy.data(),
                                        best_signs.data(), x.data(),        y.data()};
        csk::gpu::ising::StreamStats s;
        {
          nb::gil_scoped_release release;
          s = csk::gpu::ising::run_stream(a, fill, o);
        }
        nb::dict stats;
        stats["wall_s"] = s.wall_s;
        stats["wait_s"] = s.wait_s;
        stats["fill_s"] = s.fill_s;
        stats["bytes"] = s.bytes;
        stats["tiles"] = s.tiles;
        stats["passes"] = s.passes;
        stats["threads"] = s.threads;
        stats["complete"] = s.complete;
        using csk::to_numpy;
        return nb::make_tuple(
            to_numpy(std::move(energy), {P, B}), to_numpy(std::move(checksum), {P, B}),
            to_numpy(std::move(best_energy), {B}), to_numpy(std::move(best_signs), {B, size_t(W)}),
            to_numpy(std::move(x), {B, size_t(n)}), to_numpy(std::move(y), {B, size_t(n)}), stats);
      },
      "source"_a, "n"_a, "xi"_a, "matrix_seed"_a, "rows"_a, "h"_a, "replicas"_a, "steps"_a, "dt"_a,
      "a0"_a, "c0"_a, "seed"_a, "request"_a, "tile_rows"_a, "slots"_a = 8, "device_buffers"_a = 3,
      "threads"_a = 0, "time_limit_s"_a = 0.0, "streaming_stores"_a = false,
      "Streamed dSB on the GPU: (energy[S+1, B], checksum[S+1, B], best_energy[B], "
      "best_signs[B, W], x[B, n], y[B, n], stats); the arrays are valid when stats['complete']. "
      "streaming_stores: the Mattis generator writes with non-temporal stores.");
  m.def(
      "h2d_rate",
      [](std::size_t bytes, int reps) {
        nb::gil_scoped_release release;
        return csk::gpu::ising::h2d_rate(bytes, reps);
      },
      "bytes"_a, "reps"_a,
      "Pinned host-to-device copy rate (10^9 bytes/s) over `reps` back-to-back copies.");
}
