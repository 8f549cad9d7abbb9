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
  const DoubleTable& T = Hm.doubles();
  for (int u = 1; u < n; ++u) {
    const int j = occ[u];
    for (int v = 0; v < u; ++v) {
      const int i = occ[v];
      const std::int64_t pid = Hamiltonian::pair_id(i, j);
      for (std::int64_t k = T.offsets[pid]; k < T.offsets[pid + 1]; ++k) {
        const double g = T.values[k];
        if (std::fabs(g) <= eps) break;
        const int a = T.targets[k] & 0xFFFF, b = T.targets[k] >> 16;
        if (test_bit(x, a) || test_bit(x, b)) continue;
        std::memcpy(y, x, sizeof(std::uint64_t) * nw);
        flip_bit(y, i);
        flip_bit(y, j);
        flip_bit(y, a);
        flip_bit(y, b);
        emit(y, double_sign(x, i, j, a, b) * g);
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

void coupled_counts(const Hamiltonian& Hm, const std::uint64_t* configs, std::int64_t n,
                    double eps, std::int64_t* out) {
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
  check_eps(Hm, eps);
  const HamiltonianView H = Hm.view();
  const int nw = Hm.nwords();
  const std::int64_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<CoupledSet> parts(nchunks);
  // Chunks are processed in any order but concatenated in source order: deterministic output.
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t c = 0; c < nchunks; ++c) {
    CoupledSet& p = parts[c];
    for (std::int64_t r = c * kChunk; r < std::min(n, (c + 1) * kChunk); ++r) {
      for_each_coupled(Hm, H, configs + r * nw, nw, eps, [&](const std::uint64_t* y, double v) {
        p.source.push_back(r);
        p.configs.insert(p.configs.end(), y, y + nw);
        p.values.push_back(v);
      });
    }
  }
  std::vector<std::int64_t> off(nchunks + 1, 0);
  for (std::int64_t c = 0; c < nchunks; ++c)
    off[c + 1] = off[c] + static_cast<std::int64_t>(parts[c].values.size());
  CoupledSet out;
  out.source.resize(off[nchunks]);
  out.configs.resize(off[nchunks] * nw);
  out.values.resize(off[nchunks]);
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t c = 0; c < nchunks; ++c) {
    std::copy(parts[c].source.begin(), parts[c].source.end(), out.source.begin() + off[c]);
    std::copy(parts[c].configs.begin(), parts[c].configs.end(), out.configs.begin() + off[c] * nw);
    std::copy(parts[c].values.begin(), parts[c].values.end(), out.values.begin() + off[c]);
    CoupledSet().source.swap(parts[c].source);  // free early: peak memory stays ~2x the output
    CoupledSet().configs.swap(parts[c].configs);
    CoupledSet().values.swap(parts[c].values);
  }
  return out;
}

CsrMatrix hamiltonian_csr(const Hamiltonian& Hm, const std::uint64_t* space, std::int64_t n,
                          double eps) {
  check_eps(Hm, eps);
  const HamiltonianView H = Hm.view();
  const int nw = Hm.nwords();
  KeyIndex index(space, n, nw);
  if (index.has_duplicates()) throw std::invalid_argument("the space holds duplicate configurations");
  const std::int64_t nchunks = (n + kChunk - 1) / kChunk;
  std::vector<std::vector<std::int64_t>> cols(nchunks);
  std::vector<std::vector<double>> vals(nchunks);
  std::vector<std::int64_t> rowlen(n);
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t c = 0; c < nchunks; ++c) {
    std::vector<std::pair<std::int64_t, double>> row;
    for (std::int64_t r = c * kChunk; r < std::min(n, (c + 1) * kChunk); ++r) {
      const std::uint64_t* x = space + r * nw;
      row.clear();
      int occ[64 * kMaxWords];
      const int ne = occupied_list(x, nw, occ);
      row.emplace_back(r, diagonal_element(H, occ, ne));
      for_each_coupled(Hm, H, x, nw, eps, [&](const std::uint64_t* y, double v) {
        const std::int64_t k = index.find(y);
        if (k >= 0) row.emplace_back(k, v);
      });
      std::sort(row.begin(), row.end());
      rowlen[r] = static_cast<std::int64_t>(row.size());
      for (auto& e : row) {
        cols[c].push_back(e.first);
        vals[c].push_back(e.second);
      }
    }
  }
  CsrMatrix m;
  m.indptr.assign(n + 1, 0);
  for (std::int64_t r = 0; r < n; ++r) m.indptr[r + 1] = m.indptr[r] + rowlen[r];
  m.indices.resize(m.indptr[n]);
  m.data.resize(m.indptr[n]);
#pragma omp parallel for schedule(dynamic, 1)
  for (std::int64_t c = 0; c < nchunks; ++c) {
    const std::int64_t o = m.indptr[c * kChunk];
    std::copy(cols[c].begin(), cols[c].end(), m.indices.begin() + o);
    std::copy(vals[c].begin(), vals[c].end(), m.data.begin() + o);
    std::vector<std::int64_t>().swap(cols[c]);
    std::vector<double>().swap(vals[c]);
  }
  return m;
}

}  // namespace csk
