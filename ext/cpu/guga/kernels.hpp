// GUGA CI kernels of the CPU extension: the DRT as flat arrays, step vectors of CSFs by index,
// the one-body coupling lists <m|E_pq|n> by loop search (remembered across kets that share the walk
// above the start orbital; one pass, or count then write), and the gathers and scatters of the
// operator-direct sigma, the diagonal and the density matrices over those lists.
#pragma once
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
};

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
