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
void cpu_worker(svc::Server& s, bool echo) {
  std::vector<Job> jobs;
  std::vector<std::uint32_t> signs;
  const std::vector<std::uint32_t> none(std::size_t(wire::kMaxN / 32), 0u);
  svc::UdpBatch out;
  while (true) {
    jobs.clear();
    if (!s.pop(jobs, 16)) {
      if (s.stopping()) return;
      continue;
    }
    for (const Job& job : jobs) {
      if (echo) {
        s.reply_ok(job, 0, none.data(), out);
        continue;
      }
      const std::int64_t energy = solve_request(job, signs);  // fills signs
      s.reply_ok(job, energy, signs.data(), out);
    }
    s.flush(out);
  }
}

// Sends `count` copies of `request` (request_id = i, seed = seed0 + i) to host:port from
// `senders` sockets, each with a sending and a receiving thread (request i goes out on socket
// i % senders): open loop (Poisson arrivals at `rate` per second in all) or closed loop
// (`in_flight` outstanding in all). Records per request its send time, round trip (-1: no reply
// came before every socket was silent for drain_s), status, residence and energy. spin: the
// receiving threads spin on non-blocking reads instead of sleeping in poll() (a core each, no
// wake-up latency in the measured round trip).
struct LoadResult {
  std::vector<std::int64_t> sent_ns, recv_ns;
  std::vector<std::int32_t> status;
  std::vector<std::uint32_t> residence_ns;
  std::vector<std::int64_t> energy;
  double send_s = 0.0;
};

void load_one(int fd, std::size_t first, std::size_t stride, std::size_t count, double rate,
              int in_flight, double drain_s, bool spin, std::uint64_t rng_seed,
              const std::vector<std::uint8_t>& request, std::int64_t t0, LoadResult& res) {
  std::atomic<std::size_t> received{0};
  std::atomic<bool> sending{true};
  std::atomic<std::int64_t> last_activity{t0};  // the last send or reply
  const std::uint64_t seed0 = wire::load<std::uint64_t>(request.data() + 36);
  std::size_t mine = first < count ? (count - first + stride - 1) / stride : 0;
  std::thread rx([&] {
    constexpr int kBatch = 64;
    std::vector<std::vector<std::uint8_t>> bufs(kBatch, std::vector<std::uint8_t>(2048));
    std::vector<iovec> iov(kBatch);
    std::vector<mmsghdr> msgs(kBatch);
    while (received < mine) {
      if (!sending && now_ns() - last_activity > std::int64_t(drain_s * 1e9)) break;
      if (!spin) {
        pollfd pfd{fd, POLLIN, 0};
        if (::poll(&pfd, 1, 20) <= 0) continue;
      }
      for (int i = 0; i < kBatch; ++i)
        svc::point_msg(msgs[i], iov[i], bufs[i].data(), bufs[i].size());
      const int got = ::recvmmsg(fd, msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
      const std::int64_t t = now_ns();
      for (int i = 0; i < got; ++i) {
        const std::uint8_t* p = bufs[i].data();
        if (msgs[i].msg_len < wire::kReplyHeader) continue;
        const std::uint64_t id = wire::load<std::uint64_t>(p + 8);
        if (id >= count || id % stride != first || res.recv_ns[id] >= 0) continue;
        res.recv_ns[id] = t;
        res.status[id] = wire::load<std::uint16_t>(p + 6);
        res.energy[id] = wire::load<std::int64_t>(p + 16);
        res.residence_ns[id] = wire::load<std::uint32_t>(p + 24);
        received++;
        last_activity = t;
      }
    }
  });

  std::mt19937_64 rng(rng_seed);
  std::exponential_distribution<double> gap(rate > 0 ? rate : 1.0);
  constexpr std::size_t kBatch = 32;
  std::vector<std::vector<std::uint8_t>> bufs(kBatch, request);
  std::vector<iovec> iov(kBatch);
  std::vector<mmsghdr> msgs(kBatch);
  double due = gap(rng);  // seconds after t0 at which the next request is due (open loop)
  std::size_t sent = 0;
  while (sent < mine) {
    std::size_t k = 0;
    if (in_flight > 0) {
      while (sent + k < mine && k < kBatch && (sent + k) - received.load() < std::size_t(in_flight))
        ++k;
    } else {
      const double now = double(now_ns() - t0) * 1e-9;
      while (sent + k < mine && k < kBatch && due <= now) {
        due += gap(rng);
        ++k;
      }
    }
    if (k == 0) {  // wait for replies (closed loop) or for the next arrival (open loop)
      if (in_flight > 0) std::this_thread::yield();
      continue;
    }
    for (std::size_t j = 0; j < k; ++j) {
      const std::uint64_t id = first + (sent + j) * stride;
      wire::store<std::uint64_t>(bufs[j].data() + 8, id);
      wire::store<std::uint64_t>(bufs[j].data() + 36, seed0 + id);
      svc::point_msg(msgs[j], iov[j], bufs[j].data(), bufs[j].size());
    }
    const std::int64_t t = now_ns();
    for (std::size_t j = 0; j < k; ++j) res.sent_ns[first + (sent + j) * stride] = t;
    std::size_t done = 0;
    while (done < k) {
      const int r = ::sendmmsg(fd, msgs.data() + done, unsigned(k - done), 0);
      if (r > 0) {
        done += std::size_t(r);
      } else if (errno != EAGAIN && errno != EINTR && errno != ENOBUFS && errno != ECONNREFUSED) {
        break;
      }
    }
    last_activity = now_ns();
    sent += k;
  }
  sending = false;
  rx.join();
}

LoadResult run_load(const std::string& host, int port, std::vector<std::uint8_t> request,
                    std::size_t count, double rate, int in_flight, double drain_s,
                    std::uint64_t rng_seed, int senders, bool spin) {
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
    int buf = 64 << 20;
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
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
  const std::int64_t t0 = now_ns();
  std::vector<std::thread> threads;
  const int flight = in_flight > 0 ? std::max(1, in_flight / senders) : 0;
  for (int k = 0; k < senders; ++k)
    threads.emplace_back([&, k] {
      load_one(fds[k], std::size_t(k), std::size_t(senders), count, rate / senders, flight, drain_s,
               spin, rng_seed + std::uint64_t(k), request, t0, res);
    });
  for (auto& t : threads) t.join();
  for (int f : fds) ::close(f);
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
    return std::vector<svc::Server::Worker>(std::size_t(count),
                                            [e](svc::Server& s) { cpu_worker(s, e); });
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
         int in_flight, double drain_s, std::uint64_t rng_seed, int senders, bool spin) {
        std::vector<std::uint8_t> req(
            static_cast<const std::uint8_t*>(request.data()),
            static_cast<const std::uint8_t*>(request.data()) + request.size());
        LoadResult r;
        {
          nb::gil_scoped_release release;
          r = run_load(host, port, std::move(req), count, rate, in_flight, drain_s, rng_seed,
                       senders, spin);
        }
        return nb::make_tuple(csk::to_numpy(std::move(r.sent_ns), {count}),
                              csk::to_numpy(std::move(r.recv_ns), {count}),
                              csk::to_numpy(std::move(r.status), {count}),
                              csk::to_numpy(std::move(r.residence_ns), {count}),
                              csk::to_numpy(std::move(r.energy), {count}), r.send_s);
      },
      "host"_a, "port"_a, "request"_a, "count"_a, "rate"_a, "in_flight"_a, "drain_s"_a,
      "rng_seed"_a, "senders"_a, "spin"_a = false,
      "Send `count` copies of a request (ids 0.., seeds seed+i) from `senders` sockets, open loop "
      "at `rate`/s (Poisson) "
      "or closed loop with `in_flight` outstanding: (sent_ns, rtt_ns, status, residence_ns, "
      "energy, send_s); rtt -1 = no reply.");
}
#endif  // __linux__
