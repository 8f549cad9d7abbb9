// The dSB GPU kernels. One step for all replicas is an integer matrix product followed by an
// element-wise update, fused into one launch:
//
//   F = J S          J: n x n int8 couplings, S: n x B signs (+-1 as int8), F: int32 fields
//
// computed with the tensor cores' exact int8 -> int32 multiply-accumulate
// (mma.sync m16n8k32 s8.s8.s32). A block owns a tile of 128 spins x 128 replicas: it streams the
// 128 J rows and 128 sign columns through shared memory (cp.async, 4 stages) and reuses every J
// byte for 128 replicas and every sign byte for 128 spins, like a GEMM. The sums are exact
// integers, so their order does not matter. The epilogue applies the shared step of
// cuscikit/dsb.hpp to the block's (spin, replica) pairs in registers, writes the next signs, adds
// the block's part of each replica's energy and checksum (exact 64-bit integer sums, order-free),
// and packs the current sign words. The last block to finish a replica tile (a counter per tile)
// turns the sums into the per-step record and flags the replicas whose energy improved; in the
// next step every block copies its own words of those replicas into the best signs (the words are
// double-buffered), so no block copies whole sign vectors at the end of a step.
//
// Bit planes (+-1, ternary) and int8 rows are expanded once per run into the padded int8 J;
// padding rows and columns are zero, so padded spins and replicas contribute nothing.
#include <cstdint>
#include <string>
#include <vector>

#include "../common.cuh"
#include "api.hpp"
#include "cuscikit/dsb.hpp"

namespace csk::gpu::ising {
namespace {

constexpr int kBM = 128;     // spins per block tile
constexpr int kBNMax = 128;  // replicas per block tile: 32 NI, NI = 4 or 2 (kernel template)
constexpr int kBK = 64;      // bytes of J row (couplings) per pipeline stage
constexpr int kStages = 4;
constexpr int kThreads = 256;   // 8 warps: 2 (spins, 64 each) x 4 (replicas, 8 NI each)
constexpr int kLds = kBK + 16;  // shared row stride in bytes: ldmatrix rows hit distinct banks
constexpr int kTile = kBM * kLds;
constexpr std::size_t smem_bytes(int bn) { return std::size_t(kStages) * (kBM + bn) * kLds; }

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], const void* p) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}
// d += a b, int8 x int8 -> int32, exact.
__device__ __forceinline__ void mma_s8(int (&d)[4], const unsigned (&a)[4], unsigned b0,
                                       unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

struct StepArgs {
  const std::int8_t* J;      // npad x npad
  const std::int8_t* s_cur;  // Bpad x npad: signs s^(k-1) of replica b in row b (0 = padding)
  std::int8_t* s_next;       // the same for s^(k)
  float* x;                  // B x n
  float* y;
  const std::int32_t* h;
  int n, npad, B, W, steps, k, row_tiles;
  float dt, a0, c0;
  unsigned long long* energy;       // row k-1 of the record: accumulates sum s (a + h), then E
  unsigned long long* checksum;     // row k-1 of the record
  std::uint32_t* words;             // B x W: the sign words of s^(k-1)
  const std::uint32_t* words_prev;  // B x W: those of s^(k-2)
  long long* best;                  // B
  int* improved;                    // B: E(s^(k-2)) was a new best (set by step k-1)
  std::uint32_t* best_signs;        // B x W
  unsigned* counters;               // per replica tile: blocks done this step
};

// Copy k-tile kt of the block's J rows (A) and BN sign rows (B) into one pipeline stage.
template <int BN>
__device__ __forceinline__ void load_stage(std::int8_t* sa, std::int8_t* sb, const StepArgs& p,
                                           int i0, int b0, int kt) {
  for (int c = threadIdx.x; c < kBM * (kBK / 16); c += kThreads) {
    const int row = c / (kBK / 16);
    const int col = (c % (kBK / 16)) * 16;
    const std::size_t ka = static_cast<std::size_t>(kt) * kBK + col;
    cp_async16(sa + row * kLds + col, p.J + static_cast<std::size_t>(i0 + row) * p.npad + ka);
  }
  for (int c = threadIdx.x; c < BN * (kBK / 16); c += kThreads) {
    const int row = c / (kBK / 16);
    const int col = (c % (kBK / 16)) * 16;
    const std::size_t ka = static_cast<std::size_t>(kt) * kBK + col;
    cp_async16(sb + row * kLds + col, p.s_cur + static_cast<std::size_t>(b0 + row) * p.npad + ka);
  }
}

// NI: n8 replica tiles per warp; the block tile is 128 spins x BN = 32 NI replicas.
template <int NI>
__global__ void __launch_bounds__(kThreads, 2) dsb_step_kernel(StepArgs p) {
  constexpr int kBN = 32 * NI;
  static_assert(NI == 2 || NI == 4, "NI is 2 or 4");
  extern __shared__ __align__(16) std::int8_t smem[];
  __shared__ unsigned long long sh_twice[kBN];
  __shared__ unsigned long long sh_check[kBN];
  __shared__ int sh_last;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int wm = warp >> 2;  // 0..1: spins wm*64 ..
  const int wn = warp & 3;   // 0..3: replicas wn*8*NI ..
  const int i0 = blockIdx.x * kBM;
  const int b0 = blockIdx.y * kBN;
  if (tid < kBN) {
    sh_twice[tid] = 0ull;
    sh_check[tid] = 0ull;
  }

  int acc[4][NI][4];
#pragma unroll
  for (int mi = 0; mi < 4; ++mi)
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mi][ni][r] = 0;

  std::int8_t* sA = smem;
  std::int8_t* sB = smem + kStages * kTile;
  constexpr int kTileB = kBN * kLds;
  const int KT = p.npad / kBK;
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < KT) load_stage<kBN>(sA + s * kTile, sB + s * kTileB, p, i0, b0, s);
    cp_async_commit();
  }
  // ldmatrix lane addresses: A (16 x 32 bytes) as four 8x16-byte matrices in the order of the
  // mma A fragment; B two n8 tiles' (k 0-15, k 16-31) fragments.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_col = (lane >> 4) * 16;
  const int b_row = (lane & 7) + (lane >> 4) * 8;
  const int b_col = ((lane >> 3) & 1) * 16;
  for (int kt = 0; kt < KT; ++kt) {
    cp_async_wait<kStages - 2>();
    __syncthreads();
    const std::int8_t* a = sA + (kt % kStages) * kTile;
    const std::int8_t* b = sB + (kt % kStages) * kTileB;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 32) {
      unsigned af[4][4], bf[NI / 2][4];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
        ldmatrix_x4(af[mi], a + (wm * 64 + mi * 16 + a_row) * kLds + kk + a_col);
#pragma unroll
      for (int nj = 0; nj < NI / 2; ++nj)
        ldmatrix_x4(bf[nj], b + (wn * 8 * NI + nj * 16 + b_row) * kLds + kk + b_col);
#pragma unroll
      for (int mi = 0; mi < 4; ++mi)
#pragma unroll
        for (int ni = 0; ni < NI; ++ni)
          mma_s8(acc[mi][ni], af[mi], bf[ni >> 1][(ni & 1) * 2], bf[ni >> 1][(ni & 1) * 2 + 1]);
    }
    const int next = kt + kStages - 1;
    if (next < KT)
      load_stage<kBN>(sA + (next % kStages) * kTile, sB + (next % kStages) * kTileB, p, i0, b0,
                      next);
    cp_async_commit();
  }
  cp_async_wait<0>();

  // ---- epilogue: the step for this tile's (spin, replica) pairs ----
  const bool score_only = p.k == p.steps + 1;  // the final pass scores s^(S)
  const float pump = score_only ? 0.0f : csk::dsb::pump(p.k, p.steps, p.a0);
  const float dta0 = csk::dsb::fmul(p.dt, p.a0);
  const int g = lane >> 2;
  const int q = lane & 3;
  long long tw[NI][2];
#pragma unroll
  for (int ni = 0; ni < NI; ++ni) tw[ni][0] = tw[ni][1] = 0;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int i = i0 + wm * 64 + mi * 16 + g + (r >> 1) * 8;
      if (i >= p.n) continue;
      const std::int32_t hi = p.h[i];
#pragma unroll
      for (int ni = 0; ni < NI; ++ni) {
        const int b = b0 + wn * 8 * NI + ni * 8 + 2 * q + (r & 1);
        if (b >= p.B) continue;
        const std::size_t at = static_cast<std::size_t>(b) * p.n + i;
        float xi = p.x[at];
        const std::int32_t a = acc[mi][ni][r] + hi;  // sum_j J_ij s_j + h_i (J_ii = 0)
        const long long ah = static_cast<long long>(a) + hi;
        tw[ni][r & 1] += xi >= 0.0f ? ah : -ah;  // sign(x^(k-1)) = s^(k-1)
        if (!score_only) {
          float yi = p.y[at];
          csk::dsb::update(xi, yi, csk::dsb::i2f(a), pump, p.c0, p.dt, dta0);
          p.x[at] = xi;
          p.y[at] = yi;
          p.s_next[static_cast<std::size_t>(b) * p.npad + i] = xi >= 0.0f ? 1 : -1;
        }
      }
    }
  }
#pragma unroll
  for (int ni = 0; ni < NI; ++ni)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      long long v = tw[ni][c];
      for (int off = 4; off < 32; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      tw[ni][c] = v;
    }
  __syncthreads();  // sh_twice / sh_check zeroed
  if (g == 0) {
#pragma unroll
    for (int ni = 0; ni < NI; ++ni)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        atomicAdd(&sh_twice[wn * 8 * NI + ni * 8 + 2 * q + c],
                  static_cast<unsigned long long>(tw[ni][c]));
  }
  // The sign words of s^(k-1) for this tile's rows (4 words per replica) and their checksum terms;
  // the same words of s^(k-2) become best signs where that vector improved its replica's best.
  for (int t = tid; t < kBN * (kBM / 32); t += kThreads) {
    const int bl = t / (kBM / 32);
    const int b = b0 + bl;
    const int w = i0 / 32 + t % (kBM / 32);
    if (b >= p.B || w >= p.W) continue;
    const uint4* src =
        reinterpret_cast<const uint4*>(p.s_cur + static_cast<std::size_t>(b) * p.npad + 32 * w);
    const uint4 lo = src[0], hi = src[1];
    const unsigned part[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    std::uint32_t word = 0u;
#pragma unroll
    for (int j = 0; j < 8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        word |= (((part[j] >> (8 * e)) & 0xffu) == 1u ? 1u : 0u) << (4 * j + e);
    const std::size_t at = static_cast<std::size_t>(b) * p.W + w;
    p.words[at] = word;
    if (p.improved[b]) p.best_signs[at] = p.words_prev[at];
    atomicAdd(&sh_check[bl], csk::dsb::checksum_term(static_cast<std::uint32_t>(b),
                                                     static_cast<std::uint32_t>(p.W),
                                                     static_cast<std::uint32_t>(w), word));
  }
  __syncthreads();
  if (tid < kBN && b0 + tid < p.B) {
    atomicAdd(&p.energy[b0 + tid], sh_twice[tid]);
    atomicAdd(&p.checksum[b0 + tid], sh_check[tid]);
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) sh_last = atomicAdd(&p.counters[blockIdx.y], 1u) == unsigned(p.row_tiles - 1);
  __syncthreads();
  if (!sh_last) return;

  // ---- the last block of this replica tile: energies and best energies ----
  __threadfence();
  if (tid < kBN && b0 + tid < p.B) {
    const int b = b0 + tid;
    const long long twice = static_cast<long long>(__ldcg(&p.energy[b]));
    const long long e = -twice / 2;
    p.energy[b] = static_cast<unsigned long long>(e);
    const int better = e < p.best[b] ? 1 : 0;
    if (better) p.best[b] = e;
    p.improved[b] = better;
  }
  if (tid == 0) p.counters[blockIdx.y] = 0u;
}

// After the last step: the best signs of replicas whose last scored vector improved their best.
__global__ void dsb_flush_kernel(int B, int W, const int* improved, const std::uint32_t* words,
                                 std::uint32_t* best_signs) {
  const std::size_t total = static_cast<std::size_t>(B) * W;
  for (std::size_t t = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; t < total;
       t += std::size_t(gridDim.x) * blockDim.x)
    if (improved[t / W]) best_signs[t] = words[t];
}

// x, y of every (replica, spin) from Philox, and the signs s^(0).
__global__ void dsb_init_kernel(int n, int npad, int B, std::uint64_t seed, std::uint32_t request,
                                float* x, float* y, std::int8_t* s) {
  const std::size_t total = static_cast<std::size_t>(B) * n;
  for (std::size_t t = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; t < total;
       t += std::size_t(gridDim.x) * blockDim.x) {
    const int b = static_cast<int>(t / n);
    const int i = static_cast<int>(t % n);
    float xi, yi;
    csk::dsb::init_spin(seed, static_cast<std::uint32_t>(i), static_cast<std::uint32_t>(b), request,
                        xi, yi);
    x[t] = xi;
    y[t] = yi;
    s[static_cast<std::size_t>(b) * npad + i] = xi >= 0.0f ? 1 : -1;
  }
}

// The couplings as int8 rows of length npad (zero beyond n and on the diagonal).
__global__ void expand_kernel(csk::dsb::Coupling c, int npad, std::int8_t* J) {
  const std::size_t total = static_cast<std::size_t>(c.n) * c.n;
  for (std::size_t t = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; t < total;
       t += std::size_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(t / c.n);
    const int j = static_cast<int>(t % c.n);
    const std::size_t at = static_cast<std::size_t>(i) * c.nwords + (j >> 5);
    const unsigned bit = 1u << (j & 31);
    int v;
    if (c.kind == csk::dsb::kBinary) {
      v = i == j ? 0 : ((c.plus[at] & bit) ? 1 : -1);
    } else if (c.kind == csk::dsb::kTernary) {
      v = (c.plus[at] & bit) ? 1 : ((c.minus[at] & bit) ? -1 : 0);
    } else {
      v = c.j8[static_cast<std::size_t>(i) * c.nwords * 32 + j];
    }
    J[static_cast<std::size_t>(i) * npad + j] = static_cast<std::int8_t>(v);
  }
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

std::size_t round_up(std::size_t v, std::size_t m) { return (v + m - 1) / m * m; }

}  // namespace

float run_dsb(const RunArgs& a, const RunOut& o) {
  const std::size_t W = static_cast<std::size_t>(a.nwords);
  const std::size_t R = static_cast<std::size_t>(a.replicas);
  const std::size_t P = static_cast<std::size_t>(a.steps) + 1;
  const std::size_t n = static_cast<std::size_t>(a.n);
  const std::size_t npad = round_up(n, kBM);
  const std::size_t Rpad = round_up(R, kBNMax);
  if (Rpad / 64 > 65535ull)
    throw std::invalid_argument("too many replicas for the GPU kernel (at most 8388480)");

  // Everything the run keeps on the device, refused up front with its size.
  const std::size_t need = npad * npad + 2 * Rpad * npad + 2 * R * n * sizeof(float) +
                           2 * P * R * 8 + R * 8 + 3 * R * W * 4 + R * 4 + Rpad / 64 * 4 +
                           (a.plus_len + a.minus_len + a.degree_len + n) * 4 + a.j8_len;
  std::size_t free_b = 0, total_b = 0;
  CSK_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  if (need > free_b)
    throw std::invalid_argument(
        "the dSB run needs " + std::to_string(need >> 20) + " MiB on the GPU (int8 J of " +
        std::to_string(npad) + "^2 bytes, signs, states and the per-step record) but " +
        std::to_string(free_b >> 20) + " MiB are free; use fewer agents or steps");

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

  DeviceBuffer J(npad * npad);
  DeviceBuffer s0(Rpad * npad), s1(Rpad * npad);
  DeviceBuffer x(R * n * sizeof(float));
  DeviceBuffer y(R * n * sizeof(float));
  DeviceBuffer energy(P * R * sizeof(long long));
  DeviceBuffer checksum(P * R * sizeof(unsigned long long));
  DeviceBuffer best_energy(R * sizeof(long long));
  DeviceBuffer words0(R * W * sizeof(std::uint32_t)), words1(R * W * sizeof(std::uint32_t));
  DeviceBuffer improved(R * sizeof(int));
  DeviceBuffer best_signs(R * W * sizeof(std::uint32_t));
  DeviceBuffer counters(Rpad / 64 * sizeof(unsigned));
  CSK_CUDA_CHECK(cudaMemset(J.ptr, 0, npad * npad));
  CSK_CUDA_CHECK(cudaMemset(s0.ptr, 0, Rpad * npad));
  CSK_CUDA_CHECK(cudaMemset(s1.ptr, 0, Rpad * npad));
  CSK_CUDA_CHECK(cudaMemset(energy.ptr, 0, P * R * sizeof(long long)));
  CSK_CUDA_CHECK(cudaMemset(checksum.ptr, 0, P * R * sizeof(unsigned long long)));
  CSK_CUDA_CHECK(cudaMemset(best_signs.ptr, 0, R * W * sizeof(std::uint32_t)));
  CSK_CUDA_CHECK(cudaMemset(improved.ptr, 0, R * sizeof(int)));
  CSK_CUDA_CHECK(cudaMemset(counters.ptr, 0, Rpad / 64 * sizeof(unsigned)));
  {
    const std::vector<long long> inf(R, 0x7fffffffffffffffLL);
    upload(best_energy, inf.data(), R);
  }

  const csk::dsb::Coupling c{a.kind,
                             a.n,
                             a.nwords,
                             plus.as<const std::uint32_t>(),
                             minus.as<const std::uint32_t>(),
                             degree.as<const std::int32_t>(),
                             j8.as<const std::int8_t>(),
                             h.as<const std::int32_t>()};
  const int sms = sm_count();
  expand_kernel<<<grid_for(static_cast<i64>(n * n), 256, 16 * sms), 256>>>(c, int(npad),
                                                                           J.as<std::int8_t>());
  CSK_CUDA_LAUNCHED();
  // Replica tile: 128, or 64 when 128-wide tiles would leave SMs without a second block.
  int bn = a.tile_replicas;
  if (bn == 0) bn = (npad / kBM) * (Rpad / 128) < std::size_t(2 * sms) ? 64 : 128;
  if (bn != 64 && bn != 128) throw std::invalid_argument("tile_replicas must be 0, 64 or 128");
  auto step_kernel = bn == 128 ? dsb_step_kernel<4> : dsb_step_kernel<2>;
  CSK_CUDA_CHECK(cudaFuncSetAttribute(step_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes(bn))));

  cudaEvent_t start, stop;
  CSK_CUDA_CHECK(cudaEventCreate(&start));
  CSK_CUDA_CHECK(cudaEventCreate(&stop));
  CSK_CUDA_CHECK(cudaEventRecord(start, 0));
  dsb_init_kernel<<<grid_for(static_cast<i64>(R * n), 256, 16 * sms), 256>>>(
      a.n, int(npad), a.replicas, a.seed, a.request, x.as<float>(), y.as<float>(),
      s0.as<std::int8_t>());
  CSK_CUDA_LAUNCHED();

  StepArgs p{};
  p.J = J.as<const std::int8_t>();
  p.x = x.as<float>();
  p.y = y.as<float>();
  p.h = h.as<const std::int32_t>();
  p.n = a.n;
  p.npad = int(npad);
  p.B = a.replicas;
  p.W = a.nwords;
  p.steps = a.steps;
  p.row_tiles = int(npad / kBM);
  p.dt = a.dt;
  p.a0 = a.a0;
  p.c0 = a.c0;
  p.improved = improved.as<int>();
  p.best = best_energy.as<long long>();
  p.best_signs = best_signs.as<std::uint32_t>();
  p.counters = counters.as<unsigned>();
  std::int8_t* cur = s0.as<std::int8_t>();
  std::int8_t* nxt = s1.as<std::int8_t>();
  const dim3 grid(static_cast<unsigned>(npad / kBM), static_cast<unsigned>(Rpad / bn));
  for (int k = 1; k <= a.steps + 1; ++k) {
    p.k = k;
    p.s_cur = cur;
    p.s_next = nxt;
    p.energy = energy.as<unsigned long long>() + static_cast<std::size_t>(k - 1) * R;
    p.checksum = checksum.as<unsigned long long>() + static_cast<std::size_t>(k - 1) * R;
    p.words = (k % 2 ? words1 : words0).as<std::uint32_t>();
    p.words_prev = (k % 2 ? words0 : words1).as<const std::uint32_t>();
    step_kernel<<<grid, kThreads, smem_bytes(bn)>>>(p);
    CSK_CUDA_LAUNCHED();
    std::swap(cur, nxt);
  }
  dsb_flush_kernel<<<grid_for(static_cast<i64>(R * W), 256, 16 * sms), 256>>>(
      a.replicas, a.nwords, improved.as<const int>(),
      ((a.steps + 1) % 2 ? words1 : words0).as<const std::uint32_t>(),
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
