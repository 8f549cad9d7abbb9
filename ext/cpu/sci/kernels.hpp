// CPU kernels over configuration arrays (row-major uint64[n, nwords]).
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "../threads.hpp"

#include "hamiltonian.hpp"

namespace csk {

// An uninitialised heap array: large outputs are written once, never zero-filled first.
template <typename T>
struct Buffer {
  std::unique_ptr<T[]> data;
  std::size_t size = 0;
  explicit Buffer(std::size_t n = 0) : data(n ? new T[n] : nullptr), size(n) {}
};

struct CoupledSet {
  Buffer<std::int64_t> source;    // index of the source configuration
  Buffer<std::uint64_t> configs;  // [m, nwords]
  Buffer<double> values;          // H_{x' x}
};

struct CsrMatrix {
  std::vector<std::int64_t> indptr;
  std::vector<std::int32_t> indices;
  std::vector<double> data;
};

struct UniqueResult {
  std::vector<std::uint64_t> keys;    // [u, nwords], sorted
  std::vector<std::int64_t> inverse;  // [n]
  std::vector<std::int64_t> counts;   // [u]
};

// Open-addressing hash index over the rows of a key array (which must outlive it).
class KeyIndex {
 public:
  KeyIndex(const std::uint64_t* keys, std::int64_t n, int nwords);
  std::int64_t find(const std::uint64_t* q) const;
  bool has_duplicates() const { return duplicates_; }

 private:
  const std::uint64_t* keys_;
  int nwords_;
  std::uint64_t mask_;
  std::vector<std::int64_t> slots_;
  bool duplicates_ = false;
};

// Constant-time index of a complete (n_alpha, n_beta) sector: alpha and beta strings are ranked
// in the combinatorial number system, rank = rank_alpha * n_beta_strings + rank_beta, and a
// table maps ranks to rows of the caller's array (any order).
class SectorIndex {
 public:
  SectorIndex(int norb, int nalpha, int nbeta);
  std::int64_t size() const { return n_alpha_strings_ * n_beta_strings_; }
  std::int64_t rank(const std::uint64_t* x, int nwords) const;
  // Maps ranks to rows of `configs`; throws unless `configs` is exactly the whole sector.
  void attach(const std::uint64_t* configs, std::int64_t n, int nwords);
  std::int64_t find(const std::uint64_t* q) const { return row_of_rank_[rank(q, nwords_)]; }

 private:
  int norb_, nalpha_, nbeta_, nwords_ = 1;
  std::vector<std::int64_t> binom_;  // binom_[m * (norb_ + 1) + k] = C(m, k)
  std::int64_t n_alpha_strings_, n_beta_strings_;
  std::vector<std::int64_t> row_of_rank_;
  std::int64_t C(int m, int k) const { return binom_[m * (norb_ + 1) + k]; }
};

void diagonal_energies(const Hamiltonian& H, const std::uint64_t* configs, std::int64_t n,
                       double* out);
void matrix_elements(const Hamiltonian& H, const std::uint64_t* bra, const std::uint64_t* ket,
                     std::int64_t n, double* out);
CoupledSet coupled_configurations(const Hamiltonian& H, const std::uint64_t* configs,
                                  std::int64_t n, double eps);
void coupled_counts(const Hamiltonian& H, const std::uint64_t* configs, std::int64_t n, double eps,
                    std::int64_t* out);
// H restricted to a set of unique configurations; with `upper` only columns >= row are kept.
// `sector` (optional) must index exactly the rows of `space`; it replaces the hash lookup.
CsrMatrix hamiltonian_csr(const Hamiltonian& H, const std::uint64_t* space, std::int64_t n,
                          double eps, bool upper, const SectorIndex* sector = nullptr);
void symmetric_csr_matvec(const std::int64_t* indptr, const std::int32_t* indices,
                          const double* data, std::int64_t n, const double* x, int k, double* y);

UniqueResult unique_keys(const std::uint64_t* keys, std::int64_t n, int nwords);
void lookup_keys(const KeyIndex& index, const std::uint64_t* queries, std::int64_t n, int nwords,
                 std::int64_t* out);

}  // namespace csk
