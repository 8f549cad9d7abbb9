// The dSB kernel: one block of 256 threads per replica, the whole trajectory in one launch. Each
// warp owns groups of 32 rows (one sign word): its lanes sum a row's words together (exact
// integers, so the order is free), lane r keeps row r's sum, then every lane updates its own spin
// with the shared step of cuscikit/dsb.hpp and `__ballot_sync` makes the new sign word. Signs live
// in shared memory (current and next), x and y in global memory.
#include <cstdint>

#include "../common.cuh"
#include "api.hpp"
#include "cuscikit/dsb.hpp"

namespace csk::gpu::ising {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

// K: the coupling kind (csk::dsb::Kind), fixed per launch.
template <int K>
__global__ void __launch_bounds__(kThreads)
    dsb_kernel(csk::dsb::Coupling c, int replicas, int steps, float dt, float a0, float c0,
               std::uint64_t seed, std::uint32_t request, float* xs, float* ys, long long* energy,
               unsigned long long* checksum, long long* best_energy, std::uint32_t* best_signs) {
  extern __shared__ std::uint32_t smem[];
  __shared__ unsigned long long sh_twice;  // sum_i s_i (a_i + h_i), two's complement
  __shared__ unsigned long long sh_check;
  __shared__ long long sh_best;
  __shared__ int sh_improved;

  const int n = c.n;
  const int W = c.nwords;
  std::uint32_t* v = smem;         // signs of the spins being scored, s^(k-1)
  std::uint32_t* next = smem + W;  // signs after this step, s^(k)
  const int b = blockIdx.x;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  float* x = xs + static_cast<std::size_t>(b) * n;
  float* y = ys + static_cast<std::size_t>(b) * n;

  for (int g = warp; g < W; g += kWarps) {
    const int i = g * 32 + lane;
    float xi = 0.0f, yi = 0.0f;
    if (i < n) {
      csk::dsb::init_spin(seed, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(b),
                          request, xi, yi);
      x[i] = xi;
      y[i] = yi;
    }
    const unsigned word = __ballot_sync(kFull, i < n && xi >= 0.0f);
    if (lane == 0) v[g] = word;
  }
  if (threadIdx.x == 0) sh_best = 0x7fffffffffffffffLL;
  __syncthreads();

  const float dta0 = csk::dsb::fmul(dt, a0);
  for (int k = 1; k <= steps + 1; ++k) {
    const bool score_only = k == steps + 1;  // the final pass scores s^(S)
    const float p = score_only ? 0.0f : csk::dsb::pump(k, steps, a0);
    if (threadIdx.x == 0) {
      sh_twice = 0ull;
      sh_check = 0ull;
    }
    __syncthreads();

    long long twice = 0;
    for (int g = warp; g < W; g += kWarps) {
      const int rows = (n - g * 32) < 32 ? (n - g * 32) : 32;
      std::int32_t mine = 0;
      for (int r = 0; r < rows; ++r) {
        const int i = g * 32 + r;
        std::int32_t acc = 0;
        for (int w = lane; w < W; w += 32) acc += csk::dsb::word_sum_k<K>(c, i, w, v[w]);
        for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(kFull, acc, off);
        if (lane == r) mine = acc;
      }
      const int i = g * 32 + lane;
      bool positive = false;
      if (i < n) {
        const int s = csk::dsb::spin_of(v, i);
        const std::int32_t a = csk::dsb::field(c, i, mine, s);
        const long long ah = static_cast<long long>(a) + c.h[i];
        twice += s > 0 ? ah : -ah;
        if (!score_only) {
          float xi = x[i];
          float yi = y[i];
          csk::dsb::update(xi, yi, csk::dsb::i2f(a), p, c0, dt, dta0);
          x[i] = xi;
          y[i] = yi;
          positive = xi >= 0.0f;
        }
      }
      const unsigned word = __ballot_sync(kFull, positive);
      if (lane == 0) next[g] = word;
    }
    unsigned long long check = 0ull;
    for (int w = threadIdx.x; w < W; w += kThreads)
      check += csk::dsb::checksum_term(static_cast<std::uint32_t>(b), static_cast<std::uint32_t>(W),
                                       static_cast<std::uint32_t>(w), v[w]);
    atomicAdd(&sh_twice, static_cast<unsigned long long>(twice));
    atomicAdd(&sh_check, check);
    __syncthreads();

    if (threadIdx.x == 0) {
      const long long e = -static_cast<long long>(sh_twice) / 2;
      const std::size_t at = static_cast<std::size_t>(k - 1) * replicas + b;
      energy[at] = e;
      checksum[at] = sh_check;
      sh_improved = e < sh_best ? 1 : 0;
      if (e < sh_best) sh_best = e;
    }
    __syncthreads();
    if (sh_improved) {
      for (int w = threadIdx.x; w < W; w += kThreads)
        best_signs[static_cast<std::size_t>(b) * W + w] = v[w];
    }
    __syncthreads();
    if (!score_only) {
      for (int w = threadIdx.x; w < W; w += kThreads) v[w] = next[w];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) best_energy[b] = sh_best;
}

// A device buffer freed on scope exit (also when an error throws).
struct DeviceBuffer {
  void* ptr = nullptr;
  explicit DeviceBuffer(std::size_t bytes) {
    if (bytes) CSK_CUDA_CHECK(cudaMalloc(&ptr, bytes));
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

template <typename T>
void upload(const DeviceBuffer& d, const T* host, std::size_t count) {
  if (count) CSK_CUDA_CHECK(cudaMemcpy(d.ptr, host, count * sizeof(T), cudaMemcpyHostToDevice));
}

template <typename T>
void download(T* host, const DeviceBuffer& d, std::size_t count) {
  if (count) CSK_CUDA_CHECK(cudaMemcpy(host, d.ptr, count * sizeof(T), cudaMemcpyDeviceToHost));
}

}  // namespace

float run_dsb(const RunArgs& a, const RunOut& o) {
  const std::size_t W = static_cast<std::size_t>(a.nwords);
  const std::size_t shared_bytes = 2 * W * sizeof(std::uint32_t);
  if (shared_bytes > 200 * 1024)
    throw std::invalid_argument("n = " + std::to_string(a.n) +
                                " is too large for the GPU kernel (signs must fit in shared "
                                "memory: n <= 819200)");
  const std::size_t R = static_cast<std::size_t>(a.replicas);
  const std::size_t P = static_cast<std::size_t>(a.steps) + 1;
  const std::size_t n = static_cast<std::size_t>(a.n);

  DeviceBuffer plus(a.plus_len * sizeof(std::uint32_t));
  DeviceBuffer minus(a.minus_len * sizeof(std::uint32_t));
  DeviceBuffer degree(a.degree_len * sizeof(std::int32_t));
  DeviceBuffer j8(a.j8_len);
  DeviceBuffer h(n * sizeof(std::int32_t));
  upload(plus, a.plus, a.plus_len);
  upload(minus, a.minus, a.minus_len);
  upload(degree, a.degree, a.degree_len);
  upload(j8, a.j8, a.j8_len);
  upload(h, a.h, n);

  DeviceBuffer x(R * n * sizeof(float));
  DeviceBuffer y(R * n * sizeof(float));
  DeviceBuffer energy(P * R * sizeof(long long));
  DeviceBuffer checksum(P * R * sizeof(unsigned long long));
  DeviceBuffer best_energy(R * sizeof(long long));
  DeviceBuffer best_signs(R * W * sizeof(std::uint32_t));

  const csk::dsb::Coupling c{a.kind,
                             a.n,
                             a.nwords,
                             plus.as<const std::uint32_t>(),
                             minus.as<const std::uint32_t>(),
                             degree.as<const std::int32_t>(),
                             j8.as<const std::int8_t>(),
                             h.as<const std::int32_t>()};
  auto kernel = a.kind == csk::dsb::kBinary    ? dsb_kernel<csk::dsb::kBinary>
                : a.kind == csk::dsb::kTernary ? dsb_kernel<csk::dsb::kTernary>
                                               : dsb_kernel<csk::dsb::kInt8>;
  if (shared_bytes > 48 * 1024)
    CSK_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(shared_bytes)));
  cudaEvent_t start, stop;
  CSK_CUDA_CHECK(cudaEventCreate(&start));
  CSK_CUDA_CHECK(cudaEventCreate(&stop));
  CSK_CUDA_CHECK(cudaEventRecord(start, 0));
  kernel<<<static_cast<unsigned>(a.replicas), kThreads, shared_bytes, 0>>>(
      c, a.replicas, a.steps, a.dt, a.a0, a.c0, a.seed, a.request, x.as<float>(), y.as<float>(),
      energy.as<long long>(), checksum.as<unsigned long long>(), best_energy.as<long long>(),
      best_signs.as<std::uint32_t>());
  CSK_CUDA_LAUNCHED();
  CSK_CUDA_CHECK(cudaEventRecord(stop, 0));
  CSK_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  CSK_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);

  download(o.energy, energy, P * R);
  download(o.checksum, checksum, P * R);
  download(o.best_energy, best_energy, R);
  download(o.best_signs, best_signs, R * W);
  download(o.x, x, R * n);
  download(o.y, y, R * n);
  return ms;
}

}  // namespace csk::gpu::ising
