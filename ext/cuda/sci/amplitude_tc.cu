// ln|psi| of the autoregressive transformer (cuscikit.nnqs.Ansatz) with its products on the
// tensor cores: the same function as amplitude.cu, another layout.
//
// A warp takes one configuration as a 16-row tile (row r = position k0 + r of a stage of at most
// 16 positions; rows past the stage repeat its last position and are never attended by a real
// row). Every (rows x 8 columns) block of activations lives in the layout of an mma
// accumulator: lane 4 g + t holds rows g and g + 8, columns 2t and 2t + 1. That layout is also
// an mma input once the reduction index is read in the order (2t, 2t + 1) of each 8-wide step
// instead of (t, t + 4): the weights are staged in shared memory in exactly that order (the
// pair W[8kt + 2t][8nt + g], W[8kt + 2t + 1][8nt + g] per lane of fragment (kt, nt)), so the
// LayerNorm outputs feed the query, key, value and first MLP products, the attention weights
// feed the product with the values and the GELU outputs feed the second MLP product, each
// without moving between lanes. The host lays the weights out in that order, already in the
// products' format (`AmplitudeNet::layers_tc`), so a block stages them with 16-byte copies.
// A head is 8 columns, one tile: its scores are Q K^T with the keys' accumulator layout as the
// B operand as it is; only the values are transposed for P V (8 shuffles per tile and head).
// Row sums (LayerNorm, softmax) reduce over the 4 lanes of a row (two xor shuffles, the same
// result in every lane).
//
// The residual stream stays in registers (24 floats a lane at d_model 48, 128 registers a
// thread); a block of 16 warps holds one layer's weights in shared memory (218 KiB at d_model
// 48: 8 bytes a weight), one block per SM.
//
// Products (template P):
// - F64: float32 operands, exact in float64, multiplied and summed on the float64 tensor cores
//   (mma m8n8k4, rounded to nearest); a query, key, value or first MLP product is rounded once
//   to float32, the output projection and the second MLP product once per head or per 8 hidden
//   columns, added onto the residual in float32 (the module's float32 products round every
//   partial sum): unbiased, the most accurate.
// - Tf32x3: each operand split into two TF32 values rounded to nearest (hi, lo; the weights on
//   the host), the three products lo*hi + hi*lo + hi*hi of each 8-wide step on the TF32 tensor
//   cores from a zero accumulator, the steps added in float32 rounded to nearest (the tensor
//   cores' own float32 accumulation truncates, a bias; docs/performance.md#fused-trained).
// The rest is the float32 kernel's arithmetic: LayerNorms with correctly rounded division and
// square root, softmax with the largest score subtracted, the last LayerNorm, the head and the
// masked log-softmax in float64.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "amplitude.cuh"

namespace csk::gpu {

namespace {

constexpr int kWarps = 16;  // warps per block, one configuration each

__device__ __forceinline__ void dmma(double& d0, double& d1, double a, double b) {
  asm("mma.sync.aligned.m8n8k4.row.col.f64.f64.f64.f64 {%0, %1}, {%2}, {%3}, {%0, %1};"
      : "+d"(d0), "+d"(d1)
      : "d"(a), "d"(b));
}

__device__ __forceinline__ void mma_tf32(float (&d)[4], const std::uint32_t (&a)[4],
                                         std::uint32_t b0, std::uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Integer rounding of a float32 to TF32 (10 explicit mantissa bits), to nearest with ties away
// from zero, as cvt.rna.tf32.f32 but without its check for inf and NaN (activations are finite).
__device__ __forceinline__ std::uint32_t tf32_bits(float x) {
  return (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
}

// An A operand is given as the accumulator layout x[4] = (g, 2t), (g, 2t + 1), (g + 8, 2t),
// (g + 8, 2t + 1); a B operand as the lane's 16 bytes of a staged matrix fragment (the pair
// W[2t][g], W[2t + 1][g] in the policy's format); an accumulator holds (g, 2t), (g, 2t + 1),
// (g + 8, 2t), (g + 8, 2t + 1) of the 16 x 8 result.
struct F64 {
  struct A;
  struct B;
  struct Acc;
  struct A {
    double v[4];
  };
  struct B {
    double v[2];
  };
  struct Acc {
    double v[4] = {0.0, 0.0, 0.0, 0.0};
  };
  static __device__ __forceinline__ A a(const float (&x)[4]) { return {{x[0], x[1], x[2], x[3]}}; }
  static __device__ __forceinline__ B b(float4 w) {  // the pair as two float64
    return {{__hiloint2double(__float_as_int(w.y), __float_as_int(w.x)),
             __hiloint2double(__float_as_int(w.w), __float_as_int(w.z))}};
  }
  static __device__ __forceinline__ B b_value(float w0, float w1) { return {{w0, w1}}; }
  // rows g (and g + 8): (column 2t at reduction index t) then (2t + 1 at t): m8n8k4 twice
  static __device__ __forceinline__ void mma(Acc& c, const A& a, const B& b) {
    dmma(c.v[0], c.v[1], a.v[0], b.v[0]);
    dmma(c.v[2], c.v[3], a.v[2], b.v[0]);
    dmma(c.v[0], c.v[1], a.v[1], b.v[1]);
    dmma(c.v[2], c.v[3], a.v[3], b.v[1]);
  }
  // c[i] = a[i] b[i], each from zero
  template <int N>
  static __device__ __forceinline__ void products(Acc (&c)[N], const A* const (&a)[N],
                                                  const B (&b)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      c[i] = Acc{};
      mma(c[i], *a[i], b[i]);
    }
  }
  static __device__ __forceinline__ float get(const Acc& c, int i) {
    return static_cast<float>(c.v[i]);
  }
  // element i of c[0] + ... + c[N - 1], summed in float64 and rounded once
  template <int N>
  static __device__ __forceinline__ float total(const Acc (&c)[N], int i) {
    double s = c[0].v[i];
#pragma unroll
    for (int k = 1; k < N; ++k) s += c[k].v[i];
    return static_cast<float>(s);
  }
};

struct Tf32x3 {
  struct A {
    std::uint32_t hi[4], lo[4];  // in mma order: (g, t), (g + 8, t), (g, t + 4), (g + 8, t + 4)
  };
  struct B {
    std::uint32_t hi[2], lo[2];
  };
  struct Acc {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  };
  static __device__ __forceinline__ void split(float x, std::uint32_t& hi, std::uint32_t& lo) {
    hi = tf32_bits(x);
    lo = tf32_bits(x - __uint_as_float(hi));  // the difference is exact
  }
  static __device__ __forceinline__ A a(const float (&x)[4]) {
    A r;
    split(x[0], r.hi[0], r.lo[0]);
    split(x[2], r.hi[1], r.lo[1]);
    split(x[1], r.hi[2], r.lo[2]);
    split(x[3], r.hi[3], r.lo[3]);
    return r;
  }
  static __device__ __forceinline__ B b(float4 w) {  // staged split: hi of both, lo of both
    return {{__float_as_uint(w.x), __float_as_uint(w.y)},
            {__float_as_uint(w.z), __float_as_uint(w.w)}};
  }
  static __device__ __forceinline__ B b_value(float w0, float w1) {
    B r;
    split(w0, r.hi[0], r.lo[0]);
    split(w1, r.hi[1], r.lo[1]);
    return r;
  }
  static __device__ __forceinline__ void mma(Acc& c, const A& a, const B& b) {
    float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    mma_tf32(d, a.lo, b.hi[0], b.hi[1]);
    mma_tf32(d, a.hi, b.lo[0], b.lo[1]);
    mma_tf32(d, a.hi, b.hi[0], b.hi[1]);
#pragma unroll
    for (int i = 0; i < 4; ++i) c.v[i] += d[i];  // rounded to nearest, outside the tensor cores
  }
  // c[i] = a[i] b[i], each from zero, the three passes over all N interleaved (independent
  // chains for the tensor cores' latency)
  template <int N>
  static __device__ __forceinline__ void products(Acc (&c)[N], const A* const (&a)[N],
                                                  const B (&b)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      c[i] = Acc{};
      mma_tf32(c[i].v, a[i]->lo, b[i].hi[0], b[i].hi[1]);
    }
#pragma unroll
    for (int i = 0; i < N; ++i) mma_tf32(c[i].v, a[i]->hi, b[i].lo[0], b[i].lo[1]);
#pragma unroll
    for (int i = 0; i < N; ++i) mma_tf32(c[i].v, a[i]->hi, b[i].hi[0], b[i].hi[1]);
  }
  static __device__ __forceinline__ float get(const Acc& c, int i) { return c.v[i]; }
  // element i of c[0] + ... + c[N - 1], summed in order in float32
  template <int N>
  static __device__ __forceinline__ float total(const Acc (&c)[N], int i) {
    float s = c[0].v[i];
#pragma unroll
    for (int k = 1; k < N; ++k) s += c[k].v[i];
    return s;
  }
};

// The staged layer block (`AmplitudeNet::layers_tc`): the matrices first, 8 bytes per weight
// in fragment order (matrix at float offset `off` of the row-major block: its fragment (kt, nt)
// for lane l at float4 index off / 2 + (kt N / 8 + nt) 32 + l), then the vectors as they are,
// shifted by the matrices' extra Lay::bq floats.
template <int D>
struct TcLayout {
  static constexpr int floats = LayerLayout<D>::size + LayerLayout<D>::bq;
  static constexpr int vectors = LayerLayout<D>::bq;  // add to a vector's offset in LayerLayout
};

// The lane's B fragment (kt, nt) of the matrix at float offset off (nn 8-column tiles).
__device__ __forceinline__ float4 frag(const float4* sw, int off, int nn, int kt, int nt,
                                       int lane) {
  return sw[off / 2 + (kt * nn + nt) * 32 + lane];
}

// Sum over the NT 8-wide steps of x times the B fragments (kt, col) of the matrix at off (nn
// column tiles): each step's product on the tensor cores, the steps added in order (`total`).
template <int NT, class P>
__device__ __forceinline__ void dot_steps(const typename P::A (&x)[NT], const float4* sm, int off,
                                          int nn, int col, int lane, float (&out)[4]) {
  typename P::B b[NT];
  const typename P::A* a[NT];
#pragma unroll
  for (int kt = 0; kt < NT; ++kt) {
    b[kt] = P::b(frag(sm, off, nn, kt, col, lane));
    a[kt] = &x[kt];
  }
  typename P::Acc c[NT];
  P::template products<NT>(c, a, b);
#pragma unroll
  for (int e = 0; e < 4; ++e) out[e] = P::template total<NT>(c, e);
}

// h[nt] += a times the B fragments (row, nt) of the matrix at off, for every column tile nt.
template <int NT, class P>
__device__ __forceinline__ void add_row_products(const typename P::A& a, const float4* sm, int off,
                                                 int row, int lane, float (&h)[NT][4]) {
  typename P::B b[NT];
  const typename P::A* as[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    b[nt] = P::b(frag(sm, off, NT, row, nt, lane));
    as[nt] = &a;
  }
  typename P::Acc c[NT];
  P::template products<NT>(c, as, b);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) h[nt][e] += P::get(c[nt], e);
}

template <int D>
__device__ __forceinline__ void stage_layer(const float4* __restrict__ src, float4* dst) {
  for (int e = threadIdx.x; e < TcLayout<D>::floats / 4; e += blockDim.x) dst[e] = __ldg(src + e);
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(kFull, x, 1);
  return x + __shfl_xor_sync(kFull, x, 2);
}

__device__ __forceinline__ double quad_sum(double x) {
  x += __shfl_xor_sync(kFull, x, 1);
  return x + __shfl_xor_sync(kFull, x, 2);
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(kFull, x, 1));
  return fmaxf(x, __shfl_xor_sync(kFull, x, 2));
}

// LayerNorm of the tile's rows (h in the accumulator layout, NT column tiles) into A operands.
template <int D, class P>
__device__ __forceinline__ void layer_norm(const float (&h)[D / 8][4], const float* w,
                                           const float* b, int t, typename P::A (&x)[D / 8]) {
  constexpr int NT = D / 8;
  float mean[2], rstd[2];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float s = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) s += h[nt][2 * half] + h[nt][2 * half + 1];
    mean[half] = __fdiv_rn(quad_sum(s), static_cast<float>(D));
    float v = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float d = h[nt][2 * half + c] - mean[half];
        v = fmaf(d, d, v);
      }
    const float var = __fdiv_rn(quad_sum(v), static_cast<float>(D));
    rstd[half] = __fdiv_rn(1.0f, __fsqrt_rn(var + 1e-5f));
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    float xv[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int col = 8 * nt + 2 * t + (e & 1);
      xv[e] = fmaf((h[nt][e] - mean[e >> 1]) * rstd[e >> 1], w[col], b[col]);
    }
    x[nt] = P::a(xv);
  }
}

// The lane's attention pattern, the same for every head and layer: bit 4 tile + e is set where
// element e of score tile `tile` is a key its row sees (prefix tiles 0-3: the k0 cached positions;
// stage tiles 4-5: the stage's positions up to the row's own).
__device__ __forceinline__ unsigned key_mask(int k0, int sp, int g, int t) {
  const int npk = (k0 + 7) >> 3, nsk = sp > 8 ? 2 : 1;
  unsigned m = 0;
  for (int tile = 0; tile < 6; ++tile)
    for (int e = 0; e < 4; ++e) {
      const int key = 8 * (tile & 3) + 2 * t + (e & 1);
      const bool ok = tile < 4 ? tile < npk && key < k0 : tile - 4 < nsk && key <= g + 8 * (e >> 1);
      m |= static_cast<unsigned>(ok) << (4 * tile + e);
    }
  return m;
}

// One head of one tile: softmax(q k^T) v over the prefix's cached keys (k0 of them, from pk /
// pv, 16 floats apart) and the stage's keys up to the row's own position (k, v: this tile's
// accumulators of the head's 8 columns). `keys`: bit 4 tile + e says whether element e of score
// tile `tile` (prefix tiles 0-3, stage tiles 4-5) is a key of its row (`key_mask`). The result in
// the accumulator layout.
template <class P>
__device__ __forceinline__ void attend(const float (&q)[4], const float (&k)[4],
                                       const float (&v)[4], const float* pk, const float* pv,
                                       int k0, int sp, int g, int t, unsigned keys, float (&o)[4]) {
  const typename P::A qa = P::a(q);
  const int npk = (k0 + 7) >> 3;   // prefix key tiles (k0 <= 32)
  const int nsk = sp > 8 ? 2 : 1;  // stage key tiles
  float s[6][4];                   // scores: prefix tiles 0-3, stage tiles 4-5
  auto valid = [&](int tile, int e) { return (keys >> (4 * tile + e)) & 1u; };
#pragma unroll
  for (int jt = 0; jt < 4; ++jt) {
    if (jt < npk) {
      const int key = 8 * jt + g;
      const float2 kv = key < k0 ? *reinterpret_cast<const float2*>(pk + key * 16 + 2 * t)
                                 : make_float2(0.0f, 0.0f);
      typename P::Acc c[1];
      const typename P::B b[1] = {P::b_value(kv.x, kv.y)};
      const typename P::A* a[1] = {&qa};
      P::template products<1>(c, a, b);
#pragma unroll
      for (int e = 0; e < 4; ++e) s[jt][e] = P::get(c[0], e);
    }
  }
#pragma unroll
  for (int jt = 0; jt < 2; ++jt) {
    if (jt < nsk) {
      typename P::Acc c[1];
      const typename P::B b[1] = {P::b_value(k[2 * jt], k[2 * jt + 1])};
      const typename P::A* a[1] = {&qa};
      P::template products<1>(c, a, b);
#pragma unroll
      for (int e = 0; e < 4; ++e) s[4 + jt][e] = P::get(c[0], e);
    }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int tile = 0; tile < 6; ++tile) {
    if (tile < 4 ? tile < npk : tile - 4 < nsk) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[tile][e] = valid(tile, e) ? s[tile][e] : -INFINITY;  // exp gives 0 below
        mx[e >> 1] = fmaxf(mx[e >> 1], s[tile][e]);
      }
    }
  }
  mx[0] = quad_max(mx[0]);
  mx[1] = quad_max(mx[1]);
  float den[2] = {0.0f, 0.0f};
  typename P::Acc acc;
#pragma unroll
  for (int tile = 0; tile < 6; ++tile) {
    const int jt = tile & 3;
    if (tile < 4 ? tile < npk : tile - 4 < nsk) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[tile][e] = expf(s[tile][e] - mx[e >> 1]);
        den[e >> 1] += s[tile][e];
      }
      // the values of keys 8 jt + 2t and 8 jt + 2t + 1 in column g
      float b[2];
      if (tile < 4) {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = 8 * jt + 2 * t + c;
          b[c] = key < k0 ? pv[key * 16 + g] : 0.0f;
        }
      } else {
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int src = 4 * (2 * t + c) + (g >> 1);
          const float even = __shfl_sync(kFull, v[2 * jt], src);
          const float odd = __shfl_sync(kFull, v[2 * jt + 1], src);
          b[c] = (g & 1) ? odd : even;
        }
      }
      P::mma(acc, P::a(s[tile]), P::b_value(b[0], b[1]));
    }
  }
  const float inv[2] = {__fdiv_rn(1.0f, quad_sum(den[0])), __fdiv_rn(1.0f, quad_sum(den[1]))};
#pragma unroll
  for (int e = 0; e < 4; ++e) o[e] = P::get(acc, e) * inv[e >> 1];
}

template <int D, class P>
__global__ void __launch_bounds__(32 * kWarps, 1)
    amplitude_tc_kernel(const AmplitudeNet net, const AmplitudeStage st) {
  using Lay = LayerLayout<D>;
  constexpr int NT = D / 8;  // column tiles, one per head of 8
  constexpr int FT = 4 * D / 8;
  static_assert(D % 16 == 0, "heads of 8 in groups of 16 columns");
  extern __shared__ float4 smem4[];
  const float4* sm = smem4;
  const float* sv = reinterpret_cast<const float*>(smem4) + TcLayout<D>::vectors;  // vectors
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, t = lane & 3;
  const int sp = st.k1 - st.k0;
  const int ngr = (D + 15) / 16;
  const i64 kv_c = static_cast<i64>(net.n_layers) * 2 * ngr * st.lpc * 16;
  const i64 kv_s = static_cast<i64>(net.n_layers) * 2 * ngr * st.lps * 16;
  const i64 raw = static_cast<i64>(blockIdx.x) * kWarps + warp;
  const bool active = raw < st.n;  // warps past the end stage weights with the others
  const i64 cfg = active ? raw : st.n - 1;
  const u64* cw = st.configs + cfg * net.words;
  const unsigned keys = key_mask(st.k0, sp, g, t);

  // the embeddings of rows g and g + 8 (the accumulator layout)
  float h[NT][4];
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int k = st.k0 + min(g + 8 * half, sp - 1);
    const RowInputs in = row_inputs(cw, net.words, k);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = 8 * nt + 2 * t + c;
        h[nt][2 * half + c] = net.tok_emb[in.input * net.dp + col] + net.pos_emb[k * net.dp + col];
      }
  }
  const float* pkv = st.pkv ? st.pkv + static_cast<i64>(st.parent[cfg]) * kv_c : nullptr;
  float* skv = st.store && active ? st.store + cfg * kv_s : nullptr;
  if (skv && pkv) {  // a child's cache starts with its parent's keys and values of 0..k0-1
    const int total = net.n_layers * 2 * ngr * st.k0 * 16;
    for (int i = lane; i < total; i += 32) {
      const int c = i % 16, pos = (i / 16) % st.k0, blk = i / (16 * st.k0);
      skv[(static_cast<i64>(blk) * st.lps + pos) * 16 + c] =
          pkv[(static_cast<i64>(blk) * st.lpc + pos) * 16 + c];
    }
  }

  for (int layer = 0; layer < net.n_layers; ++layer) {
    __syncthreads();  // every warp is done with the previous layer's weights
    stage_layer<D>(reinterpret_cast<const float4*>(net.layers_tc) +
                       static_cast<i64>(layer) * (TcLayout<D>::floats / 4),
                   smem4);
    __syncthreads();
    const i64 cache_layer = static_cast<i64>(layer) * 2 * ngr;

    // attention: every head's output projection is added onto the residual, the LayerNorm's
    // outputs x stay for the next head
    typename P::A x[NT];
    layer_norm<D, P>(h, sv + Lay::ln1w, sv + Lay::ln1b, t, x);
#pragma unroll 1
    for (int hh = 0; hh < NT; ++hh) {
      float q[4], k[4], v[4];
      dot_steps<NT, P>(x, sm, Lay::wq, NT, hh, lane, q);
      dot_steps<NT, P>(x, sm, Lay::wk, NT, hh, lane, k);
      dot_steps<NT, P>(x, sm, Lay::wv, NT, hh, lane, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = 8 * hh + 2 * t + (e & 1);
        q[e] = (q[e] + sv[Lay::bq + col]) * net.scale;
        k[e] += sv[Lay::bk + col];
        v[e] += sv[Lay::bv + col];
      }
      const int grp = hh >> 1, off = (hh & 1) * 8;
      if (skv) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = g + 8 * half;
          if (r < sp) {
            const i64 pos = st.k0 + r;
            *reinterpret_cast<float2*>(skv + ((cache_layer + grp) * st.lps + pos) * 16 + off +
                                       2 * t) = make_float2(k[2 * half], k[2 * half + 1]);
            *reinterpret_cast<float2*>(skv + ((cache_layer + ngr + grp) * st.lps + pos) * 16 + off +
                                       2 * t) = make_float2(v[2 * half], v[2 * half + 1]);
          }
        }
      }
      const float* pk = pkv ? pkv + (cache_layer + grp) * st.lpc * 16 + off : nullptr;
      const float* pv = pkv ? pkv + (cache_layer + ngr + grp) * st.lpc * 16 + off : nullptr;
      float o[4];
      attend<P>(q, k, v, pk, pv, st.k0, sp, g, t, keys, o);
      add_row_products<NT, P>(P::a(o), sm, Lay::wo, hh, lane, h);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) h[nt][e] += sv[Lay::bo + 8 * nt + 2 * t + (e & 1)];

    // MLP, 8 hidden columns at a time, each one's share of the second product onto the residual
    layer_norm<D, P>(h, sv + Lay::ln2w, sv + Lay::ln2b, t, x);
#pragma unroll 1
    for (int f = 0; f < FT; ++f) {
      float a[4];
      dot_steps<NT, P>(x, sm, Lay::w1, FT, f, lane, a);
#pragma unroll
      for (int e = 0; e < 4; ++e) a[e] = gelu(a[e] + sv[Lay::b1 + 8 * f + 2 * t + (e & 1)]);
      add_row_products<NT, P>(P::a(a), sm, Lay::w2, f, lane, h);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) h[nt][e] += sv[Lay::b2 + 8 * nt + 2 * t + (e & 1)];
  }
  if (!active) return;

  // the last LayerNorm, the head and the masked log-softmax of each row in float64, summed over
  // the rows (lanes of one t hold rows g and g + 8: a butterfly over g)
  double lp = 0.0;
  int bad = 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = g + 8 * half;
    const int k = st.k0 + min(r, sp - 1);
    const RowInputs in = row_inputs(cw, net.words, k);
    double s = 0.0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
      s += static_cast<double>(h[nt][2 * half]) + static_cast<double>(h[nt][2 * half + 1]);
    const double mean = quad_sum(s) / D;
    double v = 0.0;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const double d = static_cast<double>(h[nt][2 * half + c]) - mean;
        v += d * d;
      }
    const double rstd = 1.0 / sqrt(quad_sum(v) / D + 1e-5);
    double logit[4] = {0.0, 0.0, 0.0, 0.0};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int col = 8 * nt + 2 * t + c;
        const double d = static_cast<double>(h[nt][2 * half + c]) - mean;
        const float xf = static_cast<float>(d * rstd * static_cast<double>(net.lnfw[col]) +
                                            static_cast<double>(net.lnfb[col]));
#pragma unroll
        for (int tk = 0; tk < 4; ++tk)
          logit[tk] += static_cast<double>(xf) * static_cast<double>(net.wh[col * 16 + tk]);
      }
#pragma unroll
    for (int tk = 0; tk < 4; ++tk) logit[tk] = quad_sum(logit[tk]);
    int b = 0;
    const double l = masked_log_prob(logit, net, k, in, b);
    if (r < sp) {
      lp += l;
      bad += b;
    }
  }
#pragma unroll
  for (int o = 4; o < 32; o <<= 1) {
    lp += __shfl_xor_sync(kFull, lp, o);
    bad += __shfl_xor_sync(kFull, bad, o);
  }
  if (lane == 0) store_amplitude(st, cfg, lp, bad);
}

template <int D, class P>
void launch_tc(const AmplitudeNet& net, const AmplitudeStage& st, cudaStream_t stream) {
  if (net.layers_tc == nullptr)
    throw std::invalid_argument("amplitude_stage: tensor-core products need layers_tc");
  constexpr int T = 32 * kWarps;
  const size_t smem = sizeof(float) * TcLayout<D>::floats;
  CSK_CUDA_CHECK(cudaFuncSetAttribute(amplitude_tc_kernel<D, P>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem)));
  const i64 blocks = (st.n + kWarps - 1) / kWarps;
  amplitude_tc_kernel<D, P><<<static_cast<unsigned>(blocks), T, smem, stream>>>(net, st);
  CSK_CUDA_LAUNCHED();
}

template <class P>
void launch_width(const AmplitudeNet& net, const AmplitudeStage& st, cudaStream_t stream) {
  switch (net.d_model) {
    case 16:
      return launch_tc<16, P>(net, st, stream);
    case 32:
      return launch_tc<32, P>(net, st, stream);
    case 48:
      return launch_tc<48, P>(net, st, stream);
    default:
      throw std::invalid_argument(
          "amplitude_stage: tensor-core products need d_model 16, 32 or 48");
  }
}

}  // namespace

bool amplitude_tc_supported(int d_model, int k0, int k1) {
  return (d_model == 16 || d_model == 32 || d_model == 48) && k1 - k0 <= 16 && k0 <= 32;
}

void amplitude_stage_tc(const AmplitudeNet& net, const AmplitudeStage& st, cudaStream_t stream) {
  if (st.products == 1) return launch_width<F64>(net, st, stream);
  if (st.products == 2) return launch_width<Tf32x3>(net, st, stream);
  throw std::invalid_argument("amplitude_stage: products must be 0, 1 (fp64) or 2 (tf32x3)");
}

}  // namespace csk::gpu
