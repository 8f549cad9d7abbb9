// ln|psi| of the autoregressive transformer (cuscikit.nnqs.Ansatz) for many configurations:
// every thread holds R (configuration, position) rows, plain float32 FMAs.
//
// The network is tiny (d_model 16-64, a few layers, <= 32 positions per stage) and the
// configurations are many, so a thread keeps its rows' residual activations in registers
// through every layer, the block stages one layer's weights at a time in shared memory (each
// weight is then read by all threads of a warp at once, a broadcast, and used for all R rows
// of a thread), and the rows of one configuration sit in consecutive lanes of a warp (32 /
// (k1 - k0) configurations per warp and row), where attention takes the other positions' keys
// and values by warp shuffles. Row i of a thread belongs to the i-th group of configurations
// of its warp, at the same position, so the shuffles serve all R rows alike. With R = 1 the
// LayerNorm outputs are registers too; with R > 1 they are the thread's own columns of shared
// memory, which leaves the registers to the residual stream. Nothing but one number per
// configuration (and, for a prefix stage, the keys and values its children attend to) leaves
// the chip.
//
// Why R = 2: a warp-wide broadcast of a weight from shared memory delivers about two floats
// per cycle and SM, so with one row per thread (one FMA per weight) the products stall on
// shared memory at half the float32 peak; two rows per weight halve that traffic.
//
// The arithmetic is the module's in float32, rounded to nearest: products summed in input
// order with fused multiply-adds, LayerNorm with correctly rounded square root and division,
// softmax over the keys in two passes (largest score first). The sublayers' products are
// added straight onto the residual stream (the module adds the finished product; the two
// differ by float32 roundings of the residual). The last LayerNorm, the head's sums, the
// masked log-softmax and the sum over positions run in float64: at tiny amplitudes each
// position's log-probability is large and float32 roundings of a row scale or of a running
// sum would add errors of that size times |log p|.
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
#include <type_traits>

#include "amplitude.cuh"

namespace csk::gpu {

namespace {

// A thread's R input rows of K values, read four at a time: in registers ...
template <int R, int K>
struct RegRows {
  static constexpr bool shared = false;
  float v[R][K];
  __device__ __forceinline__ float4 get(int i, int k4) const {
    return make_float4(v[i][4 * k4], v[i][4 * k4 + 1], v[i][4 * k4 + 2], v[i][4 * k4 + 3]);
  }
  __device__ __forceinline__ void put(int i, int k4, float4 x) {
    v[i][4 * k4] = x.x;
    v[i][4 * k4 + 1] = x.y;
    v[i][4 * k4 + 2] = x.z;
    v[i][4 * k4 + 3] = x.w;
  }
};

// ... or in the thread's own column of a (R, K / 4, T) float4 array in shared memory
// (consecutive threads at consecutive addresses: no bank conflicts).
template <int R, int K, int T>
struct SharedRows {
  static constexpr bool shared = true;
  float4* col;  // the array's first element of this thread
  __device__ __forceinline__ float4 get(int i, int k4) const { return col[(i * (K / 4) + k4) * T]; }
  __device__ __forceinline__ void put(int i, int k4, float4 x) { col[(i * (K / 4) + k4) * T] = x; }
};

__device__ __forceinline__ float part(const float4& v, int c) {
  return c == 0 ? v.x : c == 1 ? v.y : c == 2 ? v.z : v.w;
}

// y[b * R + i][N] += x_i[K] @ W_b for the NB matrices W_b = w + b * bstride (K x N, row-major
// with leading dimension ld, in shared memory; N a multiple of 4) and the R rows x_i: every
// weight is read once (a warp-wide broadcast) and used for all R rows, products in input order.
template <int K, int N, int R, int NB, class X>
__device__ __forceinline__ void gemv_add(const X& x, const float* w, int ld, int bstride,
                                         float (&y)[NB * R][N]) {
  // registers need constant indices (the whole loop unrolled); rows in shared memory do not,
  // and a shorter loop keeps the kernel's code small (instruction cache)
  constexpr int unroll = X::shared ? 2 : K / 4;
#pragma unroll(unroll)
  for (int k4 = 0; k4 < K / 4; ++k4) {
    float4 xv[R];
#pragma unroll
    for (int i = 0; i < R; ++i) xv[i] = x.get(i, k4);
#pragma unroll
    for (int c = 0; c < 4; ++c) {
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float4* row = reinterpret_cast<const float4*>(w + b * bstride + (4 * k4 + c) * ld);
#pragma unroll
        for (int n = 0; n < N / 4; ++n) {
          const float4 v = row[n];
#pragma unroll
          for (int i = 0; i < R; ++i) {
            const float xk = part(xv[i], c);
            y[b * R + i][4 * n] = fmaf(xk, v.x, y[b * R + i][4 * n]);
            y[b * R + i][4 * n + 1] = fmaf(xk, v.y, y[b * R + i][4 * n + 1]);
            y[b * R + i][4 * n + 2] = fmaf(xk, v.z, y[b * R + i][4 * n + 2]);
            y[b * R + i][4 * n + 3] = fmaf(xk, v.w, y[b * R + i][4 * n + 3]);
          }
        }
      }
    }
  }
}

// LayerNorm of each of the R rows h[i] into x (row i).
template <int R, int D, class X>
__device__ __forceinline__ void layer_norm(const float (&h)[R][D], const float* w, const float* b,
                                           X& x) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float mean = 0.0f;
#pragma unroll
    for (int d = 0; d < D; ++d) mean += h[i][d];
    mean = __fdiv_rn(mean, static_cast<float>(D));
    float var = 0.0f;
#pragma unroll
    for (int d = 0; d < D; ++d) {
      const float c = h[i][d] - mean;
      var = fmaf(c, c, var);
    }
    var = __fdiv_rn(var, static_cast<float>(D));
    const float rstd = __fdiv_rn(1.0f, __fsqrt_rn(var + 1e-5f));
#pragma unroll
    for (int d4 = 0; d4 < D / 4; ++d4) {
      float o[4];
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int d = 4 * d4 + c;
        o[c] = fmaf((h[i][d] - mean) * rstd, w[d], b[d]);
      }
      x.put(i, d4, make_float4(o[0], o[1], o[2], o[3]));
    }
  }
}

// One head's attention for a thread's R rows: row i's query (qkv[i]) against the prefix's
// cached keys pk[i] / values pv[i] (k0 positions, 16 floats apart) and the stage's positions
// k0..k0+r (lanes base..base+r of the warp hold their keys qkv[R + i] and values
// qkv[2R + i]). One pass over the keys with a running maximum (softmax rescaled whenever the
// maximum grows); the R rows advance together so that their shuffles and loads overlap.
// Called by every lane of the warp (shuffles).
template <int HD, int R>
__device__ __forceinline__ void attend(const float (&qkv)[3 * R][HD], const float* const (&pk)[R],
                                       const float* const (&pv)[R], int k0, int sp, int base, int r,
                                       float (&o)[R][HD]) {
  float m[R], den[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    m[i] = -INFINITY;
    den[i] = 0.0f;
#pragma unroll
    for (int t = 0; t < HD; ++t) o[i][t] = 0.0f;
  }
  // adds key/value j of score s to row i
  auto add = [&](int i, float s, const float (&vj)[HD]) {
    const float mn = fmaxf(m[i], s);
    const float scale = expf(m[i] - mn);  // 0 for the first key (m = -inf), else <= 1
    const float p = expf(s - mn);
    den[i] = fmaf(den[i], scale, p);
#pragma unroll
    for (int t = 0; t < HD; ++t) o[i][t] = fmaf(p, vj[t], o[i][t] * scale);
    m[i] = mn;
  };
  for (int j = 0; j < k0; ++j) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float kj[HD], vj[HD];
      load_row<HD>(pk[i] + j * 16, kj);
      load_row<HD>(pv[i] + j * 16, vj);
      float s = 0.0f;
#pragma unroll
      for (int t = 0; t < HD; ++t) s = fmaf(qkv[i][t], kj[t], s);
      add(i, s, vj);
    }
  }
  for (int j = 0; j < sp; ++j) {
#pragma unroll
    for (int i = 0; i < R; ++i) {
      float s = 0.0f, vj[HD];
#pragma unroll
      for (int t = 0; t < HD; ++t) {
        s = fmaf(qkv[i][t], __shfl_sync(kFull, qkv[R + i][t], base + j), s);
        vj[t] = __shfl_sync(kFull, qkv[2 * R + i][t], base + j);
      }
      if (j <= r) add(i, s, vj);  // causal: positions up to the row's own
    }
  }
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const float inv = __fdiv_rn(1.0f, den[i]);
#pragma unroll
    for (int t = 0; t < HD; ++t) o[i][t] *= inv;
  }
}

// The last LayerNorm, the head and the masked log-softmax of one row, in float64: the
// log-probability of the row's target token (`bad`: the token leaves the sector).
template <int D>
__device__ __forceinline__ double row_log_prob(const float (&h)[D], const AmplitudeNet& net, int k,
                                               const RowInputs& in, int& bad) {
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
  return masked_log_prob(logit, net, k, in, bad);
}

// Launch shapes: R rows per thread, T threads per block; the LayerNorm outputs sit in shared
// memory when R > 1. Two rows per thread need d_model <= 48 (shared memory).
constexpr int kTwoRowsMaxD = 48;  // the widest d_model whose two rows fit shared memory

template <int R>
struct Shape {
  static constexpr int T = R == 1 ? 128 : 256;
  static constexpr int min_blocks = R == 1 ? 2 : 1;
  static constexpr bool staged = R > 1;
};

template <int D, int HD, int R>
__global__ void __launch_bounds__(Shape<R>::T, Shape<R>::min_blocks)
    amplitude_kernel(const AmplitudeNet net, const AmplitudeStage st) {
  using Lay = LayerLayout<D>;
  constexpr int T = Shape<R>::T;
  constexpr int F = Lay::F;
  constexpr int NH = D / HD;
  constexpr int C = R == 1 ? 8 : 16;  // MLP columns per chunk (registers)
  static_assert(HD % 4 == 0 && 16 % HD == 0 && D % 16 % HD == 0, "heads must tile the groups");
  static_assert(F % C == 0, "MLP chunks must tile 4 d_model");
  extern __shared__ float4 smem4[];
  const float* sw = reinterpret_cast<const float*>(smem4);

  // a warp holds R groups of 32 / sp configurations side by side, sp consecutive lanes each
  // (the lanes left over repeat the last configuration's last row and write nothing); row i
  // of a thread is in group i
  const int sp = st.k1 - st.k0;
  const int per_warp = 32 / sp;
  const int lane = threadIdx.x & 31;
  const int slot = min(lane / sp, per_warp - 1);
  const int base = slot * sp;  // the configuration's first lane
  const bool lane_ok = lane / sp < per_warp;
  const int r = lane_ok ? lane - base : sp - 1;
  const int k = st.k0 + r;
  const int ngr = (D + 15) / 16;
  const i64 kv_per_prefix_c = static_cast<i64>(net.n_layers) * 2 * ngr * st.lpc * 16;
  const i64 kv_per_prefix_s = static_cast<i64>(net.n_layers) * 2 * ngr * st.lps * 16;

  i64 cfg[R];
  bool cfg_ok[R], row_ok[R];
  RowInputs in[R];
  const float* pkv[R];
  float* skv[R];
  float h[R][D];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    const i64 raw =
        ((static_cast<i64>(blockIdx.x) * (T / 32) + threadIdx.x / 32) * R + i) * per_warp + slot;
    cfg_ok[i] = raw < st.n;
    cfg[i] = cfg_ok[i] ? raw : st.n - 1;  // padding lanes repeat a real configuration
    row_ok[i] = cfg_ok[i] && lane_ok;
    in[i] = row_inputs(st.configs + cfg[i] * net.words, net.words, k);
    const i64 par = st.parent ? static_cast<i64>(st.parent[cfg[i]]) : 0;
    pkv[i] = st.pkv ? st.pkv + par * kv_per_prefix_c : nullptr;
    skv[i] = st.store && cfg_ok[i] ? st.store + cfg[i] * kv_per_prefix_s : nullptr;
    // a child's cache starts with its parent's keys and values of positions 0..k0-1
    if (skv[i] && pkv[i] && lane_ok) {
      const int per_pos = 16;
      const int total = net.n_layers * 2 * ngr * st.k0 * per_pos;
      for (int e = r; e < total; e += sp) {
        const int c = e % per_pos;
        const int pos = (e / per_pos) % st.k0;
        const int blk = e / (per_pos * st.k0);  // (layer, key|value, group)
        skv[i][(static_cast<i64>(blk) * st.lps + pos) * 16 + c] =
            pkv[i][(static_cast<i64>(blk) * st.lpc + pos) * 16 + c];
      }
    }
#pragma unroll
    for (int d = 0; d < D; ++d)
      h[i][d] = net.tok_emb[in[i].input * net.dp + d] + net.pos_emb[k * net.dp + d];
  }

  // the LayerNorm outputs
  using XRows = std::conditional_t<Shape<R>::staged, SharedRows<R, D, T>, RegRows<R, D>>;
  XRows x;
  if constexpr (Shape<R>::staged) x.col = smem4 + Lay::size / 4 + threadIdx.x;

  for (int layer = 0; layer < net.n_layers; ++layer) {
    __syncthreads();  // every warp is done with the previous layer's weights
    {
      const float4* src =
          reinterpret_cast<const float4*>(net.layers) + static_cast<i64>(layer) * (Lay::size / 4);
      for (int e = threadIdx.x; e < Lay::size / 4; e += T) smem4[e] = __ldg(src + e);
    }
    __syncthreads();
    const i64 cache_layer = static_cast<i64>(layer) * 2 * ngr;

    layer_norm<R, D>(h, sw + Lay::ln1w, sw + Lay::ln1b, x);
#pragma unroll 1
    for (int hh = 0; hh < NH; ++hh) {
      const int c0 = hh * HD;
      // rows 0..R-1 the queries, R..2R-1 the keys, 2R..3R-1 the values
      float qkv[3 * R][HD];
#pragma unroll
      for (int i = 0; i < 3 * R; ++i)
#pragma unroll
        for (int j = 0; j < HD; ++j) qkv[i][j] = 0.0f;
      gemv_add<D, HD, R, 3>(x, sw + Lay::wq + c0, D, D * D, qkv);
      const int grp = c0 / 16, off = c0 % 16;
      RegRows<R, HD> o;
      const float* pk[R];
      const float* pv[R];
#pragma unroll
      for (int i = 0; i < R; ++i) {
#pragma unroll
        for (int j = 0; j < HD; ++j) {
          qkv[i][j] = (qkv[i][j] + sw[Lay::bq + c0 + j]) * net.scale;
          qkv[R + i][j] += sw[Lay::bk + c0 + j];
          qkv[2 * R + i][j] += sw[Lay::bv + c0 + j];
        }
        if (skv[i] && row_ok[i]) {
          float* kd = skv[i] + ((cache_layer + grp) * st.lps + k) * 16 + off;
          float* vd = skv[i] + ((cache_layer + ngr + grp) * st.lps + k) * 16 + off;
#pragma unroll
          for (int j = 0; j < HD; ++j) {
            kd[j] = qkv[R + i][j];
            vd[j] = qkv[2 * R + i][j];
          }
        }
        pk[i] = pkv[i] ? pkv[i] + ((cache_layer + grp) * st.lpc) * 16 + off : nullptr;
        pv[i] = pkv[i] ? pkv[i] + ((cache_layer + ngr + grp) * st.lpc) * 16 + off : nullptr;
      }
      attend<HD, R>(qkv, pk, pv, st.k0, sp, base, r, o.v);
      // this head's rows of the output projection, onto the residual
      gemv_add<HD, D, R, 1>(o, sw + Lay::wo + c0 * D, D, 0, h);
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int d = 0; d < D; ++d) h[i][d] += sw[Lay::bo + d];

    layer_norm<R, D>(h, sw + Lay::ln2w, sw + Lay::ln2b, x);
#pragma unroll 1
    for (int f0 = 0; f0 < F; f0 += C) {
      RegRows<R, C> a;
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < C; ++j) a.v[i][j] = 0.0f;
      gemv_add<D, C, R, 1>(x, sw + Lay::w1 + f0, F, 0, a.v);
#pragma unroll
      for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < C; ++j) a.v[i][j] = gelu(a.v[i][j] + sw[Lay::b1 + f0 + j]);
      gemv_add<C, D, R, 1>(a, sw + Lay::w2 + f0 * D, D, 0, h);
    }
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
      for (int d = 0; d < D; ++d) h[i][d] += sw[Lay::b2 + d];
  }

#pragma unroll
  for (int i = 0; i < R; ++i) {
    int bad = 0;
    double lp = row_log_prob<D>(h[i], net, k, in[i], bad);
    if (!row_ok[i]) {
      lp = 0.0;
      bad = 0;
    }
    // the sum over the configuration's lanes (a tree in a fixed order: lane r adds lane r + o)
    for (int o = 16; o > 0; o >>= 1) {
      const double lo = __shfl_down_sync(kFull, lp, o);
      const int bo = __shfl_down_sync(kFull, bad, o);
      if (lane_ok && r + o < sp) {
        lp += lo;
        bad += bo;
      }
    }
    if (r == 0 && row_ok[i]) store_amplitude(st, cfg[i], lp, bad);
  }
}

template <int D, int HD, int R>
void launch(const AmplitudeNet& net, const AmplitudeStage& st, cudaStream_t stream) {
  constexpr int T = Shape<R>::T;
  const size_t smem = sizeof(float) * (LayerLayout<D>::size + (Shape<R>::staged ? R * D * T : 0));
  // set on every call: the attribute belongs to the current device's function
  CSK_CUDA_CHECK(cudaFuncSetAttribute(amplitude_kernel<D, HD, R>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  const i64 per_block = (T / 32) * R * (32 / (st.k1 - st.k0));
  const i64 blocks = (st.n + per_block - 1) / per_block;
  amplitude_kernel<D, HD, R><<<static_cast<unsigned>(blocks), T, smem, stream>>>(net, st);
  CSK_CUDA_LAUNCHED();
}

template <int D>
void launch_rows(const AmplitudeNet& net, const AmplitudeStage& st, cudaStream_t stream) {
  const int rows = st.rows == 0 ? amplitude_default_rows(D) : st.rows;
  if (rows == 1) return launch<D, 8, 1>(net, st, stream);
  if constexpr (D <= kTwoRowsMaxD) {
    if (rows == 2) return launch<D, 8, 2>(net, st, stream);
  }
  throw std::invalid_argument(
      "amplitude_stage: rows per thread must be 0 (the default), 1, or 2 "
      "for d_model <= " +
      std::to_string(kTwoRowsMaxD));
}

}  // namespace

int amplitude_default_rows(int d_model) {
  if (amplitude_layer_floats(d_model) == 0) return 0;
  return d_model <= kTwoRowsMaxD ? 2 : 1;
}

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
  if (st.products < 0 || st.products > 2)
    throw std::invalid_argument(
        "amplitude_stage: products must be 0 (fma), 1 (fp64) or 2 (tf32x3)");
  const cudaStream_t s = as_stream(stream);
  if (st.products != 0 && amplitude_tc_supported(net.d_model, st.k0, st.k1))
    return amplitude_stage_tc(net, st, s);
  switch (net.d_model) {
    case 16:
      return launch_rows<16>(net, st, s);
    case 32:
      return launch_rows<32>(net, st, s);
    case 48:
      return launch_rows<48>(net, st, s);
    case 64:
      return launch_rows<64>(net, st, s);
    default:
      throw std::invalid_argument("amplitude_stage: d_model must be 16, 32, 48 or 64");
  }
}

}  // namespace csk::gpu
