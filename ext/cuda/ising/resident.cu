// GPU backends of the dSB request service (resident.hpp). Two solvers, both with positions and
// momenta in registers and the new sign words formed by `__ballot_sync` (the 32 lanes of a warp
// hold 32 consecutive rows of one replica):
//  - warp-sized requests (binary or ternary couplings, B n_p <= 256 pairs, n_p = n rounded up to
//    32): one warp alone, lane l holding rows l, l + 32, ... of every replica; every sign word
//    of the request lives in every lane's registers, a step needs no barrier at all and the
//    energy is a warp reduction (`__reduce_add_sync`);
//  - the others: one thread block of 256 threads, the B n_p pairs cyclically over the threads
//    (at most 16 each), sign words in shared memory, three block barriers a step.
// Binary and ternary bit rows are read word-major (resident.hpp), so a warp's loads coalesce.
// Coupling sums are exact integers and every float operation is the one of cuscikit/dsb.hpp in
// the same order (this file is compiled without FMA contraction), so each replica's trajectory
// has the bytes of the C++ reference.
//
// Resident mode: one persistent kernel. Block 0 is the dispatcher: one thread reads the two
// rings' published counters in mapped host memory (system-scope acquire loads, back to back:
// one outstanding PCIe read at a time) and copies them into device memory, and reads the host's
// stop flag every ~50 us. Every other block serves a ring: its warps (warp ring) or the whole
// block (block ring) claim the next ticket t (a device counter), wait in device memory until
// the dispatcher has seen t published (relaxed polls, sleeping in proportion to how far back in
// the line t is, and one acquire fence once it is: see wait_ticket), read slot t % R (the task, and
// the field unless it is the model's own, already on the device), solve, write the reply into the
// slot, fence, and release-store `done`. So hundreds of waiting servers never poll host memory:
// only the dispatcher does.
#include <cuda/atomic>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>

#include "common.cuh"
#include "cuscikit/dsb.hpp"
#include "cuscikit/dsb_protocol.hpp"
#include "resident.hpp"

namespace csk::gpu::ising {

namespace {

using namespace csk::dsb;
namespace wire = csk::dsb::wire;

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = wire::kMaxPairs / kThreads;  // 16
constexpr int kMaxSignWords = wire::kMaxPairs / 32;     // B * W <= 128
constexpr int kMaxReplicas = wire::kMaxPairs / 32;      // n_p >= 32
constexpr int kMaxWordsN = wire::kMaxN / 32;
constexpr int kWarpWords = 8;  // B * W of a warp-sized request (B * n_p <= 256)
constexpr unsigned kFull = 0xffffffffu;
constexpr unsigned long long kQuit = ~0ull;

// What a solver needs for one request (device pointers; the field read once into shared memory).
struct KernelTask {
  const std::uint32_t* plus_t;
  const std::uint32_t* minus_t;
  const std::int32_t* degree;
  const std::int8_t* j8;
  const std::int32_t* h;  // resident: null = the slot's own copy
  int kind, n, nwords, replicas, steps;
  float dt, c0;
  unsigned long long seed;
};
static_assert(sizeof(KernelTask) % 4 == 0, "copied in 32-bit words");
constexpr int kTaskWords = int(sizeof(KernelTask) / 4);

// One ring slot in mapped host memory.
struct alignas(64) Slot {
  unsigned long long done;  // ticket + 1 once `energy` and `signs` hold the reply (device)
  KernelTask task;
  long long energy;
  unsigned long long solve_ns;  // the solver's time on the device (global timer)
  std::uint32_t signs[kMaxWordsN];
  std::int32_t h[wire::kMaxN];
};

// Block-sized requests: one per block.
struct BlockShared {
  std::int32_t h[wire::kMaxN];
  std::uint32_t sign[2][kMaxSignWords];
  std::uint32_t best_signs[kMaxSignWords];
  long long twice[kMaxReplicas];
  long long best[kMaxReplicas];
  int improved[kMaxReplicas];
  KernelTask task;
  unsigned long long ticket;
  int winner;
};
// Warp-sized requests: one per warp.
struct WarpShared {
  std::int32_t h[kWarps][32 * kWarpWords];
  KernelTask task[kWarps];
};
union Shared {
  BlockShared block;
  WarpShared warp;
};

// Row i's coupling sum with word w of the signs (the integer of word_sum_k in cuscikit/dsb.hpp).
template <int K>
__device__ __forceinline__ std::int32_t word_acc(const KernelTask& t, const Coupling& c, int i,
                                                 int w, int np, std::uint32_t vw) {
  if (K == kBinary) return __popc(__ldg(t.plus_t + w * np + i) ^ vw);
  if (K == kTernary)
    return __popc(__ldg(t.plus_t + w * np + i) & vw) - __popc(__ldg(t.minus_t + w * np + i) & vw);
  return word_sum_k<kInt8>(c, i, w, vw);
}

// Solves a warp-sized request with this warp (W words a row, B <= kWarpWords / W replicas);
// lane 0 writes the best energy, lanes 0 .. W - 1 the best signs. A step first forms every
// row's coupling sum (independent loads, or registers: for W <= 4 the lane's W rows of W words
// are loaded once), then updates, then forms the new sign words, so the latencies overlap.
// BF: the replica count when fixed at compile time (0: t.replicas, up to kWarpWords / W). With
// BF > 0 the loops run over exactly the B W words in use (no guards on the unused ones), and
// each lane computes the pump of one of the next 32 steps at once (lane l: step s + l), which a
// step then takes by a shuffle instead of a division of its own: the same values, so the same
// bytes, in fewer instructions on the step's path.
template <int K, int W, int BF>
__device__ void solve_warp(const KernelTask& t, const std::int32_t* h, long long* energy_out,
                           std::uint32_t* signs_out) {
  constexpr int S = BF > 0 ? BF * W : kWarpWords, BM = S / W;
  static_assert(S <= kWarpWords, "a warp-sized request holds at most kWarpWords sign words");
  constexpr bool kCached = W <= 4;
  constexpr int CW = kCached ? W : 1;
  const int lane = threadIdx.x & 31, n = t.n, B = BF > 0 ? BF : t.replicas, np = 32 * W;
  const Coupling c{t.kind, n, W, nullptr, nullptr, t.degree, nullptr, h};
  float x[S], y[S];
  std::uint32_t sg[S], nsg[S], bsg[S];
  std::int32_t acc[S];
  long long best[BM];
  std::uint32_t cp[CW * CW], cm[CW * CW];  // word w of the lane's row r at r * W + w
  if constexpr (kCached) {
#pragma unroll
    for (int r = 0; r < W; ++r)
#pragma unroll
      for (int w = 0; w < W; ++w) {
        cp[r * W + w] = __ldg(t.plus_t + w * np + lane + 32 * r);
        cm[r * W + w] = K == kTernary ? __ldg(t.minus_t + w * np + lane + 32 * r) : 0u;
      }
  }
#pragma unroll
  for (int k = 0; k < S; ++k) {
    x[k] = 0.0f;
    y[k] = 0.0f;
    sg[k] = 0u;
    bsg[k] = 0u;
    if (k < B * W) {  // uniform across the warp
      const int b = k / W, i = lane + 32 * (k % W);
      if (i < n) init_spin(t.seed, std::uint32_t(i), std::uint32_t(b), 0u, x[k], y[k]);
      sg[k] = __ballot_sync(kFull, i < n && x[k] >= 0.0f);
    }
  }
#pragma unroll
  for (int b = 0; b < BM; ++b) best[b] = LLONG_MAX;
  const float dta0 = fmul(t.dt, 1.0f);
  float pumps = 0.0f;  // BF > 0: lane l holds pump(s + l) for the 32 steps from s = 32 q + 1
  for (int s = 1; s <= t.steps + 1; ++s) {
    const bool score_only = s == t.steps + 1;  // the final pass scores s^(S)
    float p;
    if constexpr (BF > 0) {
      if (((s - 1) & 31) == 0) pumps = pump(s + lane, t.steps, 1.0f);
      p = score_only ? 0.0f : __shfl_sync(kFull, pumps, (s - 1) & 31);
    } else {
      p = score_only ? 0.0f : pump(s, t.steps, 1.0f);
    }
    long long twice[BM];
#pragma unroll
    for (int b = 0; b < BM; ++b) twice[b] = 0;
#pragma unroll
    for (int k = 0; k < S; ++k) {  // the coupling sums (rows >= n: unused)
      acc[k] = 0;
      if (k < B * W) {
        const int b = k / W, r = k % W, i = lane + 32 * r;
#pragma unroll
        for (int w = 0; w < W; ++w) {
          const std::uint32_t vw = sg[b * W + w];
          if constexpr (!kCached) {
            acc[k] += word_acc<K>(t, c, i, w, np, vw);
          } else if (K == kBinary) {
            acc[k] += __popc(cp[r * W + w] ^ vw);
          } else {
            acc[k] += __popc(cp[r * W + w] & vw) - __popc(cm[r * W + w] & vw);
          }
        }
      }
    }
    bool bits[S];
#pragma unroll
    for (int k = 0; k < S; ++k) {
      bits[k] = false;
      if (k < B * W) {
        const int b = k / W, i = lane + 32 * (k % W);
        if (i < n) {
          const int si = ((sg[k] >> lane) & 1u) ? 1 : -1;  // spin_of: word k % W, bit lane
          const std::int32_t a = field(c, i, acc[k], si);
          const long long ah = (long long)a + (long long)h[i];
          twice[b] += si > 0 ? ah : -ah;
          if (!score_only) {
            update(x[k], y[k], static_cast<float>(a), p, t.c0, t.dt, dta0);
            bits[k] = x[k] >= 0.0f;
          }
        }
      }
    }
#pragma unroll
    for (int k = 0; k < S; ++k)
      nsg[k] = k < B * W && !score_only ? __ballot_sync(kFull, bits[k]) : 0u;
#pragma unroll
    for (int b = 0; b < BM; ++b) {
      if (b < B) {
        // the exact 64-bit sum from two 32-bit reductions (|twice| < 2^40 a lane)
        const unsigned lo = __reduce_add_sync(kFull, unsigned(twice[b] & 0xffff));
        const int hi = __reduce_add_sync(kFull, int(twice[b] >> 16));
        const long long e = -((long long)hi * 65536 + (long long)lo) / 2;
        if (e < best[b]) {  // uniform: every lane holds the same sum
          best[b] = e;
#pragma unroll
          for (int r = 0; r < W; ++r) bsg[b * W + r] = sg[b * W + r];
        }
      }
    }
    if (!score_only) {
#pragma unroll
      for (int k = 0; k < S; ++k) sg[k] = nsg[k];
    }
  }
  long long e = best[0];  // the lowest energy, the lowest replica on ties
  int bb = 0;
#pragma unroll
  for (int b = 1; b < BM; ++b)
    if (b < B && best[b] < e) {
      e = best[b];
      bb = b;
    }
  if (lane == 0) *energy_out = e;
#pragma unroll
  for (int b = 0; b < BM; ++b)
#pragma unroll
    for (int r = 0; r < W; ++r)
      if (b == bb && lane == r) signs_out[r] = bsg[b * W + r];
}

// One replica (the common request) on the solver specialised for it, unless `generic`.
template <int K, int W>
__device__ void solve_warp_w(const KernelTask& t, const std::int32_t* h, long long* e,
                             std::uint32_t* s, bool generic) {
  if (!generic && t.replicas == 1) return solve_warp<K, W, 1>(t, h, e, s);
  return solve_warp<K, W, 0>(t, h, e, s);
}

template <int K>
__device__ void solve_warp_k(const KernelTask& t, const std::int32_t* h, long long* e,
                             std::uint32_t* s, bool generic) {
  switch (t.nwords) {
    case 1:
      return solve_warp_w<K, 1>(t, h, e, s, generic);
    case 2:
      return solve_warp_w<K, 2>(t, h, e, s, generic);
    case 3:
      return solve_warp_w<K, 3>(t, h, e, s, generic);
    case 4:
      return solve_warp_w<K, 4>(t, h, e, s, generic);
    case 5:
      return solve_warp_w<K, 5>(t, h, e, s, generic);
    case 6:
      return solve_warp_w<K, 6>(t, h, e, s, generic);
    case 7:
      return solve_warp_w<K, 7>(t, h, e, s, generic);
    default:
      return solve_warp_w<K, 8>(t, h, e, s, generic);
  }
}

// Solves sh.task (field in sh.h) with this block; thread 0 writes the best energy, the block
// the best signs.
template <int K>
__device__ void solve_block(BlockShared& sh, long long* energy_out, std::uint32_t* signs_out) {
  const KernelTask& t = sh.task;
  const Coupling c{t.kind, t.n, t.nwords, nullptr, nullptr, t.degree, t.j8, sh.h};
  const int n = t.n, W = t.nwords, np = 32 * W, B = t.replicas, P = B * np;
  const int tid = threadIdx.x, lane = tid & 31;
  float x[kPerThread], y[kPerThread];
  for (int b = tid; b < B; b += kThreads) {
    sh.twice[b] = 0;
    sh.best[b] = LLONG_MAX;
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int q = tid + k * kThreads;
    x[k] = 0.0f;
    y[k] = 0.0f;
    if (q < P) {  // uniform across the warp: P and the block are multiples of 32
      const int b = q / np, i = q - b * np;
      if (i < n) init_spin(t.seed, std::uint32_t(i), std::uint32_t(b), 0u, x[k], y[k]);
      const unsigned word = __ballot_sync(kFull, i < n && x[k] >= 0.0f);
      if (lane == 0) sh.sign[0][b * W + (i >> 5)] = word;
    }
  }
  __syncthreads();
  const float dta0 = fmul(t.dt, 1.0f);
  int cur = 0;
  for (int s = 1; s <= t.steps + 1; ++s) {
    const bool score_only = s == t.steps + 1;  // the final pass scores s^(S)
    const float p = score_only ? 0.0f : pump(s, t.steps, 1.0f);
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int q = tid + k * kThreads;
      if (q < P) {
        const int b = q / np, i = q - b * np;
        const std::uint32_t* v = sh.sign[cur] + b * W;
        long long twice = 0;
        bool bit = false;
        if (i < n) {
          const int si = spin_of(v, i);
          std::int32_t acc = 0;
          for (int w = 0; w < W; ++w) acc += word_acc<K>(t, c, i, w, np, v[w]);
          const std::int32_t a = field(c, i, acc, si);
          const long long ah = (long long)a + (long long)sh.h[i];
          twice = si > 0 ? ah : -ah;
          if (!score_only) {
            update(x[k], y[k], static_cast<float>(a), p, t.c0, t.dt, dta0);
            bit = x[k] >= 0.0f;
          }
        }
        for (int off = 16; off > 0; off >>= 1) twice += __shfl_down_sync(kFull, twice, off);
        if (lane == 0)
          atomicAdd(reinterpret_cast<unsigned long long*>(&sh.twice[b]),
                    static_cast<unsigned long long>(twice));  // integers: any order is exact
        if (!score_only) {
          const unsigned word = __ballot_sync(kFull, bit);
          if (lane == 0) sh.sign[cur ^ 1][b * W + (i >> 5)] = word;
        }
      }
    }
    __syncthreads();
    for (int b = tid; b < B; b += kThreads) {
      const long long e = -sh.twice[b] / 2;
      sh.twice[b] = 0;
      sh.improved[b] = e < sh.best[b];
      if (e < sh.best[b]) sh.best[b] = e;
    }
    __syncthreads();
    for (int w = tid; w < B * W; w += kThreads)
      if (sh.improved[w / W]) sh.best_signs[w] = sh.sign[cur][w];
    __syncthreads();
    if (!score_only) cur ^= 1;
  }
  if (tid == 0) {  // the lowest energy, the lowest replica on ties
    int bb = 0;
    for (int b = 1; b < B; ++b)
      if (sh.best[b] < sh.best[bb]) bb = b;
    sh.winner = bb;
    *energy_out = sh.best[bb];
  }
  __syncthreads();
  for (int w = tid; w < W; w += kThreads) signs_out[w] = sh.best_signs[sh.winner * W + w];
}

// Reads the field (from the slot in mapped memory, or the model's copy) and solves sh.task.
__device__ void solve_block_task(BlockShared& sh, const std::int32_t* h, long long* energy_out,
                                 std::uint32_t* signs_out) {
  for (int i = threadIdx.x; i < sh.task.n; i += kThreads) sh.h[i] = __ldcv(h + i);
  __syncthreads();
  if (sh.task.kind == kBinary) {
    solve_block<kBinary>(sh, energy_out, signs_out);
  } else if (sh.task.kind == kTernary) {
    solve_block<kTernary>(sh, energy_out, signs_out);
  } else {
    solve_block<kInt8>(sh, energy_out, signs_out);
  }
}

__device__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The kernel's view of the rings: slots and published counters in mapped host memory, claimed
// tickets and the dispatcher's copies of the counters in device memory.
struct Rings {
  Slot* slots[2];                // warp ring, block ring
  unsigned long long* pub[2];    // host: tickets published
  const int* stop;               // host: stop the kernel
  unsigned long long* next[2];   // device: the next ticket to claim
  unsigned long long* avail[2];  // device: tickets published, as the dispatcher last saw them
  int* quit;                     // device: the dispatcher saw the stop flag
  int nslots[2];                 // slots of each ring
  int block_servers;
  int generic;  // 1: every warp-sized request on the solver for any replica count
};

// Claims the next ticket of a ring and waits until it is published (or returns kQuit). The
// counter is polled with relaxed loads and the acquire is one fence once the ticket is out: on
// sm_90 an acquire load at device scope compiles to a strong load followed by an invalidation
// of the SM's whole L1 cache (CCTL.IVALL), so servers polling that way kept emptying the L1 of
// the solvers on their SM, which read their coupling rows through L1 every step.
__device__ unsigned long long wait_ticket(const Rings& r, int ring) {
  const unsigned long long t = atomicAdd(r.next[ring], 1ull);
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> avail(*r.avail[ring]);
  while (true) {
    const unsigned long long a = avail.load(cuda::memory_order_relaxed);
    if (a > t) {
      cuda::atomic_thread_fence(cuda::memory_order_acquire, cuda::thread_scope_device);
      return t;
    }
    if (*reinterpret_cast<volatile int*>(r.quit) != 0) return kQuit;
    const unsigned long long behind = t - a;  // requests to come before this one
    __nanosleep(behind >= 64 ? 16384u : 64u + 256u * unsigned(behind));
  }
}

// Copies the task of a slot (mapped memory, read past the caches) into shared memory.
__device__ void read_task(const Slot* slot, KernelTask* dst, int lane, int width) {
  const unsigned* src = reinterpret_cast<const unsigned*>(&slot->task);
  unsigned* d = reinterpret_cast<unsigned*>(dst);
  for (int j = lane; j < kTaskWords; j += width) d[j] = __ldcv(src + j);
}

__device__ void publish_done(Slot* slot, unsigned long long ticket) {
  __threadfence_system();
  cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> done(slot->done);
  done.store(ticket + 1, cuda::memory_order_release);
}

__device__ void dispatcher(const Rings& r) {
  if (threadIdx.x != 0) return;
  unsigned long long seen[2] = {0ull, 0ull};
  unsigned long long last = global_ns();
  while (true) {
    for (int ring = 0; ring < 2; ++ring) {
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> pub(*r.pub[ring]);
      const unsigned long long v = pub.load(cuda::memory_order_acquire);
      if (v != seen[ring]) {
        seen[ring] = v;
        cuda::atomic_ref<unsigned long long, cuda::thread_scope_device> avail(*r.avail[ring]);
        avail.store(v, cuda::memory_order_release);
      }
    }
    const unsigned long long now = global_ns();
    if (now - last > 50000ull) {  // the stop flag: every ~50 us
      last = now;
      if (*reinterpret_cast<const volatile int*>(r.stop) != 0) {
        cuda::atomic_ref<int, cuda::thread_scope_device> quit(*r.quit);
        quit.store(1, cuda::memory_order_release);
        return;
      }
    }
  }
}

__device__ void warp_server(const Rings& r, WarpShared& sh) {
  const int wid = threadIdx.x >> 5, lane = threadIdx.x & 31;
  std::int32_t* h = sh.h[wid];
  KernelTask& task = sh.task[wid];
  while (true) {
    unsigned long long t = 0;
    if (lane == 0) t = wait_ticket(r, 0);
    t = __shfl_sync(kFull, t, 0);
    if (t == kQuit) return;
    Slot* slot = r.slots[0] + t % r.nslots[0];
    const unsigned long long t0 = global_ns();
    read_task(slot, &task, lane, 32);
    __syncwarp();
    const std::int32_t* src = task.h != nullptr ? task.h : slot->h;
    for (int i = lane; i < task.n; i += 32) h[i] = __ldcv(src + i);
    __syncwarp();
    if (task.kind == kBinary) {
      solve_warp_k<kBinary>(task, h, &slot->energy, slot->signs, r.generic != 0);
    } else {
      solve_warp_k<kTernary>(task, h, &slot->energy, slot->signs, r.generic != 0);
    }
    __syncwarp();
    if (lane == 0) {
      slot->solve_ns = global_ns() - t0;
      publish_done(slot, t);
    }
    __syncwarp();
  }
}

__device__ void block_server(const Rings& r, BlockShared& sh) {
  while (true) {
    if (threadIdx.x == 0) sh.ticket = wait_ticket(r, 1);
    __syncthreads();
    const unsigned long long t = sh.ticket;
    if (t == kQuit) return;
    Slot* slot = r.slots[1] + t % r.nslots[1];
    const unsigned long long t0 = global_ns();
    if (threadIdx.x < 32) read_task(slot, &sh.task, threadIdx.x, 32);
    __syncthreads();
    solve_block_task(sh, sh.task.h != nullptr ? sh.task.h : slot->h, &slot->energy, slot->signs);
    __syncthreads();
    if (threadIdx.x == 0) {
      slot->solve_ns = global_ns() - t0;
      publish_done(slot, t);
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads, 2) resident_kernel(Rings r) {
  __shared__ Shared sh;
  if (blockIdx.x == 0) {
    dispatcher(r);
  } else if (int(blockIdx.x) <= r.block_servers) {
    block_server(r, sh.block);
  } else {
    warp_server(r, sh.warp);
  }
}

__global__ void __launch_bounds__(kThreads)
    launch_kernel(KernelTask task, long long* energy, std::uint32_t* signs) {
  __shared__ BlockShared sh;
  if (threadIdx.x == 0) sh.task = task;
  __syncthreads();
  solve_block_task(sh, task.h, energy, signs);
}

// Model copies are allocated and freed on their own non-blocking stream, stream-ordered, so that
// neither waits for a persistent kernel that never ends on its own.
cudaStream_t model_stream() {
  static cudaStream_t s = [] {
    cudaStream_t st;
    CSK_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    return st;
  }();
  return s;
}

template <typename T>
T* copy_in(const T* host, std::size_t count) {
  if (host == nullptr || count == 0) return nullptr;
  T* d = nullptr;
  CSK_CUDA_CHECK(cudaMallocAsync(&d, count * sizeof(T), model_stream()));
  CSK_CUDA_CHECK(
      cudaMemcpyAsync(d, host, count * sizeof(T), cudaMemcpyHostToDevice, model_stream()));
  return d;
}

// Bit rows (n rows of W words) word-major: word w of row i at w * 32 W + i, padding rows zero.
std::vector<std::uint32_t> word_major(const std::uint32_t* rows, int n, int W) {
  const std::size_t np = std::size_t(32) * W;
  std::vector<std::uint32_t> t(np * W, 0u);
  for (int i = 0; i < n; ++i)
    for (int w = 0; w < W; ++w) t[std::size_t(w) * np + i] = rows[std::size_t(i) * W + w];
  return t;
}

KernelTask kernel_task(const Task& t, const std::int32_t* h) {
  const DeviceModel& m = *t.model;
  return KernelTask{m.plus_t, m.minus_t,  m.degree, m.j8, h,    m.kind, m.n,
                    m.nwords, t.replicas, t.steps,  t.dt, t.c0, t.seed};
}

void check_task(const Task& t) {
  const int np = 32 * t.model->nwords;
  if (t.replicas < 1 || t.replicas * np > wire::kMaxPairs || t.steps < 1)
    throw std::invalid_argument("a GPU request needs 1 <= B * n_p <= 4096 and steps >= 1");
}

}  // namespace

bool warp_sized(const Task& t) {
  return t.model->kind != kInt8 && t.replicas * t.model->nwords <= kWarpWords;
}

DeviceModel::~DeviceModel() {
  for (void* p : {static_cast<void*>(plus_t), static_cast<void*>(minus_t),
                  static_cast<void*>(degree), static_cast<void*>(j8), static_cast<void*>(h)})
    if (p != nullptr) cudaFreeAsync(p, model_stream());
}

std::shared_ptr<DeviceModel> upload_model(int kind, int n, const std::uint32_t* plus,
                                          const std::uint32_t* minus, const std::int32_t* degree,
                                          const std::int8_t* j8, const std::int32_t* h) {
  if (n < 1 || n > wire::kMaxN) throw std::invalid_argument("a served model has 1 to 4096 spins");
  auto m = std::make_shared<DeviceModel>();
  m->kind = kind;
  m->n = n;
  m->nwords = (n + 31) / 32;
  const std::size_t rows = std::size_t(n) * m->nwords;
  std::vector<std::uint32_t> plus_t, minus_t;  // kept until the copies are done
  if (kind == kBinary || kind == kTernary) {
    plus_t = word_major(plus, n, m->nwords);
    m->plus_t = copy_in(plus_t.data(), plus_t.size());
  }
  if (kind == kTernary) {
    minus_t = word_major(minus, n, m->nwords);
    m->minus_t = copy_in(minus_t.data(), minus_t.size());
    m->degree = copy_in(degree, std::size_t(n));
  }
  if (kind == kInt8) m->j8 = copy_in(j8, rows * 32);
  m->h = copy_in(h, std::size_t(n));
  CSK_CUDA_CHECK(cudaStreamSynchronize(model_stream()));
  return m;
}

// ---- resident -------------------------------------------------------------------------------
struct Resident::Impl {
  struct Ring {
    Slot* host = nullptr;                    // the device uses Rings::slots
    unsigned long long head = 0;             // next ticket (the submitting thread's)
    unsigned long long published = 0;        // tickets the kernel may take (below this)
    std::vector<unsigned long long> ticket;  // per slot: its ticket while busy
    std::unique_ptr<std::atomic<int>[]> busy;
  };
  Ring ring[2];
  Rings dev{};
  unsigned long long* pub = nullptr;  // host view of the published counters
  int* stop = nullptr;
  unsigned long long* d_state = nullptr;
  cudaStream_t stream = nullptr;
  int nslots[2] = {0, 0}, nblocks = 0, block_servers = 0;
  // slot ids: the warp ring's 0 .. nslots[0] - 1, then the block ring's
  int base(int k) const { return k == 0 ? 0 : nslots[0]; }
  int ring_of(std::uint64_t j) const { return j < std::uint64_t(nslots[0]) ? 0 : 1; }
  std::atomic<std::uint64_t> inflight{0};
};

Resident::Resident(int warp_ring, int block_ring, int blocks, bool generic) : impl_(new Impl) {
  if (warp_ring < 1 || block_ring < 1) throw std::invalid_argument("rings need >= 1 slot");
  Impl& r = *impl_;
  r.nslots[0] = warp_ring;
  r.nslots[1] = block_ring;
  int per_sm = 0;
  CSK_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, resident_kernel, kThreads, 0));
  const int fit = per_sm * sm_count();
  if (fit < 3) throw std::runtime_error("the resident kernel does not fit on this GPU");
  r.nblocks = blocks > 0 ? std::min(blocks, fit) : fit;  // all resident at once, or it deadlocks
  if (r.nblocks < 3) throw std::invalid_argument("the resident kernel needs >= 3 blocks");
  r.block_servers = std::max(1, 3 * (r.nblocks - 1) / 4);
  if (r.block_servers > r.nblocks - 2) r.block_servers = r.nblocks - 2;
  for (int k = 0; k < 2; ++k) {
    Impl::Ring& g = r.ring[k];
    const int ring = r.nslots[k];
    CSK_CUDA_CHECK(cudaHostAlloc(&g.host, sizeof(Slot) * ring, cudaHostAllocMapped));
    std::memset(static_cast<void*>(g.host), 0, sizeof(Slot) * ring);
    CSK_CUDA_CHECK(cudaHostGetDevicePointer(&r.dev.slots[k], g.host, 0));
    g.ticket.assign(ring, 0);
    g.busy.reset(new std::atomic<int>[ring]);
    for (int i = 0; i < ring; ++i) g.busy[i] = 0;
    r.dev.nslots[k] = ring;
  }
  CSK_CUDA_CHECK(cudaHostAlloc(&r.pub, 128, cudaHostAllocMapped));  // two 64-byte lines
  std::memset(r.pub, 0, 128);
  unsigned long long* d_pub = nullptr;
  CSK_CUDA_CHECK(cudaHostGetDevicePointer(&d_pub, r.pub, 0));
  r.dev.pub[0] = d_pub;
  r.dev.pub[1] = d_pub + 8;
  CSK_CUDA_CHECK(cudaHostAlloc(&r.stop, sizeof(int), cudaHostAllocMapped));
  *r.stop = 0;
  int* d_stop = nullptr;
  CSK_CUDA_CHECK(cudaHostGetDevicePointer(&d_stop, r.stop, 0));
  r.dev.stop = d_stop;
  CSK_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  constexpr int kLine = 16;  // 128 bytes between the device counters
  CSK_CUDA_CHECK(cudaMallocAsync(&r.d_state, 5 * kLine * sizeof(unsigned long long), r.stream));
  CSK_CUDA_CHECK(cudaMemsetAsync(r.d_state, 0, 5 * kLine * sizeof(unsigned long long), r.stream));
  r.dev.next[0] = r.d_state;
  r.dev.next[1] = r.d_state + kLine;
  r.dev.avail[0] = r.d_state + 2 * kLine;
  r.dev.avail[1] = r.d_state + 3 * kLine;
  r.dev.quit = reinterpret_cast<int*>(r.d_state + 4 * kLine);
  r.dev.block_servers = r.block_servers;
  r.dev.generic = generic ? 1 : 0;
  resident_kernel<<<r.nblocks, kThreads, 0, r.stream>>>(r.dev);
  CSK_CUDA_LAUNCHED();
}

Resident::~Resident() {
  Impl& r = *impl_;
  __atomic_store_n(r.stop, 1, __ATOMIC_RELEASE);
  cudaStreamSynchronize(r.stream);
  cudaFreeAsync(r.d_state, r.stream);
  cudaStreamSynchronize(r.stream);
  cudaStreamDestroy(r.stream);
  for (auto& g : r.ring) cudaFreeHost(g.host);
  cudaFreeHost(r.pub);
  cudaFreeHost(r.stop);
}

int Resident::blocks() const { return impl_->nblocks; }
int Resident::block_servers() const { return impl_->block_servers; }
int Resident::warp_servers() const { return kWarps * (impl_->nblocks - 1 - impl_->block_servers); }
int Resident::slots() const { return impl_->nslots[0] + impl_->nslots[1]; }
int Resident::ring_slots(int k) const { return impl_->nslots[k == 0 ? 0 : 1]; }
bool Resident::generic() const { return impl_->dev.generic != 0; }
std::uint64_t Resident::in_flight() const { return impl_->inflight.load(); }

std::int64_t Resident::free_slot(const Task& t) const {
  const Impl& r = *impl_;
  const int k = warp_sized(t) ? 0 : 1;
  const int i = int(r.ring[k].head % r.nslots[k]);
  return r.ring[k].busy[i].load(std::memory_order_acquire) ? -1 : std::int64_t(r.base(k)) + i;
}

void Resident::expect(std::uint64_t count) { impl_->inflight.fetch_add(count); }

std::uint64_t Resident::submit(const Task& t, bool counted, bool publish_now) {
  Impl& r = *impl_;
  check_task(t);
  const int k = warp_sized(t) ? 0 : 1;
  Impl::Ring& g = r.ring[k];
  const int i = int(g.head % r.nslots[k]);
  if (g.busy[i].load(std::memory_order_acquire))
    throw std::logic_error("Resident::submit: the slot is busy (call free_slot first)");
  Slot& s = g.host[i];
  s.task = kernel_task(t, t.h != nullptr ? nullptr : t.model->h);
  if (t.h != nullptr) std::memcpy(s.h, t.h, sizeof(std::int32_t) * t.model->n);
  g.ticket[i] = g.head;
  g.busy[i].store(1, std::memory_order_release);
  if (!counted) r.inflight++;
  ++g.head;
  if (publish_now) publish();
  return std::uint64_t(r.base(k)) + i;
}

std::uint64_t Resident::publish() {
  Impl& r = *impl_;
  std::uint64_t count = 0;
  for (int k = 0; k < 2; ++k) {
    Impl::Ring& g = r.ring[k];
    if (g.head == g.published) continue;
    count += g.head - g.published;
    g.published = g.head;
    __atomic_store_n(r.pub + 8 * k, g.head, __ATOMIC_RELEASE);
  }
  return count;
}

int Resident::poll(std::vector<Done>& out, int part, int parts, bool claim) {
  Impl& r = *impl_;
  int got = 0;
  const int total = r.nslots[0] + r.nslots[1];
  for (int j = part; j < total; j += parts) {
    const int k = r.ring_of(std::uint64_t(j)), i = j - r.base(k);
    Impl::Ring& g = r.ring[k];
    if (g.busy[i].load(std::memory_order_acquire) != 1) continue;  // free, or claimed
    const Slot& s = g.host[i];
    if (__atomic_load_n(&s.done, __ATOMIC_ACQUIRE) != g.ticket[i] + 1) continue;
    int submitted = 1;  // 1: submitted, 2: claimed by a collector
    if (claim && !g.busy[i].compare_exchange_strong(submitted, 2, std::memory_order_acq_rel))
      continue;
    out.push_back(Done{std::uint64_t(j), s.energy, s.signs, s.solve_ns});
    ++got;
  }
  return got;
}

void Resident::release(std::uint64_t slot) { release(&slot, 1); }

void Resident::release(const std::uint64_t* slots, int count) {
  Impl& r = *impl_;
  for (int j = 0; j < count; ++j) {
    const int k = r.ring_of(slots[j]), i = int(slots[j]) - r.base(k);
    r.ring[k].busy[i].store(0, std::memory_order_release);
  }
  r.inflight.fetch_sub(std::uint64_t(count));  // one shared update for the lot
}

// ---- one launch per request -----------------------------------------------------------------
struct Launcher::Impl {
  cudaStream_t stream = nullptr;
  std::int32_t* d_h = nullptr;
  long long* d_energy = nullptr;
  std::uint32_t* d_signs = nullptr;
  std::int32_t* pinned_h = nullptr;
  long long* pinned_energy = nullptr;
  std::uint32_t* pinned_signs = nullptr;
};

Launcher::Launcher() : impl_(new Impl) {
  Impl& l = *impl_;
  CSK_CUDA_CHECK(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking));
  CSK_CUDA_CHECK(cudaMallocAsync(&l.d_h, sizeof(std::int32_t) * wire::kMaxN, l.stream));
  CSK_CUDA_CHECK(cudaMallocAsync(&l.d_energy, sizeof(long long), l.stream));
  CSK_CUDA_CHECK(cudaMallocAsync(&l.d_signs, sizeof(std::uint32_t) * kMaxWordsN, l.stream));
  CSK_CUDA_CHECK(cudaMallocHost(&l.pinned_h, sizeof(std::int32_t) * wire::kMaxN));
  CSK_CUDA_CHECK(cudaMallocHost(&l.pinned_energy, sizeof(long long)));
  CSK_CUDA_CHECK(cudaMallocHost(&l.pinned_signs, sizeof(std::uint32_t) * kMaxWordsN));
  CSK_CUDA_CHECK(cudaStreamSynchronize(l.stream));
}

Launcher::~Launcher() {
  Impl& l = *impl_;
  cudaFreeAsync(l.d_h, l.stream);
  cudaFreeAsync(l.d_energy, l.stream);
  cudaFreeAsync(l.d_signs, l.stream);
  cudaStreamSynchronize(l.stream);
  cudaStreamDestroy(l.stream);
  cudaFreeHost(l.pinned_h);
  cudaFreeHost(l.pinned_energy);
  cudaFreeHost(l.pinned_signs);
}

std::int64_t Launcher::solve(const Task& t, std::vector<std::uint32_t>& signs) {
  Impl& l = *impl_;
  check_task(t);
  const int n = t.model->n, W = t.model->nwords;
  const std::int32_t* h = t.model->h;
  if (t.h != nullptr) {
    std::memcpy(l.pinned_h, t.h, sizeof(std::int32_t) * n);
    CSK_CUDA_CHECK(cudaMemcpyAsync(l.d_h, l.pinned_h, sizeof(std::int32_t) * n,
                                   cudaMemcpyHostToDevice, l.stream));
    h = l.d_h;
  }
  launch_kernel<<<1, kThreads, 0, l.stream>>>(kernel_task(t, h), l.d_energy, l.d_signs);
  CSK_CUDA_LAUNCHED();
  CSK_CUDA_CHECK(cudaMemcpyAsync(l.pinned_energy, l.d_energy, sizeof(long long),
                                 cudaMemcpyDeviceToHost, l.stream));
  CSK_CUDA_CHECK(cudaMemcpyAsync(l.pinned_signs, l.d_signs, sizeof(std::uint32_t) * W,
                                 cudaMemcpyDeviceToHost, l.stream));
  CSK_CUDA_CHECK(cudaStreamSynchronize(l.stream));
  signs.assign(l.pinned_signs, l.pinned_signs + W);
  return *l.pinned_energy;
}

}  // namespace csk::gpu::ising
