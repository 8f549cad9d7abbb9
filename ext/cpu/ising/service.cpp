// The dSB request service with CPU workers (`cuscikit._core.ising.Server`) and its load
// generator (`cuscikit._core.ising.loadgen`). The front end is ising/server.hpp; a worker runs
// the C++ reference trajectory of every replica of a request (ising/reference.hpp), so a reply
// holds the bytes `solve` gives for the same model, field, steps, dt and seed.
#ifdef __linux__
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <functional>
#include <random>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#pragma GCC target("popcnt")
#endif
#include "cuscikit/numpy_out.hpp"
#include "ising/reference.hpp"
#include "ising/server.hpp"
#include "ising/server_bind.hpp"

namespace nb = nanobind;
using namespace nb::literals;
namespace svc = csk::dsb::service;
namespace wire = csk::dsb::wire;
using svc::Job;
using svc::Model;
using svc::now_ns;

namespace {

// Every replica's reference trajectory; the best energy (the lowest replica on ties) and spins.
std::int64_t solve_request(const Job& job, std::vector<std::uint32_t>& best_signs) {
  const Model& m = *job.model;
  const wire::Request& r = job.req;
  const std::int32_t* h = job.field.empty() ? m.h.data() : job.field.data();
  const csk::dsb::ref::Options o{
      m.n, m.nwords, int(r.replicas), int(r.steps), r.dt, 1.0f, job.c0, r.seed, 0u};
  const csk::dsb::Coupling c = m.coupling(h);
  std::vector<float> x(m.n), y(m.n);
  std::vector<std::uint32_t> signs(m.nwords);
  best_signs.assign(m.nwords, 0u);
  std::int64_t best = std::numeric_limits<std::int64_t>::max();
  auto h_of = [h](int i) { return h[i]; };
  csk::dsb::ref::with_exact_field(c, [&](auto field_of) {
    for (int b = 0; b < o.replicas; ++b) {
      const csk::dsb::ref::ReplicaOut<std::int64_t> out{x.data(), y.data(), signs.data()};
      const std::int64_t e = csk::dsb::ref::run_replica<std::int64_t>(o, b, field_of, h_of, out);
      if (e < best) {
        best = e;
        best_signs = signs;
      }
    }
    return 0;
  });
  return best;
}

// A CPU worker: requests in batches of up to 16, each solved on this thread. echo: answers at
// once with energy 0 and all spins -1, without solving (a measurement of the front end and the
// load generator alone; its replies are not solutions).
void cpu_worker(svc::Server& s, bool echo, int index) {
  svc::ThreadTrace* trace = s.thread_trace((echo ? "echo" : "cpu") + std::to_string(index));
  std::vector<Job> jobs;
  std::vector<std::uint32_t> signs;
  const std::vector<std::uint32_t> none(std::size_t(wire::kMaxN / 32), 0u);
  svc::UdpBatch out;
  while (true) {
    jobs.clear();
    if (!s.pop(jobs, 16, trace)) {
      if (s.stopping()) return;
      continue;
    }
    trace->tick();
    for (const Job& job : jobs) {
      if (echo) {
        s.reply_ok(job, 0, none.data(), out, trace);
        continue;
      }
      const std::int64_t energy = solve_request(job, signs);  // fills signs
      s.reply_ok(job, energy, signs.data(), out, trace);
    }
    s.flush(out, std::size_t(index), trace);
  }
}

// Sends `count` copies of `request` (request_id = i, seed = seed0 + i) to host:port from
// `senders` sockets, each with one thread that both sends and receives (request i goes out on
// socket i % senders): open loop (request i due at the i-th arrival of one Poisson process at
// `rate` per second) or closed loop
// (`in_flight` outstanding in all). Records per request its send time, round trip (-1: no reply
// came before every socket was silent for drain_s), status, residence and energy. spin: the
// threads spin on non-blocking reads instead of sleeping in poll() between sends (a core each,
// no wake-up latency in the measured round trip). offload: requests due together leave as one
// UDP_SEGMENT run, and replies the server sent that way are read as one run (UDP_GRO). pin: the
// threads are pinned to one CPU each (of those this process may use).
struct LoadResult {
  std::vector<std::int64_t> sent_ns, recv_ns;
  std::vector<std::int32_t> status;
  std::vector<std::uint32_t> residence_ns;
  std::vector<std::int64_t> energy;
  double send_s = 0.0;
  // per sending thread: passes of its loop more than 50 us apart (count, total ns, longest ns)
  std::vector<std::int64_t> stalls;
};

void load_one(int fd, std::size_t first, std::size_t stride, std::size_t count, double rate,
              int in_flight, double drain_s, bool spin, bool offload, std::uint64_t rng_seed,
              const std::vector<std::uint8_t>& request,
              const std::function<std::int64_t()>& start_at, LoadResult& res,
              std::int64_t* stalls) {
  const std::uint64_t seed0 = wire::load<std::uint64_t>(request.data() + 36);
  const std::size_t mine = first < count ? (count - first + stride - 1) / stride : 0;
  const std::int64_t drain_ns = std::int64_t(drain_s * 1e9);
  if (offload) svc::enable_gro(fd);
  // This socket's requests j = 0, 1, ... (request id first + j * stride), recorded here and
  // copied into `res` at the end (no cache line shared with the other sockets' threads).
  LoadResult own;
  own.sent_ns.assign(mine, -1);
  own.recv_ns.assign(mine, -1);
  own.status.assign(mine, -1);
  own.residence_ns.assign(mine, 0);
  own.energy.assign(mine, 0);

  constexpr int kRecv = 64;
  const std::size_t rx_bytes = offload ? 65536 : 2048;
  std::vector<std::vector<std::uint8_t>> rbufs(kRecv, std::vector<std::uint8_t>(rx_bytes));
  std::vector<iovec> riov(kRecv);
  std::vector<mmsghdr> rmsgs(kRecv);
  std::vector<std::array<char, 64>> rctrl(kRecv);
  std::size_t received = 0;
  // Reads what has arrived; returns how many replies it took.
  auto receive = [&]() -> int {
    for (int i = 0; i < kRecv; ++i) {
      svc::point_msg(rmsgs[i], riov[i], rbufs[i].data(), rbufs[i].size());
      if (offload) {
        rmsgs[i].msg_hdr.msg_control = rctrl[i].data();
        rmsgs[i].msg_hdr.msg_controllen = rctrl[i].size();
      }
    }
    const int got = ::recvmmsg(fd, rmsgs.data(), kRecv, MSG_DONTWAIT, nullptr);
    const std::int64_t t = now_ns();
    int took = 0;
    for (int i = 0; i < got; ++i) {
      const std::size_t len = rmsgs[i].msg_len;
      const std::size_t seg = offload ? svc::gro_segment(rmsgs[i].msg_hdr) : 0;
      const std::size_t step = seg > 0 && seg < len ? seg : len;
      for (std::size_t off = 0; step > 0 && off < len; off += step) {
        const std::uint8_t* p = rbufs[i].data() + off;
        if (std::min(step, len - off) < wire::kReplyHeader) continue;
        const std::uint64_t id = wire::load<std::uint64_t>(p + 8);
        if (id >= count || id % stride != first) continue;
        const std::size_t j = (id - first) / stride;
        if (own.recv_ns[j] >= 0) continue;
        own.recv_ns[j] = t;
        own.status[j] = wire::load<std::uint16_t>(p + 6);
        own.energy[j] = wire::load<std::int64_t>(p + 16);
        own.residence_ns[j] = wire::load<std::uint32_t>(p + 24);
        ++received;
        ++took;
      }
    }
    return took;
  };

  // Open loop: one Poisson process at `rate` for all sockets, request i due at its i-th
  // arrival. Every thread draws the same gaps (same seed) and takes the arrivals of its own
  // requests (i = first, first + stride, ...), so that the load offered in all is `rate` up to
  // the last request. (A Poisson process of rate / senders per socket, each with its share of
  // the requests, would offer `rate` only until the first socket ran out: the run would end
  // with the slowest socket, offering in all ~0.5-1 % less than `rate` over a 0.4 s run.)
  std::mt19937_64 rng(rng_seed);
  std::exponential_distribution<double> gap(rate > 0 ? rate : 1.0);
  double due_s = 0.0;  // the schedule's time of the last arrival drawn (s since t0)
  auto next_due = [&](std::size_t arrivals) {  // `arrivals` more of the process
    for (std::size_t a = 0; a < arrivals; ++a) due_s += gap(rng);
    return std::int64_t(due_s * 1e9);
  };
  constexpr std::size_t kBatch = 64;
  const std::size_t L = request.size();
  // offload: a run of up to `per_run` requests per message (one UDP_SEGMENT send)
  const std::size_t per_run =
      offload ? std::min(kBatch, std::max<std::size_t>(1, svc::UdpBatch::kMaxBytes / L)) : 1;
  std::vector<std::uint8_t> sbuf(L * kBatch);
  for (std::size_t j = 0; j < kBatch; ++j) std::memcpy(sbuf.data() + L * j, request.data(), L);
  std::vector<iovec> siov(kBatch);
  std::vector<mmsghdr> smsgs(kBatch);
  std::vector<std::array<char, CMSG_SPACE(sizeof(std::uint16_t))>> sctrl(kBatch);
  // Everything above is allocated and written (its pages faulted in) before the schedule
  // starts: done after it, a few MB a thread made the first requests due during the setup
  // leave late and at once, a burst at the start of every run that the offered load does not
  // have.
  const std::int64_t t0 = start_at();
  std::int64_t due_ns = t0 + next_due(first + 1);  // this socket's next arrival (open loop)
  std::size_t sent = 0;
  std::int64_t last_activity = t0;  // the last send or reply
  std::int64_t last_pass = 0;
  while (received < mine) {
    std::int64_t now = now_ns();
    if (spin && last_pass != 0 && now - last_pass > svc::ThreadTrace::kStallNs) {
      stalls[0] += 1;
      stalls[1] += now - last_pass;
      stalls[2] = std::max(stalls[2], now - last_pass);
    }
    last_pass = now;
    std::size_t k = 0;
    if (sent < mine) {
      if (in_flight > 0) {
        while (sent + k < mine && k < kBatch && (sent + k) - received < std::size_t(in_flight)) ++k;
      } else {
        while (sent + k < mine && k < kBatch && due_ns <= now) {
          due_ns = t0 + next_due(stride);
          ++k;
        }
      }
    }
    if (k > 0) {
      for (std::size_t j = 0; j < k; ++j) {
        const std::uint64_t id = first + (sent + j) * stride;
        wire::store<std::uint64_t>(sbuf.data() + L * j + 8, id);
        wire::store<std::uint64_t>(sbuf.data() + L * j + 36, seed0 + id);
      }
      const std::int64_t t = now_ns();
      for (std::size_t j = 0; j < k; ++j) own.sent_ns[sent + j] = t;
      bool segmented = per_run > 1 && k > 1 && svc::gso_usable().load(std::memory_order_relaxed);
      std::size_t nmsg = 0;
      for (std::size_t j = 0; j < k; j += segmented ? per_run : 1, ++nmsg) {
        const std::size_t len = segmented ? std::min(per_run, k - j) : 1;
        svc::point_msg(smsgs[nmsg], siov[nmsg], sbuf.data() + L * j, L * len);
        if (len > 1) {
          svc::set_segment_size(smsgs[nmsg], sctrl[nmsg], std::uint16_t(L));
        }
      }
      std::size_t done = 0;
      while (done < nmsg) {
        const int r = ::sendmmsg(fd, smsgs.data() + done, unsigned(nmsg - done), 0);
        if (r > 0) {
          done += std::size_t(r);
        } else if (segmented && done == 0 &&
                   (errno == EINVAL || errno == EIO || errno == EOPNOTSUPP ||
                    errno == ENOPROTOOPT)) {
          svc::gso_usable().store(false);  // the kernel does not segment: datagram by datagram
          segmented = false;
          nmsg = k;
          for (std::size_t j = 0; j < k; ++j)
            svc::point_msg(smsgs[j], siov[j], sbuf.data() + L * j, L);
        } else if (errno != EAGAIN && errno != EINTR && errno != ENOBUFS && errno != ECONNREFUSED) {
          break;
        }
      }
      sent += k;
      now = now_ns();
      last_activity = now;
    }
    if (receive() > 0) {
      last_activity = now_ns();
      continue;
    }
    if (sent == mine && now - last_activity > drain_ns) break;  // the rest is lost
    if (!spin && k == 0) {  // sleep until a reply comes or the next request is due
      std::int64_t wait_ns = 20'000'000;
      if (in_flight == 0 && sent < mine) wait_ns = std::min(wait_ns, due_ns - now);
      if (wait_ns > 0) {
        pollfd pfd{fd, POLLIN, 0};
        const timespec ts{time_t(wait_ns / 1'000'000'000), long(wait_ns % 1'000'000'000)};
        ::ppoll(&pfd, 1, &ts, nullptr);
      }
    }
  }
  for (std::size_t j = 0; j < mine; ++j) {
    const std::size_t id = first + j * stride;
    res.sent_ns[id] = own.sent_ns[j];
    res.recv_ns[id] = own.recv_ns[j];
    res.status[id] = own.status[j];
    res.residence_ns[id] = own.residence_ns[j];
    res.energy[id] = own.energy[j];
  }
}

LoadResult run_load(const std::string& host, int port, std::vector<std::uint8_t> request,
                    std::size_t count, double rate, int in_flight, double drain_s,
                    std::uint64_t rng_seed, int senders, bool spin, bool offload, bool pin) {
  if (request.size() < wire::kRequestHeader) throw std::invalid_argument("request too short");
  if (senders < 1) throw std::invalid_argument("senders must be >= 1");
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(std::uint16_t(port));
  if (::inet_pton(AF_INET, host.c_str(), &to.sin_addr) != 1)
    throw std::invalid_argument("not an IPv4 address: " + host);
  std::vector<int> fds;
  for (int k = 0; k < senders; ++k) {
    const int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) throw std::runtime_error("socket failed");
    svc::size_udp_buffers(fd, 64 << 20);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
      for (int f : fds) ::close(f);
      ::close(fd);
      throw std::runtime_error("connect failed");
    }
    fds.push_back(fd);
  }
  LoadResult res;
  res.sent_ns.assign(count, -1);
  res.recv_ns.assign(count, -1);
  res.status.assign(count, -1);
  res.residence_ns.assign(count, 0);
  res.energy.assign(count, 0);
  std::vector<std::thread> threads;
  const int flight = in_flight > 0 ? std::max(1, in_flight / senders) : 0;
  const std::vector<int> cpus = pin ? svc::allowed_cpus() : std::vector<int>{};
  res.stalls.assign(std::size_t(senders) * 3, 0);
  std::vector<std::array<std::int64_t, 8>> stalls(
      static_cast<std::size_t>(senders));  // a line each
  for (auto& st : stalls) st.fill(0);
  // The schedule starts once every thread runs where it is pinned and has set up its buffers
  // (load_one calls start_at when ready): a thread that started late would otherwise send all
  // its requests already due at once, a burst the offered load does not have.
  std::atomic<int> ready{0};
  std::atomic<std::int64_t> start{0};
  auto start_at = [&]() {
    ready++;
    std::int64_t t_start;
    while ((t_start = start.load(std::memory_order_acquire)) == 0) std::this_thread::yield();
    while (now_ns() < t_start) {
    }
    return t_start;
  };
  for (int k = 0; k < senders; ++k)
    threads.emplace_back([&, k] {
      if (!cpus.empty()) svc::pin_to(cpus[std::size_t(k) % cpus.size()]);
      ::pthread_setname_np(::pthread_self(), ("gen" + std::to_string(k)).c_str());
      load_one(fds[k], std::size_t(k), std::size_t(senders), count, rate, flight, drain_s, spin,
               offload, rng_seed, request, start_at, res, stalls[std::size_t(k)].data());
    });
  while (ready.load() < senders) std::this_thread::yield();
  const std::int64_t t0 = now_ns() + 200000;  // 200 us from now
  start.store(t0, std::memory_order_release);
  for (auto& t : threads) t.join();
  for (int f : fds) ::close(f);
  for (int k = 0; k < senders; ++k)
    for (int j = 0; j < 3; ++j) res.stalls[std::size_t(k) * 3 + j] = stalls[std::size_t(k)][j];
  std::int64_t last_send = t0;
  for (std::size_t j = 0; j < count; ++j) {  // sent_ns: since the start; recv_ns: round trip
    if (res.recv_ns[j] >= 0) res.recv_ns[j] -= res.sent_ns[j];
    if (res.sent_ns[j] >= 0) {
      last_send = std::max(last_send, res.sent_ns[j]);
      res.sent_ns[j] -= t0;
    }
  }
  res.send_s = double(last_send - t0) * 1e-9;
  return res;
}

// The CPU backend: `param` worker threads (mode "cpu"; mode "echo": no solving, see
// cpu_worker).
struct CpuWorkers {
  int count;
  bool echo;
  CpuWorkers(const std::string& mode, int param, int /*collectors*/)
      : count(param), echo(mode == "echo") {
    if (mode != "cpu" && mode != "echo")
      throw std::invalid_argument("the CPU service has modes 'cpu' and 'echo', got " + mode);
    if (param < 1) throw std::invalid_argument("workers must be >= 1");
  }
  void prepare(Model&) {}
  std::vector<svc::Server::Worker> workers() {
    const bool e = echo;
    std::vector<svc::Server::Worker> all;
    for (int i = 0; i < count; ++i) all.push_back([e, i](svc::Server& s) { cpu_worker(s, e, i); });
    return all;
  }
  void stop() {}
  void add_stats(std::map<std::string, std::uint64_t>&) {}
  std::string info() {
    return std::string(echo ? "cpu echo (no solving), " : "cpu, ") + std::to_string(count) +
           " worker thread(s)";
  }
};

}  // namespace

void bind_ising_service(nb::module_& m) {
  svc::bind_service<CpuWorkers>(m, "The dSB request service with CPU workers.");
  m.def(
      "loadgen",
      [](const std::string& host, int port, nb::bytes request, std::size_t count, double rate,
         int in_flight, double drain_s, std::uint64_t rng_seed, int senders, bool spin,
         bool offload, bool pin) {
        std::vector<std::uint8_t> req(
            static_cast<const std::uint8_t*>(request.data()),
            static_cast<const std::uint8_t*>(request.data()) + request.size());
        LoadResult r;
        {
          nb::gil_scoped_release release;
          r = run_load(host, port, std::move(req), count, rate, in_flight, drain_s, rng_seed,
                       senders, spin, offload, pin);
        }
        return nb::make_tuple(csk::to_numpy(std::move(r.sent_ns), {count}),
                              csk::to_numpy(std::move(r.recv_ns), {count}),
                              csk::to_numpy(std::move(r.status), {count}),
                              csk::to_numpy(std::move(r.residence_ns), {count}),
                              csk::to_numpy(std::move(r.energy), {count}), r.send_s,
                              csk::to_numpy(std::move(r.stalls), {std::size_t(senders), 3}));
      },
      "host"_a, "port"_a, "request"_a, "count"_a, "rate"_a, "in_flight"_a, "drain_s"_a,
      "rng_seed"_a, "senders"_a, "spin"_a = false, "offload"_a = false, "pin"_a = false,
      "Send `count` copies of a request (ids 0.., seeds seed+i) from `senders` sockets, open loop "
      "at `rate`/s (Poisson) "
      "or closed loop with `in_flight` outstanding: (sent_ns, rtt_ns, status, residence_ns, "
      "energy, send_s, stalls); rtt -1 = no reply; stalls: per sending thread, passes of its "
      "loop more than 50 us apart (count, total ns, longest ns; spin only).");
}
#endif  // __linux__
