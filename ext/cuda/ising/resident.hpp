// The GPU backends of the dSB request service, in plain C++ (no CUDA headers) so that the
// server code compiles with the host compiler: a model copied to the device, a persistent
// kernel serving a ring of request slots in mapped host memory (one thread block per request),
// and the baseline that launches one kernel per request. Both run the same block solver, whose
// bytes equal the C++ reference's (cuscikit/dsb.hpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace csk::gpu::ising {

// A model's couplings in device memory (freed stream-ordered, so that replacing a model while
// the persistent kernel runs never waits for it).
struct DeviceModel {
  int kind = 0, n = 0, nwords = 0;
  std::uint32_t* plus = nullptr;
  std::uint32_t* minus = nullptr;
  std::int32_t* degree = nullptr;
  std::int8_t* j8 = nullptr;
  ~DeviceModel();
};

// Copies host arrays (sizes as in IsingModel.coupling_arrays(); null where the kind has none).
std::shared_ptr<DeviceModel> upload_model(int kind, int n, const std::uint32_t* plus,
                                          const std::uint32_t* minus, const std::int32_t* degree,
                                          const std::int8_t* j8);

// One request for the device: the model, the field (n values), B replicas, S steps.
struct Task {
  const DeviceModel* model;
  const std::int32_t* h;
  int replicas, steps;
  float dt, c0;
  std::uint64_t seed;
};

struct Done {
  std::uint64_t tag;
  std::int64_t energy;
  std::vector<std::uint32_t> signs;
};

// The persistent kernel and its ring. One thread submits (free_ticket, then submit); collectors
// poll disjoint parts of the ring and release a ticket once done with the request's own data.
class Resident {
 public:
  // slots: ring size; blocks: persistent blocks (0: as many as fit on the device at once).
  Resident(int slots, int blocks);
  ~Resident();  // stops the kernel (it polls the stop flag at most every 0.5 ms) and waits
  Resident(const Resident&) = delete;
  Resident& operator=(const Resident&) = delete;

  int blocks() const;
  int slots() const;
  // The ticket the next submit() gets, or -1 while its slot is still in use (the ring is full).
  std::int64_t free_ticket() const;
  // Publishes a task in the next slot (free_ticket() must not be -1); returns its ticket.
  std::uint64_t submit(const Task& t);
  // Appends the finished requests (tag = ticket) of slots part, part + parts, ... to `out`;
  // returns how many. Each stays reported until release(ticket). Several collectors may poll
  // disjoint parts at once.
  int poll(std::vector<Done>& out, int part = 0, int parts = 1);
  void release(std::uint64_t ticket);
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
