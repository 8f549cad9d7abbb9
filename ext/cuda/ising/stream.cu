// Streamed dSB on the GPU: the replicas' state (positions, momenta, sign words, one int32 row sum
// per row and replica) stays on the device while the ±1 couplings arrive as 1-bit row tiles.
//
// Host side: producer threads fill a ring of pinned buffers (one tile each, split into chunks so
// that every thread works on every tile); the issuing thread copies each filled tile into one of a
// few device buffers on a copy stream of its own and runs the accumulation on a compute stream, the
// two ordered by events (a copy waits until the accumulation that used its device buffer is done;
// the accumulation waits for its copy), so copies overlap the arithmetic. A releaser thread waits
// for each copy's event in turn and frees its pinned buffer for the producers (a host function on
// the copy stream would hold the next copy back). Each tile serves every replica.
//
// Device side, pass k = 1 .. K + 1: acc[b][i] = sum_w popc(u_iw ^ v_bw) over all tiles (exact
// integer atomics, so the order does not matter); then per spin a_i = n - 2 acc + s_i + h_i and the
// step of cuscikit/dsb.hpp in the reference's order, the energy sum (int64) and checksum of the
// scored signs, and the best signs kept where the energy improved. Records: byte for byte those of
// the C++ reference (ext/cpu/ising/reference.hpp) and the resident kernel on the same matrix.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../common.cuh"
#include "cuscikit/dsb.hpp"
#include "stream.hpp"

namespace csk::gpu::ising {
namespace {

namespace d = csk::dsb;
using ull = unsigned long long;

constexpr int kBlock = 256;
constexpr int kWarps = kBlock / 32;
constexpr int kGroup = 8;  // replicas summed in registers at once

// acc[b * n + r0 + r] += sum over the words w of row r of popc(tile[r][w] ^ v[b][w]). Block
// (r, s): row r of the tile, words s * kBlock * per_thread .. (s + 1) * kBlock * per_thread - 1.
__global__ void accumulate_kernel(const std::uint32_t* __restrict__ tile, int W, int r0, int n,
                                  const std::uint32_t* __restrict__ v, int B, int per_thread,
                                  std::int32_t* __restrict__ acc) {
  const int r = blockIdx.x;
  const std::size_t seg = std::size_t(blockIdx.y) * kBlock * per_thread;
  const std::uint32_t* u = tile + std::size_t(r) * W;
  __shared__ std::int32_t part[kWarps][kGroup];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int b0 = 0; b0 < B; b0 += kGroup) {
    std::int32_t s[kGroup];
#pragma unroll
    for (int g = 0; g < kGroup; ++g) s[g] = 0;
    for (int j = 0; j < per_thread; ++j) {
      const std::size_t w = seg + threadIdx.x + std::size_t(j) * kBlock;
      if (w < std::size_t(W)) {
        const std::uint32_t uw = u[w];
#pragma unroll
        for (int g = 0; g < kGroup; ++g)
          if (b0 + g < B) s[g] += __popc(uw ^ __ldg(v + std::size_t(b0 + g) * W + w));
      }
    }
#pragma unroll
    for (int g = 0; g < kGroup; ++g)
      for (int off = 16; off > 0; off >>= 1) s[g] += __shfl_down_sync(0xffffffffu, s[g], off);
    if (lane == 0)
#pragma unroll
      for (int g = 0; g < kGroup; ++g) part[warp][g] = s[g];
    __syncthreads();
    if (threadIdx.x < kGroup && b0 + int(threadIdx.x) < B) {
      std::int32_t t = 0;
      for (int k = 0; k < kWarps; ++k) t += part[k][threadIdx.x];
      atomicAdd(acc + std::size_t(b0 + threadIdx.x) * n + r0 + r, t);
    }
    __syncthreads();
  }
}

// Sums a (per-thread) value over the block into *dst with one atomic.
__device__ void block_add(ull value, ull* dst) {
  __shared__ ull part[kWarps];
  for (int off = 16; off > 0; off >>= 1) value += __shfl_down_sync(0xffffffffu, value, off);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = value;
  __syncthreads();
  if (threadIdx.x == 0) {
    ull t = 0;
    for (int k = 0; k < kWarps; ++k) t += part[k];
    atomicAdd(dst, t);
  }
  __syncthreads();
}

// Initial state: thread i of replica blockIdx.y (i < 32 W; spins i >= n are padding).
__global__ void init_kernel(int n, int W, std::uint64_t seed, std::uint32_t request, float* x,
                            float* y, std::uint32_t* v) {
  const int b = blockIdx.y;
  const int i = blockIdx.x * kBlock + threadIdx.x;
  bool bit = false;
  if (i < n) {
    float xi, yi;
    d::init_spin(seed, std::uint32_t(i), std::uint32_t(b), request, xi, yi);
    x[std::size_t(b) * n + i] = xi;
    y[std::size_t(b) * n + i] = yi;
    bit = xi >= 0.0f;
  }
  const std::uint32_t word = __ballot_sync(0xffffffffu, bit);
  if ((threadIdx.x & 31) == 0 && (i >> 5) < W) v[std::size_t(b) * W + (i >> 5)] = word;
}

// Pass k (1 .. steps + 1) of replica blockIdx.y after all tiles: scores the signs v (twice the
// energy's negative into *twice, the checksum into *checksum) and, unless k = steps + 1, makes
// the step, the new signs into next.
__global__ void step_kernel(int n, int W, int k, int steps, float a0, float dt, float c0,
                            const std::int32_t* __restrict__ acc,
                            const std::int32_t* __restrict__ h, float* x, float* y,
                            const std::uint32_t* __restrict__ v, std::uint32_t* __restrict__ next,
                            ull* twice, ull* checksum, int B) {
  const int b = blockIdx.y;
  const int i = blockIdx.x * kBlock + threadIdx.x;
  const bool score_only = k == steps + 1;
  const std::uint32_t* vb = v + std::size_t(b) * W;
  std::int64_t t = 0;
  bool bit = false;
  if (i < n) {
    const int s = d::spin_of(vb, i);
    const d::Coupling c{d::kBinary, n, W, nullptr, nullptr, nullptr, nullptr, h};
    const std::int32_t a = d::field(c, i, acc[std::size_t(b) * n + i], s);
    t = s > 0 ? std::int64_t(a) + h[i] : -(std::int64_t(a) + h[i]);
    if (!score_only) {
      const std::size_t at = std::size_t(b) * n + i;
      float xi = x[at], yi = y[at];
      d::update(xi, yi, d::i2f(a), d::pump(k, steps, a0), c0, dt, d::fmul(dt, a0));
      x[at] = xi;
      y[at] = yi;
      bit = xi >= 0.0f;
    }
  }
  const std::uint32_t word = __ballot_sync(0xffffffffu, bit);
  const int w = i >> 5;
  ull cs = 0;
  if ((threadIdx.x & 31) == 0 && w < W) {
    if (!score_only) next[std::size_t(b) * W + w] = word;
    cs = d::checksum_term(std::uint32_t(b), std::uint32_t(W), std::uint32_t(w), vb[w]);
  }
  block_add(ull(t), twice + b);
  block_add(cs, checksum + b);
}

// After step_kernel of pass k: replica blockIdx.x's energy -twice / 2 into energy[b], and where
// it beats best[b], the signs v into best_signs.
__global__ void finish_kernel(int W, const ull* twice, std::int64_t* energy, std::int64_t* best,
                              const std::uint32_t* v, std::uint32_t* best_signs) {
  const int b = blockIdx.x;
  const std::int64_t e = -static_cast<std::int64_t>(twice[b]) / 2;
  const bool better = e < best[b];
  __syncthreads();
  if (better)
    for (int w = threadIdx.x; w < W; w += blockDim.x)
      best_signs[std::size_t(b) * W + w] = v[std::size_t(b) * W + w];
  if (threadIdx.x == 0) {
    energy[b] = e;
    if (better) best[b] = e;
  }
}

template <typename T>
struct DeviceArray {
  T* p = nullptr;
  explicit DeviceArray(std::size_t count) {
    CSK_CUDA_CHECK(cudaMalloc(&p, std::max<std::size_t>(count, 1) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

// The ring of pinned tile buffers shared by the producers, the issuing thread and the releaser.
struct Ring {
  std::mutex m;
  std::condition_variable cv;
  long long issued = 0;     // tiles whose copy is queued
  long long released = 0;   // tiles whose copy has finished (their buffers are free again)
  std::vector<int> filled;  // chunks written into each buffer
  bool stop = false;
  std::string error;
};

struct Streams {
  cudaStream_t copy = nullptr, compute = nullptr;
  std::vector<cudaEvent_t> copied, used, sent;  // per device buffer; sent: per pinned buffer
  Streams(int buffers, int slots)
      : copied(buffers, nullptr), used(buffers, nullptr), sent(slots, nullptr) {
    CSK_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
    CSK_CUDA_CHECK(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
    for (int i = 0; i < buffers; ++i) {
      CSK_CUDA_CHECK(cudaEventCreateWithFlags(&copied[i], cudaEventDisableTiming));
      CSK_CUDA_CHECK(cudaEventCreateWithFlags(&used[i], cudaEventDisableTiming));
    }
    for (auto& e : sent)
      CSK_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
  }
  ~Streams() {
    if (copy) cudaStreamSynchronize(copy);
    if (compute) cudaStreamSynchronize(compute);
    for (auto* list : {&copied, &used, &sent})
      for (auto e : *list)
        if (e) cudaEventDestroy(e);
    if (copy) cudaStreamDestroy(copy);
    if (compute) cudaStreamDestroy(compute);
  }
};

struct Pinned {
  std::uint32_t* p = nullptr;
  explicit Pinned(std::size_t bytes) {
    CSK_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&p), bytes, cudaHostAllocDefault));
  }
  ~Pinned() { cudaFreeHost(p); }
};

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

StreamStats run_stream(const StreamArgs& a, const FillRows& fill, const RunOut& out) {
  const int n = a.n, W = (n + 31) / 32, B = a.replicas, S = a.steps, P = S + 1;
  if (n < 2 || B < 1 || S < 0) throw std::invalid_argument("run_stream: bad sizes");
  const int R = std::max(1, std::min(a.tile_rows, n));
  const int per_pass = (n + R - 1) / R;
  const long long T = 1LL * P * per_pass;
  const int slots = std::max(2, a.slots), buffers = std::max(2, a.device_buffers);
  const int threads =
      a.threads > 0 ? a.threads : std::max(1, int(std::thread::hardware_concurrency()) - 2);
  const int chunks = std::min(R, threads);
  const std::size_t tile_words = std::size_t(R) * W, nB = std::size_t(n) * B;
  const int per_thread = std::min(8, (W + kBlock - 1) / kBlock);
  const unsigned segs = unsigned((W + kBlock * per_thread - 1) / (kBlock * per_thread));
  const dim3 spin_grid(unsigned((32LL * W + kBlock - 1) / kBlock), unsigned(B));
  if (segs > 65535u || B > 65535) throw std::invalid_argument("run_stream: n or replicas too big");

  DeviceArray<std::uint32_t> tiles(tile_words * buffers), v(std::size_t(B) * W),
      next(std::size_t(B) * W), best_signs(std::size_t(B) * W);
  DeviceArray<float> x(nB), y(nB);
  DeviceArray<std::int32_t> acc(nB), h(n);
  DeviceArray<ull> twice(std::size_t(P) * B), checksum(std::size_t(P) * B);
  DeviceArray<std::int64_t> energy(std::size_t(P) * B), best(B);
  Pinned pinned(tile_words * slots * sizeof(std::uint32_t));
  Streams st(buffers, slots);
  Ring ring;
  ring.filled.assign(slots, 0);

  CSK_CUDA_CHECK(
      cudaMemcpyAsync(h.p, a.h, sizeof(std::int32_t) * n, cudaMemcpyHostToDevice, st.compute));
  const std::vector<std::int64_t> worst(B, std::numeric_limits<std::int64_t>::max());
  CSK_CUDA_CHECK(cudaMemcpyAsync(best.p, worst.data(), sizeof(std::int64_t) * B,
                                 cudaMemcpyHostToDevice, st.compute));
  CSK_CUDA_CHECK(cudaMemsetAsync(twice.p, 0, sizeof(ull) * P * B, st.compute));
  CSK_CUDA_CHECK(cudaMemsetAsync(checksum.p, 0, sizeof(ull) * P * B, st.compute));
  CSK_CUDA_CHECK(cudaMemsetAsync(best_signs.p, 0, sizeof(std::uint32_t) * B * W, st.compute));
  init_kernel<<<spin_grid, kBlock, 0, st.compute>>>(n, W, a.seed, a.request, x.p, y.p, v.p);
  CSK_CUDA_LAUNCHED();
  CSK_CUDA_CHECK(cudaStreamSynchronize(st.compute));

  // Producers: work item q = chunk q % chunks of tile q / chunks, taken in order.
  std::atomic<long long> next_item{0};
  std::vector<double> fill_s(threads, 0.0);
  auto produce = [&](int id) {
    for (;;) {
      const long long q = next_item.fetch_add(1);
      if (q >= T * chunks) return;
      const long long t = q / chunks;
      const int c = int(q % chunks), slot = int(t % slots);
      {
        std::unique_lock<std::mutex> lk(ring.m);
        ring.cv.wait(lk, [&] { return ring.stop || ring.released > t - slots; });
        if (ring.stop) return;
      }
      const int r0 = int(t % per_pass) * R, rows = std::min(R, n - r0);
      const int lo = int(1LL * rows * c / chunks), hi = int(1LL * rows * (c + 1) / chunks);
      const auto t0 = std::chrono::steady_clock::now();
      try {
        if (hi > lo) fill(r0 + lo, hi - lo, pinned.p + tile_words * slot + std::size_t(lo) * W);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lk(ring.m);
        ring.error = e.what();
        ring.stop = true;
      }
      fill_s[id] += seconds_since(t0);
      {
        std::lock_guard<std::mutex> lk(ring.m);
        ++ring.filled[slot];
      }
      ring.cv.notify_all();
    }
  };
  // The releaser: frees each pinned buffer once its copy is done, in tile order.
  int device = 0;
  CSK_CUDA_CHECK(cudaGetDevice(&device));
  auto release = [&] {
    cudaSetDevice(device);  // the issuing thread's device (a new thread starts on device 0)
    for (long long t = 0; t < T; ++t) {
      {
        std::unique_lock<std::mutex> lk(ring.m);
        ring.cv.wait(lk, [&] { return ring.stop || ring.issued > t; });
        if (ring.stop) return;
      }
      const cudaError_t err = cudaEventSynchronize(st.sent[t % slots]);
      {
        std::lock_guard<std::mutex> lk(ring.m);
        if (err != cudaSuccess) {
          ring.error = cudaGetErrorString(err);
          ring.stop = true;
        }
        ++ring.released;
      }
      ring.cv.notify_all();
      if (err != cudaSuccess) return;
    }
  };
  std::vector<std::thread> pool;
  auto stop_all = [&] {
    {
      std::lock_guard<std::mutex> lk(ring.m);
      ring.stop = true;
    }
    ring.cv.notify_all();
    for (auto& th : pool) th.join();
    pool.clear();
  };

  StreamStats stats;
  stats.threads = threads;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    for (int id = 0; id < threads; ++id) pool.emplace_back(produce, id);
    pool.emplace_back(release);
    std::uint32_t *vp = v.p, *np = next.p;
    long long t = 0;
    for (; t < T; ++t) {
      if (a.time_limit_s > 0 && seconds_since(t0) > a.time_limit_s) break;
      const int slot = int(t % slots), db = int(t % buffers), j = int(t % per_pass);
      const int pass = int(t / per_pass), r0 = j * R, rows = std::min(R, n - r0);
      {
        const auto w0 = std::chrono::steady_clock::now();
        std::unique_lock<std::mutex> lk(ring.m);
        ring.cv.wait(lk, [&] { return ring.stop || ring.filled[slot] == chunks; });
        if (!ring.error.empty()) throw std::runtime_error("tile producer: " + ring.error);
        if (ring.stop) throw std::runtime_error("the tile producers stopped");
        ring.filled[slot] = 0;
        stats.wait_s += seconds_since(w0);
      }
      const std::size_t bytes = std::size_t(rows) * W * sizeof(std::uint32_t);
      std::uint32_t* dtile = tiles.p + tile_words * db;
      CSK_CUDA_CHECK(cudaStreamWaitEvent(st.copy, st.used[db], 0));
      CSK_CUDA_CHECK(cudaMemcpyAsync(dtile, pinned.p + tile_words * slot, bytes,
                                     cudaMemcpyHostToDevice, st.copy));
      CSK_CUDA_CHECK(cudaEventRecord(st.copied[db], st.copy));
      CSK_CUDA_CHECK(cudaEventRecord(st.sent[slot], st.copy));
      {
        std::lock_guard<std::mutex> lk(ring.m);
        ring.issued = t + 1;
      }
      ring.cv.notify_all();
      if (j == 0) CSK_CUDA_CHECK(cudaMemsetAsync(acc.p, 0, sizeof(std::int32_t) * nB, st.compute));
      CSK_CUDA_CHECK(cudaStreamWaitEvent(st.compute, st.copied[db], 0));
      accumulate_kernel<<<dim3(unsigned(rows), segs), kBlock, 0, st.compute>>>(
          dtile, W, r0, n, vp, B, per_thread, acc.p);
      CSK_CUDA_LAUNCHED();
      CSK_CUDA_CHECK(cudaEventRecord(st.used[db], st.compute));
      stats.bytes += bytes;
      if (j == per_pass - 1) {
        const int k = pass + 1;
        const std::size_t at = std::size_t(pass) * B;
        step_kernel<<<spin_grid, kBlock, 0, st.compute>>>(n, W, k, S, a.a0, a.dt, a.c0, acc.p, h.p,
                                                          x.p, y.p, vp, np, twice.p + at,
                                                          checksum.p + at, B);
        CSK_CUDA_LAUNCHED();
        finish_kernel<<<B, kBlock, 0, st.compute>>>(W, twice.p + at, energy.p + at, best.p, vp,
                                                    best_signs.p);
        CSK_CUDA_LAUNCHED();
        if (k <= S) std::swap(vp, np);
      }
    }
    stats.tiles = t;
    stats.passes = int(t / per_pass);
    stats.complete = t == T;
    CSK_CUDA_CHECK(cudaStreamSynchronize(st.compute));
    CSK_CUDA_CHECK(cudaStreamSynchronize(st.copy));
    stats.wall_s = seconds_since(t0);
    stop_all();
    if (stats.complete) {
      const std::size_t PB = std::size_t(P) * B;
      CSK_CUDA_CHECK(
          cudaMemcpy(out.energy, energy.p, sizeof(std::int64_t) * PB, cudaMemcpyDeviceToHost));
      CSK_CUDA_CHECK(
          cudaMemcpy(out.checksum, checksum.p, sizeof(ull) * PB, cudaMemcpyDeviceToHost));
      CSK_CUDA_CHECK(
          cudaMemcpy(out.best_energy, best.p, sizeof(std::int64_t) * B, cudaMemcpyDeviceToHost));
      CSK_CUDA_CHECK(cudaMemcpy(out.best_signs, best_signs.p, sizeof(std::uint32_t) * B * W,
                                cudaMemcpyDeviceToHost));
      CSK_CUDA_CHECK(cudaMemcpy(out.x, x.p, sizeof(float) * nB, cudaMemcpyDeviceToHost));
      CSK_CUDA_CHECK(cudaMemcpy(out.y, y.p, sizeof(float) * nB, cudaMemcpyDeviceToHost));
    }
  } catch (...) {
    stop_all();
    cudaStreamSynchronize(st.copy);
    cudaStreamSynchronize(st.compute);
    throw;
  }
  for (double s : fill_s) stats.fill_s += s;
  return stats;
}

double h2d_rate(std::size_t bytes, int reps) {
  if (bytes == 0 || reps < 1) throw std::invalid_argument("h2d_rate: bytes and reps must be > 0");
  Pinned src(bytes);
  std::memset(src.p, 0x5a, bytes);
  DeviceArray<std::uint8_t> dst(bytes);
  cudaStream_t s;
  CSK_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CSK_CUDA_CHECK(cudaEventCreate(&e0));
  CSK_CUDA_CHECK(cudaEventCreate(&e1));
  float ms = 0.0f;
  try {
    CSK_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyHostToDevice, s));  // warm-up
    CSK_CUDA_CHECK(cudaEventRecord(e0, s));
    for (int r = 0; r < reps; ++r)
      CSK_CUDA_CHECK(cudaMemcpyAsync(dst.p, src.p, bytes, cudaMemcpyHostToDevice, s));
    CSK_CUDA_CHECK(cudaEventRecord(e1, s));
    CSK_CUDA_CHECK(cudaEventSynchronize(e1));
    CSK_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
  } catch (...) {
    cudaStreamSynchronize(s);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(s);
    throw;
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  return double(bytes) * reps / (double(ms) * 1e6);
}

}  // namespace csk::gpu::ising
