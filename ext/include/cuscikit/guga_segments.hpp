// GUGA step vectors and segment values, written once for the CPU extension and the GPU kernels.
//
// A configuration state function (CSF) is a walk through the distinct row table (DRT): at arc k
// (orbital k) it takes a step d in {0, 1, 2, 3}, with occupation 0, 1, 1, 2 and a change of the
// intermediate spin 2S_k = b of 0, +1, -1, 0. The one-body coupling coefficient <m|E_pq|n> is a
// product of segment values over the arcs min(p,q)..max(p,q), after Shavitt's tables ("The
// graphical unitary group approach and its application to direct configuration interaction
// calculations", Lecture Notes in Chemistry 22, 51 (1981), doi:10.1007/978-3-642-93163-5_2) and
// Paldus' ("Group theoretical approach to the configuration interaction and perturbation theory
// calculations for atomic and molecular systems", J. Chem. Phys. 61, 5321 (1974),
// doi:10.1063/1.1681883).
//
// Conventions: "bra"/"ket" steps are d'/d of <m| and |n>; b is the ket's b at the upper vertex of
// the arc; delta = b(ket) - b(bra) at that upper vertex (+1 or -1 inside a loop).
#pragma once
#include "hd.hpp"

#if !defined(__CUDACC_RTC__)
#include <cmath>
#endif

namespace csk {
namespace guga {

// Segment kinds: raising generator E_pq (p < q) starts at p, lowering (p > q) starts at q.
enum SegmentKind : int {
  kRaiseStart = 0,
  kRaiseMiddle = 1,
  kRaiseEnd = 2,
  kLowerStart = 3,
  kLowerMiddle = 4,
  kLowerEnd = 5,
  kNumSegmentKinds = 6
};

// Electrons on an orbital for step d.
CSK_HD int step_occupation(int d) { return (d + 1) >> 1; }

// Change of b = 2S_k along a step d.
CSK_HD int step_db(int d) { return d == 1 ? 1 : (d == 2 ? -1 : 0); }

// A(b, x, y) = sqrt((b + x) / (b + y)).
CSK_HD double segment_a(double b, double x, double y) { return sqrt((b + x) / (b + y)); }

// C(b, x) = sqrt((b + x - 1)(b + x + 1)) / (b + x).
CSK_HD double segment_c(double b, double x) {
  return sqrt((b + x - 1.0) * (b + x + 1.0)) / (b + x);
}

// The value of one segment, 0 where the pair of steps is not allowed. `delta` matters only for
// the middle segments with equal singly occupied steps (11, 22).
CSK_HD double segment_factor(int kind, int dbra, int dket, int delta, int b) {
  const double bb = static_cast<double>(b);
  const int code = 4 * dbra + dket;  // "d'd"
  switch (kind) {
    case kRaiseStart:
      if (code == 4 || code == 8) return 1.0;          // 10, 20
      if (code == 13) return segment_a(bb, 1.0, 0.0);  // 31
      if (code == 14) return segment_a(bb, 1.0, 2.0);  // 32
      return 0.0;
    case kRaiseMiddle:
      if (code == 0) return 1.0;                                     // 00
      if (code == 15) return -1.0;                                   // 33
      if (code == 5) return delta < 0 ? -1.0 : segment_c(bb, 0.0);   // 11
      if (code == 10) return delta < 0 ? segment_c(bb, 2.0) : -1.0;  // 22
      if (code == 9) return 1.0 / bb;                                // 21
      if (code == 6) return -1.0 / (bb + 2.0);                       // 12
      return 0.0;
    case kRaiseEnd:
      if (code == 1 || code == 2) return 1.0;          // 01, 02
      if (code == 7) return segment_a(bb, 0.0, 1.0);   // 13
      if (code == 11) return segment_a(bb, 2.0, 1.0);  // 23
      return 0.0;
    case kLowerStart:
      if (code == 1 || code == 2) return 1.0;          // 01, 02
      if (code == 7) return segment_a(bb, 2.0, 1.0);   // 13
      if (code == 11) return segment_a(bb, 0.0, 1.0);  // 23
      return 0.0;
    case kLowerMiddle:
      if (code == 0) return 1.0;                                     // 00
      if (code == 15) return -1.0;                                   // 33
      if (code == 5) return delta < 0 ? segment_c(bb, 1.0) : -1.0;   // 11
      if (code == 10) return delta < 0 ? -1.0 : segment_c(bb, 1.0);  // 22
      if (code == 9) return -1.0 / (bb + 1.0);                       // 21
      if (code == 6) return 1.0 / (bb + 1.0);                        // 12
      return 0.0;
    case kLowerEnd:
      if (code == 4 || code == 8) return 1.0;          // 10, 20
      if (code == 13) return segment_a(bb, 0.0, 1.0);  // 31
      if (code == 14) return segment_a(bb, 2.0, 1.0);  // 32
      return 0.0;
    default:
      return 0.0;
  }
}

// Index into a table of segment values over b = 0..bmax - 1 (see segment_table_size).
CSK_HD int segment_index(int kind, int dbra, int dket, int delta, int b, int bmax) {
  return ((((kind * 4 + dbra) * 4 + dket) * 2 + (delta > 0 ? 1 : 0)) * bmax) + b;
}

CSK_HD int segment_table_size(int bmax) { return kNumSegmentKinds * 4 * 4 * 2 * bmax; }

// Fill a table of every segment value for b = 0..bmax - 1 (once per DRT, in double). Entries
// that are unreachable (a zero denominator) hold 0.
inline void fill_segment_table(double* table, int bmax) {
  for (int kind = 0; kind < kNumSegmentKinds; ++kind)
    for (int dbra = 0; dbra < 4; ++dbra)
      for (int dket = 0; dket < 4; ++dket)
        for (int delta = -1; delta <= 1; delta += 2)
          for (int b = 0; b < bmax; ++b) {
            double v = segment_factor(kind, dbra, dket, delta, b);
            if (!(v == v) || v > 1e300 || v < -1e300) v = 0.0;  // NaN or inf: unreachable
            table[segment_index(kind, dbra, dket, delta, b, bmax)] = v;
          }
}

}  // namespace guga
}  // namespace csk
