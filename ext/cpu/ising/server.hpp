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
#include <linux/filter.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <netinet/udp.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/socket.h>
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
  bool pop(std::vector<Job>& out, std::size_t most, const std::atomic<bool>& stop,
           std::int64_t spin_ns = 0) {
    if (take(out, most) > 0) return true;
    if (spin_ns > 0) {
      const std::int64_t until = now_ns() + spin_ns;
      while (!stop && now_ns() < until) {
        if (take(out, most) > 0) return true;
      }
    }
    std::unique_lock<std::mutex> lock(m_);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (take(out, most) == 0 && !stop) cv_.wait_for(lock, std::chrono::milliseconds(50));
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
    lock.unlock();
    take(out, most);
    return !out.empty();
  }
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
    // With pin_: receivers and workers on one CPU each, in this order, over the CPUs the process
    // may use (wrapping around when there are more threads than CPUs).
    const std::vector<int> cpus = pin_ ? allowed_cpus() : std::vector<int>{};
    std::size_t next_cpu = 0;
    auto cpu = [&]() { return cpus.empty() ? -1 : cpus[next_cpu++ % cpus.size()]; };
    for (std::size_t r = 0; r < udp_fds_.size(); ++r) {
      const int c = cpu(), fd = udp_fds_[r];
      threads_.emplace_back([this, fd, r, c] {
        if (c >= 0) pin_to(c);
        udp_loop(fd, per_receiver_[r]);
      });
    }
    if (tcp_ >= 0) threads_.emplace_back([this] { tcp_accept_loop(); });
    for (auto& w : workers) {
      const int c = cpu();
      threads_.emplace_back([this, w, c] {
        if (c >= 0) pin_to(c);
        w(*this);
      });
    }
  }

  bool pop(std::vector<Job>& jobs, std::size_t most) {
    return queue_.pop(jobs, most, stop_, spin_ns_);
  }
  // Receivers and workers waiting for work spin this long (no sleep, no wake-up latency) before
  // they block; 0: block at once.
  void set_spin(std::int64_t ns) { spin_ns_ = ns; }
  // Segmentation offload (before start): replies to one peer leave as UDP_SEGMENT runs, and
  // the receive sockets take runs a client sent that way in one read (UDP_GRO).
  void set_offload(bool on) { offload_ = on; }
  // Pin the receivers and workers to one CPU each (before start).
  void set_pin(bool on) { pin_ = on; }
  bool stopping() const { return stop_; }

  // Answers a solved request (UDP replies go into `out`, sent by flush()).
  void reply_ok(const Job& job, std::int64_t energy, const std::uint32_t* signs, UdpBatch& out) {
    const std::uint32_t n = job.req.n;
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
  void flush(UdpBatch& out, std::size_t via = 0) {
    if (out.ok > 0) {
      replies_[wire::kOk].fetch_add(out.ok, std::memory_order_relaxed);
      out.ok = 0;
    }
    const std::size_t runs = out.flush(udp_fds_[via % udp_fds_.size()], offload_);
    if (runs > 0) runs_out_ += runs;
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

  // Parses one request; answers errors and loads at once (into `now`), queues good solves.
  // Returns true when a job was added to `jobs`. The caller counts it received.
  template <typename Reply>
  bool admit(const std::uint8_t* p, std::size_t len, bool truncated, std::vector<Job>& jobs,
             Reply reply) {
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
      std::lock_guard<std::mutex> lock(models_m_);
      auto it = models_.find(r.model_id);
      if (it == models_.end()) {
        st = wire::kNoModel;
      } else if (int(r.n) != it->second->n) {
        st = wire::kBadParam;
      } else {
        model = it->second;
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

  std::uint32_t residence(std::int64_t t_recv) const {
    const std::int64_t d = now_ns() - t_recv;
    return std::uint32_t(std::min<std::int64_t>(d, std::numeric_limits<std::uint32_t>::max()));
  }

  void udp_loop(int fd, std::atomic<std::uint64_t>& mine) {
    constexpr int kBatch = 64;
    constexpr std::size_t kBuf = 65536;  // a datagram, or a run of them (UDP_GRO)
    std::vector<std::vector<std::uint8_t>> bufs(kBatch, std::vector<std::uint8_t>(kBuf));
    std::vector<sockaddr_in> from(kBatch);
    std::vector<iovec> iov(kBatch);
    std::vector<mmsghdr> msgs(kBatch);
    std::vector<std::array<char, 64>> ctrl(kBatch);
    UdpBatch out;
    std::vector<Job> jobs;
    std::int64_t last = 0;  // the last datagram
    while (!stop_) {
      if (spin_ns_ <= 0 || now_ns() - last > spin_ns_) {  // idle: block in poll()
        pollfd pfd{fd, POLLIN, 0};
        if (::poll(&pfd, 1, 50) <= 0) continue;
      }
      for (int i = 0; i < kBatch; ++i) {
        point_msg(msgs[i], iov[i], bufs[i].data(), bufs[i].size(), &from[i]);
        if (offload_) {
          msgs[i].msg_hdr.msg_control = ctrl[i].data();
          msgs[i].msg_hdr.msg_controllen = ctrl[i].size();
        }
      }
      const int got = ::recvmmsg(fd, msgs.data(), kBatch, MSG_DONTWAIT, nullptr);
      if (got <= 0) continue;
      last = now_ns();
      jobs.clear();
      std::uint64_t pieces = 0;  // requests read (a run counts each of its datagrams)
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
          if (admit(bufs[i].data() + off, piece, truncated, jobs, reply)) jobs.back().addr = peer;
          if (step == 0) break;
        }
      }
      received_.fetch_add(pieces, std::memory_order_relaxed);
      mine.fetch_add(pieces, std::memory_order_relaxed);
      const std::size_t taken = queue_.push(jobs);
      for (std::size_t i = taken; i < jobs.size(); ++i) {  // the queue is full: BUSY, not silence
        std::uint8_t* b = out.next(wire::kReplyHeader, jobs[i].addr);
        wire::write_reply(b, wire::kBusy, jobs[i].req.request_id, 0, residence(jobs[i].t_recv), 0,
                          nullptr);
      }
      if (taken < jobs.size()) replies_[wire::kBusy].fetch_add(jobs.size() - taken);
      const std::size_t runs = out.flush(fd, offload_);
      if (runs > 0) runs_out_ += runs;
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
};

}  // namespace csk::dsb::service
