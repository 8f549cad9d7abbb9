// GUGA CI kernels of the CPU extension: the DRT as flat arrays, step vectors of CSFs by index,
// and the gathers and scatters of the operator-direct sigma, the diagonal and the density
// matrices in two forms: loop-driven (the loops between vertex pairs, enumerated once per DRT and
// applied to every upper walk as contiguous ranges of CSFs; nothing stored per ket) and over
// per-ket coupling lists <m|E_pq|n> (loop search per ket, remembered across kets that share the
// walk above the start orbital; one pass, or count then write).
#pragma once
#include <cuscikit/guga_loops.hpp>

#include <cstdint>
#include <vector>

#include "../threads.hpp"

namespace csk {
namespace guga {

// A DRT as built in Python: vertices numbered from the head; arrays per vertex.
struct Drt {
  int norb = 0;
  int nvert = 0;
  int head = 0;
  std::int64_t ncsf = 0;
  std::vector<std::int32_t> up;    // (nvert, 4): upper vertex along step d, -1 if none
  std::vector<std::int32_t> down;  // (nvert, 4): lower vertex along step d, -1 if none
  std::vector<std::int32_t> b;     // (nvert): 2S of the vertex
  std::vector<std::int64_t> L;     // (nvert): walks from the tail to the vertex
  std::vector<std::int64_t> y;     // (nvert, 4): arc weights, sum of L below step d
  int bmax = 0;
  std::vector<double> seg;  // segment values (guga_segments.hpp's table)

  void finish();  // fill the segment table once the arrays are set
  // Steps (orbital 0 first) and vertices (level 0..norb) of the CSF of index r.
  void unrank(std::int64_t r, int* steps, int* verts) const;
  DrtView view() const;  // for the shared loop search (guga_loops.hpp)
};

// Every raising loop of the DRT (guga_loops.hpp's for_each_loop_from over all bottom vertices),
// factored at the level `split`: a loop that crosses it is a lower part (start segment and the
// middle segments below) times an upper part, each stored once per pair of open vertices there,
// so the table grows with the sum, not the product, of the two. Heads are grouped by top vertex
// vt; head h couples, for every upper walk U of vt (index parts `uoff`, ascending) and every entry
// e of e0[h] .. e1[h] - 1, the ket U + hoffk[h] + offk[e] + l with the bra U + hoffb[h] + offb[e]
// + l, l = 0 .. len[e] - 1, by hw[h] w[e] = <bra|E_{lo,hi}|ket>, code[e] + hadd[h] = lo * norb +
// hi. A loop that does not cross the split is an entry of its top vertex's plain head (offsets
// 0, value 1, hadd 0).
struct LoopTable {
  int split = -1;
  std::vector<std::int32_t> tops;    // the top vertices
  std::vector<std::int64_t> hfirst;  // heads of tops[i]: hfirst[i] .. hfirst[i + 1] - 1
  std::vector<std::int64_t> ufirst;  // upper walks of tops[i]: ufirst[i] .. ufirst[i + 1] - 1
  std::vector<std::int64_t> uoff;    // their index parts, ascending per top vertex
  std::vector<std::int32_t> hoffk, hoffb, hadd;
  std::vector<std::int64_t> e0, e1;
  std::vector<std::int64_t> hspank, hspanb;  // the CSFs below the open pair: L[kv], L[bv]
  std::vector<double> hw;
  std::vector<std::int32_t> offk, offb, len;  // entries
  std::vector<std::uint16_t> code;
  std::vector<double> w;
  std::vector<std::int64_t> cells;  // first CSF of every walk from the head to level split
  std::int64_t nloops = 0;          // loops represented (products of parts counted)
  std::int64_t total = 0;           // CSFs
  std::int64_t bytes() const;
  // k0 and k0 + count are cell borders (or the CSF count): the kernels need not cut loops
  bool aligned(std::int64_t k0, std::int64_t count) const;
};
// split < 0: choose the level that keeps the table smallest; split = 0: no split.
LoopTable build_loops(const Drt& drt, int split = -1);

// Loop-driven kernels over the CSFs k0 .. k0 + count - 1, in column form (row P of T or G holds
// pair P of those CSFs, row stride ld): every output range of kSub CSFs is written by one thread.
// T[P, k] = ((E_pq + E_qp) c)_k, T[P(r,r), k] = n_r(k) c_k; row npair = c_k when rows > npair.
void loop_gather_pairs(const Drt& drt, const LoopTable& lt, const std::int32_t* symmap, int npair,
                       int rows, const double* c, double* T, std::int64_t ld, std::int64_t k0,
                       std::int64_t count, int nthreads);
// sigma_m += sum_P <m|E^sym_P|k> G[P, k] over the CSFs k of the block; `sigma` holds nbuf
// buffers of ncsf entries, one per thread (the caller sums them); a static schedule keeps the
// sum bitwise reproducible for a thread count.
void loop_scatter_pairs(const Drt& drt, const LoopTable& lt, const std::int32_t* symmap, int npair,
                        const double* G, std::int64_t ld, std::int64_t k0, std::int64_t count,
                        double* sigma, int nbuf, int nthreads);
// Fortran BLAS dgemm (column-major), as scipy.linalg.cython_blas exports it.
using Dgemm = void (*)(const char*, const char*, const int*, const int*, const int*, const double*,
                       const double*, const int*, const double*, const int*, const double*, double*,
                       const int*);
// The whole loop-driven sigma in one pass over output ranges of about `range` CSFs (cell
// borders), each range by one thread from start to end: T of the range (rows x R, as
// loop_gather_pairs; rows = npair, or npair + 1 with c_k in the last row), G = W1 T (W1 row-major
// npair x rows) or G = W2 (W1 T) (W1 mid x rows, W2 npair x mid) by `gemm` on the thread, then
// sigma += the scatter of G (as loop_scatter_pairs) into the thread's buffer (nbuf of ncsf).
// With `first` (ncsf entries), thread 0 adds into it and thread t > 0 into row t - 1 of sigma
// (nbuf - 1 rows): the caller's result vector serves as one of the buffers.
// T and G stay in the thread's cache, the range's occupations are found once, and there is no
// barrier between the steps. The caller keeps the BLAS at one thread.
void loop_sigma(const Drt& drt, const LoopTable& lt, const std::int32_t* symmap, int npair,
                const double* c, int rows, const double* W1, int mid, const double* W2,
                double* sigma, int nbuf, int nthreads, Dgemm gemm, std::int64_t range,
                double* first = nullptr);
// out[k - k0] = sum of <m|E_pq|k>^2 K[p, q] over p != q.
void loop_exchange_diagonal(const Drt& drt, const LoopTable& lt, const double* K, double* out,
                            std::int64_t k0, std::int64_t count, int nthreads);
// t[k - k0, r * norb + s] = (E_rs c)_k.
void loop_gather_generators(const Drt& drt, const LoopTable& lt, const double* c, double* t,
                            std::int64_t k0, std::int64_t count, int nthreads);

// Coupling lists of the kets k0 .. k0 + count - 1 in CSR form: row k holds every (m, code, w)
// with w = <m|E_pq|k0 + k>, code = p * norb + q, p != q.
struct Lists {
  std::vector<std::int64_t> offsets;  // count + 1
  std::vector<std::int32_t> bra;
  std::vector<std::uint16_t> code;
  std::vector<double> w;
};

// counts: the entries per ket (count_lists) when known, else nullptr (one loop search per ket
// into per-thread buffers, then copied into place).
Lists build_lists(const Drt& drt, std::int64_t k0, std::int64_t count, int nthreads,
                  const std::int64_t* counts = nullptr);
std::vector<std::int64_t> count_lists(const Drt& drt, std::int64_t k0, std::int64_t count,
                                      int nthreads);
std::vector<std::uint8_t> csf_steps(const Drt& drt, std::int64_t k0, std::int64_t count,
                                    int nthreads);

// Kernels over the lists of one block of kets (k = 0 .. count - 1 is CSF k0 + k; `steps` are
// theirs, (count, norb)). symmap maps code p * norb + q (and r * norb + r) to the symmetric pair
// index P in 0 .. npair - 1.
struct BlockView {
  const std::int64_t* offsets;
  const std::int32_t* bra;
  const std::uint16_t* code;
  const double* w;
  const std::uint8_t* steps;
  std::int64_t k0;
  std::int64_t count;
};

// T[k, P(p,q)] = ((E_pq + E_qp) c)_k for p != q, T[k, P(r,r)] = n_r(k) c_k; rows of length
// ld >= npair, and T[k, npair] = c_k when ld > npair.
void gather_pairs(const Drt& drt, const BlockView& v, const std::int32_t* symmap, int npair,
                  const double* c, double* T, int ld, int nthreads);
// sigma_m += sum_P <m|E^sym_P|k> G[k, P] over the kets k of the block. `sigma` holds nbuf
// buffers of ncsf entries, one per thread (no races; the caller sums them), at most nbuf threads.
void scatter_pairs(const Drt& drt, const BlockView& v, const std::int32_t* symmap, int npair,
                   const double* G, double* sigma, std::int64_t ncsf, int nbuf, int nthreads);
// t[k, r * norb + s] = (E_rs c)_k for every (r, s).
void gather_generators(const Drt& drt, const BlockView& v, const double* c, double* t,
                       int nthreads);
// out[k] = sum over the entries of ket k of w^2 K[code].
void exchange_diagonal(const Drt& drt, const BlockView& v, const double* K, double* out,
                       int nthreads);

}  // namespace guga
}  // namespace csk
