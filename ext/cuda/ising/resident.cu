// GPU backends of the dSB request service (resident.hpp): one thread block of 256 threads solves
// one request. The B n_p (replica, row) pairs (n_p = n rounded up to 32) go to the threads
// cyclically, at most 16 per thread, with their positions and momenta in registers; the 32 lanes
// of a warp hold 32 consecutive rows of one replica, so `__ballot_sync` forms that replica's new
// sign word directly. Coupling sums are exact integers and every float operation is the one of
// cuscikit/dsb.hpp in the same order (this file is compiled without FMA contraction), so each
// replica's trajectory has the bytes of the C++ reference.
//
// Resident mode: a persistent kernel whose blocks each claim the next ticket t (a device
// counter), wait until the host has published ring slot t % R (acquire load of `seq`, system
// scope, with a growing sleep), solve it, write the reply into the slot, fence, and release-store
// `done`. The stop flag is read at most every 0.5 ms: per-iteration polling of host memory by
// hundreds of blocks floods PCIe.
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
constexpr int kPerThread = wire::kMaxPairs / kThreads;  // 16
constexpr int kMaxSignWords = wire::kMaxPairs / 32;     // B * W <= 128
constexpr int kMaxReplicas = wire::kMaxPairs / 32;      // n_p >= 32
constexpr int kMaxWordsN = wire::kMaxN / 32;

// What a block needs to solve one request (device pointers; h read once into shared memory).
struct KernelTask {
  const std::uint32_t* plus;
  const std::uint32_t* minus;
  const std::int32_t* degree;
  const std::int8_t* j8;
  const std::int32_t* h;
  int kind, n, nwords, replicas, steps;
  float dt, c0;
  unsigned long long seed;
};

// One ring slot in mapped host memory.
struct alignas(64) Slot {
  unsigned long long seq;   // ticket + 1 once `task` and `h` hold the request (host, release)
  unsigned long long done;  // ticket + 1 once `energy` and `signs` hold the reply (device)
  KernelTask task;
  long long energy;
  std::uint32_t signs[kMaxWordsN];
  std::int32_t h[wire::kMaxN];
};

struct Shared {
  std::int32_t h[wire::kMaxN];
  std::uint32_t sign[2][kMaxSignWords];
  std::uint32_t best_signs[kMaxSignWords];
  long long twice[kMaxReplicas];
  long long best[kMaxReplicas];
  int improved[kMaxReplicas];
  KernelTask task;
  unsigned long long ticket;
  int quit, winner;
};

// Solves sh.task with this block; thread 0 writes the best energy, the block the best signs.
template <int K>
__device__ void solve_block(Shared& sh, long long* energy_out, std::uint32_t* signs_out) {
  const KernelTask& t = sh.task;
  const Coupling c{t.kind, t.n, t.nwords, t.plus, t.minus, t.degree, t.j8, sh.h};
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
      const unsigned word = __ballot_sync(0xffffffffu, i < n && x[k] >= 0.0f);
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
          for (int w = 0; w < W; ++w) acc += word_sum_k<K>(c, i, w, v[w]);
          const std::int32_t a = field(c, i, acc, si);
          const long long ah = (long long)a + (long long)sh.h[i];
          twice = si > 0 ? ah : -ah;
          if (!score_only) {
            update(x[k], y[k], static_cast<float>(a), p, t.c0, t.dt, dta0);
            bit = x[k] >= 0.0f;
          }
        }
        for (int off = 16; off > 0; off >>= 1) twice += __shfl_down_sync(0xffffffffu, twice, off);
        if (lane == 0)
          atomicAdd(reinterpret_cast<unsigned long long*>(&sh.twice[b]),
                    static_cast<unsigned long long>(twice));  // integers: any order is exact
        if (!score_only) {
          const unsigned word = __ballot_sync(0xffffffffu, bit);
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

__device__ void solve_task(Shared& sh, long long* energy_out, std::uint32_t* signs_out) {
  for (int i = threadIdx.x; i < sh.task.n; i += kThreads) sh.h[i] = sh.task.h[i];
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

__global__ void __launch_bounds__(kThreads)
    resident_kernel(Slot* slots, int nslots, unsigned long long* next_ticket, const int* stop) {
  __shared__ Shared sh;
  while (true) {
    if (threadIdx.x == 0) {
      const unsigned long long t = atomicAdd(next_ticket, 1ull);
      Slot& slot = slots[t % nslots];
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> seq(slot.seq);
      unsigned long long last = global_ns();
      unsigned sleep = 64;
      int quit = 0;
      while (seq.load(cuda::memory_order_acquire) != t + 1) {
        __nanosleep(sleep);
        if (sleep < 16384) sleep *= 2;
        const unsigned long long now = global_ns();
        if (now - last > 500000ull) {  // the stop flag: at most every 0.5 ms
          last = now;
          if (*reinterpret_cast<const volatile int*>(stop) != 0) {
            quit = 1;
            break;
          }
        }
      }
      sh.ticket = t;
      sh.quit = quit;
      if (!quit) {
        sh.task = slot.task;
        sh.task.h = slot.h;  // mapped host memory, read once into shared memory
      }
    }
    __syncthreads();
    if (sh.quit) return;
    Slot& slot = slots[sh.ticket % nslots];
    solve_task(sh, &slot.energy, slot.signs);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();
      cuda::atomic_ref<unsigned long long, cuda::thread_scope_system> done(slot.done);
      done.store(sh.ticket + 1, cuda::memory_order_release);
    }
    __syncthreads();
  }
}

__global__ void __launch_bounds__(kThreads)
    launch_kernel(KernelTask task, long long* energy, std::uint32_t* signs) {
  __shared__ Shared sh;
  if (threadIdx.x == 0) sh.task = task;
  __syncthreads();
  solve_task(sh, energy, signs);
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

KernelTask kernel_task(const Task& t, const std::int32_t* h) {
  const DeviceModel& m = *t.model;
  return KernelTask{m.plus,   m.minus,    m.degree, m.j8, h,    m.kind, m.n,
                    m.nwords, t.replicas, t.steps,  t.dt, t.c0, t.seed};
}

void check_task(const Task& t) {
  const int np = 32 * t.model->nwords;
  if (t.replicas < 1 || t.replicas * np > wire::kMaxPairs || t.steps < 1)
    throw std::invalid_argument("a GPU request needs 1 <= B * n_p <= 4096 and steps >= 1");
}

}  // namespace

DeviceModel::~DeviceModel() {
  for (void* p : {static_cast<void*>(plus), static_cast<void*>(minus), static_cast<void*>(degree),
                  static_cast<void*>(j8)})
    if (p != nullptr) cudaFreeAsync(p, model_stream());
}

std::shared_ptr<DeviceModel> upload_model(int kind, int n, const std::uint32_t* plus,
                                          const std::uint32_t* minus, const std::int32_t* degree,
                                          const std::int8_t* j8) {
  if (n < 1 || n > wire::kMaxN) throw std::invalid_argument("a served model has 1 to 4096 spins");
  auto m = std::make_shared<DeviceModel>();
  m->kind = kind;
  m->n = n;
  m->nwords = (n + 31) / 32;
  const std::size_t rows = std::size_t(n) * m->nwords;
  if (kind == kBinary || kind == kTernary) m->plus = copy_in(plus, rows);
  if (kind == kTernary) {
    m->minus = copy_in(minus, rows);
    m->degree = copy_in(degree, std::size_t(n));
  }
  if (kind == kInt8) m->j8 = copy_in(j8, rows * 32);
  CSK_CUDA_CHECK(cudaStreamSynchronize(model_stream()));
  return m;
}

// ---- resident -------------------------------------------------------------------------------
struct Resident::Impl {
  Slot* slots = nullptr;  // host view; the device uses d_slots
  Slot* d_slots = nullptr;
  int* stop = nullptr;
  int* d_stop = nullptr;
  unsigned long long* d_next = nullptr;
  cudaStream_t stream = nullptr;
  int nslots = 0, nblocks = 0;
  unsigned long long head = 0;             // next ticket (the submitting thread's)
  std::vector<unsigned long long> ticket;  // per slot: its ticket while busy
  std::unique_ptr<std::atomic<int>[]> busy;
  std::atomic<std::uint64_t> inflight{0};
};

Resident::Resident(int slots, int blocks) : impl_(new Impl) {
  if (slots < 1) throw std::invalid_argument("slots must be >= 1");
  Impl& r = *impl_;
  r.nslots = slots;
  int per_sm = 0;
  CSK_CUDA_CHECK(
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, resident_kernel, kThreads, 0));
  const int fit = per_sm * sm_count();
  if (fit < 1) throw std::runtime_error("the resident kernel does not fit on this GPU");
  r.nblocks = blocks > 0 ? std::min(blocks, fit) : fit;  // all resident at once, or it deadlocks
  CSK_CUDA_CHECK(cudaHostAlloc(&r.slots, sizeof(Slot) * slots, cudaHostAllocMapped));
  std::memset(static_cast<void*>(r.slots), 0, sizeof(Slot) * slots);
  CSK_CUDA_CHECK(cudaHostGetDevicePointer(&r.d_slots, r.slots, 0));
  CSK_CUDA_CHECK(cudaHostAlloc(&r.stop, sizeof(int), cudaHostAllocMapped));
  *r.stop = 0;
  CSK_CUDA_CHECK(cudaHostGetDevicePointer(&r.d_stop, r.stop, 0));
  CSK_CUDA_CHECK(cudaStreamCreateWithFlags(&r.stream, cudaStreamNonBlocking));
  CSK_CUDA_CHECK(cudaMallocAsync(&r.d_next, sizeof(unsigned long long), r.stream));
  CSK_CUDA_CHECK(cudaMemsetAsync(r.d_next, 0, sizeof(unsigned long long), r.stream));
  r.ticket.assign(slots, 0);
  r.busy.reset(new std::atomic<int>[slots]);
  for (int i = 0; i < slots; ++i) r.busy[i] = 0;
  resident_kernel<<<r.nblocks, kThreads, 0, r.stream>>>(r.d_slots, slots, r.d_next, r.d_stop);
  CSK_CUDA_LAUNCHED();
}

Resident::~Resident() {
  Impl& r = *impl_;
  __atomic_store_n(r.stop, 1, __ATOMIC_RELEASE);
  cudaStreamSynchronize(r.stream);
  cudaFreeAsync(r.d_next, r.stream);
  cudaStreamSynchronize(r.stream);
  cudaStreamDestroy(r.stream);
  cudaFreeHost(r.slots);
  cudaFreeHost(r.stop);
}

int Resident::blocks() const { return impl_->nblocks; }
int Resident::slots() const { return impl_->nslots; }
std::uint64_t Resident::in_flight() const { return impl_->inflight.load(); }

std::int64_t Resident::free_ticket() const {
  const Impl& r = *impl_;
  return r.busy[r.head % r.nslots].load(std::memory_order_acquire) ? -1 : std::int64_t(r.head);
}

std::uint64_t Resident::submit(const Task& t) {
  Impl& r = *impl_;
  check_task(t);
  const int i = int(r.head % r.nslots);
  if (r.busy[i].load(std::memory_order_acquire))
    throw std::logic_error("Resident::submit: the slot is busy (call free_ticket first)");
  Slot& s = r.slots[i];
  s.task = kernel_task(t, nullptr);
  std::memcpy(s.h, t.h, sizeof(std::int32_t) * t.model->n);
  r.ticket[i] = r.head;
  r.busy[i].store(1, std::memory_order_release);
  r.inflight++;
  __atomic_store_n(&s.seq, r.head + 1, __ATOMIC_RELEASE);
  return r.head++;
}

int Resident::poll(std::vector<Done>& out, int part, int parts) {
  Impl& r = *impl_;
  int got = 0;
  for (int i = part; i < r.nslots; i += parts) {
    if (!r.busy[i].load(std::memory_order_acquire)) continue;
    const Slot& s = r.slots[i];
    if (__atomic_load_n(&s.done, __ATOMIC_ACQUIRE) != r.ticket[i] + 1) continue;
    Done d;
    d.tag = r.ticket[i];
    d.energy = s.energy;
    d.signs.assign(s.signs, s.signs + s.task.nwords);
    out.push_back(std::move(d));
    ++got;
  }
  return got;
}

void Resident::release(std::uint64_t ticket) {
  Impl& r = *impl_;
  const int i = int(ticket % r.nslots);
  r.busy[i].store(0, std::memory_order_release);
  r.inflight--;
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
  std::memcpy(l.pinned_h, t.h, sizeof(std::int32_t) * n);
  CSK_CUDA_CHECK(cudaMemcpyAsync(l.d_h, l.pinned_h, sizeof(std::int32_t) * n,
                                 cudaMemcpyHostToDevice, l.stream));
  launch_kernel<<<1, kThreads, 0, l.stream>>>(kernel_task(t, l.d_h), l.d_energy, l.d_signs);
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
