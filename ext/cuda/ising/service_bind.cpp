// The dSB request service with GPU workers (`cuscikit._cuda.ising.Server`): the front end of
// ext/cpu/ising/server.hpp with the backends of resident.hpp. Mode "resident": one feeder thread
// moves queued requests into the persistent kernel's ring and one collector thread sends the
// replies (param: persistent blocks, 0 = as many as fit). Mode "launch": `param` threads, each
// launching one kernel per request on its own stream (the baseline).
#ifdef __linux__
#include <nanobind/nanobind.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "../../cpu/ising/server_bind.hpp"
#include "resident.hpp"

namespace svc = csk::dsb::service;
namespace gi = csk::gpu::ising;

namespace {

gi::Task task_of(const svc::Job& job) {
  const svc::Model& m = *job.model;
  const std::int32_t* h = job.field.empty() ? m.h.data() : job.field.data();
  return gi::Task{static_cast<const gi::DeviceModel*>(m.device.get()),
                  h,
                  int(job.req.replicas),
                  int(job.req.steps),
                  job.req.dt,
                  job.c0,
                  job.req.seed};
}

struct GpuWorkers {
  static constexpr int kCollectors = 4;  // reply threads (each polls a quarter of the ring)
  std::string mode;
  int param;
  std::unique_ptr<gi::Resident> resident;
  std::vector<svc::Job> held;  // resident: the job of each ring slot
  std::atomic<bool> feeder_done{false};

  GpuWorkers(const std::string& m, int p) : mode(m), param(p) {
    if (mode == "resident") {
      resident = std::make_unique<gi::Resident>(1024, param);
      held.resize(std::size_t(resident->slots()));
    } else if (mode == "launch") {
      if (param < 1) throw std::invalid_argument("streams must be >= 1");
    } else {
      throw std::invalid_argument("the GPU service has modes 'resident' and 'launch', got " + m);
    }
  }

  void prepare(svc::Model& m) {
    m.device =
        gi::upload_model(m.kind, m.n, m.plus.data(), m.minus.data(), m.degree.data(), m.j8.data());
  }

  std::vector<svc::Server::Worker> workers() {
    if (mode == "launch") {
      auto one = [](svc::Server& s) {
        gi::Launcher launcher;
        std::vector<svc::Job> jobs;
        std::vector<std::uint32_t> signs;
        svc::UdpBatch out;
        while (true) {
          jobs.clear();
          if (!s.pop(jobs, 1)) {
            if (s.stopping()) return;
            continue;
          }
          for (const svc::Job& job : jobs) {
            const std::int64_t e = launcher.solve(task_of(job), signs);
            s.reply_ok(job, e, signs.data(), out);
          }
          s.flush(out);
        }
      };
      return std::vector<svc::Server::Worker>(std::size_t(param), one);
    }
    feeder_done = false;
    auto feeder = [this](svc::Server& s) {
      std::vector<svc::Job> jobs;
      while (true) {
        jobs.clear();
        if (!s.pop(jobs, 64)) {
          if (s.stopping()) break;
          continue;
        }
        for (svc::Job& job : jobs) {
          std::int64_t t;
          while ((t = resident->free_ticket()) < 0) std::this_thread::yield();
          const gi::Task task = task_of(job);
          held[std::size_t(t) % held.size()] = std::move(job);
          resident->submit(task);
        }
      }
      feeder_done = true;
    };
    auto collector = [this](svc::Server& s, int part) {
      std::vector<gi::Done> done;
      svc::UdpBatch out;
      while (true) {
        done.clear();
        if (resident->poll(done, part, kCollectors) == 0) {
          if (feeder_done && resident->in_flight() == 0) return;
          std::this_thread::yield();
          continue;
        }
        for (const gi::Done& d : done) {
          svc::Job& job = held[d.tag % held.size()];
          s.reply_ok(job, d.energy, d.signs.data(), out);
          job.model.reset();
          job.tcp.reset();
          resident->release(d.tag);
        }
        s.flush(out, std::size_t(part));
      }
    };
    std::vector<svc::Server::Worker> all{feeder};
    for (int c = 0; c < kCollectors; ++c)
      all.push_back([collector, c](svc::Server& s) { collector(s, c); });
    return all;
  }

  void stop() { resident.reset(); }

  std::string info() {
    if (mode == "launch")
      return "cuda, one launch per request, " + std::to_string(param) + " stream(s)";
    return "cuda, resident kernel, " + std::to_string(resident ? resident->blocks() : 0) +
           " blocks of 256 threads, ring of " + std::to_string(held.size()) + " slots, " +
           std::to_string(kCollectors) + " collectors";
  }
};

}  // namespace

void bind_ising_service(nanobind::module_& m) {
  svc::bind_service<GpuWorkers>(m, "The dSB request service with GPU workers.");
}
#endif  // __linux__
