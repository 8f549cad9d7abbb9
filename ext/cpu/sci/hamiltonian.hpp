// The CPU-side Hamiltonian: integrals plus the excitation tables (the NNQS-SCI paper's section
// 4.2.1; docs/nnqs_sci.md).
#pragma once
#include <cstdint>
#include <vector>

#include "cuscikit/slater_condon.hpp"

namespace csk {

// Double-excitation table: for each spin-orbital pair (i<j), pair id j*(j-1)/2+i, the target
// pairs (a<b) with |<ab||ij>| > eps, sorted by decreasing magnitude so that a screened walk can
// stop at the first entry below its threshold.
struct DoubleTable {
  std::vector<std::int64_t> offsets;  // n_pairs + 1
  std::vector<std::int32_t> targets;  // a | (b << 16)
  std::vector<double> values;         // <ab||ij>
  std::int64_t max_size = 0;
};

class Hamiltonian {
 public:
  Hamiltonian(int norb, std::vector<double> h1, std::vector<double> eri, double e_core,
              double table_eps);

  HamiltonianView view() const { return HamiltonianView{norb_, h1_.data(), eri_.data(), e_core_}; }
  int norb() const { return norb_; }
  int n_spin_orbitals() const { return 2 * norb_; }
  int nwords() const { return (2 * norb_ + 63) / 64; }
  double e_core() const { return e_core_; }
  double table_eps() const { return table_eps_; }
  const DoubleTable& doubles() const { return doubles_; }
  // Singles: every same-spin target; their elements depend on the other occupied orbitals, so
  // they are computed exactly per source and screened afterwards.
  int max_single_size() const { return norb_ - 1; }
  const std::vector<double>& h1() const { return h1_; }
  const std::vector<double>& eri() const { return eri_; }

  static std::int64_t pair_id(int i, int j) {  // i < j
    return static_cast<std::int64_t>(j) * (j - 1) / 2 + i;
  }

 private:
  int norb_;
  std::vector<double> h1_, eri_;
  double e_core_;
  double table_eps_;
  DoubleTable doubles_;
};

}  // namespace csk
