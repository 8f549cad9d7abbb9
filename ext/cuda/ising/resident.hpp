// The GPU backends of the dSB request service, in plain C++ (no CUDA headers) so that the
// server code compiles with the host compiler: a model copied to the device, a persistent
// kernel serving two rings of request slots in mapped host memory (small requests one warp
// each, the others one thread block each), and the baseline that launches one kernel per
// request. Every path runs a solver whose bytes equal the C++ reference's (cuscikit/dsb.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace csk::gpu::ising {

// A model's couplings and field in device memory (freed stream-ordered, so that replacing a
// model while the persistent kernel runs never waits for it). plus_t / minus_t hold the bit
// rows word-major (word w of row i at w * n_p + i), so that the rows of a warp load together.
struct DeviceModel {
  int kind = 0, n = 0, nwords = 0;
  std::uint32_t* plus_t = nullptr;
  std::uint32_t* minus_t = nullptr;
  std::int32_t* degree = nullptr;
  std::int8_t* j8 = nullptr;
  std::int32_t* h = nullptr;
  ~DeviceModel();
};

// Copies host arrays (sizes as in IsingModel.coupling_arrays(); null where the kind has none).
std::shared_ptr<DeviceModel> upload_model(int kind, int n, const std::uint32_t* plus,
                                          const std::uint32_t* minus, const std::int32_t* degree,
                                          const std::int8_t* j8, const std::int32_t* h);

// One request for the device: the model, the field (n values on the host; null: the model's
// own, already on the device), B replicas, S steps.
struct Task {
  const DeviceModel* model;
  const std::int32_t* h;
  int replicas, steps;
  float dt, c0;
  std::uint64_t seed;
};

// A finished request: its slot, energy and best spins (valid until release(slot)), and the
// time its solver took on the device (reading the task to writing the reply).
struct Done {
  std::uint64_t slot;
  std::int64_t energy;
  const std::uint32_t* signs;
  std::uint64_t solve_ns;
};

// True when one warp serves the task alone (binary or ternary couplings, B * n_p <= 256).
bool warp_sized(const Task& t);

// The persistent kernel and its two rings (warp-sized requests, block-sized requests). Slots
// are numbered 0 .. slots() - 1 (the warp ring first). One thread submits (free_slot, then
// submit); collectors poll disjoint parts of the slots and release a slot once done with it.
class Resident {
 public:
  // warp_ring, block_ring: slots of each ring (a slot is taken again warp_ring tickets later:
  // the ring must hold the requests submitted while its oldest waits for its solve and a
  // collector); blocks: persistent blocks of 256 threads (0: as many as fit on the device at
  // once), one of them the dispatcher, three quarters of the rest serving block-sized requests
  // and the others eight warp-sized requests at a time (one per warp). generic: warp-sized
  // requests of one replica on the solver for any replica count too (the same bytes, slower;
  // for comparison) instead of the one specialised for them.
  Resident(int warp_ring, int block_ring, int blocks, bool generic = false);
  ~Resident();  // stops the kernel (the dispatcher reads the stop flag every ~50 us) and waits
  Resident(const Resident&) = delete;
  Resident& operator=(const Resident&) = delete;

  int blocks() const;
  int block_servers() const;
  int warp_servers() const;
  int slots() const;            // both rings
  int ring_slots(int k) const;  // ring k's (0: warp ring, 1: block ring)
  bool generic() const;
  // The slot the task's next submit() takes, or -1 while that slot is still in use.
  std::int64_t free_slot(const Task& t) const;
  // Writes a task into its ring's next slot (free_slot(t) must not be -1) and, with publish,
  // publishes it (and any written before without) to the kernel; returns the slot. counted:
  // the caller has counted it in flight already (expect()), so that a batch of submissions
  // costs one shared update instead of one each. publish = false lets a batch of submissions
  // go out with one store to the counter the dispatcher reads over PCIe (publish()).
  std::uint64_t submit(const Task& t, bool counted = false, bool publish = true);
  // Publishes every task written so far (both rings); returns how many it published.
  std::uint64_t publish();
  void expect(std::uint64_t count);  // counts `count` submissions to come in flight
  // Appends the finished requests of slots part, part + parts, ... to `out`; returns how many.
  // Each stays reported until release(slot). Several collectors may poll disjoint parts; with
  // claim, a finished slot is reported once only (taken by compare-and-swap), so that several
  // collectors may poll the same part.
  int poll(std::vector<Done>& out, int part = 0, int parts = 1, bool claim = false);
  void release(std::uint64_t slot);
  void release(const std::uint64_t* slots, int count);  // several at once
  std::uint64_t in_flight() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The baseline: one kernel launch (one block) per request on the calling thread's own stream,
// copies in and out, and a synchronisation. One object per thread.
class Launcher {
 public:
  Launcher();
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;
  std::int64_t solve(const Task& t, std::vector<std::uint32_t>& signs);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace csk::gpu::ising
