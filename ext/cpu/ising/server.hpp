// The front end of the dSB request service, written once for every backend (the CPU workers
// in service.cpp, the GPU ones in ext/cuda/ising): models in slots by id, UDP receiver threads
// (one socket each on the same port, recvmmsg batches) and a TCP listener (u32 length-prefixed
// frames, one thread per connection) that parse requests, answer bad ones at once with their
// error status (counted), and queue good ones in a bounded lock-free queue; a full queue answers
// BUSY at once instead of dropping. The backend's worker threads take queued requests in batches
// and answer through reply_ok() / flush() (sendmmsg batches). A LOAD request or load_model()
// replaces a slot; requests already queued keep the model they were given. Optionally the UDP
// sockets use segmentation offload (UDP_SEGMENT for the replies to one peer, UDP_GRO for
// requests a client sent the same way) and the threads are pinned to one CPU each. Wire format:
// cuscikit/dsb_protocol.hpp. Linux only.
#pragma once
#include <arpa/inet.h>
#include <dirent.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cuscikit/dsb.hpp"
#include "cuscikit/dsb_protocol.hpp"

namespace csk::dsb::service {

namespace wire = csk::dsb::wire;

inline std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The wall clock (ns), the clock of the kernel's receive time stamps.
inline std::int64_t wall_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// ---- models ---------------------------------------------------------------------------------
struct Model {
  int kind = 0, n = 0, nwords = 0;
  std::vector<std::uint32_t> plus, minus;
  std::vector<std::int32_t> degree, h;
  std::vector<std::int8_t> j8;
  std::int64_t jnorm2 = 0;             // ||J||_F^2, exact
  std::shared_ptr<const void> device;  // the backend's copy (a GPU's), if it keeps one
  float c0 = 0.0f;                     // coupling_scale with the model's own field

  Coupling coupling(const std::int32_t* field) const {
    return Coupling{kind, n, nwords, plus.data(), minus.data(), degree.data(), j8.data(), field};
  }
};

// c0 = 0.5 sqrt(n_e - 1) / sqrt(||J||^2 + 2 ||h||^2) in double, rounded once to float: the value
// IsingModel.c0() computes for the same J and h.
float coupling_scale(const Model& m, const std::int32_t* h) {
  std::int64_t f = m.jnorm2;
  bool any = false;
  for (int i = 0; i < m.n; ++i) {
    f += 2 * std::int64_t(h[i]) * h[i];
    any = any || h[i] != 0;
  }
  const int ne = m.n + (any ? 1 : 0);
  if (f == 0 || ne < 2) return 0.0f;
  return static_cast<float>(0.5 * std::sqrt(double(ne - 1)) / std::sqrt(double(f)));
}

// A model from the upper triangle of a LOAD payload (binary: +1 bits; int8: signed bytes).
inline std::shared_ptr<Model> model_from_wire(const wire::Request& r) {
  auto m = std::make_shared<Model>();
  const int n = int(r.n), W = (n + 31) / 32;
  m->n = n;
  m->nwords = W;
  m->h.assign(n, 0);
  std::size_t k = 0;
  if (r.payload_type == wire::kBinaryPlanes) {
    m->kind = kBinary;
    m->plus.assign(std::size_t(n) * W, 0u);
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j, ++k) {
        const std::uint32_t word = wire::load<std::uint32_t>(r.payload + 4 * (k >> 5));
        if ((word >> (k & 31)) & 1u) {
          m->plus[std::size_t(i) * W + (j >> 5)] |= 1u << (j & 31);
          m->plus[std::size_t(j) * W + (i >> 5)] |= 1u << (i & 31);
        }
      }
    m->jnorm2 = std::int64_t(n) * (n - 1);
  } else {
    m->kind = kInt8;
    const std::size_t ld = std::size_t(W) * 32;
    m->j8.assign(std::size_t(n) * ld, 0);
    for (int i = 0; i < n; ++i)
      for (int j = i + 1; j < n; ++j, ++k) {
        const std::int8_t v = static_cast<std::int8_t>(r.payload[k]);
        m->j8[std::size_t(i) * ld + j] = v;
        m->j8[std::size_t(j) * ld + i] = v;
        m->jnorm2 += 2 * std::int64_t(v) * v;
      }
  }
  return m;
}

// ---- jobs and the bounded queue -----------------------------------------------------------
struct TcpConn {
  int fd;
  std::mutex write;
  std::atomic<bool> open{true};
  explicit TcpConn(int f) : fd(f) {}
  ~TcpConn() { ::close(fd); }
  void send_frame(const std::uint8_t* p, std::size_t len) {
    std::lock_guard<std::mutex> lock(write);
    std::uint8_t head[4];
    wire::store<std::uint32_t>(head, std::uint32_t(len));
    if (!send_all(head, 4) || !send_all(p, len)) open = false;
  }
  bool send_all(const std::uint8_t* p, std::size_t len) {
    while (len > 0) {
      const ssize_t k = ::send(fd, p, len, MSG_NOSIGNAL);
      if (k <= 0) return false;
      p += k;
      len -= std::size_t(k);
    }
    return true;
  }
};

struct Job {
  wire::Request req;
  std::shared_ptr<const Model> model;
  std::vector<std::int32_t> field;  // the request's h (empty: the model's own)
  float c0;                         // the coupling scale for the request's field
  std::int64_t t_recv;
  sockaddr_in addr;              // UDP peer
  std::shared_ptr<TcpConn> tcp;  // or the TCP connection
  // Stage times (steady clock, ns; 0: not recorded): the kernel's receive time stamp of the
  // datagram (SO_TIMESTAMPNS, moved onto the steady clock), the start and the return of the
  // read that brought the request, its push into the queue, its pop by a worker, its submission
  // to a GPU ring, a collector finding it done, and the device's solve time. Set while the
  // server traces (Server::set_trace).
  std::int64_t t_kernel = 0, t_call = 0;
  std::int64_t t_read = 0, t_push = 0, t_pop = 0, t_submit = 0, t_seen = 0;
  std::uint64_t solve_ns = 0;
};

// What one server thread saw, written by that thread only (relaxed atomics on lines of their
// own, so stats() may read them while it runs):
//  - stalls: gaps between two consecutive passes of its loop longer than kStallNs (the thread
//    lost its CPU to another thread or the hypervisor, or one system call took that long);
//  - with tracing on, for every request it answered: the residence histogram, the histogram of
//    its time since the kernel received it (arrival: residence plus the wait in the socket and
//    the read) and, for the requests slower than the slow threshold (on the time since arrival
//    where the kernel stamped it, else on the residence), the sum of each stage's time and which
//    stage took the longest (socket, recv, read, admit, queue, feed, kernel, device, reply: see
//    Stage), and how many separate episodes they came in (slow requests more than 1 ms apart);
//  - the slowest reply send (flush) and how many sends took longer than kStallNs.
struct ThreadTrace {
  static constexpr std::int64_t kStallNs = 50000;
  enum Stage { kSocket, kRecv, kRead, kAdmit, kQueue, kFeed, kKernel, kDevice, kReply, kStages };
  static constexpr const char* kStageNames[kStages] = {
      "socket", "recv", "read", "admit", "queue", "feed", "kernel", "device", "reply"};
  // residence histogram bucket upper bounds (us); the last bucket is everything above
  static constexpr int kBuckets = 8;
  static constexpr std::int64_t kBucketUs[kBuckets - 1] = {50, 100, 150, 200, 300, 500, 1000};

  std::string name;
  alignas(64) std::atomic<std::uint64_t> stalls{0}, stall_ns{0}, stall_max_ns{0};
  std::atomic<std::uint64_t> flush_max_ns{0}, slow_flushes{0};
  std::atomic<std::uint64_t> answered{0}, slow{0}, episodes{0};
  std::atomic<std::uint64_t> hist[kBuckets] = {}, arrival_hist[kBuckets] = {};
  std::atomic<std::uint64_t> stamped{0}, socket_max_ns{0};
  std::atomic<std::uint64_t> slow_ns[kStages] = {}, dominant[kStages] = {};
  // With cpu_clock (tracing): the thread's own CPU time (CLOCK_THREAD_CPUTIME_ID) read at each
  // pass, so that a stall splits into the time the thread ran (a long system call, a page
  // fault, softirq work charged to it) and the time it did not (a run queue, or a hypervisor
  // that took the virtual CPU without counting steal): stall_cpu_ns over all stalls, and the
  // CPU time within the longest one.
  std::atomic<std::uint64_t> stall_cpu_ns{0}, stall_max_cpu_ns{0};
  bool cpu_clock = false;
  std::int64_t last = 0, last_slow = 0, last_cpu = 0;

  explicit ThreadTrace(std::string n, bool cpu = false) : name(std::move(n)), cpu_clock(cpu) {}
  static std::int64_t thread_cpu_ns() {
    timespec ts{};
    ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
  }

  static void add(std::atomic<std::uint64_t>& a, std::uint64_t v) {
    a.store(a.load(std::memory_order_relaxed) + v, std::memory_order_relaxed);
  }
  static void raise(std::atomic<std::uint64_t>& a, std::uint64_t v) {
    if (v > a.load(std::memory_order_relaxed)) a.store(v, std::memory_order_relaxed);
  }
  // One pass of the thread's loop at time `now`.
  void tick(std::int64_t now) {
    const std::int64_t cpu = cpu_clock ? thread_cpu_ns() : 0;
    if (last != 0 && now - last > kStallNs) {
      add(stalls, 1);
      add(stall_ns, std::uint64_t(now - last));
      const std::uint64_t ran = cpu_clock && last_cpu > 0 && cpu >= last_cpu ? cpu - last_cpu : 0;
      add(stall_cpu_ns, ran);
      if (std::uint64_t(now - last) > stall_max_ns.load(std::memory_order_relaxed))
        stall_max_cpu_ns.store(ran, std::memory_order_relaxed);
      raise(stall_max_ns, std::uint64_t(now - last));
    }
    last = now;
    last_cpu = cpu;
  }
  void tick() { tick(now_ns()); }
  void idle() { last = 0; }  // about to block: the wait is no stall
  void flushed(std::int64_t ns) {
    raise(flush_max_ns, std::uint64_t(ns));
    if (ns > kStallNs) add(slow_flushes, 1);
  }
  static int bucket(std::int64_t ns) {
    int b = 0;
    while (b < kBuckets - 1 && ns > kBucketUs[b] * 1000) ++b;
    return b;
  }
  // A request answered at time `now` (its residence: now - job.t_recv; its time since arrival:
  // now - job.t_kernel, where the kernel stamped it).
  void answer(const Job& j, std::int64_t now, std::int64_t slow_ns_threshold) {
    auto span = [](std::int64_t a, std::int64_t b) { return a > 0 && b >= a ? b - a : 0; };
    const std::int64_t res = now - j.t_recv;
    add(hist[bucket(res)], 1);
    add(answered, 1);
    std::int64_t total = res;
    if (j.t_kernel > 0) {
      total = std::max(res, now - j.t_kernel);
      add(arrival_hist[bucket(total)], 1);
      add(stamped, 1);
      raise(socket_max_ns, std::uint64_t(span(j.t_kernel, j.t_read)));
    }
    if (total <= slow_ns_threshold) return;
    add(slow, 1);
    if (j.t_recv - last_slow > 1000000) add(episodes, 1);
    last_slow = j.t_recv;
    std::int64_t st[kStages] = {};
    st[kSocket] = span(j.t_kernel, j.t_call);
    // a datagram that came while the read ran: its wait in the read counts from its arrival
    st[kRecv] = j.t_kernel > j.t_call ? span(j.t_kernel, j.t_read) : span(j.t_call, j.t_read);
    st[kRead] = span(j.t_read, j.t_recv);
    st[kAdmit] = span(j.t_recv, j.t_push);
    st[kQueue] = span(j.t_push, j.t_pop);
    const std::int64_t fed = j.t_submit > 0 ? j.t_submit : now;  // CPU workers: pop to reply
    st[kFeed] = span(j.t_pop, fed);
    if (j.t_submit > 0 && j.t_seen > 0) {
      st[kDevice] = std::int64_t(j.solve_ns);
      st[kKernel] = std::max<std::int64_t>(0, span(j.t_submit, j.t_seen) - st[kDevice]);
      st[kReply] = span(j.t_seen, now);
    }
    int top = 0;
    for (int k = 0; k < kStages; ++k) {
      add(slow_ns[k], std::uint64_t(st[k]));
      if (k != kDevice && st[k] > st[top]) top = k;  // the device time is the solve itself
    }
    add(dominant[top], 1);
  }
};

// The bounded queue between the receivers and the workers: D. Vyukov's bounded multi-producer
// multi-consumer array queue (a sequence number per cell; a push or pop is one compare-and-swap
// on the tail or head counter, no lock). A consumer finding it empty spins up to spin_ns, then
// sleeps on a condition variable; producers take the mutex to wake it only when someone sleeps
// (the sleeper registers, then looks at the queue again: no wake-up is lost).
class Queue {
 public:
  explicit Queue(std::size_t depth) : depth_(depth), cells_(new Cell[depth]) {
    for (std::size_t i = 0; i < depth; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  // Moves jobs[i] in while there is room; returns how many went in.
  std::size_t push(std::vector<Job>& jobs) {
    std::size_t taken = 0;
    while (taken < jobs.size() && try_push(jobs[taken])) ++taken;
    if (taken > 0) {
      const std::size_t tail = tail_.load(std::memory_order_relaxed);
      const std::size_t head = head_.load(std::memory_order_relaxed);
      const std::size_t size = std::min(depth_, tail > head ? tail - head : std::size_t(0));
      std::size_t peak = peak_.load(std::memory_order_relaxed);
      while (size > peak && !peak_.compare_exchange_weak(peak, size)) {
      }
      std::atomic_thread_fence(std::memory_order_seq_cst);  // the pushes before the look below
      if (sleepers_.load(std::memory_order_relaxed) > 0) {
        std::lock_guard<std::mutex> lock(m_);
        cv_.notify_all();
      }
    }
    return taken;
  }
  // Takes up to `most` jobs; waits for work (or stop), first spinning up to spin_ns without
  // sleeping, then sleeping (50 ms at most, so that stop is seen).
  // A thread trace, if given, sees every spinning pass (and not the blocking wait).
  bool pop(std::vector<Job>& out, std::size_t most, const std::atomic<bool>& stop,
           std::int64_t spin_ns = 0, ThreadTrace* trace = nullptr) {
    if (take(out, most) > 0) return true;
    if (spin_ns > 0) {
      const std::int64_t until = now_ns() + spin_ns;
      std::int64_t now;
      while (!stop && (now = now_ns()) < until) {
        if (trace != nullptr) trace->tick(now);
        if (take(out, most) > 0) return true;
      }
    }
    if (trace != nullptr) trace->idle();
    std::unique_lock<std::mutex> lock(m_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (take(out, most) == 0 && !stop) cv_.wait_for(lock, std::chrono::milliseconds(50));
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    lock.unlock();
    take(out, most);
    return !out.empty();
  }
  // Takes up to `most` jobs without waiting; returns how many.
  std::size_t try_pop(std::vector<Job>& out, std::size_t most) { return take(out, most); }
  void wake() {
    std::lock_guard<std::mutex> lock(m_);
    cv_.notify_all();
  }
  std::size_t peak() const { return peak_.load(); }

 private:
  struct alignas(64) Cell {
    std::atomic<std::size_t> seq{0};
    Job job;
  };
  bool try_push(Job& job) {
    std::size_t pos = tail_.load(std::memory_order_relaxed);
    while (true) {
      Cell& c = cells_[pos % depth_];
      const std::size_t seq = c.seq.load(std::memory_order_acquire);
      const std::ptrdiff_t dif = std::ptrdiff_t(seq - pos);
      if (dif == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.job = std::move(job);
          c.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        return false;  // full
      } else {
        pos = tail_.load(std::memory_order_relaxed);
      }
    }
  }
  std::size_t take(std::vector<Job>& out, std::size_t most) {
    std::size_t got = 0;
    while (out.size() < most) {
      std::size_t pos = head_.load(std::memory_order_relaxed);
      Cell* c = nullptr;
      while (true) {
        c = &cells_[pos % depth_];
        const std::size_t seq = c->seq.load(std::memory_order_acquire);
        const std::ptrdiff_t dif = std::ptrdiff_t(seq - (pos + 1));
        if (dif == 0) {
          if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) break;
        } else if (dif < 0) {
          return got;  // empty
        } else {
          pos = head_.load(std::memory_order_relaxed);
        }
      }
      out.push_back(std::move(c->job));
      c->seq.store(pos + depth_, std::memory_order_release);
      ++got;
    }
    return got;
  }

  const std::size_t depth_;
  std::unique_ptr<Cell[]> cells_;
  alignas(64) std::atomic<std::size_t> tail_{0};
  alignas(64) std::atomic<std::size_t> head_{0};
  alignas(64) std::atomic<std::size_t> peak_{0};
  std::atomic<int> sleepers_{0};
  std::mutex m_;
  std::condition_variable cv_;
};

// Points message m at one buffer (and, for unconnected sockets, at the peer's address).
inline void point_msg(mmsghdr& m, iovec& iov, std::uint8_t* buf, std::size_t len,
                      sockaddr_in* peer = nullptr) {
  iov = iovec{buf, len};
  std::memset(&m, 0, sizeof(mmsghdr));
  if (peer != nullptr) {
    m.msg_hdr.msg_name = peer;
    m.msg_hdr.msg_namelen = sizeof(sockaddr_in);
  }
  m.msg_hdr.msg_iov = &iov;
  m.msg_hdr.msg_iovlen = 1;
}

#ifndef UDP_SEGMENT
#define UDP_SEGMENT 103
#endif
#ifndef UDP_GRO
#define UDP_GRO 104
#endif

// Marks message m as a run of equal datagrams of `size` bytes each (UDP segmentation offload:
// the kernel splits the payload). ctrl holds the control message and must outlive the send.
template <std::size_t N>
inline void set_segment_size(mmsghdr& m, std::array<char, N>& ctrl, std::uint16_t size) {
  m.msg_hdr.msg_control = ctrl.data();
  m.msg_hdr.msg_controllen = ctrl.size();
  cmsghdr* c = CMSG_FIRSTHDR(&m.msg_hdr);
  c->cmsg_level = SOL_UDP;
  c->cmsg_type = UDP_SEGMENT;
  c->cmsg_len = CMSG_LEN(sizeof(std::uint16_t));
  std::memcpy(CMSG_DATA(c), &size, sizeof(size));
}

// Segmentation offload (UDP_SEGMENT) works until the kernel refuses it once; then every sender
// of the process sends datagram by datagram.
inline std::atomic<bool>& gso_usable() {
  static std::atomic<bool> ok{true};
  return ok;
}

// Sends msgs[0..count) with sendmmsg, retrying on EAGAIN / EINTR / ENOBUFS; returns how many went
// out (fewer: the peer is gone, or errno says why).
inline std::size_t send_all_msgs(int fd, mmsghdr* msgs, std::size_t count) {
  std::size_t done = 0;
  while (done < count) {
    const int k = ::sendmmsg(fd, msgs + done, unsigned(count - done), 0);
    if (k <= 0) {
      if (k < 0 && (errno == EAGAIN || errno == EINTR || errno == ENOBUFS)) continue;
      break;
    }
    done += std::size_t(k);
  }
  return done;
}

// Datagrams gathered for one send: sendmmsg, or with `gso` the datagrams of equal size to one
// peer (a run of up to kMaxSegments) as one UDP_SEGMENT message each: the kernel's loopback
// path then runs once per run instead of once per datagram, and the peer still receives
// separate datagrams (or, with UDP_GRO, the run in one read).
struct UdpBatch {
  static constexpr std::size_t kMaxSegments = 64, kMaxBytes = 60000;
  std::vector<std::vector<std::uint8_t>> bufs;
  std::vector<sockaddr_in> addrs;
  std::size_t used = 0;
  std::vector<mmsghdr> msgs;
  std::vector<iovec> iov;
  std::vector<std::uint32_t> order;
  std::vector<std::array<char, CMSG_SPACE(sizeof(std::uint16_t))>> ctrl;
  std::uint64_t ok = 0;  // OK replies gathered (the server counts them once a flush)

  std::uint8_t* next(std::size_t bytes, const sockaddr_in& to) {
    if (used == bufs.size()) {
      bufs.emplace_back();
      addrs.emplace_back();
    }
    bufs[used].resize(bytes);
    addrs[used] = to;
    return bufs[used++].data();
  }
  // Sends the gathered datagrams; returns how many runs of several left as one message.
  std::size_t flush(int fd, bool gso = false) {
    if (used == 0) return 0;
    msgs.assign(used, mmsghdr{});
    iov.resize(used);
    std::size_t runs = 0;
    if (gso && used > 1 && gso_usable().load(std::memory_order_relaxed) &&
        flush_segmented(fd, runs)) {
      used = 0;
      return runs;
    }
    for (std::size_t i = 0; i < used; ++i)
      point_msg(msgs[i], iov[i], bufs[i].data(), bufs[i].size(), &addrs[i]);
    send_all_msgs(fd, msgs.data(), used);  // short: the peer is gone (counted by the client)
    used = 0;
    return 0;
  }

 private:
  static bool same_peer(const sockaddr_in& a, const sockaddr_in& b) {
    return a.sin_addr.s_addr == b.sin_addr.s_addr && a.sin_port == b.sin_port;
  }
  // False when the kernel refused segmentation (nothing of the batch was sent).
  bool flush_segmented(int fd, std::size_t& runs) {
    order.resize(used);
    for (std::size_t i = 0; i < used; ++i) order[i] = std::uint32_t(i);
    std::stable_sort(order.begin(), order.end(), [this](std::uint32_t a, std::uint32_t b) {
      const sockaddr_in &x = addrs[a], &y = addrs[b];
      if (x.sin_addr.s_addr != y.sin_addr.s_addr) return x.sin_addr.s_addr < y.sin_addr.s_addr;
      if (x.sin_port != y.sin_port) return x.sin_port < y.sin_port;
      return bufs[a].size() < bufs[b].size();
    });
    ctrl.resize(used);
    std::size_t nmsg = 0;
    for (std::size_t i = 0; i < used;) {  // one message per run of equal peer and size
      const std::uint32_t first = order[i];
      const std::size_t size = bufs[first].size();
      std::size_t j = i;
      while (j < used && j - i < kMaxSegments && (j - i + 1) * size <= kMaxBytes &&
             same_peer(addrs[order[j]], addrs[first]) && bufs[order[j]].size() == size)
        ++j;
      if (j == i) j = i + 1;  // a datagram above kMaxBytes: alone
      mmsghdr& m = msgs[nmsg];
      std::memset(&m, 0, sizeof(mmsghdr));
      for (std::size_t k = i; k < j; ++k) iov[k] = iovec{bufs[order[k]].data(), size};
      m.msg_hdr.msg_name = &addrs[first];
      m.msg_hdr.msg_namelen = sizeof(sockaddr_in);
      m.msg_hdr.msg_iov = &iov[i];
      m.msg_hdr.msg_iovlen = j - i;
      if (j - i > 1) {
        ++runs;
        set_segment_size(m, ctrl[nmsg], std::uint16_t(size));
      }
      ++nmsg;
      i = j;
    }
    const std::size_t done = send_all_msgs(fd, msgs.data(), nmsg);
    if (done == 0 && nmsg > 0 &&
        (errno == EINVAL || errno == EIO || errno == EOPNOTSUPP || errno == ENOPROTOOPT ||
         errno == EMSGSIZE)) {
      gso_usable().store(false);  // this kernel does not segment: datagram by datagram from now
      msgs.assign(used, mmsghdr{});
      runs = 0;
      return false;
    }
    return true;
  }
};

#ifndef SO_ATTACH_REUSEPORT_CBPF
#define SO_ATTACH_REUSEPORT_CBPF 51
#endif

// Spreads the datagrams reaching a group of `count` SO_REUSEPORT sockets (fd one of them) over
// the sockets by the low byte of the request id (payload byte 8) modulo count, instead of by
// the hash of the sender's address and port: with few clients, the hash can put most of them
// on one receiver. Consecutive request ids go round robin; a run read with UDP_GRO goes where
// its first datagram's id says; a datagram too short for the id goes to the first socket.
// Returns false when the kernel refuses the filter (then the hash spreads them).
inline bool spread_by_request_id(int fd, int count) {
  sock_filter code[] = {
      {BPF_LD | BPF_B | BPF_ABS, 0, 0, 8},                      // A = payload[8]
      {BPF_ALU | BPF_MOD | BPF_K, 0, 0, std::uint32_t(count)},  // A %= count
      {BPF_RET | BPF_A, 0, 0, 0},                               // the socket's index in the group
  };
  sock_fprog prog{static_cast<unsigned short>(sizeof(code) / sizeof(code[0])), code};
  return ::setsockopt(fd, SOL_SOCKET, SO_ATTACH_REUSEPORT_CBPF, &prog, sizeof(prog)) == 0;
}

// The CPUs this process may run on, in order.
inline std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  return cpus;
}

// Pins the calling thread to one CPU (best effort: a refusal leaves it where it was).
inline void pin_to(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  ::pthread_setaffinity_np(::pthread_self(), sizeof(set), &set);
}

// Sets a UDP socket's buffers to `bytes`: SO_*BUFFORCE where allowed (CAP_NET_ADMIN), else as
// much as net.core.[rw]mem_max allows.
inline void size_udp_buffers(int fd, int bytes) {
  if (::setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes)) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  if (::setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof(bytes)) != 0)
    ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

// Asks the kernel to hand a run of datagrams sent with UDP_SEGMENT to this socket in one read
// (the segment size in a UDP_GRO control message); false when it cannot.
inline bool enable_gro(int fd) {
  int one = 1;
  return ::setsockopt(fd, IPPROTO_UDP, UDP_GRO, &one, sizeof(one)) == 0;
}

// The segment size of a datagram read with UDP_GRO on (0: a single datagram).
inline std::size_t gro_segment(const msghdr& h) {
  for (const cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(&h), const_cast<cmsghdr*>(c))) {
    if (c->cmsg_level == SOL_UDP && c->cmsg_type == UDP_GRO) {
      int seg = 0;
      std::memcpy(&seg, CMSG_DATA(c), sizeof(seg));
      return seg > 0 ? std::size_t(seg) : 0;
    }
  }
  return 0;
}

// The kernel's receive time stamp of a read message (SO_TIMESTAMPNS; wall clock ns), 0: none.
inline std::int64_t kernel_stamp(const msghdr& h) {
  for (const cmsghdr* c = CMSG_FIRSTHDR(&h); c != nullptr;
       c = CMSG_NXTHDR(const_cast<msghdr*>(&h), const_cast<cmsghdr*>(c))) {
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_TIMESTAMPNS) {
      timespec ts{};
      std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
      return std::int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
    }
  }
  return 0;
}

// A model from the arrays of IsingModel.coupling_arrays() (sizes checked by the caller: plus and
// minus n W words, degree and h n values, j8 n 32 W bytes, as the kind needs).
inline std::shared_ptr<Model> model_from_arrays(int kind, int n, const std::uint32_t* plus,
                                                const std::uint32_t* minus,
                                                const std::int32_t* degree, const std::int8_t* j8,
                                                const std::int32_t* h, std::int64_t jnorm2) {
  if (n < 1 || n > wire::kMaxN)
    throw std::invalid_argument("a served model has 1 to " + std::to_string(wire::kMaxN) +
                                " spins");
  auto m = std::make_shared<Model>();
  m->kind = kind;
  m->n = n;
  m->nwords = (n + 31) / 32;
  const std::size_t rows = std::size_t(n) * m->nwords;
  if (kind == kBinary || kind == kTernary) m->plus.assign(plus, plus + rows);
  if (kind == kTernary) {
    m->minus.assign(minus, minus + rows);
    m->degree.assign(degree, degree + n);
  } else if (kind == kInt8) {
    m->j8.assign(j8, j8 + rows * 32);
  } else if (kind != kBinary) {
    throw std::invalid_argument("the service takes exact couplings only (binary, ternary, int8)");
  }
  m->h.assign(h, h + n);
  m->jnorm2 = jnorm2;
  return m;
}

// ---- the server (front end; the workers are the backend's)
// --------------------------------------------------------------------------
class Server {
 public:
  // receivers: UDP sockets bound to the same port (SO_REUSEPORT), each with its own receiver
  // thread; the kernel spreads the clients' flows over them.
  Server(const std::string& host, int udp_port, int tcp_port, std::size_t depth, int receivers = 1)
      : queue_(depth), per_receiver_(std::size_t(std::max(receivers, 1))) {
    if (receivers < 1) throw std::invalid_argument("receivers must be >= 1");
    if (depth < 1) throw std::invalid_argument("depth must be >= 1");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    if (::inet_pton(AF_INET, host.c_str(), &a.sin_addr) != 1)
      throw std::invalid_argument("not an IPv4 address: " + host);
    udp_ = open_socket(SOCK_DGRAM, a, udp_port, receivers > 1);
    udp_fds_.push_back(udp_);
    for (int r = 1; r < receivers; ++r)
      udp_fds_.push_back(open_socket(SOCK_DGRAM, a, port_of(udp_), true));
    for (auto& c : per_receiver_) c.store(0);
    if (receivers > 1) spread_ = spread_by_request_id(udp_, receivers);
    if (tcp_port >= 0) {
      tcp_ = open_socket(SOCK_STREAM, a, tcp_port, false);
      if (::listen(tcp_, 64) != 0) fail("listen");
    }
  }
  ~Server() { stop(); }

  int udp_port() const { return port_of(udp_); }
  int tcp_port() const { return tcp_ >= 0 ? port_of(tcp_) : -1; }

  // The threads that run the queued requests: each calls pop() until it returns false with
  // stopping() true, and answers with reply_ok() and flush().
  using Worker = std::function<void(Server&)>;
  void start(std::vector<Worker> workers) {
    if (running_) return;
    running_ = true;
    stop_ = false;
    if (offload_)
      for (int fd : udp_fds_) enable_gro(fd);  // refused: runs arrive as single datagrams
    if (trace_) {  // the kernel stamps each datagram's arrival (refused: no stamps, no socket
                   // stage)
      int one = 1;
      for (int fd : udp_fds_) ::setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
    }
    // With pin_: receivers and workers on one CPU each, in this order, over the CPUs the process
    // may use (wrapping around when there are more threads than CPUs).
    const std::vector<int> cpus = pin_ ? allowed_cpus() : std::vector<int>{};
    std::size_t next_cpu = 0;
    auto cpu = [&]() { return cpus.empty() ? -1 : cpus[next_cpu++ % cpus.size()]; };
    rx_beat_.reset(new Beat[udp_fds_.size()]);
    const std::size_t pinned = cpus.empty() ? 0 : udp_fds_.size() + workers.size();
    started_ = 0;
    for (std::size_t r = 0; r < udp_fds_.size(); ++r) {
      const int c = cpu();
      threads_.emplace_back([this, r, c] {
        if (c >= 0) pin_to(c);
        started_++;
        udp_loop(r);
      });
    }
    if (tcp_ >= 0) threads_.emplace_back([this] { tcp_accept_loop(); });
    for (auto& w : workers) {
      const int c = cpu();
      threads_.emplace_back([this, w, c] {
        if (c >= 0) pin_to(c);
        started_++;
        w(*this);
      });
    }
    // With isolate_: every other thread of the process (the caller's, the TCP threads, a GPU
    // runtime's helpers) onto the CPUs no pinned thread uses, so that none of them preempts a
    // pinned one; nothing moves when no CPU is left over.
    if (isolate_ && pinned > 0 && pinned < cpus.size()) {
      while (started_.load() < pinned) std::this_thread::yield();
      const std::vector<int> spare(cpus.begin() + std::ptrdiff_t(pinned), cpus.end());
      isolated_ = move_unpinned_threads(spare);
    }
  }

  // Takes up to `most` queued jobs, waiting (spinning, then blocking) for them; false when
  // none came (stopping() says whether to end). trace: the calling thread's (ThreadTrace).
  bool pop(std::vector<Job>& jobs, std::size_t most, ThreadTrace* trace = nullptr) {
    const std::size_t before = jobs.size();
    const bool got = queue_.pop(jobs, most, stop_, spin_ns_, trace);
    if (got && trace_) stamp_pop(jobs, before);
    return got;
  }
  // Takes up to `most` queued jobs without waiting; returns how many.
  std::size_t try_pop(std::vector<Job>& jobs, std::size_t most) {
    const std::size_t before = jobs.size();
    const std::size_t got = queue_.try_pop(jobs, most);
    if (got > 0 && trace_) stamp_pop(jobs, before);
    return got;
  }
  // The calling thread's trace (registered once per thread; the thread takes the name, at most
  // 15 characters, so that /proc shows it).
  ThreadTrace* thread_trace(const std::string& name) {
    ::pthread_setname_np(::pthread_self(), name.substr(0, 15).c_str());
    std::lock_guard<std::mutex> lock(traces_m_);
    traces_.push_back(std::make_unique<ThreadTrace>(name, trace_));
    return traces_.back().get();
  }
  // Record each request's stages and the slow ones' (residence above slow_us) breakdown.
  void set_trace(bool on, double slow_us = 200.0) {
    trace_ = on;
    slow_ns_ = std::int64_t(slow_us * 1000.0);
  }
  bool tracing() const { return trace_; }
  // Work sharing, by parts (a mask of kShare*): with kShareRead a receiver also reads a peer's
  // socket that has not been read for help_ns (a stalled peer: its requests wait at most
  // help_ns, not the length of the stall); backends use share(part) and help_ns() alike
  // (kShareCollect: reply threads take over a stalled peer's finished requests; kShareFeed:
  // feeding is a role any of the backend's threads takes when the feeder stalls).
  static constexpr int kShareRead = 1, kShareCollect = 2, kShareFeed = 4, kShareAll = 7;
  void set_share(int parts, std::int64_t help_ns = 50000) {
    if (parts < 0 || parts > kShareAll)
      throw std::invalid_argument("share must be a mask of read (1), collect (2), feed (4)");
    share_ = parts;
    help_ns_ = help_ns;
  }
  bool share(int part = kShareAll) const { return (share_ & part) != 0; }
  int share_parts() const { return share_; }
  std::int64_t help_ns() const { return help_ns_; }
  // With pinning, move the process's other threads to the CPUs left over (before start).
  void set_isolate(bool on) { isolate_ = on; }
  // Receivers and workers waiting for work spin this long (no sleep, no wake-up latency) before
  // they block; 0: block at once.
  void set_spin(std::int64_t ns) { spin_ns_ = ns; }
  // Segmentation offload (before start): replies to one peer leave as UDP_SEGMENT runs, and
  // the receive sockets take runs a client sent that way in one read (UDP_GRO).
  void set_offload(bool on) { offload_ = on; }
  // Pin the receivers and workers to one CPU each (before start).
  void set_pin(bool on) { pin_ = on; }
  // The most datagrams (or runs of them, with offload) one read of a receiver takes (before
  // start; 1 .. 1024, default 64).
  void set_rx_batch(int most) {
    if (most < 1 || most > 1024) throw std::invalid_argument("rx_batch must be in [1, 1024]");
    rx_batch_ = most;
  }
  bool stopping() const { return stop_; }

  // Answers a solved request (UDP replies go into `out`, sent by flush()).
  void reply_ok(const Job& job, std::int64_t energy, const std::uint32_t* signs, UdpBatch& out,
                ThreadTrace* trace = nullptr) {
    const std::uint32_t n = job.req.n;
    if (trace_ && trace != nullptr) trace->answer(job, now_ns(), slow_ns_);
    if (job.tcp) {
      std::vector<std::uint8_t> frame(wire::reply_bytes(wire::kOk, n));
      wire::write_reply(frame.data(), wire::kOk, job.req.request_id, energy, residence(job.t_recv),
                        n, signs);
      job.tcp->send_frame(frame.data(), frame.size());
    } else {
      std::uint8_t* b = out.next(wire::reply_bytes(wire::kOk, n), job.addr);
      wire::write_reply(b, wire::kOk, job.req.request_id, energy, residence(job.t_recv), n, signs);
      out.ok++;  // counted by flush(): one atomic add a batch, not a reply
      return;
    }
    replies_[wire::kOk]++;
  }
  // Sends the batched UDP replies, through receiver socket `via` (any: all share the port).
  void flush(UdpBatch& out, std::size_t via = 0, ThreadTrace* trace = nullptr) {
    if (out.ok > 0) {
      replies_[wire::kOk].fetch_add(out.ok, std::memory_order_relaxed);
      out.ok = 0;
    }
    if (out.used == 0) return;
    const std::int64_t t0 = trace != nullptr ? now_ns() : 0;
    const std::size_t runs = out.flush(udp_fds_[via % udp_fds_.size()], offload_);
    if (runs > 0) runs_out_ += runs;
    if (trace != nullptr) trace->flushed(now_ns() - t0);
  }

  void stop() {
    if (!running_) return;
    stop_ = true;
    queue_.wake();
    for (auto& t : threads_) t.join();
    threads_.clear();
    {
      std::lock_guard<std::mutex> lock(conns_m_);
      for (auto& t : conn_threads_) t.join();
      conn_threads_.clear();
    }
    running_ = false;
    for (int fd : udp_fds_) ::close(fd);
    udp_fds_.clear();
    if (tcp_ >= 0) ::close(tcp_);
    udp_ = tcp_ = -1;
  }

  // Runs the backend's preparation (a copy to the GPU, say) and puts the model into slot id.
  void load_model(std::uint32_t id, std::shared_ptr<Model> m) {
    m->c0 = coupling_scale(*m, m->h.data());
    if (prepare_) prepare_(*m);
    std::lock_guard<std::mutex> lock(models_m_);
    models_[id] = std::move(m);
    models_version_.fetch_add(1, std::memory_order_release);
  }
  void set_prepare(std::function<void(Model&)> f) { prepare_ = std::move(f); }

  std::map<std::string, std::uint64_t> stats() {
    std::map<std::string, std::uint64_t> s;
    const char* names[wire::kStatusCount] = {"ok",         "busy",      "bad_magic", "bad_version",
                                             "bad_length", "too_large", "bad_param", "no_model"};
    for (int i = 0; i < wire::kStatusCount; ++i) s[names[i]] = replies_[i].load();
    s["received"] = received_.load();
    for (std::size_t r = 0; r < per_receiver_.size(); ++r)  // datagrams each UDP receiver read
      s["received_udp" + std::to_string(r)] = per_receiver_[r].load();
    s["spread_by_id"] = spread_ ? 1 : 0;
    s["loads"] = loads_.load();
    s["runs_in"] = runs_in_.load();    // reads that held a run of datagrams (UDP_GRO)
    s["runs_out"] = runs_out_.load();  // sends of a run of replies (UDP_SEGMENT)
    s["queue_peak"] = queue_.peak();
    s["isolated_threads"] = isolated_;
    s["helped_reads"] = helped_reads_.load();
    s["share"] = std::uint64_t(share_);
    s["rx_batch"] = std::uint64_t(rx_batch_);
    // per thread: stalls (count, total and longest ns), slow sends; with tracing on, the
    // residence histogram, slow requests, their stage sums and dominant stages (summed over
    // the threads that answer), and the slow episodes
    std::lock_guard<std::mutex> lock(traces_m_);
    for (const auto& t : traces_) {
      const std::string k = "thread_" + t->name + "_";
      s[k + "stalls"] = t->stalls.load();
      s[k + "stall_ns"] = t->stall_ns.load();
      s[k + "stall_max_ns"] = t->stall_max_ns.load();
      s[k + "stall_cpu_ns"] = t->stall_cpu_ns.load();
      s[k + "stall_max_cpu_ns"] = t->stall_max_cpu_ns.load();
      s[k + "flush_max_ns"] = t->flush_max_ns.load();
      s[k + "slow_flushes"] = t->slow_flushes.load();
      if (!trace_) continue;
      s[k + "slow"] = t->slow.load();
      s[k + "episodes"] = t->episodes.load();
      s["trace_answered"] += t->answered.load();
      s["trace_stamped"] += t->stamped.load();
      s["trace_socket_max_ns"] = std::max(s["trace_socket_max_ns"], t->socket_max_ns.load());
      s["trace_slow"] += t->slow.load();
      for (int b = 0; b < ThreadTrace::kBuckets; ++b) {
        s["trace_hist" + std::to_string(b)] += t->hist[b].load();
        s["trace_arrival_hist" + std::to_string(b)] += t->arrival_hist[b].load();
      }
      for (int g = 0; g < ThreadTrace::kStages; ++g) {
        const std::string name = ThreadTrace::kStageNames[g];
        s["trace_slow_" + name + "_ns"] += t->slow_ns[g].load();
        s["trace_dominant_" + name] += t->dominant[g].load();
      }
    }
    s["trace_slow_us"] = std::uint64_t(slow_ns_ / 1000);
    return s;
  }

 private:
  static void fail(const char* what) {
    throw std::runtime_error(std::string(what) + ": " + std::strerror(errno));
  }

  static int port_of(int fd) {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    return ntohs(a.sin_port);
  }

  static int open_socket(int type, sockaddr_in a, int port, bool reuse_port) {
    const int fd = ::socket(AF_INET, type, 0);
    if (fd < 0) fail("socket");
    int one = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (reuse_port) ::setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one));
    if (type == SOCK_DGRAM) size_udp_buffers(fd, 64 << 20);
    a.sin_port = htons(std::uint16_t(port));
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      ::close(fd);
      fail("bind");
    }
    return fd;
  }

  // A receiver's last model looked up (valid while no model was loaded since).
  struct ModelCache {
    std::uint64_t version = ~0ull;
    std::uint32_t id = 0;
    std::shared_ptr<const Model> model;
  };

  // Parses one request; answers errors and loads at once (into `now`), queues good solves.
  // Returns true when a job was added to `jobs`. The caller counts it received. cache: the
  // receiver's (null: look the model up under the lock).
  template <typename Reply>
  bool admit(const std::uint8_t* p, std::size_t len, bool truncated, std::vector<Job>& jobs,
             Reply reply, ModelCache* cache = nullptr) {
    const std::int64_t t = now_ns();
    wire::Request r{};
    wire::Status st = wire::parse(p, len, r);
    if (truncated && st != wire::kBadMagic && st != wire::kBadVersion) st = wire::kTooLarge;
    std::shared_ptr<const Model> model;
    if (st == wire::kOk && (r.flags & wire::kFlagLoad)) {
      try {
        load_model(r.model_id, model_from_wire(r));
      } catch (const std::exception&) {  // no memory for it (host or device)
        reply(wire::kTooLarge, r.request_id, 0, t, 0u, nullptr);
        return false;
      }
      loads_++;
      reply(wire::kOk, r.request_id, 0, t, 0u, nullptr);
      return false;
    }
    if (st == wire::kOk) {
      const std::uint64_t version = models_version_.load(std::memory_order_acquire);
      if (cache != nullptr && cache->version == version && cache->id == r.model_id) {
        model = cache->model;
      } else {
        std::lock_guard<std::mutex> lock(models_m_);
        auto it = models_.find(r.model_id);
        if (it != models_.end()) model = it->second;
        if (cache != nullptr) *cache = ModelCache{version, r.model_id, model};
      }
      if (!model) {
        st = wire::kNoModel;
      } else if (int(r.n) != model->n) {
        st = wire::kBadParam;
        model.reset();
      }
    }
    if (st != wire::kOk) {
      reply(st, r.request_id, 0, t, 0u, nullptr);
      return false;
    }
    Job job{r, std::move(model), {}, 0.0f, t, {}, nullptr};
    if (r.payload_type == wire::kFieldInt16) {
      job.field.resize(r.n);
      for (std::uint32_t i = 0; i < r.n; ++i)
        job.field[i] = wire::load<std::int16_t>(r.payload + 2 * i);
      job.c0 = coupling_scale(*job.model, job.field.data());
    } else {
      job.c0 = job.model->c0;
    }
    job.req.payload = nullptr;  // the receive buffer is reused
    jobs.push_back(std::move(job));
    return true;
  }

  void stamp_pop(std::vector<Job>& jobs, std::size_t from) const {
    const std::int64_t t = now_ns();
    for (std::size_t j = from; j < jobs.size(); ++j) jobs[j].t_pop = t;
  }

  // Moves every thread of this process except the pinned ones (those that called pin_to: their
  // affinity is one CPU) onto `cpus`; returns how many moved.
  static std::uint64_t move_unpinned_threads(const std::vector<int>& cpus) {
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c : cpus) CPU_SET(c, &set);
    std::uint64_t moved = 0;
    DIR* dir = ::opendir("/proc/self/task");
    if (dir == nullptr) return 0;
    while (dirent* e = ::readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const pid_t tid = pid_t(std::atol(e->d_name));
      cpu_set_t now;
      CPU_ZERO(&now);
      if (::sched_getaffinity(tid, sizeof(now), &now) != 0 || CPU_COUNT(&now) == 1) continue;
      if (::sched_setaffinity(tid, sizeof(set), &set) == 0) ++moved;
    }
    ::closedir(dir);
    return moved;
  }

  std::uint32_t residence(std::int64_t t_recv) const {
    const std::int64_t d = now_ns() - t_recv;
    return std::uint32_t(std::min<std::int64_t>(d, std::numeric_limits<std::uint32_t>::max()));
  }

  // Receiver r: reads its socket (sharing reads, also a peer's that nobody read for help_ns_),
  // admits the requests, queues them (in chunks of kChunk, so that the first of a large read
  // do not wait for the last to be parsed) and answers BUSY for those the queue refused.
  void udp_loop(std::size_t r) {
    const int kBatch = rx_batch_;
    constexpr std::size_t kChunk = 32;
    constexpr std::size_t kBuf = 65536;  // a datagram, or a run of them (UDP_GRO)
    ThreadTrace* trace = thread_trace("rx" + std::to_string(r));
    const int own = udp_fds_[r];
    const std::size_t nfds = udp_fds_.size();
    std::vector<std::vector<std::uint8_t>> bufs(kBatch, std::vector<std::uint8_t>(kBuf));
    std::vector<sockaddr_in> from(kBatch);
    std::vector<iovec> iov(kBatch);
    std::vector<mmsghdr> msgs(kBatch);
    std::vector<std::array<char, 64>> ctrl(kBatch);  // UDP_GRO and the kernel's time stamp
    std::vector<std::int64_t> t_kernel(kBatch);
    UdpBatch out;
    std::vector<Job> jobs, refused;
    ModelCache cache;
    std::int64_t last = 0;  // the last datagram
    // Reads socket k once; returns how many messages it took.
    auto serve = [&](std::size_t k) -> int {
      for (int i = 0; i < kBatch; ++i) {
        point_msg(msgs[i], iov[i], bufs[i].data(), bufs[i].size(), &from[i]);
        if (offload_ || trace_) {
          msgs[i].msg_hdr.msg_control = ctrl[i].data();
          msgs[i].msg_hdr.msg_controllen = ctrl[i].size();
        }
      }
      const std::int64_t t_call = trace_ ? now_ns() : 0;
      const int got = ::recvmmsg(udp_fds_[k], msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
      if (got <= 0) return 0;
      const std::int64_t t_read = now_ns();
      if (trace_) {  // the kernel's receive stamps (wall clock) onto the steady clock
        const std::int64_t shift = wall_ns() - t_read;
        for (int i = 0; i < got; ++i) {
          const std::int64_t w = kernel_stamp(msgs[i].msg_hdr);
          t_kernel[i] = w > 0 ? w - shift : 0;
        }
      }
      jobs.clear();
      std::uint64_t pieces = 0;   // requests read (a run counts each of its datagrams)
      std::uint64_t counted = 0;  // of them, added to the counters
      auto push = [&]() {         // queues what was admitted; the queue's refusals to `refused`
        // count the requests before a worker can answer them, so that a client holding all its
        // replies finds them all in stats()
        received_.fetch_add(pieces - counted, std::memory_order_relaxed);
        per_receiver_[k].fetch_add(pieces - counted, std::memory_order_relaxed);
        counted = pieces;
        if (jobs.empty()) return;
        if (trace_) {
          const std::int64_t t_push = now_ns();
          for (Job& j : jobs) {
            j.t_call = t_call;
            j.t_read = t_read;
            j.t_push = t_push;
          }
        }
        const std::size_t in = queue_.push(jobs);
        for (std::size_t j = in; j < jobs.size(); ++j) refused.push_back(std::move(jobs[j]));
        jobs.clear();
      };
      for (int i = 0; i < got; ++i) {
        const bool truncated = (msgs[i].msg_hdr.msg_flags & MSG_TRUNC) != 0;
        const sockaddr_in peer = from[i];
        auto reply = [&](std::uint16_t st, std::uint64_t id, std::int64_t e, std::int64_t t,
                         std::uint32_t n, const std::uint32_t* s) {
          std::uint8_t* b = out.next(wire::reply_bytes(st, n), peer);
          wire::write_reply(b, st, id, e, residence(t), n, s);
          replies_[st]++;
        };
        // A run read in one piece (UDP_GRO) holds datagrams of `seg` bytes, the last one maybe
        // shorter.
        const std::size_t len = msgs[i].msg_len;
        const std::size_t seg = offload_ ? gro_segment(msgs[i].msg_hdr) : 0;
        const std::size_t step = seg > 0 && seg < len ? seg : len;
        if (step < len) runs_in_++;
        for (std::size_t off = 0; off < len || off == 0; off += step) {
          const std::size_t piece = std::min(step, len - off);
          ++pieces;
          if (admit(bufs[i].data() + off, piece, truncated, jobs, reply, &cache)) {
            jobs.back().addr = peer;
            if (trace_) jobs.back().t_kernel = t_kernel[i];
          }
          if (jobs.size() >= kChunk) push();
          if (step == 0) break;
        }
      }
      push();
      return got;
    };
    while (!stop_) {
      const std::int64_t now = now_ns();
      if (spin_ns_ <= 0 || now - last > spin_ns_) {  // idle: block in poll()
        trace->idle();
        pollfd pfd{own, POLLIN, 0};
        if (::poll(&pfd, 1, 50) <= 0) continue;
      } else {
        trace->tick(now);
      }
      rx_beat_[r].t.store(now, std::memory_order_relaxed);  // socket r is being read
      int got = serve(r);
      if (share(kShareRead) && nfds > 1) {  // a peer's socket nobody has read for a while
        // looked at on every pass, busy or not: under load the own socket is never empty
        const std::int64_t t = now_ns();
        rx_beat_[r].t.store(t, std::memory_order_relaxed);
        for (std::size_t d = 1; d < nfds; ++d) {
          const std::size_t k = (r + d) % nfds;
          if (t - rx_beat_[k].t.load(std::memory_order_relaxed) <= help_ns_) continue;
          const int more = serve(k);
          got += more;
          if (more > 0) helped_reads_.fetch_add(1, std::memory_order_relaxed);
        }
      }
      if (got <= 0) continue;
      last = now_ns();
      // BUSY, not silence, for what the queue refused
      for (const Job& j : refused) {
        std::uint8_t* b = out.next(wire::kReplyHeader, j.addr);
        wire::write_reply(b, wire::kBusy, j.req.request_id, 0, residence(j.t_recv), 0, nullptr);
      }
      if (!refused.empty()) replies_[wire::kBusy].fetch_add(refused.size());
      refused.clear();
      const std::int64_t t0 = now_ns();
      const std::size_t runs = out.flush(own, offload_);
      if (runs > 0) runs_out_ += runs;
      trace->flushed(now_ns() - t0);
    }
  }

  void tcp_accept_loop() {
    while (!stop_) {
      pollfd pfd{tcp_, POLLIN, 0};
      if (::poll(&pfd, 1, 50) <= 0) continue;
      const int fd = ::accept(tcp_, nullptr, nullptr);
      if (fd < 0) continue;
      int one = 1;
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto conn = std::make_shared<TcpConn>(fd);
      std::lock_guard<std::mutex> lock(conns_m_);
      conn_threads_.emplace_back([this, conn] { tcp_conn_loop(conn); });
    }
  }

  // Reads exactly len bytes; false on close, error or stop.
  bool read_exact(TcpConn& c, std::uint8_t* p, std::size_t len) {
    while (len > 0) {
      pollfd pfd{c.fd, POLLIN, 0};
      const int ready = ::poll(&pfd, 1, 50);
      if (stop_) return false;
      if (ready <= 0) continue;
      const ssize_t k = ::recv(c.fd, p, len, 0);
      if (k <= 0) return false;
      p += k;
      len -= std::size_t(k);
    }
    return true;
  }

  void tcp_conn_loop(std::shared_ptr<TcpConn> conn) {
    std::vector<std::uint8_t> buf;
    std::vector<Job> jobs;
    std::uint8_t head[4];
    std::vector<std::uint8_t> out(wire::kReplyHeader);
    auto reply = [&](std::uint16_t st, std::uint64_t id, std::int64_t e, std::int64_t t,
                     std::uint32_t n, const std::uint32_t* s) {
      out.resize(wire::reply_bytes(st, n));
      wire::write_reply(out.data(), st, id, e, residence(t), n, s);
      replies_[st]++;
      conn->send_frame(out.data(), out.size());
    };
    while (!stop_ && conn->open) {
      if (!read_exact(*conn, head, 4)) break;
      const std::uint32_t len = wire::load<std::uint32_t>(head);
      if (len > wire::kRequestHeader + wire::kMaxModelBytes) {
        received_++;
        reply(wire::kTooLarge, 0, 0, now_ns(), 0, nullptr);
        break;  // the stream cannot be resynchronised past an unread frame
      }
      buf.resize(len);
      if (!read_exact(*conn, buf.data(), len)) break;
      received_++;
      jobs.clear();
      if (admit(buf.data(), len, false, jobs, reply)) {
        jobs.back().tcp = conn;
        if (queue_.push(jobs) == 0) {
          reply(wire::kBusy, jobs[0].req.request_id, 0, jobs[0].t_recv, 0, nullptr);
        }
      }
    }
    conn->open = false;
  }

  Queue queue_;
  int udp_ = -1, tcp_ = -1;
  std::vector<int> udp_fds_;
  std::atomic<bool> stop_{false}, running_{false};
  std::int64_t spin_ns_ = 0;
  bool offload_ = false, pin_ = false;
  std::vector<std::thread> threads_;
  std::mutex conns_m_;
  std::vector<std::thread> conn_threads_;
  std::mutex models_m_;
  std::map<std::uint32_t, std::shared_ptr<const Model>> models_;
  std::function<void(Model&)> prepare_;
  std::atomic<std::uint64_t> replies_[wire::kStatusCount] = {};
  std::atomic<std::uint64_t> received_{0}, loads_{0}, runs_in_{0}, runs_out_{0};
  std::vector<std::atomic<std::uint64_t>> per_receiver_;
  bool spread_ = false;
  // tracing, work sharing, isolation
  struct alignas(64) Beat {
    std::atomic<std::int64_t> t{0};  // when a receiver last read its socket
  };
  std::unique_ptr<Beat[]> rx_beat_;
  bool trace_ = false, isolate_ = false;
  int share_ = 0;  // kShare* parts
  std::int64_t slow_ns_ = 200000, help_ns_ = 50000;
  int rx_batch_ = 64;  // datagrams (or runs) a receiver's recvmmsg takes at most
  std::atomic<std::size_t> started_{0};
  std::uint64_t isolated_ = 0;
  std::atomic<std::uint64_t> helped_reads_{0}, models_version_{0};
  std::mutex traces_m_;
  std::vector<std::unique_ptr<ThreadTrace>> traces_;
};

}  // namespace csk::dsb::service
