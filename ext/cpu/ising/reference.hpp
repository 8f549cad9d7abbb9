// The C++ reference trajectory of one dSB replica, shared by the array API (bind.cpp) and the
// request service (service.cpp): a plain loop over the spins with the step of cuscikit/dsb.hpp.
// Include it from sources compiled with -ffp-contract=off (CMake does so for ext/cpu/ising).
#pragma once
#include <algorithm>
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "cuscikit/dsb.hpp"

static_assert(FLT_EVAL_METHOD == 0, "float expressions must be evaluated in float");

namespace csk::dsb::ref {

struct Options {
  int n, nwords, replicas, steps;
  float dt, a0, c0;
  std::uint64_t seed;
  std::uint32_t request;
};

// Where one replica's results go. x, y: its n final positions and momenta; best_signs: W words
// of its best spin vector. energy / checksum, when not null, receive pass p's values at
// [p * stride] (p = 0..S); the array API records every pass, the service only the best.
template <typename E>
struct ReplicaOut {
  float* x;
  float* y;
  std::uint32_t* best_signs;
  E* energy = nullptr;
  std::uint64_t* checksum = nullptr;
  std::size_t stride = 1;
};

// One replica's state between passes: x, y (in the caller's arrays), the sign words v and the
// same signs as +-1 bytes sv (0 = padding), the best energy so far. Pass k = 1..S+1 scores the
// current signs s^(k-1) and, for k <= S, makes the step to s^(k); pass S+1 only scores.
template <typename E>
struct Replica {
  const Options& o;
  int b;
  float* x;
  float* y;
  std::vector<std::uint32_t> v, next;
  std::vector<std::int8_t> sv;
  float dta0;
  E best = std::numeric_limits<E>::max();

  Replica(const Options& opt, int replica, float* xs, float* ys)
      : o(opt),
        b(replica),
        x(xs),
        y(ys),
        v(opt.nwords, 0u),
        next(opt.nwords, 0u),
        sv(std::size_t(opt.nwords) * 32, 0),
        dta0(fmul(opt.dt, opt.a0)) {
    for (int i = 0; i < o.n; ++i) {
      init_spin(o.seed, std::uint32_t(i), std::uint32_t(b), o.request, x[i], y[i]);
      if (x[i] >= 0.0f) v[i >> 5] |= 1u << (i & 31);
      sv[i] = x[i] >= 0.0f ? 1 : -1;
    }
  }

  // `field_of(i, v, sv, s_i)` gives a_i (int32 for exact kinds, float for float32 couplings)
  // from the current sign words v or bytes sv; `h_of(i)` the field h_i in the energy's type;
  // E accumulates s_i (a_i + h_i). Records pass k into `out` (see ReplicaOut).
  template <typename Field, typename H>
  void pass(int k, Field field_of, H h_of, const ReplicaOut<E>& out) {
    const int n = o.n, W = o.nwords;
    const bool score_only = k == o.steps + 1;  // the final pass scores s^(S)
    const float p = score_only ? 0.0f : pump(k, o.steps, o.a0);
    E twice = 0;  // sum_i s_i (a_i + h_i) = -2 E
    std::fill(next.begin(), next.end(), 0u);
    for (int i = 0; i < n; ++i) {
      const int s = spin_of(v.data(), i);
      const auto a = field_of(i, v.data(), sv.data(), s);
      twice += s > 0 ? E(a) + E(h_of(i)) : -(E(a) + E(h_of(i)));
      if (!score_only) {
        update(x[i], y[i], static_cast<float>(a), p, o.c0, o.dt, dta0);
        if (x[i] >= 0.0f) next[i >> 5] |= 1u << (i & 31);
      }
    }
    const E energy = -twice / 2;
    const std::size_t at = std::size_t(k - 1) * out.stride;
    if (out.energy != nullptr) out.energy[at] = energy;
    if (out.checksum != nullptr) {
      std::uint64_t sum = 0;
      for (int w = 0; w < W; ++w) sum += checksum_term(std::uint32_t(b), std::uint32_t(W), w, v[w]);
      out.checksum[at] = sum;
    }
    if (energy < best) {
      best = energy;
      std::memcpy(out.best_signs, v.data(), sizeof(std::uint32_t) * W);
    }
    if (!score_only) {
      v.swap(next);
      for (int i = 0; i < n; ++i) sv[i] = x[i] >= 0.0f ? 1 : -1;
    }
  }
};

// One replica's whole trajectory (S + 1 passes); returns its best energy.
template <typename E, typename Field, typename H>
E run_replica(const Options& o, int b, Field field_of, H h_of, const ReplicaOut<E>& out) {
  Replica<E> r(o, b, out.x, out.y);
  for (int k = 1; k <= o.steps + 1; ++k) r.pass(k, field_of, h_of, out);
  return r.best;
}

// a_i for the plane kinds (binary, ternary) from the sign words.
template <int K>
auto plane_field(const Coupling& c) {
  return [c](int i, const std::uint32_t* v, const std::int8_t*, int s) {
    std::int32_t acc = 0;
    for (int w = 0; w < c.nwords; ++w) acc += word_sum_k<K>(c, i, w, v[w]);
    return field(c, i, acc, s);
  };
}

// a_i for int8 couplings: a byte dot product of the row with the +-1 bytes (the same integer as
// word_sum_k<kInt8>).
inline auto int8_field(const Coupling& c) {
  const std::size_t ld = std::size_t(c.nwords) * 32;
  return [c, ld](int i, const std::uint32_t*, const std::int8_t* sv, int s) {
    const std::int8_t* row = c.j8 + std::size_t(i) * ld;
    std::int32_t acc = 0;
    for (std::size_t j = 0; j < ld; ++j) acc += std::int32_t(row[j]) * std::int32_t(sv[j]);
    return field(c, i, acc, s);
  };
}

// Calls f(field_of) with the kind's field function (exact kinds only).
template <typename F>
auto with_exact_field(const Coupling& c, F&& f) {
  if (c.kind == kBinary) return f(plane_field<kBinary>(c));
  if (c.kind == kTernary) return f(plane_field<kTernary>(c));
  return f(int8_field(c));
}

}  // namespace csk::dsb::ref
