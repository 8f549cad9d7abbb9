// GUGA CI loop search and the sigma / RDM gathers on the CPU (OpenMP over kets).
#include "kernels.hpp"

#include <cuscikit/guga_segments.hpp>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

namespace csk {
namespace guga {

namespace {

constexpr int kMaxOrb = 64;

struct Frame {
  int level;  // the last orbital whose bra step is fixed
  int vert;   // the bra's vertex above that orbital
  double val;
  std::int64_t dy;  // sum of bra minus ket arc weights so far
};

// Every <m|E_pq|n> != 0 of one ket n with p != q whose loop starts at orbital lo (E_{lo,hi} if
// raising, E_{hi,lo} if not), as (m - n, p * norb + q, value). The middle segments are shared by
// every end orbital hi > lo, and a loop is closed at each arc where the end segment lands on the
// ket's vertex. Only the ket's walk from level lo up to the head enters (its steps and vertices).
template <class Emit>
void search_from(const Drt& drt, const int* steps, const int* verts, int lo, int raising,
                 Emit&& emit) {
  const int n = drt.norb;
  const int bmax = drt.bmax;
  const double* seg = drt.seg.data();
  const std::int32_t* up = drt.up.data();
  const std::int32_t* bv = drt.b.data();
  const std::int64_t* y = drt.y.data();
  Frame stack[2 * kMaxOrb + 8];
  const int occ_lo = step_occupation(steps[lo]);
  // raising: E_{lo,hi}, an electron moves down to lo; lowering: E_{hi,lo}, up from lo
  if (raising ? occ_lo == 2 : occ_lo == 0) return;
  const int kstart = raising ? kRaiseStart : kLowerStart;
  const int kmid = raising ? kRaiseMiddle : kLowerMiddle;
  const int kend = raising ? kRaiseEnd : kLowerEnd;
  int top = 0;
  {
    const int d = steps[lo];
    const int target = occ_lo + (raising ? 1 : -1);
    const int ku = verts[lo + 1];
    const int bk = bv[ku];
    for (int dp = 0; dp < 4; ++dp) {
      if (step_occupation(dp) != target) continue;
      const int u = up[4 * verts[lo] + dp];
      if (u < 0) continue;
      const int delta = bk - bv[u];
      if (delta != 1 && delta != -1) continue;
      const double v = seg[segment_index(kstart, dp, d, delta, bk, bmax)];
      if (v == 0.0) continue;
      stack[top++] = Frame{lo, u, v, y[4 * u + dp] - y[4 * ku + d]};
    }
  }
  while (top > 0) {
    const Frame f = stack[--top];
    const int i = f.level + 1;
    const int d = steps[i];
    const int occ = step_occupation(d);
    const int ku = verts[i + 1];
    const int bk = bv[ku];
    // close the loop at i
    if (raising ? occ > 0 : occ < 2) {
      const int target = occ + (raising ? -1 : 1);
      for (int dp = 0; dp < 4; ++dp) {
        if (step_occupation(dp) != target) continue;
        if (up[4 * f.vert + dp] != ku) continue;
        const double v = seg[segment_index(kend, dp, d, 1, bk, bmax)];
        if (v == 0.0) continue;
        const int p = raising ? lo : i, q = raising ? i : lo;
        emit(f.dy + y[4 * ku + dp] - y[4 * ku + d], static_cast<std::uint16_t>(p * n + q),
             f.val * v);
      }
    }
    // or pass through i as a middle segment
    if (i + 1 < n) {
      for (int dp = 0; dp < 4; ++dp) {
        if (step_occupation(dp) != occ) continue;
        const int u = up[4 * f.vert + dp];
        if (u < 0) continue;
        const int delta = bk - bv[u];
        if (delta != 1 && delta != -1) continue;
        const double v = seg[segment_index(kmid, dp, d, delta, bk, bmax)];
        if (v == 0.0) continue;
        stack[top++] = Frame{i, u, f.val * v, f.dy + y[4 * u + dp] - y[4 * ku + d]};
      }
    }
  }
}

// The loop search of one thread over kets in any order, remembering the last result of each
// (lo, direction): kets that share their walk from level lo up to the head (a run of L[v_lo]
// consecutive indices) share those couplings up to the index shift, so only the first of a run
// searches. The emitted lists are those of a search from scratch, in the same order.
class CouplingSearch {
 public:
  explicit CouplingSearch(const Drt& drt) : drt_(drt), memo_(2 * drt.norb) {}

  // emit(m, p * norb + q, <m|E_pq|n>) for every coupling of ket n (steps and vertices given).
  template <class Emit>
  void run(const int* steps, const int* verts, std::int64_t rank, Emit&& emit) {
    const int n = drt_.norb;
    const std::int64_t* y = drt_.y.data();
    std::int64_t upper = 0;  // the index part of levels lo..n-1: identifies the walk above lo
    std::int64_t uppers[kMaxOrb];
    for (int k = n - 1; k >= 0; --k) {
      upper += y[4 * verts[k + 1] + steps[k]];
      uppers[k] = upper;
    }
    for (int lo = 0; lo < n - 1; ++lo) {
      for (int raising = 0; raising < 2; ++raising) {
        Memo& m = memo_[2 * lo + raising];
        if (m.key != uppers[lo]) {
          m.key = uppers[lo];
          m.entries.clear();
          search_from(drt_, steps, verts, lo, raising,
                      [&](std::int64_t dy, std::uint16_t code, double w) {
                        m.entries.push_back(Entry{dy, w, code});
                      });
        }
        for (const Entry& e : m.entries) emit(rank + e.dy, e.code, e.w);
      }
    }
  }

 private:
  struct Entry {
    std::int64_t dy;
    double w;
    std::uint16_t code;
  };
  struct Memo {
    std::int64_t key = -1;
    std::vector<Entry> entries;
  };
  const Drt& drt_;
  std::vector<Memo> memo_;
};

int threads_or_default(int nthreads) { return nthreads > 0 ? nthreads : max_threads(); }

}  // namespace

void Drt::finish() {
  if (norb < 1 || norb > kMaxOrb) throw std::invalid_argument("norb must be in 1..64");
  bmax = norb + 3;
  seg.assign(segment_table_size(bmax), 0.0);
  fill_segment_table(seg.data(), bmax);
  ncsf = L[head];
}

void Drt::unrank(std::int64_t r, int* steps, int* verts) const {
  int v = head;
  verts[norb] = v;
  for (int k = norb - 1; k >= 0; --k) {
    int chosen = -1;
    for (int d = 3; d >= 0; --d) {
      const int w = down[4 * v + d];
      if (w < 0) continue;
      if (r >= y[4 * v + d]) {
        chosen = d;
        break;
      }
    }
    r -= y[4 * v + chosen];
    steps[k] = chosen;
    v = down[4 * v + chosen];
    verts[k] = v;
  }
}

std::vector<std::int64_t> count_lists(const Drt& drt, std::int64_t k0, std::int64_t count,
                                      int nthreads) {
  std::vector<std::int64_t> counts(count);
  nthreads = threads_or_default(nthreads);
#pragma omp parallel num_threads(nthreads)
  {
    CouplingSearch search(drt);
#pragma omp for schedule(dynamic, 64)
    for (std::int64_t k = 0; k < count; ++k) {
      int steps[kMaxOrb], verts[kMaxOrb + 1];
      drt.unrank(k0 + k, steps, verts);
      std::int64_t c = 0;
      search.run(steps, verts, k0 + k, [&](std::int64_t, std::uint16_t, double) { ++c; });
      counts[k] = c;
    }
  }
  return counts;
}

Lists build_lists(const Drt& drt, std::int64_t k0, std::int64_t count, int nthreads,
                  const std::int64_t* known) {
  nthreads = threads_or_default(nthreads);
  Lists out;
  out.offsets.assign(count + 1, 0);
  if (known) {  // counts given: write straight into place
    for (std::int64_t k = 0; k < count; ++k) out.offsets[k + 1] = out.offsets[k] + known[k];
    const std::int64_t total = out.offsets[count];
    out.bra.resize(total);
    out.code.resize(total);
    out.w.resize(total);
#pragma omp parallel num_threads(nthreads)
    {
      CouplingSearch search(drt);
#pragma omp for schedule(dynamic, 64)
      for (std::int64_t k = 0; k < count; ++k) {
        int steps[kMaxOrb], verts[kMaxOrb + 1];
        drt.unrank(k0 + k, steps, verts);
        std::int64_t pos = out.offsets[k];
        search.run(steps, verts, k0 + k, [&](std::int64_t m, std::uint16_t c, double w) {
          out.bra[pos] = static_cast<std::int32_t>(m);
          out.code[pos] = c;
          out.w[pos] = w;
          ++pos;
        });
      }
    }
    return out;
  }
  // One loop search per ket: runs of kets fill buffers of their own, which are then copied into
  // place (the extra memory is one copy of this call's lists; callers build in blocks).
  constexpr std::int64_t kRun = 256;
  const std::int64_t nrun = (count + kRun - 1) / kRun;
  std::vector<Lists> runs(static_cast<size_t>(nrun));
#pragma omp parallel num_threads(nthreads)
  {
    CouplingSearch search(drt);
    size_t last = 0;  // entries of this thread's previous run: the next one's reservation
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t r = 0; r < nrun; ++r) {
      Lists& part = runs[r];
      const std::int64_t a = r * kRun, b = a + kRun < count ? a + kRun : count;
      const size_t guess = last + last / 4;
      part.bra.reserve(guess);
      part.code.reserve(guess);
      part.w.reserve(guess);
      int steps[kMaxOrb], verts[kMaxOrb + 1];
      for (std::int64_t k = a; k < b; ++k) {
        drt.unrank(k0 + k, steps, verts);
        const size_t before = part.w.size();
        search.run(steps, verts, k0 + k, [&](std::int64_t m, std::uint16_t c, double w) {
          part.bra.push_back(static_cast<std::int32_t>(m));
          part.code.push_back(c);
          part.w.push_back(w);
        });
        out.offsets[k + 1] = static_cast<std::int64_t>(part.w.size() - before);
      }
      last = part.w.size();
    }
  }
  for (std::int64_t k = 0; k < count; ++k) out.offsets[k + 1] += out.offsets[k];
  const std::int64_t total = out.offsets[count];
  out.bra.resize(total);
  out.code.resize(total);
  out.w.resize(total);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (std::int64_t r = 0; r < nrun; ++r) {
    Lists& part = runs[r];
    const std::int64_t pos = out.offsets[r * kRun];
    std::copy(part.bra.begin(), part.bra.end(), out.bra.begin() + pos);
    std::copy(part.code.begin(), part.code.end(), out.code.begin() + pos);
    std::copy(part.w.begin(), part.w.end(), out.w.begin() + pos);
    part = Lists();
  }
  return out;
}

std::vector<std::uint8_t> csf_steps(const Drt& drt, std::int64_t k0, std::int64_t count,
                                    int nthreads) {
  const int n = drt.norb;
  std::vector<std::uint8_t> out(static_cast<size_t>(count) * n);
  nthreads = threads_or_default(nthreads);
#pragma omp parallel for schedule(static) num_threads(nthreads)
  for (std::int64_t k = 0; k < count; ++k) {
    int steps[kMaxOrb], verts[kMaxOrb + 1];
    drt.unrank(k0 + k, steps, verts);
    for (int i = 0; i < n; ++i) out[k * n + i] = static_cast<std::uint8_t>(steps[i]);
  }
  return out;
}

void gather_pairs(const Drt& drt, const BlockView& v, const std::int32_t* symmap, int npair,
                  const double* c, double* T, int ld, int nthreads) {
  const int n = drt.norb;
  nthreads = threads_or_default(nthreads);
#pragma omp parallel for schedule(dynamic, 256) num_threads(nthreads)
  for (std::int64_t k = 0; k < v.count; ++k) {
    double* row = T + k * ld;
    for (int P = 0; P < npair; ++P) row[P] = 0.0;
    const double ck = c[v.k0 + k];
    if (ld > npair) row[npair] = ck;  // the column that carries the one-body term
    for (int r = 0; r < n; ++r) row[symmap[r * n + r]] = step_occupation(v.steps[k * n + r]) * ck;
    for (std::int64_t e = v.offsets[k]; e < v.offsets[k + 1]; ++e)
      row[symmap[v.code[e]]] += v.w[e] * c[v.bra[e]];
  }
}

void scatter_pairs(const Drt& drt, const BlockView& v, const std::int32_t* symmap, int npair,
                   const double* G, double* sigma, std::int64_t ncsf, int nbuf, int nthreads) {
  const int n = drt.norb;
  nthreads = threads_or_default(nthreads);
  if (nthreads > nbuf) nthreads = nbuf;
  // Row k's own diagonal term goes to buffer 0 (k is owned by this call alone).
  for (std::int64_t k = 0; k < v.count; ++k) {
    const double* g = G + k * npair;
    double s = 0.0;
    for (int r = 0; r < n; ++r) s += step_occupation(v.steps[k * n + r]) * g[symmap[r * n + r]];
    sigma[v.k0 + k] += s;
  }
#pragma omp parallel num_threads(nthreads)
  {
    const int tid = thread_id();
    double* out = sigma + static_cast<size_t>(tid) * ncsf;  // this thread's buffer
    // a static schedule gives each thread the same kets on every call, so every buffer adds
    // the same terms in the same order: the sum is bitwise reproducible for a thread count
#pragma omp for schedule(static, 256)
    for (std::int64_t k = 0; k < v.count; ++k) {
      const double* g = G + k * npair;
      for (std::int64_t e = v.offsets[k]; e < v.offsets[k + 1]; ++e)
        out[v.bra[e]] += v.w[e] * g[symmap[v.code[e]]];
    }
  }
}

void gather_generators(const Drt& drt, const BlockView& v, const double* c, double* t,
                       int nthreads) {
  const int n = drt.norb;
  const int nn = n * n;
  nthreads = threads_or_default(nthreads);
#pragma omp parallel for schedule(dynamic, 256) num_threads(nthreads)
  for (std::int64_t k = 0; k < v.count; ++k) {
    double* row = t + k * nn;
    for (int i = 0; i < nn; ++i) row[i] = 0.0;
    const double ck = c[v.k0 + k];
    for (int r = 0; r < n; ++r) row[r * n + r] = step_occupation(v.steps[k * n + r]) * ck;
    // entry (m, p, q, w): w = <m|E_pq|k> = <k|E_qp|m>, a term of (E_qp c)_k
    for (std::int64_t e = v.offsets[k]; e < v.offsets[k + 1]; ++e) {
      const int p = v.code[e] / n, q = v.code[e] % n;
      row[q * n + p] += v.w[e] * c[v.bra[e]];
    }
  }
}

void exchange_diagonal(const Drt& drt, const BlockView& v, const double* K, double* out,
                       int nthreads) {
  nthreads = threads_or_default(nthreads);
#pragma omp parallel for schedule(dynamic, 256) num_threads(nthreads)
  for (std::int64_t k = 0; k < v.count; ++k) {
    double s = 0.0;
    for (std::int64_t e = v.offsets[k]; e < v.offsets[k + 1]; ++e)
      s += v.w[e] * v.w[e] * K[v.code[e]];
    out[k] = s;
  }
}

}  // namespace guga
}  // namespace csk
