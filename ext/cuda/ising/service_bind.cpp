// The dSB request service with GPU workers (`cuscikit._cuda.ising.Server`): the front end of
// ext/cpu/ising/server.hpp with the backends of resident.hpp. Mode "resident": one feeder thread
// moves queued requests into the persistent kernel's rings and `collectors` threads (each
// scanning its share of the slots) send the replies (param: persistent blocks, 0 = as many as
// fit). Mode "launch": `param` threads, each launching one kernel per request on its own stream
// (the baseline).
#ifdef __linux__
#include <nanobind/nanobind.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
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
    std::atomic<std::uint64_t> fed{0}, wait_ns{0}, busy_ns{0}, batches{0};
  } feed_stats;
  // Work sharing (Server::share()): when each collector and the feeder last made a pass, the
  // feeding try-lock, and how much the others did for a stalled one.
  static constexpr std::size_t kShareFeed = 16;
  static constexpr std::size_t kPublish = 8;  // tasks a store of the ring's published counter
  // Ring slots. The feeder waits when the slot of its next ticket is still busy, and then
  // holds every request behind it: at 1 M req/s 1024 warp slots came round in ~1 ms, and in a
  // burst the feeder wraps them several times faster, so one collector behind by a few hundred
  // us stopped all feeding. 4096 warp slots (69 MB of pinned memory) keep that apart; the block
  // ring stays at 1024 (its requests take ~0.3-0.7 ms: in overload more slots only add wait).
  static constexpr int kWarpRing = 4096, kBlockRing = 1024;
  struct alignas(64) Beat {
    std::atomic<std::int64_t> t{0};
  };
  std::unique_ptr<Beat[]> coll_beat;
  Beat feed_beat;
  alignas(64) std::atomic<bool> feeding{false};
  alignas(64) std::atomic<std::uint64_t> helped_collects{0}, helped_feeds{0};

  GpuWorkers(const std::string& m, int p, int c) : mode(m), param(p), collectors(c) {
    if (collectors < 1) throw std::invalid_argument("collectors must be >= 1");
    if (mode == "resident") {
      const char* generic = std::getenv("CUSCIKIT_DSB_GENERIC_SOLVER");  // for comparison
      resident = std::make_unique<gi::Resident>(
          kWarpRing, kBlockRing, param, generic != nullptr && *generic != '\0' && *generic != '0');
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
    coll_beat.reset(new Beat[std::size_t(collectors)]);
    // Moves popped jobs into the ring (waiting for a free slot where needed).
    // The shared counters (fed, in flight) go up once for the batch, before its first submit
    // (so fed >= solved always): a locked update drains the store buffer, and one per request
    // made every submission wait for its own slot writes. The kernel sees the tasks kPublish at
    // a time (and the rest at the end, or before a wait for a free slot): one store to the
    // counter its dispatcher reads over PCIe for several tasks.
    auto submit_all = [this](svc::Server& s, std::vector<svc::Job>& jobs) {
      if (jobs.empty()) return;
      const std::int64_t t0 = svc::now_ns();
      feed_stats.fed.fetch_add(jobs.size(), std::memory_order_relaxed);
      resident->expect(jobs.size());
      std::uint64_t wait_ns = 0;
      std::size_t unpublished = 0;
      for (svc::Job& job : jobs) {
        const gi::Task task = task_of(job);
        std::int64_t slot = resident->free_slot(task);
        if (slot < 0) {
          resident->publish();
          unpublished = 0;
          while ((slot = resident->free_slot(task)) < 0) std::this_thread::yield();
        }
        const std::int64_t now = svc::now_ns();
        wait_ns += std::uint64_t(now - job.t_recv);
        svc::Job& held_job = held[std::size_t(slot)];
        held_job = std::move(job);
        if (s.tracing()) held_job.t_submit = now;
        const bool publish = ++unpublished == kPublish;
        resident->submit(task, true, publish);
        if (publish) unpublished = 0;
      }
      resident->publish();
      feed_stats.wait_ns.fetch_add(wait_ns, std::memory_order_relaxed);
      feed_stats.busy_ns.fetch_add(std::uint64_t(svc::now_ns() - t0), std::memory_order_relaxed);
      feed_stats.batches.fetch_add(1, std::memory_order_relaxed);
    };
    // With sharing, feeding is a role any thread takes by a try-lock, a few jobs at a time:
    // the feeder holds it most of the time, a collector takes it when the feeder has not fed
    // for help_ns (a stalled feeder then holds at most kShareFeed jobs back).
    auto try_feed = [this, submit_all](svc::Server& s, std::vector<svc::Job>& jobs) {
      if (feeding.exchange(true, std::memory_order_acquire)) return std::size_t(0);
      jobs.clear();
      const std::size_t got = s.try_pop(jobs, kShareFeed);
      submit_all(s, jobs);
      feeding.store(false, std::memory_order_release);
      return got;
    };
    auto feeder = [this, submit_all, try_feed](svc::Server& s) {
      svc::ThreadTrace* trace = s.thread_trace("feed");
      std::vector<svc::Job> jobs;
      while (true) {
        if (s.share(svc::Server::kShareFeed)) {
          if (s.stopping()) break;
          const std::int64_t now = svc::now_ns();
          trace->tick(now);
          feed_beat.t.store(now, std::memory_order_relaxed);
          try_feed(s, jobs);
          continue;
        }
        jobs.clear();
        if (!s.pop(jobs, 64, trace)) {
          if (s.stopping()) break;
          continue;
        }
        trace->tick();
        submit_all(s, jobs);
      }
      feeder_done = true;
    };
    auto collector = [this, try_feed](svc::Server& s, int part) {
      svc::ThreadTrace* trace = s.thread_trace("coll" + std::to_string(part));
      const bool share = s.share(svc::Server::kShareCollect);
      const bool feed = s.share(svc::Server::kShareFeed);
      const std::int64_t help = s.help_ns();
      std::vector<gi::Done> done;
      std::vector<std::uint64_t> slots;
      std::vector<svc::Job> jobs;
      svc::UdpBatch out;
      while (true) {
        done.clear();
        const std::int64_t now = svc::now_ns();
        trace->tick(now);
        coll_beat[std::size_t(part)].t.store(now, std::memory_order_relaxed);
        int got = resident->poll(done, part, collectors, share);
        if (share) {  // help a collector that has stalled (looked at on every pass: under load
                      // the own share is never empty)
          for (int q = 1; q < collectors; ++q) {
            const int other = (part + q) % collectors;
            if (now - coll_beat[std::size_t(other)].t.load(std::memory_order_relaxed) > help) {
              const int more = resident->poll(done, other, collectors, true);
              got += more;
              if (more > 0) helped_collects.fetch_add(std::uint64_t(more));
            }
          }
        }
        if (feed && got == 0 && now - feed_beat.t.load(std::memory_order_relaxed) > help) {
          const std::size_t fed = try_feed(s, jobs);  // or the feeder
          if (fed > 0) helped_feeds.fetch_add(fed);
        }
        if (got == 0) {
          if (feeder_done && resident->in_flight() == 0) return;
          std::this_thread::yield();
          continue;
        }
        const std::int64_t seen = s.tracing() ? svc::now_ns() : 0;
        std::uint64_t dev_ns = 0, dev_max = 0, res_ns = 0;
        slots.clear();
        for (const gi::Done& d : done) {
          svc::Job& job = held[d.slot];
          job.t_seen = seen;
          job.solve_ns = d.solve_ns;
          s.reply_ok(job, d.energy, d.signs, out, trace);  // copies the spins out of the slot
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
        s.flush(out, std::size_t(part), trace);
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
    st["feed_busy_ns"] = feed_stats.busy_ns.load();  // submitting (batches of feed_batches)
    st["feed_batches"] = feed_stats.batches.load();
    st["helped_collects"] = helped_collects.load();
    st["helped_feeds"] = helped_feeds.load();
  }

  std::string info() {
    if (mode == "launch")
      return "cuda, one launch per request, " + std::to_string(param) + " stream(s)";
    if (!resident) return "cuda, resident kernel (stopped)";
    return "cuda, resident kernel, " + std::to_string(resident->blocks()) +
           " blocks of 256 threads (" + std::to_string(resident->warp_servers()) +
           " warp servers, " + std::to_string(resident->block_servers()) +
           " block servers, 1 dispatcher), rings of " + std::to_string(resident->ring_slots(0)) +
           " (warp) and " + std::to_string(resident->ring_slots(1)) + " (block) slots, " +
           std::to_string(collectors) + " collectors" +
           (resident->generic() ? ", generic warp solver" : "");
  }
};

}  // namespace

void bind_ising_service(nanobind::module_& m) {
  svc::bind_service<GpuWorkers>(m, "The dSB request service with GPU workers.");
}
#endif  // __linux__
