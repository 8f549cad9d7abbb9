// The dSB kernel's host entry point, in plain C++ (no CUDA headers) so that the nanobind code
// compiles with the host compiler.
#pragma once
#include <cstddef>
#include <cstdint>

namespace csk::gpu::ising {

// One run of `replicas` replicas for `steps` steps; host arrays in, host arrays out (the shapes
// of the C++ reference: energy and checksum (steps + 1) x replicas, best_energy replicas,
// best_signs replicas x nwords, x and y replicas x n).
struct RunArgs {
  int kind = 0, n = 0, nwords = 0, replicas = 0, steps = 0;
  float dt = 0.5f, a0 = 1.0f, c0 = 0.0f;
  std::uint64_t seed = 0;
  std::uint32_t request = 0;
  const std::uint32_t* plus = nullptr;
  std::size_t plus_len = 0;
  const std::uint32_t* minus = nullptr;
  std::size_t minus_len = 0;
  const std::int32_t* degree = nullptr;
  std::size_t degree_len = 0;
  const std::int8_t* j8 = nullptr;
  std::size_t j8_len = 0;
  const std::int32_t* h = nullptr;
  int tile_replicas = 0;  // replicas per block tile: 64, 128 or 0 (chosen from the sizes)
};

struct RunOut {
  std::int64_t* energy;
  std::uint64_t* checksum;
  std::int64_t* best_energy;
  std::uint32_t* best_signs;
  float* x;
  float* y;
};

// Runs on the current device and waits for it; returns the kernel's time in milliseconds.
// Throws std::runtime_error on CUDA errors, std::invalid_argument on sizes it cannot run.
float run_dsb(const RunArgs& args, const RunOut& out);

}  // namespace csk::gpu::ising
