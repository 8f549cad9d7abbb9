// The dSB request service with GPU workers (`cuscikit._cuda.ising.Server`): the front end of
// ext/cpu/ising/server.hpp with the backends of resident.hpp. Mode "resident": one feeder thread
// moves queued requests into the persistent kernel's rings and `collectors` threads (each
// scanning its share of the slots) send the replies (param: persistent blocks, 0 = as many as
// fit). Mode "launch": `param` threads, each launching one kernel per request on its own stream
// (the baseline).
#ifdef __linux__
#include <nanobind/nanobind.h>

#include <algorithm>
#include <map>
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
  const std::int32_t* h = job.field.empty() ? nullptr : job.field.data();  // null: the model's
  return gi::Task{static_cast<const gi::DeviceModel*>(m.device.get()),
                  h,
                  int(job.req.replicas),
                  int(job.req.steps),
                  job.req.dt,
                  job.c0,
                  job.req.seed};
}

struct GpuWorkers {
  std::string mode;
  int param, collectors;
  std::unique_ptr<gi::Resident> resident;
  std::vector<svc::Job> held;  // resident: the job of each ring slot
  std::atomic<bool> feeder_done{false};
  // Resident counters, each thread adding its sums once a batch, the feeder's and the
  // collectors' on cache lines of their own: the device time of the solves, receipt to the
  // reply (the whole residence), and receipt to submission (the queue and the feeder); a
  // residence less both is the wait for the kernel to pick the request up and for a collector
  // to find it done.
  struct alignas(64) {
    std::atomic<std::uint64_t> solved{0}, solve_ns{0}, solve_max_ns{0}, reply_ns{0};
  } done_stats;
  struct alignas(64) {
    std::atomic<std::uint64_t> fed{0}, wait_ns{0};
  } feed_stats;

  GpuWorkers(const std::string& m, int p, int c) : mode(m), param(p), collectors(c) {
    if (collectors < 1) throw std::invalid_argument("collectors must be >= 1");
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
    m.device = gi::upload_model(m.kind, m.n, m.plus.data(), m.minus.data(), m.degree.data(),
                                m.j8.data(), m.h.data());
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
          const gi::Task task = task_of(job);
          std::int64_t slot;
          while ((slot = resident->free_slot(task)) < 0) std::this_thread::yield();
          // counted before the submit (a line only this thread writes): fed >= solved always
          feed_stats.wait_ns.fetch_add(std::uint64_t(svc::now_ns() - job.t_recv),
                                       std::memory_order_relaxed);
          feed_stats.fed.fetch_add(1, std::memory_order_relaxed);
          held[std::size_t(slot)] = std::move(job);
          resident->submit(task);
        }
      }
      feeder_done = true;
    };
    auto collector = [this](svc::Server& s, int part) {
      std::vector<gi::Done> done;
      std::vector<std::uint64_t> slots;
      svc::UdpBatch out;
      while (true) {
        done.clear();
        if (resident->poll(done, part, collectors) == 0) {
          if (feeder_done && resident->in_flight() == 0) return;
          std::this_thread::yield();
          continue;
        }
        std::uint64_t dev_ns = 0, dev_max = 0, res_ns = 0;
        slots.clear();
        for (const gi::Done& d : done) {
          svc::Job& job = held[d.slot];
          s.reply_ok(job, d.energy, d.signs, out);  // copies the spins out of the slot
          res_ns += std::uint64_t(svc::now_ns() - job.t_recv);
          dev_ns += d.solve_ns;
          dev_max = std::max<std::uint64_t>(dev_max, d.solve_ns);
          job.model.reset();
          job.tcp.reset();
          slots.push_back(d.slot);
        }
        resident->release(slots.data(), int(slots.size()));
        auto& st = done_stats;
        st.solve_ns.fetch_add(dev_ns, std::memory_order_relaxed);
        st.reply_ns.fetch_add(res_ns, std::memory_order_relaxed);
        std::uint64_t m = st.solve_max_ns.load();
        while (dev_max > m && !st.solve_max_ns.compare_exchange_weak(m, dev_max)) {
        }
        st.solved.fetch_add(done.size());  // last: a reader seeing it sees the sums
        s.flush(out, std::size_t(part));
      }
    };
    std::vector<svc::Server::Worker> all{feeder};
    for (int c = 0; c < collectors; ++c)
      all.push_back([collector, c](svc::Server& s) { collector(s, c); });
    return all;
  }

  void stop() { resident.reset(); }

  void add_stats(std::map<std::string, std::uint64_t>& st) {
    if (mode != "resident") return;
    st["device_solved"] = done_stats.solved.load();
    st["device_solve_ns"] = done_stats.solve_ns.load();
    st["device_solve_max_ns"] = done_stats.solve_max_ns.load();
    st["reply_ns"] = done_stats.reply_ns.load();
    st["fed"] = feed_stats.fed.load();
    st["feed_wait_ns"] = feed_stats.wait_ns.load();
  }

  std::string info() {
    if (mode == "launch")
      return "cuda, one launch per request, " + std::to_string(param) + " stream(s)";
    if (!resident) return "cuda, resident kernel (stopped)";
    return "cuda, resident kernel, " + std::to_string(resident->blocks()) +
           " blocks of 256 threads (" + std::to_string(resident->warp_servers()) +
           " warp servers, " + std::to_string(resident->block_servers()) +
           " block servers, 1 dispatcher), 2 rings of " + std::to_string(held.size() / 2) +
           " slots, " + std::to_string(collectors) + " collectors";
  }
};

}  // namespace

void bind_ising_service(nanobind::module_& m) {
  svc::bind_service<GpuWorkers>(m, "The dSB request service with GPU workers.");
}
#endif  // __linux__
