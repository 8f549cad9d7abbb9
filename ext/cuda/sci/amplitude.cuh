// Pieces shared by the amplitude kernels (amplitude.cu: float32 FMAs, one thread per row;
// amplitude_tc.cu: the products on tensor cores, a warp per 16-row tile): the layer block's
// layout, a row's tokens, GELU and the masked log-softmax of the head.
#pragma once
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "api.hpp"
#include "common.cuh"
#include "cuscikit/bits.hpp"

namespace csk::gpu {

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

// The row of position k of a configuration: its input token (the previous orbital's, 4 at the
// start), its target token and the electrons of each spin before position k.
struct RowInputs {
  int input, target, used_a, used_b;
};

__device__ __forceinline__ RowInputs row_inputs(const u64* config, int words, int k) {
  u64 w[2] = {0, 0};
#pragma unroll
  for (int j = 0; j < 2; ++j)
    if (j < words) w[j] = config[j];
  RowInputs in;
  in.target = token(w, k);
  in.input = k == 0 ? 4 : token(w, k - 1);
  in.used_a = in.used_b = 0;
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int below = min(max(k - 32 * j, 0), 32);
    const u64 m = below == 32 ? ~0ull : ((1ull << (2 * below)) - 1);
    in.used_a += popcount64(w[j] & m & 0x5555555555555555ull);  // alpha bits: even
    in.used_b += popcount64(w[j] & m & 0xAAAAAAAAAAAAAAAAull);
  }
  return in;
}

// The masked log-softmax of position k's four logits (the head's sums in float64, before the
// bias), in float64: the log-probability of the row's target token (`bad`: the token leaves the
// sector).
__device__ __forceinline__ double masked_log_prob(const double (&logit)[4], const AmplitudeNet& net,
                                                  int k, const RowInputs& in, int& bad) {
  const int rem = net.norb - 1 - k;
  bool allowed[4];
  int n_allowed = 0;
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const int ua = in.used_a + (t & 1), ub = in.used_b + (t >> 1);
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
    if (in.target == t) {
      picked = lg[t];
      ok = allowed[t];
    }
  bad = !ok;
  return (picked - mx) - log(sum);
}

// A configuration's result: 0.5 times the sum of its rows' log-probabilities (-inf when a
// token left the sector), plus its parent prefix's partial sum, stored in the stage's precision.
__device__ __forceinline__ void store_amplitude(const AmplitudeStage& st, i64 cfg, double lp,
                                                int bad) {
  double amp = bad ? -INFINITY : 0.5 * lp;
  if (st.parent) amp += st.pamp[st.parent[cfg]];
  if (st.out64)
    st.out64[cfg] = amp;
  else
    st.out32[cfg] = static_cast<float>(amp);
}

// The tensor-core kernel (amplitude_tc.cu; AmplitudeStage::products 1 or 2): whether it runs
// this width and stage (d_model 16, 32 or 48, at most 16 positions after at most 32 cached).
bool amplitude_tc_supported(int d_model, int k0, int k1);
void amplitude_stage_tc(const AmplitudeNet& net, const AmplitudeStage& st, cudaStream_t stream);

}  // namespace csk::gpu
