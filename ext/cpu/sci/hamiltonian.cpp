#include "hamiltonian.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace csk {

Hamiltonian::Hamiltonian(int norb, std::vector<double> h1, std::vector<double> eri, double e_core,
                         double table_eps)
    : norb_(norb),
      h1_(std::move(h1)),
      eri_(std::move(eri)),
      e_core_(e_core),
      table_eps_(table_eps) {
  if (norb <= 0 || 2 * norb > 64 * kMaxWords)
    throw std::invalid_argument("norb must be in 1.." + std::to_string(32 * kMaxWords));
  const std::size_t n2 = static_cast<std::size_t>(norb) * norb;
  if (h1_.size() != n2 || eri_.size() != n2 * n2)
    throw std::invalid_argument("h1 must be norb^2 and eri norb^4 values");

  const int nso = 2 * norb;
  const std::int64_t npairs = static_cast<std::int64_t>(nso) * (nso - 1) / 2;
  HamiltonianView H = view();
  std::vector<std::vector<std::int32_t>> tgt(npairs);
  std::vector<std::vector<double>> val(npairs);
#pragma omp parallel for schedule(dynamic, 16)
  for (std::int64_t pid = 0; pid < npairs; ++pid) {
    int j = static_cast<int>((1.0 + std::sqrt(1.0 + 8.0 * pid)) / 2.0);
    while (pair_id(0, j) > pid) --j;
    while (pair_id(0, j + 1) <= pid) ++j;
    int i = static_cast<int>(pid - pair_id(0, j));
    int spin = (i & 1) + (j & 1);  // number of beta electrons moved: conserved
    std::vector<std::pair<double, std::int32_t>> row;
    for (int b = 1; b < nso; ++b) {
      if (b == i || b == j) continue;
      for (int a = 0; a < b; ++a) {
        if (a == i || a == j || (a & 1) + (b & 1) != spin) continue;
        double v = H.antisym(a, b, i, j);
        if (std::fabs(v) > table_eps) row.emplace_back(v, a | (b << 16));
      }
    }
    std::stable_sort(row.begin(), row.end(), [](const auto& x, const auto& y) {
      return std::fabs(x.first) > std::fabs(y.first);
    });
    tgt[pid].reserve(row.size());
    val[pid].reserve(row.size());
    for (auto& r : row) {
      tgt[pid].push_back(r.second);
      val[pid].push_back(r.first);
    }
  }
  doubles_.offsets.assign(npairs + 1, 0);
  for (std::int64_t p = 0; p < npairs; ++p) {
    doubles_.offsets[p + 1] = doubles_.offsets[p] + static_cast<std::int64_t>(tgt[p].size());
    doubles_.max_size = std::max<std::int64_t>(doubles_.max_size, tgt[p].size());
  }
  doubles_.targets.resize(doubles_.offsets.back());
  doubles_.values.resize(doubles_.offsets.back());
  for (std::int64_t p = 0; p < npairs; ++p) {
    std::copy(tgt[p].begin(), tgt[p].end(), doubles_.targets.begin() + doubles_.offsets[p]);
    std::copy(val[p].begin(), val[p].end(), doubles_.values.begin() + doubles_.offsets[p]);
  }
}

}  // namespace csk
