// GUGA loop search and the per-CSF rows of the operator-direct sigma, written once for the host
// and the device. The CUDA kernels (ext/cuda/guga) run one CSF per thread through these
// functions; the CPU extension exposes the same functions over a plain loop (`_core.guga_rows`)
// so that the device logic is tested on any machine.
//
// Every <m|E_pq|n> != 0 (p != q) of one ket n is found by a depth-first search through the DRT:
// a loop starts at orbital lo (raising E_{lo,hi} or lowering E_{hi,lo}), passes the orbitals
// above it as middle segments and closes at every orbital where the end segment lands back on
// the ket's walk. The bra's index follows from the arc weights: rank(m) = rank(n) + sum of
// (y[bra arc] - y[ket arc]) over the arcs of the loop. Segment values come from
// guga_segments.hpp's table (Shavitt's tables, see there).
//
// Each row function owns its output (a row of T, or one sigma / diagonal entry) and sums in the
// order of the search: no atomics, so GPU results are the same bit for bit from run to run.
#pragma once
#include "guga_segments.hpp"
#include "hd.hpp"

namespace csk {
namespace guga {

// A DRT as flat arrays numbered from the head (host or device pointers).
struct DrtView {
  int norb = 0;
  int head = 0;
  int bmax = 0;                        // segment table rows: b = 0 .. bmax - 1
  const std::int32_t* up = nullptr;    // (nvert, 4): upper vertex along step d, -1 if none
  const std::int32_t* down = nullptr;  // (nvert, 4): lower vertex along step d, -1 if none
  const std::int32_t* b = nullptr;     // (nvert): 2S of the vertex
  const std::int64_t* y = nullptr;     // (nvert, 4): arc weights
  const double* seg = nullptr;         // fill_segment_table(seg, bmax)
  std::int64_t ncsf = 0;
};

// The walk of the CSF of index r from the head down: vertices (level 0..norb) into verts and
// put(k, step) for every orbital k.
template <class Put>
CSK_HD void walk_of_rank(const DrtView& d, std::int64_t r, int* verts, Put&& put) {
  int v = d.head;
  verts[d.norb] = v;
  for (int k = d.norb - 1; k >= 0; --k) {
    int chosen = 0;
    for (int s = 3; s >= 0; --s) {
      if (d.down[4 * v + s] < 0) continue;
      if (r >= d.y[4 * v + s]) {
        chosen = s;
        break;
      }
    }
    r -= d.y[4 * v + chosen];
    put(k, chosen);
    v = d.down[4 * v + chosen];
    verts[k] = v;
  }
}

// Steps (orbital 0 first) and vertices (level 0..norb) of the CSF of index r.
CSK_HD void unrank_csf(const DrtView& d, std::int64_t r, int* steps, int* verts) {
  walk_of_rank(d, r, verts, [&](int k, int s) { steps[k] = s; });
}

struct LoopFrame {
  int level;  // the last orbital whose bra step is fixed
  int vert;   // the bra's vertex above that orbital
  double val;
  std::int64_t dy;  // sum of bra minus ket arc weights so far
};

// The steps of a CSF packed two bits each into registers (orbital i at bits 2i, 2i + 1): the
// loop search reads them at every level, and an array would live in local memory on the GPU.
template <int MaxOrb>
struct PackedSteps {
  static constexpr int kWords = (MaxOrb + 31) / 32;
  std::uint64_t w[kWords];
  CSK_HD int operator[](int i) const {
    if constexpr (kWords == 1)
      return static_cast<int>((w[0] >> (2 * i)) & 3u);
    else
      return static_cast<int>((w[i >> 5] >> (2 * (i & 31))) & 3u);
  }
};

// unrank_csf with the steps packed.
template <int MaxOrb>
CSK_HD void unrank_csf(const DrtView& d, std::int64_t r, PackedSteps<MaxOrb>& steps, int* verts) {
  for (int j = 0; j < PackedSteps<MaxOrb>::kWords; ++j) steps.w[j] = 0;
  walk_of_rank(d, r, verts, [&](int k, int s) {
    steps.w[k >> 5] |= static_cast<std::uint64_t>(s) << (2 * (k & 31));
  });
}

// Calls emit(m, code, w) for every w = <m|E_pq|n> != 0 of the ket n = rank (steps and vertices
// given; steps an int array or PackedSteps) whose loop starts at orbital lo in one direction:
// raising (E_{lo,hi}, an electron moves down to lo) or lowering (E_{hi,lo}, up from lo);
// code = p * norb + q. MaxOrb bounds norb (the stack: a depth-first search with at most two
// children per frame holds at most norb + 1). The frame being extended stays in registers: its
// last child becomes the next frame and only the others go to the stack, so the frames are
// taken in the order of a plain stack (push every child, pop the last).
template <int MaxOrb, class Steps, class Emit>
CSK_HD void for_each_coupling_from(const DrtView& d, const Steps& steps, const int* verts,
                                   std::int64_t rank, int lo, int raising, Emit&& emit) {
  const int n = d.norb;
  const int bmax = d.bmax;
  const int occ_lo = step_occupation(steps[lo]);
  if (raising ? occ_lo == 2 : occ_lo == 0) return;
  const int kstart = raising ? kRaiseStart : kLowerStart;
  const int kmid = raising ? kRaiseMiddle : kLowerMiddle;
  const int kend = raising ? kRaiseEnd : kLowerEnd;
  LoopFrame stack[MaxOrb + 4];
  int top = 0;
  {
    const int dk = steps[lo];
    const int target = occ_lo + (raising ? 1 : -1);
    const int ku = verts[lo + 1];
    const int bk = d.b[ku];
    for (int dp = 0; dp < 4; ++dp) {
      if (step_occupation(dp) != target) continue;
      const int u = d.up[4 * verts[lo] + dp];
      if (u < 0) continue;
      const int delta = bk - d.b[u];
      if (delta != 1 && delta != -1) continue;
      const double v = d.seg[segment_index(kstart, dp, dk, delta, bk, bmax)];
      if (v == 0.0) continue;
      stack[top++] = LoopFrame{lo, u, v, d.y[4 * u + dp] - d.y[4 * ku + dk]};
    }
  }
  if (top == 0) return;
  LoopFrame f = stack[--top];
  for (;;) {
    const int i = f.level + 1;
    const int dk = steps[i];
    const int occ = step_occupation(dk);
    const int ku = verts[i + 1];
    const int bk = d.b[ku];
    // close the loop at i
    if (raising ? occ > 0 : occ < 2) {
      const int target = occ + (raising ? -1 : 1);
      for (int dp = 0; dp < 4; ++dp) {
        if (step_occupation(dp) != target) continue;
        if (d.up[4 * f.vert + dp] != ku) continue;
        const double v = d.seg[segment_index(kend, dp, dk, 1, bk, bmax)];
        if (v == 0.0) continue;
        const int p = raising ? lo : i, q = raising ? i : lo;
        emit(rank + f.dy + d.y[4 * ku + dp] - d.y[4 * ku + dk], p * n + q, f.val * v);
      }
    }
    // or pass through i as a middle segment: the last child is the next frame
    bool next = false;
    LoopFrame g{};
    if (i + 1 < n) {
      for (int dp = 0; dp < 4; ++dp) {
        if (step_occupation(dp) != occ) continue;
        const int u = d.up[4 * f.vert + dp];
        if (u < 0) continue;
        const int delta = bk - d.b[u];
        if (delta != 1 && delta != -1) continue;
        const double v = d.seg[segment_index(kmid, dp, dk, delta, bk, bmax)];
        if (v == 0.0) continue;
        if (next) stack[top++] = g;
        g = LoopFrame{i, u, f.val * v, f.dy + d.y[4 * u + dp] - d.y[4 * ku + dk]};
        next = true;
      }
    }
    if (next)
      f = g;
    else if (top > 0)
      f = stack[--top];
    else
      return;
  }
}

// --- loops between two vertices ---------------------------------------------------------------
// The loop-driven form needs no ket: a raising loop of E_{lo,hi} (lo < hi) is a pair of partial
// walks, the ket's and the bra's, that leave the same bottom vertex vb at level lo, differ on the
// arcs lo..hi and meet again at the top vertex vt at level hi + 1. Its value w = <m|E_{lo,hi}|n>
// is the product of the segment values, the same for every CSF pair that completes the two
// partial walks with one walk from the head down to vt (upper walk, index part U) and one from vb
// down to the tail (lower walk, index part l in 0 .. L[vb] - 1): n = U + off_ket + l,
// m = U + off_bra + l. The lowering generator E_{hi,lo} has the transposed couplings.
struct LoopFrame2 {
  int level;  // the last orbital whose steps are fixed
  int kv;     // the ket's vertex above that orbital
  int bv;     // the bra's vertex above that orbital
  double val;
  std::int64_t offk, offb;  // index parts of the ket's and the bra's arcs so far
};

// Runs the loop frames on `stack` (top of them) to their ends: close(vt, hi, off_ket, off_bra, w)
// for every loop closed at orbital hi (vt at level hi + 1), and cut(frame) instead of every frame
// that reaches the vertices of level `cut_level` (none when cut_level < 0): a loop split there
// is a lower part (its start segment and the middle segments below the level) times an upper
// part (the middle segments above and the end segment), see for_each_loop_above.
template <int MaxOrb, class Close, class Cut>
CSK_HD void extend_loops(const DrtView& d, LoopFrame2* stack, int top, int cut_level, Close&& close,
                         Cut&& cut) {
  const int n = d.norb;
  const int bmax = d.bmax;
  while (top > 0) {
    const LoopFrame2 f = stack[--top];
    const int i = f.level + 1;
    if (i >= n) continue;
    for (int dk = 0; dk < 4; ++dk) {
      const int ku = d.up[4 * f.kv + dk];
      if (ku < 0) continue;
      const int occ = step_occupation(dk);
      const int bk = d.b[ku];
      const std::int64_t offk = f.offk + d.y[4 * ku + dk];
      // close the loop at i: the bra steps onto the ket's vertex with one electron less
      if (occ > 0) {
        for (int dp = 0; dp < 4; ++dp) {
          if (step_occupation(dp) != occ - 1 || d.up[4 * f.bv + dp] != ku) continue;
          const double v = d.seg[segment_index(kRaiseEnd, dp, dk, 1, bk, bmax)];
          if (v == 0.0) continue;
          close(ku, i, offk, f.offb + d.y[4 * ku + dp], f.val * v);
        }
      }
      // or pass through i as a middle segment
      if (i + 1 < n) {
        for (int dp = 0; dp < 4; ++dp) {
          if (step_occupation(dp) != occ) continue;
          const int ub = d.up[4 * f.bv + dp];
          if (ub < 0) continue;
          const int delta = bk - d.b[ub];
          if (delta != 1 && delta != -1) continue;
          const double v = d.seg[segment_index(kRaiseMiddle, dp, dk, delta, bk, bmax)];
          if (v == 0.0) continue;
          const LoopFrame2 g{i, ku, ub, f.val * v, offk, f.offb + d.y[4 * ub + dp]};
          if (i + 1 == cut_level)
            cut(g);
          else
            stack[top++] = g;
        }
      }
    }
  }
}

// Every raising loop that starts at orbital lo from the bottom vertex vb (at level lo), in a
// fixed order: close(vt, hi, off_ket, off_bra, w) for each, or cut(frame) for its lower part
// when it reaches level cut_level (see extend_loops).
template <int MaxOrb, class Close, class Cut>
CSK_HD void for_each_loop_from(const DrtView& d, int lo, int vb, int cut_level, Close&& close,
                               Cut&& cut) {
  const int bmax = d.bmax;
  // every frame has at most 6 children (ket step 0: 1, 1: 2, 2: 2, 3: 1)
  LoopFrame2 stack[6 * (MaxOrb + 1)];
  int top = 0;
  for (int dk = 0; dk < 4; ++dk) {
    const int uk = d.up[4 * vb + dk];
    const int occ = step_occupation(dk);
    if (uk < 0 || occ == 2) continue;
    const int bk = d.b[uk];
    for (int dp = 0; dp < 4; ++dp) {
      if (step_occupation(dp) != occ + 1) continue;
      const int ub = d.up[4 * vb + dp];
      if (ub < 0) continue;
      const int delta = bk - d.b[ub];
      if (delta != 1 && delta != -1) continue;
      const double v = d.seg[segment_index(kRaiseStart, dp, dk, delta, bk, bmax)];
      if (v == 0.0) continue;
      const LoopFrame2 g{lo, uk, ub, v, d.y[4 * uk + dk], d.y[4 * ub + dp]};
      if (lo + 1 == cut_level)
        cut(g);
      else
        stack[top++] = g;
    }
  }
  extend_loops<MaxOrb>(d, stack, top, cut_level, close, cut);
}

// The upper parts of the loops open at level `level` with the ket at vertex kv and the bra at
// bv: close(vt, hi, off_ket, off_bra, w) with the index parts and the value of the arcs from
// `level` up (a loop's value is its lower part's times its upper part's).
template <int MaxOrb, class Close>
CSK_HD void for_each_loop_above(const DrtView& d, int level, int kv, int bv, Close&& close) {
  LoopFrame2 stack[6 * (MaxOrb + 1)];
  stack[0] = LoopFrame2{level - 1, kv, bv, 1.0, 0, 0};
  extend_loops<MaxOrb>(d, stack, 1, -1, close, [](const LoopFrame2&) {});
}

// Every <m|E_pq|n> != 0 (p != q) of the ket n: the searches of every start orbital and
// direction, lo ascending, lowering first.
template <int MaxOrb, class Steps, class Emit>
CSK_HD void for_each_coupling(const DrtView& d, const Steps& steps, const int* verts,
                              std::int64_t rank, Emit&& emit) {
  for (int lo = 0; lo < d.norb - 1; ++lo)
    for (int raising = 0; raising < 2; ++raising)
      for_each_coupling_from<MaxOrb>(d, steps, verts, rank, lo, raising, emit);
}

// --- rows split over the searches of one CSF ----------------------------------------------------
// A warp of the GPU shares one CSF: part j = 0 .. split_parts(norb) - 1 is the search from
// lo = j / 2 in direction raising = j % 2. The parts' outputs never collide: with the pair map
// (or the generator map) the columns of a part are its own within its direction, so a gather
// keeps one row per direction (the diagonal goes to the lowering row) and adds the two at the end.
CSK_HD int split_parts(int norb) { return 2 * (norb - 1); }

// Part j of the gather of ket k into rows[j % 2] (rows[0] holds n_r c_k on the diagonal
// columns beforehand, see gather_split_init).
template <int MaxOrb>
CSK_HD void gather_part(const DrtView& d, const int* steps, const int* verts, std::int64_t k, int j,
                        const std::int32_t* colmap, const double* c, double* row) {
  for_each_coupling_from<MaxOrb>(
      d, steps, verts, k, j >> 1, j & 1,
      [&](std::int64_t m, int code, double w) { row[colmap[code]] += w * c[m]; });
}

// Part j of sigma_row (without its diagonal term, sigma_diagonal_part).
template <int MaxOrb>
CSK_HD double sigma_part(const DrtView& d, const int* steps, const int* verts, std::int64_t m,
                         int j, const std::int32_t* symmap, const double* G, int ldg,
                         std::int64_t g0, std::int64_t gcount) {
  double s = 0.0;
  for_each_coupling_from<MaxOrb>(d, steps, verts, m, j >> 1, j & 1,
                                 [&](std::int64_t k, int code, double w) {
                                   const std::int64_t r = k - g0;
                                   if (r >= 0 && r < gcount) s += w * G[r * ldg + symmap[code]];
                                 });
  return s;
}

// sum_r n_r(m) G[m, P(r,r)] when row m lies in the chunk g0 .. g0 + gcount - 1, else 0.
CSK_HD double sigma_diagonal_part(const DrtView& d, const int* steps, std::int64_t m,
                                  const std::int32_t* symmap, const double* G, int ldg,
                                  std::int64_t g0, std::int64_t gcount) {
  if (m < g0 || m >= g0 + gcount) return 0.0;
  const int n = d.norb;
  const double* g = G + (m - g0) * ldg;
  double s = 0.0;
  for (int r = 0; r < n; ++r) s += step_occupation(steps[r]) * g[symmap[r * n + r]];
  return s;
}

// The steps of a split gather for the lanes `lane`, lane + stride, ... of a group (the host runs
// them with lane 0, stride 1); the group synchronises between steps.
// 1. both direction rows to zero;
CSK_HD void split_zero(double* r0, double* r1, int ld, int lane, int stride) {
  for (int j = lane; j < ld; j += stride) r0[j] = r1[j] = 0.0;
}
// 2. n_r c_k on the diagonal columns of the lowering row;
CSK_HD void split_diagonal(int n, const int* steps, const std::int32_t* colmap, double ck,
                           double* r0, int lane, int stride) {
  for (int r = lane; r < n; r += stride) r0[colmap[r * n + r]] = step_occupation(steps[r]) * ck;
}
// 3. the parts (gather_part); 4. the row: the sum of the two, and c_k in column ncol < ld.
CSK_HD void split_finish(const double* r0, const double* r1, int ld, int ncol, double ck,
                         double* row, int lane, int stride) {
  for (int j = lane; j < ld; j += stride) row[j] = j == ncol ? ck : r0[j] + r1[j];
}

// The fixed reduction tree of a warp's partial sums (a shuffle-down tree over 32 lanes), for the
// host twin of the GPU sigma: v[0] after the tree.
CSK_HD double warp_tree_sum(double* v) {
  for (int o = 16; o > 0; o >>= 1)
    for (int i = 0; i < o; ++i) v[i] += v[i + o];
  return v[0];
}

// Row k of the gather T = E c (T has ld >= ncol columns): T[colmap[r * n + r]] = n_r(k) c_k,
// T[colmap[p * n + q]] = sum of <m|E_pq|k> c_m over the couplings of ket k, and T[ncol] = c_k
// when ld > ncol (the column that carries a one-body term through the GEMM). With colmap the
// packed pair index this is T[k, P] = ((E_pq + E_qp) c)_k; with colmap[p * n + q] = q * n + p
// it is t[k, r * n + s] = (E_rs c)_k. colmap must reach every column 0 .. ncol - 1 (both maps
// do): each column of the row is stored exactly once, never read back. The searches from one
// start orbital lo (lowering, then raising) touch only the columns of the pairs (lo, hi), so
// they sum into acc (2 norb slots, `astride` doubles apart: a thread's column of shared memory on
// the GPU, a small array on the host), and the columns of lo are stored when both are done.
// symmetric: colmap[p * n + q] == colmap[q * n + p] for all p, q (the pair map; the caller
// vouches): both directions share one slot per hi, norb slots suffice and no column is looked up
// per coupling. The terms of every column are summed in the order of the search.
template <int MaxOrb>
CSK_HD void gather_row(const DrtView& d, std::int64_t k, const std::int32_t* colmap, int ncol,
                       int ld, const double* c, double* row, double* acc, int astride,
                       bool symmetric) {
  PackedSteps<MaxOrb> steps;
  int verts[MaxOrb + 1];
  unrank_csf(d, k, steps, verts);
  const int n = d.norb;
  const double ck = c[k];
  for (int j = ncol + 1; j < ld; ++j) row[j] = 0.0;
  if (ld > ncol) row[ncol] = ck;
  for (int r = 0; r < n; ++r) row[colmap[r * n + r]] = step_occupation(steps[r]) * ck;
  for (int s = 0; s < (symmetric ? n : 2 * n); ++s) acc[s * astride] = 0.0;
  for (int lo = 0; lo + 1 < n; ++lo) {
    for (int raising = 0; raising < 2; ++raising)
      for_each_coupling_from<MaxOrb>(
          d, steps, verts, k, lo, raising, [&](std::int64_t m, int code, double w) {
            // lowering E_{hi,lo}: code hi * n + lo; raising E_{lo,hi}: code lo * n + hi
            const int hi = raising ? code - lo * n : code / n;
            const bool own = !symmetric && raising && colmap[code] != colmap[hi * n + lo];
            acc[(own ? n + hi : hi) * astride] += w * c[m];
          });
    for (int hi = lo + 1; hi < n; ++hi) {
      const int cl = colmap[hi * n + lo];
      row[cl] = acc[hi * astride];
      acc[hi * astride] = 0.0;
      if (symmetric) continue;
      const int cr = colmap[lo * n + hi];
      if (cr != cl) {
        row[cr] = acc[(n + hi) * astride];
        acc[(n + hi) * astride] = 0.0;
      }
    }
  }
}

// The number of couplings <m|E_pq|k> != 0 (p != q) of ket k: the work of its rows (the GPU
// sorts the CSFs of a tile by it, so that the threads of a warp get similar work).
template <int MaxOrb>
CSK_HD int coupling_count(const DrtView& d, std::int64_t k) {
  PackedSteps<MaxOrb> steps;
  int verts[MaxOrb + 1];
  unrank_csf(d, k, steps, verts);
  int count = 0;
  for_each_coupling<MaxOrb>(d, steps, verts, k, [&](std::int64_t, int, double) { ++count; });
  return count;
}

// sigma_m's share from the rows g0 .. g0 + gcount - 1 of G (row stride ldg):
// sum_P <m|E^sym_P|k> G[k, P] over those k, E^sym_P = E_pq + E_qp (E_rr on the diagonal). As
// E^sym_P is symmetric, the couplings of m as a ket are exactly the incoming ones: a gather.
template <int MaxOrb>
CSK_HD double sigma_row(const DrtView& d, std::int64_t m, const std::int32_t* symmap,
                        const double* G, int ldg, std::int64_t g0, std::int64_t gcount) {
  PackedSteps<MaxOrb> steps;
  int verts[MaxOrb + 1];
  unrank_csf(d, m, steps, verts);
  const int n = d.norb;
  double s = 0.0;
  if (m >= g0 && m < g0 + gcount) {
    const double* g = G + (m - g0) * ldg;
    for (int r = 0; r < n; ++r) s += step_occupation(steps[r]) * g[symmap[r * n + r]];
  }
  for_each_coupling<MaxOrb>(d, steps, verts, m, [&](std::int64_t k, int code, double w) {
    const std::int64_t j = k - g0;
    if (j >= 0 && j < gcount) s += w * G[j * ldg + symmap[code]];
  });
  return s;
}

// <k|H - ecore|k> = sum_r n_r hp[r] + 1/2 sum_rs n_r n_s J[r, s] + 1/2 sum <m|E_pq|k>^2 K[p, q]
// with hp[r] = h_rr - 1/2 sum_s (rs|sr), J[r, s] = (rr|ss), K[p, q] = (pq|qp).
template <int MaxOrb>
CSK_HD double diagonal_row(const DrtView& d, std::int64_t k, const double* hp, const double* J,
                           const double* K) {
  PackedSteps<MaxOrb> steps;
  int verts[MaxOrb + 1];
  unrank_csf(d, k, steps, verts);
  const int n = d.norb;
  double one = 0.0, coul = 0.0, exch = 0.0;
  for (int r = 0; r < n; ++r) {
    const int nr = step_occupation(steps[r]);
    if (nr == 0) continue;
    one += nr * hp[r];
    for (int s = 0; s < n; ++s) coul += nr * step_occupation(steps[s]) * J[r * n + s];
  }
  for_each_coupling<MaxOrb>(d, steps, verts, k,
                            [&](std::int64_t, int code, double w) { exch += w * w * K[code]; });
  return one + 0.5 * coul + 0.5 * exch;
}

// --- sums whose value does not depend on the order of their terms ------------------------------
// Where many threads add into one output (the scatter form of sigma below), floating-point sums
// would change with the order of arrival. Here every term t is rounded once to a multiple of
// 2^-e, split into two signed limbs, |t| 2^e = hi 2^kLimbBits + lo with 0 <= lo <= 2^kLimbBits,
// and the limbs are added as integers into two words per output (lo[m] and hi[m]): integer
// addition does not depend on the order, and no addition needs the old value (on the GPU a
// reduction that the thread does not wait for). The caller picks e so that |t| 2^e < 2^76 for
// every term (`fixed_exponent`): hi stays below 2^32 per term, and a word overflows only beyond
// 2^19 terms per output (a CSF has far fewer couplings). The value is (hi 2^kLimbBits + lo)
// 2^-e; the rounding error of a term is at most 2^-e-1.
constexpr int kLimbBits = 44;

// add(word, v) adds v to *word (an atomic reduction on the GPU). scale = 2^e (products with a
// power of two are exact), so a term costs two multiplications, floor, rint and one fma.
template <class Add>
CSK_HD void fixed_add(csk_i64* lo, csk_i64* hi, double t, double scale, Add&& add) {
  if (t == 0.0) return;
  const double q = (t < 0.0 ? -t : t) * scale;
  const double h = floor(q * (1.0 / 17592186044416.0));  // q / 2^44
  const double l = rint(fma(-h, 17592186044416.0, q));   // q - h 2^44: exact, below 2^44
  const csk_i64 li = static_cast<csk_i64>(l), hi_i = static_cast<csk_i64>(h);
  if (li != 0) add(lo, t < 0.0 ? -li : li);
  if (hi_i != 0) add(hi, t < 0.0 ? -hi_i : hi_i);
}

// The double nearest (within two roundings) to the fixed-point sum (hi 2^kLimbBits + lo) 2^-e.
CSK_HD double fixed_value(csk_i64 lo, csk_i64 hi, int e) {
  return ldexp(ldexp(static_cast<double>(hi), kLimbBits) + static_cast<double>(lo), -e);
}

// The scatter form of sigma's second half for one ket k: every <m|E^sym_P|k> G[k, P] (and the
// diagonal sum_r n_r(k) G[k, P(r,r)] into k itself) added into the fixed-point sums (lo[m],
// hi[m]) of the outputs m (fixed_add with `add`). The row g = G[k, :] is k's own: G need not be
// kept beyond the tile that holds it. The couplings of k as a ket are those that the gather form
// (sigma_row) finds from m, as E^sym_P is symmetric; the value is the same up to the rounding of
// the terms (2^-e-1 each), and the same bit for bit in any order of the threads.
template <int MaxOrb, class Add>
CSK_HD void scatter_row(const DrtView& d, std::int64_t k, const std::int32_t* symmap,
                        const double* g, int e, csk_i64* lo, csk_i64* hi, Add&& add) {
  PackedSteps<MaxOrb> steps;
  int verts[MaxOrb + 1];
  unrank_csf(d, k, steps, verts);
  const int n = d.norb;
  const double scale = ldexp(1.0, e);
  double s = 0.0;
  for (int r = 0; r < n; ++r) s += step_occupation(steps[r]) * g[symmap[r * n + r]];
  fixed_add(lo + k, hi + k, s, scale, add);
  for_each_coupling<MaxOrb>(d, steps, verts, k, [&](std::int64_t m, int code, double w) {
    fixed_add(lo + m, hi + m, w * g[symmap[code]], scale, add);
  });
}

}  // namespace guga
}  // namespace csk
