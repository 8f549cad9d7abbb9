// Coupled-configuration generation and Hamiltonian assembly on the CPU (OpenMP over sources).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "kernels.hpp"

#ifdef CSK_HAVE_OPENMP
#include <omp.h>
#endif

namespace csk {

int max_threads() {
#ifdef CSK_HAVE_OPENMP
  return omp_get_max_threads();
#else
  return 1;
#endif
}

int thread_id() {
#ifdef CSK_HAVE_OPENMP
  return omp_get_thread_num();
#else
  return 0;
#endif
}

namespace {

// Calls emit(y, value) for every single and double excitation y of x with |<y|H|x>| > eps.
// The double table is sorted by |<ab||ij>|, so the walk over a pair stops at the first entry
// at or below eps.
template <class Emit>
void for_each_coupled(const Hamiltonian& Hm, const HamiltonianView& H, const std::uint64_t* x,
                      int nw, double eps, Emit&& emit) {
  int occ[64 * kMaxWords];
  std::uint64_t y[kMaxWords];
  const int n = occupied_list(x, nw, occ);
  const int nso = Hm.n_spin_orbitals();
  for (int u = 0; u < n; ++u) {
    const int i = occ[u];
    for (int a = i & 1; a < nso; a += 2) {
      if (a == i || test_bit(x, a)) continue;
      const double v = single_element(H, x, occ, n, i, a);
      if (std::fabs(v) > eps) {
        std::memcpy(y, x, sizeof(std::uint64_t) * nw);
        flip_bit(y, i);
        flip_bit(y, a);
        emit(y, v);
      }
    }
  }
  // Doubles. Per occupied pair, either walk its table (sorted by |<ab||ij>|, stops at eps) or,
  // when the source has fewer empty target pairs than the table has entries (nearly-full
  // spaces), loop over the empty pairs directly. Both give the same set and the same values.
  int vir[2][64 * kMaxWords], nv[2] = {0, 0};
  for (int k = 0; k < nso; ++k)
    if (!test_bit(x, k)) vir[k & 1][nv[k & 1]++] = k;
  const std::int64_t n_same[2] = {static_cast<std::int64_t>(nv[0]) * (nv[0] - 1) / 2,
                                  static_cast<std::int64_t>(nv[1]) * (nv[1] - 1) / 2};
  const std::int64_t n_mixed = static_cast<std::int64_t>(nv[0]) * nv[1];
  const DoubleTable& T = Hm.doubles();
  auto emit_double = [&](int i, int j, int a, int b, double g) {
    std::memcpy(y, x, sizeof(std::uint64_t) * nw);
    flip_bit(y, i);
    flip_bit(y, j);
    flip_bit(y, a);
    flip_bit(y, b);
    emit(y, double_sign(x, i, j, a, b) * g);
  };
  for (int u = 1; u < n; ++u) {
    const int j = occ[u];
    for (int v = 0; v < u; ++v) {
      const int i = occ[v];
      const std::int64_t pid = Hamiltonian::pair_id(i, j);
      const std::int64_t t0 = T.offsets[pid], t1 = T.offsets[pid + 1];
      const bool same = ((i ^ j) & 1) == 0;
      const std::int64_t n_direct = same ? n_same[i & 1] : n_mixed;
      if (n_direct < t1 - t0) {
        if (same) {
          const int* vs = vir[i & 1];
          const int m = nv[i & 1];
          for (int q = 1; q < m; ++q)
            for (int p = 0; p < q; ++p) {
              const double g = H.antisym(vs[p], vs[q], i, j);
              if (std::fabs(g) > eps) emit_double(i, j, vs[p], vs[q], g);
            }
        } else {
          for (int p = 0; p < nv[0]; ++p)
            for (int q = 0; q < nv[1]; ++q) {
              const int a = vir[0][p] < vir[1][q] ? vir[0][p] : vir[1][q];
              const int b = vir[0][p] < vir[1][q] ? vir[1][q] : vir[0][p];
              const double g = H.antisym(a, b, i, j);
              if (std::fabs(g) > eps) emit_double(i, j, a, b, g);
            }
        }
        continue;
      }
      for (std::int64_t k = t0; k < t1; ++k) {
        const double g = T.values[k];
        if (std::fabs(g) <= eps) break;
        const int a = T.targets[k] & 0xFFFF, b = T.targets[k] >> 16;
        if (test_bit(x, a) || test_bit(x, b)) continue;
        emit_double(i, j, a, b, g);
      }
    }
  }
}

void check_eps(const Hamiltonian& H, double eps) {
  if (eps < H.table_eps())
    throw std::invalid_argument("eps is below the threshold the excitation tables were built with");
}

constexpr std::int64_t kChunk = 32;  // sources per work item: small enough to balance 2 cores

}  // namespace

void diagonal_energies(const Hamiltonian& Hm, const std::uint64_t* configs, std::int64_t n,
                       double* out) {
  const HamiltonianView H = Hm.view();
  const int nw = Hm.nwords();
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < n; ++r) {
    int occ[64 * kMaxWords];
    const int ne = occupied_list(configs + r * nw, nw, occ);
    out[r] = diagonal_element(H, occ, ne);
  }
}

void matrix_elements(const Hamiltonian& Hm, const std::uint64_t* bra, const std::uint64_t* ket,
                     std::int64_t n, double* out) {
  const HamiltonianView H = Hm.view();
  const int nw = Hm.nwords();
#pragma omp parallel for schedule(static)
  for (std::int64_t r = 0; r < n; ++r) out[r] = matrix_element(H, bra + r * nw, ket + r * nw, nw);
}

void coupled_counts(const Hamiltonian& Hm, const std::uint64_t* configs, std::int64_t n, double eps,
                    std::int64_t* out) {
  check_eps(Hm, eps);
  const HamiltonianView H = Hm.view();
  const int nw = Hm.nwords();
#pragma omp parallel for schedule(dynamic, kChunk)
  for (std::int64_t r = 0; r < n; ++r) {
    std::int64_t c = 0;
    for_each_coupled(Hm, H, configs + r * nw, nw, eps, [&](const std::uint64_t*, double) { ++c; });
    out[r] = c;
  }
}

CoupledSet coupled_configurations(const Hamiltonian& Hm, const std::uint64_t* configs,
                                  std::int64_t n, double eps) {
  // Count, prefix-sum, then write every coupled configuration straight into its final slot:
  // deterministic order (by source, then generation order) and no intermediate copies.
  std::vector<std::int64_t> offsets(n + 1, 0);
  coupled_counts(Hm, configs, n, eps, offsets.data() + 1);
  for (std::int64_t r = 0; r < n; ++r) offsets[r + 1] += offsets[r];
  const HamiltonianView H = Hm.view();
  const int nw = Hm.nwords();
  const std::int64_t m = offsets[n];
  CoupledSet out;
  out.source = Buffer<std::int64_t>(m);
  out.configs = Buffer<std::uint64_t>(static_cast<std::size_t>(m) * nw);
  out.values = Buffer<double>(m);
#pragma omp parallel for schedule(dynamic, kChunk)
  for (std::int64_t r = 0; r < n; ++r) {
    std::int64_t k = offsets[r];
    for_each_coupled(Hm, H, configs + r * nw, nw, eps, [&](const std::uint64_t* y, double v) {
      out.source.data[k] = r;
      std::memcpy(out.configs.data.get() + k * nw, y, sizeof(std::uint64_t) * nw);
      out.values.data[k] = v;
      ++k;
    });
  }
  return out;
}

namespace {

template <class Lookup>
CsrMatrix hamiltonian_csr_impl(const Hamiltonian& Hm, const std::uint64_t* space, std::int64_t n,
                               double eps, bool upper, const Lookup& index) {
  const HamiltonianView H = Hm.view();
  const int nw = Hm.nwords();
  // Two passes (count, then fill in place) so that peak memory is the matrix itself.
  CsrMatrix m;
  m.indptr.assign(n + 1, 0);
  auto visit_row = [&](std::int64_t r, auto&& take) {
    const std::uint64_t* x = space + r * nw;
    int occ[64 * kMaxWords];
    const int ne = occupied_list(x, nw, occ);
    take(r, diagonal_element(H, occ, ne));
    for_each_coupled(Hm, H, x, nw, eps, [&](const std::uint64_t* y, double v) {
      const std::int64_t k = index.find(y);
      if (k >= 0 && (!upper || k > r)) take(k, v);
    });
  };
#pragma omp parallel for schedule(dynamic, kChunk)
  for (std::int64_t r = 0; r < n; ++r) {
    std::int64_t c = 0;
    visit_row(r, [&](std::int64_t, double) { ++c; });
    m.indptr[r + 1] = c;
  }
  for (std::int64_t r = 0; r < n; ++r) m.indptr[r + 1] += m.indptr[r];
  m.indices.resize(m.indptr[n]);
  m.data.resize(m.indptr[n]);
#pragma omp parallel
  {
    std::vector<std::pair<std::int32_t, double>> row;
#pragma omp for schedule(dynamic, kChunk)
    for (std::int64_t r = 0; r < n; ++r) {
      row.clear();
      visit_row(
          r, [&](std::int64_t k, double v) { row.emplace_back(static_cast<std::int32_t>(k), v); });
      std::sort(row.begin(), row.end());
      std::int64_t o = m.indptr[r];
      for (auto& e : row) {
        m.indices[o] = e.first;
        m.data[o++] = e.second;
      }
    }
  }
  return m;
}

}  // namespace

CsrMatrix hamiltonian_csr(const Hamiltonian& Hm, const std::uint64_t* space, std::int64_t n,
                          double eps, bool upper, const SectorIndex* sector) {
  check_eps(Hm, eps);
  if (sector) return hamiltonian_csr_impl(Hm, space, n, eps, upper, *sector);
  KeyIndex index(space, n, Hm.nwords());
  if (index.has_duplicates())
    throw std::invalid_argument("the space holds duplicate configurations");
  return hamiltonian_csr_impl(Hm, space, n, eps, upper, index);
}

SectorIndex::SectorIndex(int norb, int nalpha, int nbeta)
    : norb_(norb), nalpha_(nalpha), nbeta_(nbeta) {
  if (nalpha < 0 || nbeta < 0 || nalpha > norb || nbeta > norb)
    throw std::invalid_argument("electrons do not fit in the orbitals");
  binom_.assign(static_cast<std::size_t>(norb + 1) * (norb + 1), 0);
  for (int m = 0; m <= norb; ++m) {
    binom_[m * (norb + 1)] = 1;
    for (int k = 1; k <= m; ++k)
      binom_[m * (norb + 1) + k] = binom_[(m - 1) * (norb + 1) + k - 1] +
                                   (k <= m - 1 ? binom_[(m - 1) * (norb + 1) + k] : 0);
  }
  n_alpha_strings_ = C(norb, nalpha);
  n_beta_strings_ = C(norb, nbeta);
}

std::int64_t SectorIndex::rank(const std::uint64_t* x, int nwords) const {
  std::int64_t ra = 0, rb = 0;
  int ka = 0, kb = 0;
  for (int w = 0; w < nwords; ++w) {
    std::uint64_t v = x[w];
    while (v) {
      const int bit = (w << 6) + ctz64(v);
      v &= v - 1;
      if (bit & 1)
        rb += C(bit >> 1, ++kb);
      else
        ra += C(bit >> 1, ++ka);
    }
  }
  return ra * n_beta_strings_ + rb;
}

void SectorIndex::attach(const std::uint64_t* configs, std::int64_t n, int nwords) {
  if (n != size()) throw std::invalid_argument("the configurations are not the whole sector");
  nwords_ = nwords;
  row_of_rank_.assign(n, -1);
  for (std::int64_t r = 0; r < n; ++r) {
    const std::uint64_t* x = configs + r * nwords;
    int na = 0, nb = 0;
    for (int w = 0; w < nwords; ++w) {
      na += popcount64(x[w] & 0x5555555555555555ULL);
      nb += popcount64(x[w] & 0xAAAAAAAAAAAAAAAAULL);
    }
    if (na != nalpha_ || nb != nbeta_)
      throw std::invalid_argument("a configuration lies outside the sector");
    std::int64_t& slot = row_of_rank_[rank(x, nwords)];
    if (slot >= 0) throw std::invalid_argument("the sector holds duplicate configurations");
    slot = r;
  }
}

void symmetric_csr_matvec(const std::int64_t* indptr, const std::int32_t* indices,
                          const double* data, std::int64_t n, const double* x, int k, double* y) {
  // y = (U + U^T - D) x for the upper triangle U (diagonal included); x, y are (n, k) row-major.
  const int nt = max_threads();
  std::vector<double> priv(static_cast<std::size_t>(nt) * n * k, 0.0);
#pragma omp parallel num_threads(nt)
  {
    const int t = thread_id();
    double* yt = priv.data() + static_cast<std::size_t>(t) * n * k;
#pragma omp for schedule(dynamic, 256)
    for (std::int64_t r = 0; r < n; ++r) {
      const double* xr = x + r * k;
      for (std::int64_t e = indptr[r]; e < indptr[r + 1]; ++e) {
        const std::int64_t c = indices[e];
        const double a = data[e];
        const double* xc = x + c * k;
        double* yr = yt + r * k;
        for (int q = 0; q < k; ++q) yr[q] += a * xc[q];
        if (c != r) {
          double* yc = yt + c * k;
          for (int q = 0; q < k; ++q) yc[q] += a * xr[q];
        }
      }
    }
#pragma omp for schedule(static)
    for (std::int64_t i = 0; i < n * k; ++i) {
      double s = 0.0;
      for (int u = 0; u < nt; ++u) s += priv[static_cast<std::size_t>(u) * n * k + i];
      y[i] = s;
    }
  }
}

}  // namespace csk
