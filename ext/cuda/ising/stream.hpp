// The streamed dSB run on the GPU (ext/cuda/ising/stream.cu), in plain C++ (no CUDA headers) so
// that the nanobind code compiles with the host compiler.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>

#include "api.hpp"

namespace csk::gpu::ising {

struct StreamArgs {
  int n = 0, replicas = 0;
  int steps = 0;  // K updates take K + 1 passes; 0: one pass scoring the initial signs
  float dt = 0.5f, a0 = 1.0f, c0 = 0.0f;
  std::uint64_t seed = 0;
  std::uint32_t request = 0;
  const std::int32_t* h = nullptr;  // n integers
  int tile_rows = 1;                // rows of the matrix per tile
  int slots = 8;                    // pinned host buffers of one tile each
  int device_buffers = 3;           // device buffers of one tile each
  int threads = 0;                  // producer threads (0: the machine's cores less two)
  double time_limit_s = 0.0;        // > 0: stop issuing tiles after this long (then incomplete)
};

// Writes rows r0 .. r0 + rows - 1 of the matrix (rows x ceil(n/32) words) to `out`; called from
// several producer threads at once, for disjoint rows.
using FillRows = std::function<void(int r0, int rows, std::uint32_t* out)>;

struct StreamStats {
  double wall_s = 0.0;    // first tile requested .. results on the host
  double wait_s = 0.0;    // time the issuing thread waited for filled tiles
  double fill_s = 0.0;    // producer time spent filling, summed over threads
  std::size_t bytes = 0;  // coupling bytes copied to the device
  long long tiles = 0;    // tiles copied
  int passes = 0;         // passes completed
  int threads = 0;        // producer threads used
  bool complete = false;  // all passes done (false: stopped by time_limit_s)
};

// The run: outputs as run_dsb's (energy and checksum (steps + 1) x replicas, ...), written only
// when the run completes. Throws std::runtime_error on CUDA errors.
StreamStats run_stream(const StreamArgs& args, const FillRows& fill, const RunOut& out);

// Pinned host -> device copy rate in GB/s (10^9 bytes/s): `reps` copies of `bytes` each, queued
// back to back on one stream, timed with CUDA events.
double h2d_rate(std::size_t bytes, int reps);

}  // namespace csk::gpu::ising
