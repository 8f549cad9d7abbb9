// ln|psi| of the autoregressive transformer (cuscikit.nnqs.Ansatz) for many configurations:
// one thread per (configuration, position) row, plain float32 FMAs.
//
// The network is tiny (d_model 16-64, a few layers, <= 32 positions per stage) and the
// configurations are many, so a thread keeps its row's residual activations in registers
// through every layer, the block stages one layer's weights at a time in shared memory (each
// weight is then read by all threads of a warp at once, a broadcast), and the rows of one
// configuration sit in consecutive lanes of a warp (32 / (k1 - k0) configurations per warp),
// where attention takes the other positions' keys and values by warp shuffles. Nothing but one
// number per configuration (and, for a prefix stage, the keys and values its children attend to)
// leaves the chip.
//
// The arithmetic is the module's in float32, rounded to nearest: products summed in input
// order with fused multiply-adds, LayerNorm with correctly rounded square root and division,
// softmax over the keys in two passes (largest score first). The last LayerNorm, the head's
// sums, the masked log-softmax and the sum over positions run in float64: at tiny amplitudes
// each position's log-probability is large and float32 roundings of a row scale or of a
// running sum would add errors of that size times |log p|.
//
// A stage runs positions k0..k1-1 (k1 - k0 <= 32) of each configuration. With a parent, the
// keys and values of positions 0..k0-1 come from the parent prefix's cache and its partial
// ln|psi| is added; with `store`, the keys and values of positions 0..k1-1 are written for
// the next stage. Cache layout (float32): (prefix, layer, key|value, group of 16 columns,
// position (padded to lpc or lps), 16).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "api.hpp"
#include "common.cuh"
#include "cuscikit/bits.hpp"

namespace csk::gpu {

namespace {

constexpr int kThreads = 128;  // threads per block: 4 warps
constexpr unsigned kFull = 0xffffffffu;

// Offsets (in floats) of one layer's parameters in the layer block (see api.hpp).
template <int D>
struct LayerLayout {
  static constexpr int F = 4 * D;
  static constexpr int wq = 0, wk = D * D, wv = 2 * D * D, wo = 3 * D * D;
  static constexpr int w1 = 4 * D * D;
  static constexpr int w2 = w1 + D * F;
  static constexpr int bq = w2 + F * D, bk = bq + D, bv = bk + D, bo = bv + D;
  static constexpr int ln1w = bo + D, ln1b = ln1w + D, ln2w = ln1b + D, ln2b = ln2w + D;
  static constexpr int b1 = ln2b + D;
  static constexpr int b2 = b1 + F;
  static constexpr int size = (b2 + D + 3) / 4 * 4;  // float4-aligned blocks
};

// y[N] = x[D] @ W (D x N row-major in shared memory; N a multiple of 4), accumulated onto y.
template <int D, int N>
__device__ __forceinline__ void gemv_add(const float (&x)[D], const float* w, int ld,
                                         float (&y)[N]) {
#pragma unroll
  for (int k = 0; k < D; ++k) {
    const float xk = x[k];
    const float4* row = reinterpret_cast<const float4*>(w + k * ld);
#pragma unroll
    for (int n = 0; n < N / 4; ++n) {
      const float4 v = row[n];
      y[4 * n + 0] = fmaf(xk, v.x, y[4 * n + 0]);
      y[4 * n + 1] = fmaf(xk, v.y, y[4 * n + 1]);
      y[4 * n + 2] = fmaf(xk, v.z, y[4 * n + 2]);
      y[4 * n + 3] = fmaf(xk, v.w, y[4 * n + 3]);
    }
  }
}

template <int D>
__device__ __forceinline__ void layer_norm(const float (&h)[D], const float* w, const float* b,
                                           float (&x)[D]) {
  float mean = 0.0f;
#pragma unroll
  for (int d = 0; d < D; ++d) mean += h[d];
  mean = __fdiv_rn(mean, static_cast<float>(D));
  float var = 0.0f;
#pragma unroll
  for (int d = 0; d < D; ++d) {
    x[d] = h[d] - mean;
    var = fmaf(x[d], x[d], var);
  }
  var = __fdiv_rn(var, static_cast<float>(D));
  const float rstd = __fdiv_rn(1.0f, __fsqrt_rn(var + 1e-5f));
#pragma unroll
  for (int d = 0; d < D; ++d) x[d] = fmaf(x[d] * rstd, w[d], b[d]);
}

__device__ __forceinline__ float gelu(float a) {
  return 0.5f * a * (1.0f + erff(a * 0.7071067811865476f));
}

// N floats (a multiple of 4, 16-byte aligned) from global memory through the read-only cache.
template <int N>
__device__ __forceinline__ void load_row(const float* p, float (&out)[N]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 v = __ldg(reinterpret_cast<const float4*>(p) + i);
    out[4 * i] = v.x;
    out[4 * i + 1] = v.y;
    out[4 * i + 2] = v.z;
    out[4 * i + 3] = v.w;
  }
}

// Token (n_alpha + 2 n_beta) of orbital j.
__device__ __forceinline__ int token(const u64 (&w)[2], int j) {
  return static_cast<int>((((j >> 5) ? w[1] : w[0]) >> (2 * (j & 31))) & 3u);
}

template <int D, int HD>
__global__ void __launch_bounds__(kThreads, 2)
    amplitude_kernel(const AmplitudeNet net, const AmplitudeStage st) {
  using Lay = LayerLayout<D>;
  constexpr int F = Lay::F;
  constexpr int NH = D / HD;
  static_assert(HD % 4 == 0 && 16 % HD == 0 && D % 16 % HD == 0, "heads must tile the groups");
  extern __shared__ float4 smem4[];
  const float* sw = reinterpret_cast<const float*>(smem4);

  // a warp holds 32 / sp configurations side by side, sp consecutive lanes each (the lanes
  // left over repeat the last configuration's last row and write nothing)
  const int sp = st.k1 - st.k0;
  const int per_warp = 32 / sp;
  const int lane = threadIdx.x & 31;
  const int slot = min(lane / sp, per_warp - 1);
  const int base = slot * sp;  // the configuration's first lane
  const bool lane_ok = lane / sp < per_warp;
  const int r = lane_ok ? lane - base : sp - 1;
  const i64 cfg_raw =
      (static_cast<i64>(blockIdx.x) * (kThreads / 32) + threadIdx.x / 32) * per_warp + slot;
  const bool cfg_ok = cfg_raw < st.n;
  const i64 cfg = cfg_ok ? cfg_raw : st.n - 1;  // padding lanes repeat a real configuration
  const bool row_ok = cfg_ok && lane_ok;
  const int k = st.k0 + r;

  // tokens: the input (previous orbital's token, 4 at the start), the target, the electrons
  // of each spin before position k
  u64 w[2] = {0, 0};
#pragma unroll
  for (int i = 0; i < 2; ++i)
    if (i < net.words) w[i] = st.configs[cfg * net.words + i];
  const int target = token(w, k);
  const int inp = k == 0 ? 4 : token(w, k - 1);
  int used_a = 0, used_b = 0;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int below = min(max(k - 32 * i, 0), 32);
    const u64 m = below == 32 ? ~0ull : ((1ull << (2 * below)) - 1);
    used_a += popcount64(w[i] & m & 0x5555555555555555ull);  // alpha bits: even
    used_b += popcount64(w[i] & m & 0xAAAAAAAAAAAAAAAAull);
  }

  const int ngr = (D + 15) / 16;
  const i64 par = st.parent ? static_cast<i64>(st.parent[cfg]) : 0;
  const float* pkv =
      st.pkv ? st.pkv + par * (static_cast<i64>(net.n_layers) * 2 * ngr * st.lpc * 16) : nullptr;
  float* skv = st.store && cfg_ok
                   ? st.store + cfg * (static_cast<i64>(net.n_layers) * 2 * ngr * st.lps * 16)
                   : nullptr;
  // a child's cache starts with its parent's keys and values of positions 0..k0-1
  if (skv && pkv && lane_ok) {
    const int per_pos = 16;
    const int total = net.n_layers * 2 * ngr * st.k0 * per_pos;
    for (int e = r; e < total; e += sp) {
      const int c = e % per_pos;
      const int pos = (e / per_pos) % st.k0;
      const int blk = e / (per_pos * st.k0);  // (layer, key|value, group)
      skv[(static_cast<i64>(blk) * st.lps + pos) * 16 + c] =
          pkv[(static_cast<i64>(blk) * st.lpc + pos) * 16 + c];
    }
  }

  float h[D];
#pragma unroll
  for (int d = 0; d < D; ++d) h[d] = net.tok_emb[inp * net.dp + d] + net.pos_emb[k * net.dp + d];

  for (int layer = 0; layer < net.n_layers; ++layer) {
    __syncthreads();  // every warp is done with the previous layer's weights
    {
      const float4* src =
          reinterpret_cast<const float4*>(net.layers) + static_cast<i64>(layer) * (Lay::size / 4);
      for (int i = threadIdx.x; i < Lay::size / 4; i += kThreads) smem4[i] = __ldg(src + i);
    }
    __syncthreads();
    const i64 cache_layer = static_cast<i64>(layer) * 2 * ngr;

    float x[D];
    layer_norm<D>(h, sw + Lay::ln1w, sw + Lay::ln1b, x);
    float y[D];
#pragma unroll
    for (int d = 0; d < D; ++d) y[d] = 0.0f;
#pragma unroll 1
    for (int hh = 0; hh < NH; ++hh) {
      const int c0 = hh * HD;
      float q[HD], kk[HD], v[HD];
#pragma unroll
      for (int j = 0; j < HD; ++j) q[j] = kk[j] = v[j] = 0.0f;
      gemv_add<D, HD>(x, sw + Lay::wq + c0, D, q);
      gemv_add<D, HD>(x, sw + Lay::wk + c0, D, kk);
      gemv_add<D, HD>(x, sw + Lay::wv + c0, D, v);
#pragma unroll
      for (int j = 0; j < HD; ++j) {
        q[j] = (q[j] + sw[Lay::bq + c0 + j]) * net.scale;
        kk[j] += sw[Lay::bk + c0 + j];
        v[j] += sw[Lay::bv + c0 + j];
      }
      const int grp = c0 / 16, off = c0 % 16;
      if (skv && row_ok) {
        float* kd = skv + ((cache_layer + grp) * st.lps + k) * 16 + off;
        float* vd = skv + ((cache_layer + ngr + grp) * st.lps + k) * 16 + off;
#pragma unroll
        for (int j = 0; j < HD; ++j) {
          kd[j] = kk[j];
          vd[j] = v[j];
        }
      }
      const float* pk = pkv ? pkv + ((cache_layer + grp) * st.lpc) * 16 + off : nullptr;
      const float* pv = pkv ? pkv + ((cache_layer + ngr + grp) * st.lpc) * 16 + off : nullptr;

      // pass 1: the largest score over the prefix's keys and positions k0..k
      float m = -INFINITY;
      for (int j = 0; j < st.k0; ++j) {
        float kj[HD];
        load_row<HD>(pk + j * 16, kj);
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < HD; ++t) s = fmaf(q[t], kj[t], s);
        m = fmaxf(m, s);
      }
      for (int j = 0; j < sp; ++j) {
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < HD; ++t) s = fmaf(q[t], __shfl_sync(kFull, kk[t], base + j), s);
        if (j <= r) m = fmaxf(m, s);
      }
      // pass 2: exp(s - m), their sum and the weighted values
      float den = 0.0f, o[HD];
#pragma unroll
      for (int t = 0; t < HD; ++t) o[t] = 0.0f;
      for (int j = 0; j < st.k0; ++j) {
        float kj[HD], vj[HD];
        load_row<HD>(pk + j * 16, kj);
        load_row<HD>(pv + j * 16, vj);
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < HD; ++t) s = fmaf(q[t], kj[t], s);
        const float p = expf(s - m);
        den += p;
#pragma unroll
        for (int t = 0; t < HD; ++t) o[t] = fmaf(p, vj[t], o[t]);
      }
      for (int j = 0; j < sp; ++j) {
        float s = 0.0f;
#pragma unroll
        for (int t = 0; t < HD; ++t) s = fmaf(q[t], __shfl_sync(kFull, kk[t], base + j), s);
        float vj[HD];
#pragma unroll
        for (int t = 0; t < HD; ++t) vj[t] = __shfl_sync(kFull, v[t], base + j);
        if (j <= r) {
          const float p = expf(s - m);
          den += p;
#pragma unroll
          for (int t = 0; t < HD; ++t) o[t] = fmaf(p, vj[t], o[t]);
        }
      }
      const float inv = __fdiv_rn(1.0f, den);
#pragma unroll
      for (int t = 0; t < HD; ++t) o[t] *= inv;
      // this head's columns of the output projection
      gemv_add<HD, D>(o, sw + Lay::wo + c0 * D, D, y);
    }
#pragma unroll
    for (int d = 0; d < D; ++d) h[d] += y[d] + sw[Lay::bo + d];

    layer_norm<D>(h, sw + Lay::ln2w, sw + Lay::ln2b, x);
#pragma unroll
    for (int d = 0; d < D; ++d) y[d] = 0.0f;
#pragma unroll 1
    for (int f0 = 0; f0 < F; f0 += 8) {
      float a[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) a[j] = 0.0f;
      gemv_add<D, 8>(x, sw + Lay::w1 + f0, F, a);
#pragma unroll
      for (int j = 0; j < 8; ++j) a[j] = gelu(a[j] + sw[Lay::b1 + f0 + j]);
      gemv_add<8, D>(a, sw + Lay::w2 + f0 * D, D, y);
    }
#pragma unroll
    for (int d = 0; d < D; ++d) h[d] += y[d] + sw[Lay::b2 + d];
  }

  // the last LayerNorm, the head and the masked log-softmax, in float64
  double mean = 0.0;
#pragma unroll
  for (int d = 0; d < D; ++d) mean += static_cast<double>(h[d]);
  mean /= D;
  double var = 0.0;
#pragma unroll
  for (int d = 0; d < D; ++d) {
    const double c = static_cast<double>(h[d]) - mean;
    var += c * c;
  }
  var /= D;
  const double rstd = 1.0 / sqrt(var + 1e-5);
  double logit[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll
  for (int d = 0; d < D; ++d) {
    const double c = static_cast<double>(h[d]) - mean;
    const float xf = static_cast<float>(c * rstd * static_cast<double>(net.lnfw[d]) +
                                        static_cast<double>(net.lnfb[d]));
#pragma unroll
    for (int t = 0; t < 4; ++t)
      logit[t] += static_cast<double>(xf) * static_cast<double>(net.wh[d * 16 + t]);
  }
  const int rem = net.norb - 1 - k;
  bool allowed[4];
  int n_allowed = 0;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int ua = used_a + (t & 1), ub = used_b + (t >> 1);
    allowed[t] = ua <= net.na && net.na - ua <= rem && ub <= net.nb && net.nb - ub <= rem;
    n_allowed += allowed[t];
  }
  double lg[4], mx = -1.0e30;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const float lf = static_cast<float>(logit[t]) + net.bias16[k * 16 + t];
    lg[t] = (allowed[t] || n_allowed == 0) ? static_cast<double>(lf) : -1.0e30;
    mx = fmax(mx, lg[t]);
  }
  double sum = 0.0;
#pragma unroll
  for (int t = 0; t < 4; ++t)
    if (allowed[t] || n_allowed == 0) sum += exp(lg[t] - mx);
  double picked = lg[0];
  bool ok = allowed[0];
#pragma unroll
  for (int t = 1; t < 4; ++t)
    if (target == t) {
      picked = lg[t];
      ok = allowed[t];
    }
  double lp = row_ok ? (picked - mx) - log(sum) : 0.0;
  int bad = row_ok && !ok;
  // the sum over the configuration's lanes (a tree in a fixed order: lane r adds lane r + o)
  for (int o = 16; o > 0; o >>= 1) {
    const double lo = __shfl_down_sync(kFull, lp, o);
    const int bo = __shfl_down_sync(kFull, bad, o);
    if (lane_ok && r + o < sp) {
      lp += lo;
      bad += bo;
    }
  }
  if (r == 0 && row_ok) {
    double amp = bad ? -INFINITY : 0.5 * lp;
    if (st.parent) amp += st.pamp[st.parent[cfg]];
    if (st.out64)
      st.out64[cfg] = amp;
    else
      st.out32[cfg] = static_cast<float>(amp);
  }
}

template <int D, int HD>
void launch(const AmplitudeNet& net, const AmplitudeStage& st, cudaStream_t stream) {
  const size_t smem = sizeof(float) * LayerLayout<D>::size;
  // set on every call: the attribute belongs to the current device's function
  CSK_CUDA_CHECK(cudaFuncSetAttribute(amplitude_kernel<D, HD>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  const i64 per_block = (kThreads / 32) * (32 / (st.k1 - st.k0));
  const i64 blocks = (st.n + per_block - 1) / per_block;
  amplitude_kernel<D, HD><<<static_cast<unsigned>(blocks), kThreads, smem, stream>>>(net, st);
  CSK_CUDA_LAUNCHED();
}

}  // namespace

int amplitude_layer_floats(int d_model) {
  switch (d_model) {
    case 16:
      return LayerLayout<16>::size;
    case 32:
      return LayerLayout<32>::size;
    case 48:
      return LayerLayout<48>::size;
    case 64:
      return LayerLayout<64>::size;
    default:
      return 0;
  }
}

void amplitude_stage(const AmplitudeNet& net, const AmplitudeStage& st, void* stream) {
  if (st.n <= 0) return;
  const int sp = st.k1 - st.k0;
  if (sp < 1 || sp > 32 || st.k1 > net.norb || st.k0 < 0)
    throw std::invalid_argument("amplitude_stage: a stage runs 1 to 32 positions within norb");
  if (net.head_dim != 8) throw std::invalid_argument("amplitude_stage: head width must be 8");
  const cudaStream_t s = as_stream(stream);
  switch (net.d_model) {
    case 16:
      return launch<16, 8>(net, st, s);
    case 32:
      return launch<32, 8>(net, st, s);
    case 48:
      return launch<48, 8>(net, st, s);
    case 64:
      return launch<64, 8>(net, st, s);
    default:
      throw std::invalid_argument("amplitude_stage: d_model must be 16, 32, 48 or 64");
  }
}

}  // namespace csk::gpu
