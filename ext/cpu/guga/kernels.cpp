// GUGA CI on the CPU: the loop table and its kernels (OpenMP over output ranges of CSFs), and the
// per-ket coupling lists and their kernels (OpenMP over kets). The loop searches themselves are
// guga_loops.hpp's, shared with the CUDA kernels.
#include "kernels.hpp"

#include <cuscikit/guga_segments.hpp>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <utility>

namespace csk {
namespace guga {

namespace {

constexpr int kMaxOrb = 64;

// The loop search of one thread over kets in any order, remembering the last result of each
// (lo, direction): kets that share their walk from level lo up to the head (a run of L[v_lo]
// consecutive indices) share those couplings up to the index shift, so only the first of a run
// searches. The emitted lists are those of a search from scratch, in the same order.
class CouplingSearch {
 public:
  explicit CouplingSearch(const Drt& drt) : drt_(drt), view_(drt.view()), memo_(2 * drt.norb) {}

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
          // rank 0: the emitted bra index is the shift dy = m - n
          for_each_coupling_from<kMaxOrb>(
              view_, steps, verts, 0, lo, raising, [&](std::int64_t dy, int code, double w) {
                m.entries.push_back(Entry{dy, w, static_cast<std::uint16_t>(code)});
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
  DrtView view_;
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

DrtView Drt::view() const {
  DrtView v;
  v.norb = norb;
  v.head = head;
  v.bmax = bmax;
  v.up = up.data();
  v.down = down.data();
  v.b = b.data();
  v.y = y.data();
  v.seg = seg.data();
  v.ncsf = ncsf;
  return v;
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

// --- loop-driven form --------------------------------------------------------------------------

std::int64_t LoopTable::bytes() const {
  return static_cast<std::int64_t>(
      4 * tops.size() + 8 * (hfirst.size() + ufirst.size()) + 8 * (uoff.size() + cells.size()) +
      (4 + 4 + 4 + 8 + 8 + 8 + 8 + 8) * hw.size() + (4 + 4 + 4 + 2 + 8) * w.size());
}

bool LoopTable::aligned(std::int64_t k0, std::int64_t count) const {
  if (cells.empty()) return false;
  auto border = [&](std::int64_t k) {
    return k == 0 || k == total || std::binary_search(cells.begin(), cells.end(), k);
  };
  return border(k0) && border(k0 + count);
}

namespace {

struct Levels {
  std::vector<int> level;  // per vertex
  std::vector<int> order;  // vertices, level descending
};

Levels levels_of(const Drt& drt) {
  const int nv = drt.nvert;
  Levels out;
  out.level.assign(nv, -1);
  out.level[drt.head] = drt.norb;
  for (int v = 0; v < nv; ++v)  // numbered from the head: parents come first
    for (int d = 0; d < 4; ++d) {
      const int u = drt.up[4 * v + d];
      if (u >= 0 && out.level[u] >= 0) out.level[v] = out.level[u] - 1;
    }
  for (int v = 0; v < nv; ++v)
    if (out.level[v] < 0) throw std::invalid_argument("a vertex without a path to the head");
  out.order.resize(nv);
  for (int v = 0; v < nv; ++v) out.order[v] = v;
  std::stable_sort(out.order.begin(), out.order.end(),
                   [&](int a, int b) { return out.level[a] > out.level[b]; });
  return out;
}

// Entries (whole loops and lower parts) and heads (upper parts) for a split level, counted only.
std::pair<std::int64_t, std::int64_t> count_parts(const Drt& drt, const Levels& lv, int split) {
  const int n = drt.norb;
  const DrtView view = drt.view();
  std::int64_t entries = 0, heads = 0;
  std::vector<std::pair<int, int>> open;
  for (int lo = 0; lo + 1 < n; ++lo)
    for (int vb : lv.order) {
      if (lv.level[vb] != lo) continue;
      for_each_loop_from<kMaxOrb>(
          view, lo, vb, split, [&](int, int, std::int64_t, std::int64_t, double) { ++entries; },
          [&](const LoopFrame2& f) {
            ++entries;
            open.emplace_back(f.kv, f.bv);
          });
    }
  std::sort(open.begin(), open.end());
  open.erase(std::unique(open.begin(), open.end()), open.end());
  for (const auto& o : open)
    for_each_loop_above<kMaxOrb>(view, split, o.first, o.second,
                                 [&](int, int, std::int64_t, std::int64_t, double) { ++heads; });
  return {entries, heads};
}

}  // namespace

LoopTable build_loops(const Drt& drt, int split) {
  const int n = drt.norb;
  const Levels lv = levels_of(drt);
  const std::vector<int>& level = lv.level;
  const std::vector<int>& order = lv.order;
  const DrtView view = drt.view();
  if (split < 0) {  // the level near the middle with the smallest table (entries 28 bytes,
    // heads 40); levels far from the middle leave most loops whole
    split = 0;
    std::int64_t best = -1;
    for (int J = std::max(2, n / 2 - 1); J <= std::min(n - 1, n / 2 + 1); ++J) {
      const auto c = count_parts(drt, lv, J);
      const std::int64_t b = 28 * c.first + 40 * c.second;
      if (best < 0 || b < best) {
        best = b;
        split = J;
      }
    }
  }
  const int cut = split > 0 && split < n ? split : -1;
  struct Loop {  // a whole loop, or a lower part (vt: the open pair's index; code lo * n)
    std::int64_t key;
    std::int32_t offk, offb, len;
    std::uint16_t code;
    double w;
  };
  std::vector<Loop> whole, lower;
  const std::int64_t nv = drt.nvert;
  LoopTable t;
  t.split = cut;
  t.total = drt.ncsf;
  for (int lo = 0; lo + 1 < n; ++lo)
    for (int vb : order) {
      if (level[vb] != lo) continue;
      const std::int32_t len = static_cast<std::int32_t>(drt.L[vb]);
      for_each_loop_from<kMaxOrb>(
          view, lo, vb, cut,
          [&](int vt, int hi, std::int64_t offk, std::int64_t offb, double w) {
            whole.push_back(Loop{vt, static_cast<std::int32_t>(offk),
                                 static_cast<std::int32_t>(offb), len,
                                 static_cast<std::uint16_t>(lo * n + hi), w});
          },
          [&](const LoopFrame2& f) {
            lower.push_back(Loop{f.kv * nv + f.bv, static_cast<std::int32_t>(f.offk),
                                 static_cast<std::int32_t>(f.offb), len,
                                 static_cast<std::uint16_t>(lo * n), f.val});
          });
    }
  auto by_key = [](const Loop& a, const Loop& b) { return a.key < b.key; };
  std::stable_sort(whole.begin(), whole.end(), by_key);
  std::stable_sort(lower.begin(), lower.end(), by_key);
  // entries: the whole loops by top vertex, then the lower parts by open pair
  const size_t ne = whole.size() + lower.size();
  t.offk.resize(ne);
  t.offb.resize(ne);
  t.len.resize(ne);
  t.code.resize(ne);
  t.w.resize(ne);
  struct Head {
    std::int32_t vt, offk, offb, hadd;
    std::int64_t e0, e1;
    double w;
    std::int64_t spank, spanb;
  };
  std::vector<Head> heads;
  size_t pos = 0;
  for (const std::vector<Loop>* part : {&whole, &lower}) {
    const bool is_lower = part == &lower;
    const std::vector<Loop>& L = *part;
    for (size_t j = 0; j < L.size();) {
      size_t k = j;
      const size_t base = pos;
      for (; k < L.size() && L[k].key == L[j].key; ++k, ++pos) {
        t.offk[pos] = L[k].offk;
        t.offb[pos] = L[k].offb;
        t.len[pos] = L[k].len;
        t.code[pos] = L[k].code;
        t.w[pos] = L[k].w;
      }
      const std::int64_t e0 = static_cast<std::int64_t>(base), e1 = static_cast<std::int64_t>(pos);
      if (!is_lower) {
        const std::int64_t span = drt.L[L[j].key];
        heads.push_back(
            Head{static_cast<std::int32_t>(L[j].key), 0, 0, 0, e0, e1, 1.0, span, span});
      } else {
        const int kv = static_cast<int>(L[j].key / nv), bv = static_cast<int>(L[j].key % nv);
        for_each_loop_above<kMaxOrb>(
            view, cut, kv, bv, [&](int vt, int hi, std::int64_t offk, std::int64_t offb, double w) {
              heads.push_back(Head{vt, static_cast<std::int32_t>(offk),
                                   static_cast<std::int32_t>(offb), hi, e0, e1, w, drt.L[kv],
                                   drt.L[bv]});
            });
      }
      j = k;
    }
  }
  std::vector<Loop>().swap(whole);
  std::vector<Loop>().swap(lower);
  std::stable_sort(heads.begin(), heads.end(),
                   [](const Head& a, const Head& b) { return a.vt < b.vt; });
  const size_t nh = heads.size();
  t.hoffk.resize(nh);
  t.hoffb.resize(nh);
  t.hadd.resize(nh);
  t.e0.resize(nh);
  t.e1.resize(nh);
  t.hw.resize(nh);
  t.hspank.resize(nh);
  t.hspanb.resize(nh);
  for (size_t h = 0; h < nh; ++h) {
    const Head& x = heads[h];
    if (h == 0 || x.vt != heads[h - 1].vt) {
      t.tops.push_back(x.vt);
      t.hfirst.push_back(static_cast<std::int64_t>(h));
    }
    t.hoffk[h] = x.offk;
    t.hoffb[h] = x.offb;
    t.hadd[h] = x.hadd;
    t.e0[h] = x.e0;
    t.e1[h] = x.e1;
    t.hw[h] = x.w;
    t.hspank[h] = x.spank;
    t.hspanb[h] = x.spanb;
    t.nloops += x.e1 - x.e0;
  }
  t.hfirst.push_back(static_cast<std::int64_t>(nh));
  std::vector<Head>().swap(heads);
  // index parts of the upper walks of every vertex, level by level from the head; kept for the
  // top vertices only
  std::vector<std::vector<std::int64_t>> upper(nv);
  std::vector<char> is_top(nv, 0);
  int min_top_level = n;
  for (int v : t.tops) {
    is_top[v] = 1;
    min_top_level = std::min(min_top_level, level[v]);
  }
  upper[drt.head] = {0};
  for (int u : order) {
    if (level[u] <= min_top_level && level[u] < cut) break;
    for (int d = 0; d < 4; ++d) {
      const int v = drt.down[4 * u + d];
      if (v < 0) continue;
      for (std::int64_t U : upper[u]) upper[v].push_back(U + drt.y[4 * u + d]);
    }
    if (level[u] == cut) {  // the cells: CSFs that share their walk from the head to level cut
      for (std::int64_t U : upper[u]) t.cells.push_back(U);
    }
    if (!is_top[u]) std::vector<std::int64_t>().swap(upper[u]);
  }
  std::sort(t.cells.begin(), t.cells.end());
  t.ufirst.push_back(0);
  for (int v : t.tops) {
    std::vector<std::int64_t>& U = upper[v];
    std::sort(U.begin(), U.end());
    t.uoff.insert(t.uoff.end(), U.begin(), U.end());
    t.ufirst.push_back(static_cast<std::int64_t>(t.uoff.size()));
    std::vector<std::int64_t>().swap(U);
  }
  return t;
}

namespace {

// Output ranges of this many CSFs: one thread writes each (no races, the order of the sums fixed).
constexpr std::int64_t kSub = 4096;

// Output ranges of about kSub CSFs in [k0, k0 + count) whose borders are cell borders of the
// table (where it has cells and k0, k0 + count are such borders): then the kets (and the bras) of
// a head's entries lie all inside one range or all outside, and nothing is cut.
std::vector<std::int64_t> sub_ranges(const LoopTable& t, std::int64_t k0, std::int64_t count,
                                     std::int64_t size = kSub) {
  std::vector<std::int64_t> cuts{k0};
  const std::int64_t end = k0 + count;
  if (t.cells.empty()) {
    for (std::int64_t a = k0 + size; a < end; a += size) cuts.push_back(a);
  } else {
    auto it = std::upper_bound(t.cells.begin(), t.cells.end(), k0);
    for (; it != t.cells.end() && *it < end; ++it)
      if (*it - cuts.back() >= size) cuts.push_back(*it);
  }
  cuts.push_back(end);
  return cuts;
}

// The loops of one head applied to a set of upper walks: entries e0 .. e1 - 1, ket
// U[u] + hk + offk[e] + l, bra U[u] + hb + offb[e] + l, value hw w[e], code code[e] + hadd.
// With `cut`, only outputs inside [a, b) are wanted (nU = 1 then).
struct HeadVisit {
  std::int64_t hk, hb;
  double hw;
  int hadd;
  std::int64_t e0, e1;
  const std::int64_t* U;
  std::int64_t nU;
  bool cut;
};

// visit(HeadVisit) for every head and upper walk whose CSFs meet [a, b). Upper walks inside
// [a, b) come in tiles of about kTile CSFs (the entries of a head run over the tile: short loops
// of many upper walks are one tight loop); those that straddle a border come one by one, to be
// cut, and heads whose kets and bras both miss [a, b) are skipped.
constexpr std::int64_t kTile = 4096;

template <class Visit>
void visit_heads(const Drt& drt, const LoopTable& t, std::int64_t a, std::int64_t b,
                 Visit&& visit) {
  const size_t ntop = t.tops.size();
  for (size_t i = 0; i < ntop; ++i) {
    const std::int64_t span = drt.L[t.tops[i]];
    const std::int64_t h0 = t.hfirst[i], h1 = t.hfirst[i + 1];
    const std::int64_t* u0 = t.uoff.data() + t.ufirst[i];
    const std::int64_t* u1 = t.uoff.data() + t.ufirst[i + 1];
    // the upper walks whose CSFs U .. U + span - 1 meet [a, b)
    const std::int64_t* it = std::upper_bound(u0, u1, a - span);
    const std::int64_t* end = std::lower_bound(it, u1, b);
    const std::int64_t tile = std::max<std::int64_t>(1, kTile / span);
    while (it < end) {
      const std::int64_t U = *it;
      if (U < a || U + span > b) {  // straddles a border
        for (std::int64_t h = h0; h < h1; ++h) {
          const std::int64_t hk = U + t.hoffk[h], hb = U + t.hoffb[h];
          // the head's entries keep their kets in hk .. hk + hspank - 1 (bras: hb ..)
          if ((hk >= b || hk + t.hspank[h] <= a) && (hb >= b || hb + t.hspanb[h] <= a)) continue;
          visit(
              HeadVisit{t.hoffk[h], t.hoffb[h], t.hw[h], t.hadd[h], t.e0[h], t.e1[h], it, 1, true});
        }
        ++it;
        continue;
      }
      const std::int64_t* stop = it + 1;
      while (stop < end && stop - it < tile && *stop + span <= b) ++stop;
      for (std::int64_t h = h0; h < h1; ++h)
        visit(HeadVisit{t.hoffk[h], t.hoffb[h], t.hw[h], t.hadd[h], t.e0[h], t.e1[h], it, stop - it,
                        false});
      it = stop;
    }
  }
}

// visit(code, w, side, out, in, l0, l1): output CSFs out + l, input CSFs in + l, l = l0 .. l1 - 1
// (inside [a, b)), once with the ket as output (side 0, w = <in|E_{lo,hi}|out>, code
// lo * norb + hi) and once with the bra (side 1, w = <in|E_{hi,lo}|out>).
template <class Visit>
void visit_range(const Drt& drt, const LoopTable& t, std::int64_t a, std::int64_t b,
                 Visit&& visit) {
  const std::int32_t* offk = t.offk.data();
  const std::int32_t* offb = t.offb.data();
  const std::int32_t* len = t.len.data();
  const std::uint16_t* code = t.code.data();
  const double* w = t.w.data();
  visit_heads(drt, t, a, b, [&](const HeadVisit& hv) {
    for (std::int64_t u = 0; u < hv.nU; ++u)
      for (std::int64_t j = hv.e0; j < hv.e1; ++j) {
        const std::int64_t ok = hv.U[u] + hv.hk + offk[j], ob = hv.U[u] + hv.hb + offb[j];
        const std::int64_t n = len[j];
        const double v = hv.hw * w[j];
        const int c = code[j] + hv.hadd;
        std::int64_t l0 = hv.cut ? std::max<std::int64_t>(0, a - ok) : 0;
        std::int64_t l1 = hv.cut ? std::min<std::int64_t>(n, b - ok) : n;
        if (l0 < l1) visit(c, v, 0, ok, ob, l0, l1);
        l0 = hv.cut ? std::max<std::int64_t>(0, a - ob) : 0;
        l1 = hv.cut ? std::min<std::int64_t>(n, b - ob) : n;
        if (l0 < l1) visit(c, v, 1, ob, ok, l0, l1);
      }
  });
}

// d[l] += v s[l], l < n: most loops have one lower walk (n = 1), which takes no loop at all.
inline void axpy(double* __restrict d, const double* __restrict s, double v, std::int64_t n) {
  if (n == 1) {
    d[0] += v * s[0];
    return;
  }
  for (std::int64_t l = 0; l < n; ++l) d[l] += v * s[l];
}

// Offsets of the entries into a block of pair rows of stride S (T or G; row P holds pair P of
// the block's CSFs), for the packed pair map P(p, q) = max (max + 1) / 2 + min: the entry's part
// of the pair row times S plus its ket (k) or bra (b) offset. A whole loop's part is its pair; a
// lower part's (code lo * norb) is lo, and its head adds hi (hi + 1) / 2 (head_row).
struct BlockOffsets {
  std::vector<std::int64_t> k, b;
};

BlockOffsets block_offsets(const LoopTable& t, int norb, std::int64_t S) {
  const size_t ne = t.w.size();
  BlockOffsets o;
  o.k.resize(ne);
  o.b.resize(ne);
  for (size_t j = 0; j < ne; ++j) {
    const std::int64_t lo = t.code[j] / norb, hi = t.code[j] % norb;
    const std::int64_t row = hi > 0 ? hi * (hi + 1) / 2 + lo : lo;
    o.k[j] = row * S + t.offk[j];
    o.b[j] = row * S + t.offb[j];
  }
  return o;
}

inline std::int64_t head_row(int hadd) { return static_cast<std::int64_t>(hadd) * (hadd + 1) / 2; }

// The gather (Sd = 0: block T[P, x] += w c[y], dst = T) and the scatter (Sd = 1: sigma[y] +=
// w G[P, x], src = G) over the entries of a head, both sides of an entry in one pass: x is the
// CSF whose pair row of the block is used, y the one of the vector. `blk` and `vec` point at the
// block's element (row 0, CSF 0) and the vector's CSF 0 (block rows of stride S).
template <int Sd>
void apply_head(const LoopTable& t, const HeadVisit& hv, const BlockOffsets& bo,
                const std::int32_t* symmap, std::int64_t S, const double* src, double* dst,
                std::int64_t a, std::int64_t b, bool aligned) {
  const std::int32_t* offk = t.offk.data();
  const std::int32_t* offb = t.offb.data();
  const std::int32_t* len = t.len.data();
  const std::uint16_t* code = t.code.data();
  const double* w = t.w.data();
  const std::int64_t* bk = bo.k.data();
  const std::int64_t* bb = bo.b.data();
  // block element bi (row part included) and vector element vi
  auto at = [&](std::int64_t bi, std::int64_t vi, double v, std::int64_t n) {
    if (Sd)
      axpy(dst + vi, src + bi, v, n);
    else
      axpy(dst + bi, src + vi, v, n);
  };
  bool ket_side = true, bra_side = true;  // the ket (bra) as the block side x
  if (hv.cut && hv.hadd > 0 && aligned) {
    // a lower head's kets fill one cell: all inside [a, b) or all outside (bras the same)
    const std::int64_t k = hv.U[0] + hv.hk, m = hv.U[0] + hv.hb;
    ket_side = k >= a && k < b;
    bra_side = m >= a && m < b;
    if (!ket_side && !bra_side) return;
  } else if (hv.cut) {  // a loop may be cut at a range border: the block side inside [a, b)
    const std::int64_t U = hv.U[0];
    for (std::int64_t j = hv.e0; j < hv.e1; ++j) {
      const std::int64_t ok = U + hv.hk + offk[j], ob = U + hv.hb + offb[j], n = len[j];
      const double v = hv.hw * w[j];
      const std::int64_t P = symmap[code[j] + hv.hadd];
      for (int side = 0; side < 2; ++side) {
        const std::int64_t x = side ? ob : ok, y = side ? ok : ob;
        const std::int64_t l0 = std::max<std::int64_t>(0, a - x);
        const std::int64_t l1 = std::min<std::int64_t>(n, b - x);
        if (l0 < l1) at(P * S + x + l0, y + l0, v, l1 - l0);
      }
    }
    return;
  }
  const double hw = hv.hw;
  const std::int64_t hr = head_row(hv.hadd) * S;
  if (!(ket_side && bra_side)) {  // one side only (nU = 1)
    const std::int64_t hk = hv.U[0] + hv.hk, hb = hv.U[0] + hv.hb;
    if (ket_side) {
      for (std::int64_t j = hv.e0; j < hv.e1; ++j)
        at(hr + hk + bk[j], hb + offb[j], hw * w[j], len[j]);
    } else {
      for (std::int64_t j = hv.e0; j < hv.e1; ++j)
        at(hr + hb + bb[j], hk + offk[j], hw * w[j], len[j]);
    }
    return;
  }
  for (std::int64_t u = 0; u < hv.nU; ++u) {
    const std::int64_t hk = hv.U[u] + hv.hk, hb = hv.U[u] + hv.hb;
    for (std::int64_t j = hv.e0; j < hv.e1; ++j) {
      const double v = hw * w[j];
      const std::int64_t n = len[j];
      at(hr + hk + bk[j], hb + offb[j], v, n);
      at(hr + hb + bb[j], hk + offk[j], v, n);
    }
  }
}

// Occupations of the CSFs a .. b - 1 into occ[(k - a) * norb + r].
void occupations(const Drt& drt, std::int64_t a, std::int64_t b, std::vector<std::uint8_t>& occ) {
  const int n = drt.norb;
  occ.resize(static_cast<size_t>(b - a) * n);
  int steps[kMaxOrb], verts[kMaxOrb + 1];
  for (std::int64_t k = a; k < b; ++k) {
    drt.unrank(k, steps, verts);
    for (int r = 0; r < n; ++r)
      occ[(k - a) * n + r] = static_cast<std::uint8_t>((steps[r] + 1) >> 1);
  }
}

}  // namespace

void loop_gather_pairs(const Drt& drt, const LoopTable& lt, const std::int32_t* symmap, int npair,
                       int rows, const double* c, double* T, std::int64_t ld, std::int64_t k0,
                       std::int64_t count, int nthreads) {
  const int n = drt.norb;
  nthreads = threads_or_default(nthreads);
  const std::vector<std::int64_t> cuts = sub_ranges(lt, k0, count);
  const bool aligned = lt.aligned(k0, count);
  const BlockOffsets bo = block_offsets(lt, n, ld);
  const std::int64_t nsub = static_cast<std::int64_t>(cuts.size()) - 1;
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<std::uint8_t> occ;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t s = 0; s < nsub; ++s) {
      const std::int64_t a = cuts[s], b = cuts[s + 1];
      for (int P = 0; P < npair; ++P) std::fill(T + P * ld + (a - k0), T + P * ld + (b - k0), 0.0);
      if (rows > npair) std::copy(c + a, c + b, T + npair * ld + (a - k0));
      occupations(drt, a, b, occ);
      for (int r = 0; r < n; ++r) {
        double* row = T + static_cast<std::int64_t>(symmap[r * n + r]) * ld - k0;
        for (std::int64_t k = a; k < b; ++k) row[k] = occ[(k - a) * n + r] * c[k];
      }
      double* base = T - k0;
      visit_heads(drt, lt, a, b, [&](const HeadVisit& hv) {
        apply_head<0>(lt, hv, bo, symmap, ld, c, base, a, b, aligned);
      });
    }
  }
}

void loop_scatter_pairs(const Drt& drt, const LoopTable& lt, const std::int32_t* symmap, int npair,
                        const double* G, std::int64_t ld, std::int64_t k0, std::int64_t count,
                        double* sigma, int nbuf, int nthreads) {
  const int n = drt.norb;
  const std::int64_t ncsf = drt.ncsf;
  nthreads = threads_or_default(nthreads);
  if (nthreads > nbuf) nthreads = nbuf;
  const std::vector<std::int64_t> cuts = sub_ranges(lt, k0, count);
  const bool aligned = lt.aligned(k0, count);
  const BlockOffsets bo = block_offsets(lt, n, ld);
  const std::int64_t nsub = static_cast<std::int64_t>(cuts.size()) - 1;
  (void)npair;
#pragma omp parallel num_threads(nthreads)
  {
    double* out = sigma + static_cast<std::int64_t>(thread_id()) * ncsf;
    std::vector<std::uint8_t> occ;
#pragma omp for schedule(static, 1)
    for (std::int64_t s = 0; s < nsub; ++s) {
      const std::int64_t a = cuts[s], b = cuts[s + 1];
      occupations(drt, a, b, occ);
      for (int r = 0; r < n; ++r) {
        const double* g = G + static_cast<std::int64_t>(symmap[r * n + r]) * ld - k0;
        for (std::int64_t k = a; k < b; ++k) out[k] += occ[(k - a) * n + r] * g[k];
      }
      // G's columns are the range [a, b) here: sigma_m += w G[P, k]
      visit_heads(drt, lt, a, b, [&](const HeadVisit& hv) {
        apply_head<1>(lt, hv, bo, symmap, ld, G - k0, out, a, b, aligned);
      });
    }
  }
}

void loop_sigma(const Drt& drt, const LoopTable& lt, const std::int32_t* symmap, int npair,
                const double* c, int rows, const double* W1, int mid, const double* W2,
                double* sigma, int nbuf, int nthreads, Dgemm gemm, std::int64_t range,
                double* first) {
  const int n = drt.norb;
  const std::int64_t ncsf = drt.ncsf;
  nthreads = threads_or_default(nthreads);
  if (nthreads > nbuf) nthreads = nbuf;
  const std::vector<std::int64_t> cuts = sub_ranges(lt, 0, ncsf, range);
  const bool aligned = lt.aligned(0, ncsf);
  const std::int64_t nsub = static_cast<std::int64_t>(cuts.size()) - 1;
  std::int64_t widest = 0;
  for (std::int64_t s = 0; s < nsub; ++s) widest = std::max(widest, cuts[s + 1] - cuts[s]);
  const int m1 = W2 ? mid : npair;         // rows of W1 T
  const int S = static_cast<int>(widest);  // the row stride of T, X and G
  const BlockOffsets bo = block_offsets(lt, n, S);
#pragma omp parallel num_threads(nthreads)
  {
    const std::int64_t tid = thread_id();
    double* out = !first ? sigma + tid * ncsf : tid == 0 ? first : sigma + (tid - 1) * ncsf;
    std::vector<double> T(static_cast<size_t>(rows * widest)),
        G(static_cast<size_t>(npair * widest));
    std::vector<double> X(W2 ? static_cast<size_t>(mid * widest) : 0);
    std::vector<std::uint8_t> occ;
    const double one = 1.0, zero = 0.0;
    // a static schedule: every buffer adds the same terms in the same order on every call
#pragma omp for schedule(static, 1)
    for (std::int64_t s = 0; s < nsub; ++s) {
      const std::int64_t a = cuts[s], b = cuts[s + 1], R = b - a;
      const int r32 = static_cast<int>(R);
      // 1. T (rows x R, row stride S): pair rows from the loops, n_r c_k, and c_k in row npair
      for (int P = 0; P < rows; ++P)
        std::fill(T.data() + P * widest, T.data() + P * widest + R, 0.0);
      if (rows > npair) std::copy(c + a, c + b, T.data() + npair * widest);
      occupations(drt, a, b, occ);
      for (int r = 0; r < n; ++r) {
        double* row = T.data() + static_cast<std::int64_t>(symmap[r * n + r]) * S - a;
        for (std::int64_t k = a; k < b; ++k) row[k] = occ[(k - a) * n + r] * c[k];
      }
      double* tb = T.data() - a;
      visit_heads(drt, lt, a, b, [&](const HeadVisit& hv) {
        apply_head<0>(lt, hv, bo, symmap, S, c, tb, a, b, aligned);
      });
      // 2. G = W1 T (or W2 (W1 T)): column-major, G^T = T^T W1^T
      if (W2) {
        gemm("N", "N", &r32, &m1, &rows, &one, T.data(), &S, W1, &rows, &zero, X.data(), &S);
        gemm("N", "N", &r32, &npair, &mid, &one, X.data(), &S, W2, &mid, &zero, G.data(), &S);
      } else {
        gemm("N", "N", &r32, &npair, &rows, &one, T.data(), &S, W1, &rows, &zero, G.data(), &S);
      }
      // 3. sigma_k += sum_r n_r G[P(r,r), k]; sigma_m += w G[P, k] over the loops
      for (int r = 0; r < n; ++r) {
        const double* g = G.data() + static_cast<std::int64_t>(symmap[r * n + r]) * S - a;
        for (std::int64_t k = a; k < b; ++k) out[k] += occ[(k - a) * n + r] * g[k];
      }
      const double* gb = G.data() - a;
      visit_heads(drt, lt, a, b, [&](const HeadVisit& hv) {
        apply_head<1>(lt, hv, bo, symmap, S, gb, out, a, b, aligned);
      });
    }
  }
}

void loop_exchange_diagonal(const Drt& drt, const LoopTable& lt, const double* K, double* out,
                            std::int64_t k0, std::int64_t count, int nthreads) {
  const int n = drt.norb;
  nthreads = threads_or_default(nthreads);
  const std::vector<std::int64_t> cuts = sub_ranges(lt, k0, count);
  const bool aligned = lt.aligned(k0, count);
  const std::int64_t nsub = static_cast<std::int64_t>(cuts.size()) - 1;
  std::fill(out, out + count, 0.0);
  // K by code for each side (code = lo n + hi): no division per coupling
  std::vector<double> Ks(2 * static_cast<size_t>(n) * n);
  for (int lo = 0; lo < n; ++lo)
    for (int hi = 0; hi < n; ++hi) {
      Ks[lo * n + hi] = K[lo * n + hi];
      Ks[n * n + lo * n + hi] = K[hi * n + lo];
    }
  const double* ks = Ks.data();
#pragma omp parallel for schedule(dynamic, 1) num_threads(nthreads)
  for (std::int64_t s = 0; s < nsub; ++s) {
    const std::int64_t a = cuts[s], b = cuts[s + 1];
    visit_range(drt, lt, a, b,
                [&](int code, double w, int side, std::int64_t o, std::int64_t, std::int64_t l0,
                    std::int64_t l1) {
                  const double v = w * w * ks[side * n * n + code];
                  double* dst = out + o - k0;
                  for (std::int64_t l = l0; l < l1; ++l) dst[l] += v;
                });
  }
}

void loop_gather_generators(const Drt& drt, const LoopTable& lt, const double* c, double* t,
                            std::int64_t k0, std::int64_t count, int nthreads) {
  const int n = drt.norb;
  const std::int64_t nn = static_cast<std::int64_t>(n) * n;
  nthreads = threads_or_default(nthreads);
  const std::vector<std::int64_t> cuts = sub_ranges(lt, k0, count);
  const bool aligned = lt.aligned(k0, count);
  const std::int64_t nsub = static_cast<std::int64_t>(cuts.size()) - 1;
#pragma omp parallel num_threads(nthreads)
  {
    std::vector<std::uint8_t> occ;
#pragma omp for schedule(dynamic, 1)
    for (std::int64_t s = 0; s < nsub; ++s) {
      const std::int64_t a = cuts[s], b = cuts[s + 1];
      std::fill(t + (a - k0) * nn, t + (b - k0) * nn, 0.0);
      occupations(drt, a, b, occ);
      for (std::int64_t k = a; k < b; ++k)
        for (int r = 0; r < n; ++r) t[(k - k0) * nn + r * n + r] = occ[(k - a) * n + r] * c[k];
      // ket side: <in|E_{lo,hi}|out> is a term of (E_{hi,lo} c)_out; bra side of (E_{lo,hi} c)
      visit_range(drt, lt, a, b,
                  [&](int code, double v, int side, std::int64_t o, std::int64_t in,
                      std::int64_t l0, std::int64_t l1) {
                    const int lo = code / n, hi = code % n;
                    const std::int64_t col = side ? lo * n + hi : hi * n + lo;
                    double* dst = t + (o - k0) * nn + col;
                    const double* src = c + in;
                    for (std::int64_t l = l0; l < l1; ++l) dst[l * nn] += v * src[l];
                  });
    }
  }
}

}  // namespace guga
}  // namespace csk
