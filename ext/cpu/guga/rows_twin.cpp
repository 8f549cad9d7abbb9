// `cuscikit._core.guga_rows`: the per-CSF row functions of the CUDA GUGA kernels
// (cuscikit/guga_loops.hpp) run over a plain host loop. The GPU sigma, diagonal and density
// kernels are these same functions, one CSF per thread; tests compare them with the CPU engine
// on machines without a GPU.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuscikit/guga_loops.hpp"
#include "cuscikit/numpy_out.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using csk::HostVector;
using csk::need;
using csk::to_numpy;
using csk::guga::DrtView;

// The DRT's arrays and segment table, owned; `view` points into them.
struct RowsDrt {
  std::vector<std::int32_t> up, down, b;
  std::vector<std::int64_t> y;
  std::vector<double> seg;
  DrtView view;
};

constexpr int kMaxOrb = 64;

// The GPU's warp-split gather of ket k (one group of lanes, run here in lane order).
void gather_split(const DrtView& d, std::int64_t k, const std::int32_t* colmap, int ncol, int ld,
                  const double* c, double* row, std::vector<double>& scratch) {
  scratch.assign(2 * static_cast<size_t>(ld), 0.0);
  double* r0 = scratch.data();
  double* r1 = r0 + ld;
  int steps[kMaxOrb], verts[kMaxOrb + 1];
  csk::guga::unrank_csf(d, k, steps, verts);
  csk::guga::split_zero(r0, r1, ld, 0, 1);
  csk::guga::split_diagonal(d.norb, steps, colmap, c[k], r0, 0, 1);
  for (int j = 0; j < csk::guga::split_parts(d.norb); ++j)
    csk::guga::gather_part<kMaxOrb>(d, steps, verts, k, j, colmap, c, (j & 1) ? r1 : r0);
  csk::guga::split_finish(r0, r1, ld, ld > ncol ? ncol : -1, c[k], row, 0, 1);
}

// The GPU's warp-split sigma of CSF m: lane l sums parts l, l + 32, ... (lane 0 the diagonal
// term first), then the warp's reduction tree.
double sigma_split(const DrtView& d, std::int64_t m, const std::int32_t* symmap, const double* G,
                   int ldg, std::int64_t g0, std::int64_t gcount) {
  int steps[kMaxOrb], verts[kMaxOrb + 1];
  csk::guga::unrank_csf(d, m, steps, verts);
  double lanes[32] = {0.0};
  lanes[0] = csk::guga::sigma_diagonal_part(d, steps, m, symmap, G, ldg, g0, gcount);
  for (int j = 0; j < csk::guga::split_parts(d.norb); ++j)
    lanes[j % 32] +=
        csk::guga::sigma_part<kMaxOrb>(d, steps, verts, m, j, symmap, G, ldg, g0, gcount);
  return csk::guga::warp_tree_sum(lanes);
}

void check_range(const RowsDrt& d, std::int64_t k0, std::int64_t count) {
  if (k0 < 0 || count < 0 || k0 + count > d.view.ncsf)
    throw std::invalid_argument("CSF range outside 0.." + std::to_string(d.view.ncsf));
}

// The order's pointer (null without one): a permutation of 0 .. ncsf - 1 that maps the range
// k0 .. k0 + count - 1 onto itself (checked).
const std::int32_t* order_of(const RowsDrt& d, const std::optional<HostVector<std::int32_t>>& o,
                             std::int64_t k0, std::int64_t count) {
  if (!o) return nullptr;
  need(o->size(), static_cast<size_t>(d.view.ncsf), "order");
  std::vector<char> seen(static_cast<size_t>(count), 0);
  for (std::int64_t j = 0; j < count; ++j) {
    const std::int64_t k = o->data()[k0 + j] - k0;
    if (k < 0 || k >= count || seen[k])
      throw std::invalid_argument("order must permute the CSFs of the range");
    seen[k] = 1;
  }
  return o->data();
}

}  // namespace

void bind_guga_rows(nb::module_& m) {
  nb::class_<RowsDrt>(m, "Drt")
      .def(
          "__init__",
          [](RowsDrt* self, int norb, int head, HostVector<std::int32_t> up,
             HostVector<std::int32_t> down, HostVector<std::int32_t> b, HostVector<std::int64_t> y,
             std::int64_t ncsf) {
            if (norb < 1 || norb > kMaxOrb) throw std::invalid_argument("norb must be in 1..64");
            const size_t nv = b.size();
            need(up.size(), 4 * nv, "up");
            need(down.size(), 4 * nv, "down");
            need(y.size(), 4 * nv, "y");
            if (head < 0 || static_cast<size_t>(head) >= nv)
              throw std::invalid_argument("head outside the vertices");
            RowsDrt* d = new (self) RowsDrt();
            d->up.assign(up.data(), up.data() + up.size());
            d->down.assign(down.data(), down.data() + down.size());
            d->b.assign(b.data(), b.data() + b.size());
            d->y.assign(y.data(), y.data() + y.size());
            const int bmax = norb + 3;
            d->seg.assign(csk::guga::segment_table_size(bmax), 0.0);
            csk::guga::fill_segment_table(d->seg.data(), bmax);
            d->view = DrtView{norb,        head,        bmax,          d->up.data(), d->down.data(),
                              d->b.data(), d->y.data(), d->seg.data(), ncsf};
          },
          "norb"_a, "head"_a, "up"_a, "down"_a, "b"_a, "y"_a, "ncsf"_a)
      .def_prop_ro("ncsf", [](const RowsDrt& d) { return d.view.ncsf; });

  m.def(
      "gather",
      [](const RowsDrt& d, std::int64_t k0, std::int64_t count, HostVector<std::int32_t> colmap,
         int ncol, int ld, HostVector<double> c, bool split,
         std::optional<HostVector<std::int32_t>> order, bool symmetric) {
        check_range(d, k0, count);
        const std::int32_t* ord = order_of(d, order, k0, count);
        const int n = d.view.norb;
        need(colmap.size(), static_cast<size_t>(n) * n, "colmap");
        need(c.size(), static_cast<size_t>(d.view.ncsf), "c");
        if (ld < ncol) throw std::invalid_argument("ld must be >= ncol");
        for (size_t i = 0; i < colmap.size(); ++i)
          if (colmap.data()[i] < 0 || colmap.data()[i] >= ncol)
            throw std::invalid_argument("colmap entries must lie in 0..ncol - 1");
        for (int p = 0; symmetric && p < n; ++p)
          for (int q = 0; q < n; ++q)
            if (colmap.data()[p * n + q] != colmap.data()[q * n + p])
              throw std::invalid_argument("symmetric: colmap is not symmetric in (p, q)");
        std::vector<double> T(static_cast<size_t>(count) * ld);
        {
          nb::gil_scoped_release rel;
          std::vector<double> scratch, acc(2 * static_cast<size_t>(n));
          for (std::int64_t j = 0; j < count; ++j) {
            const std::int64_t k = ord ? ord[k0 + j] - k0 : j;
            if (split)
              gather_split(d.view, k0 + k, colmap.data(), ncol, ld, c.data(), T.data() + k * ld,
                           scratch);
            else
              csk::guga::gather_row<kMaxOrb>(d.view, k0 + k, colmap.data(), ncol, ld, c.data(),
                                             T.data() + k * ld, acc.data(), 1, symmetric);
          }
        }
        return to_numpy(std::move(T), {static_cast<size_t>(count), static_cast<size_t>(ld)});
      },
      "drt"_a, "k0"_a, "count"_a, "colmap"_a, "ncol"_a, "ld"_a, "c"_a, "split"_a = false,
      "order"_a = nb::none(), "symmetric"_a = false,
      "T (count, ld): row k is gather_row of CSF k0 + k (split: as the GPU's warps run it; "
      "order: in the GPU threads' order; symmetric: one slot per pair, checked).");

  m.def(
      "sigma",
      [](const RowsDrt& d, std::int64_t m0, std::int64_t count, HostVector<std::int32_t> symmap,
         nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu> G, std::int64_t g0,
         bool split, std::optional<HostVector<std::int32_t>> order) {
        check_range(d, m0, count);
        const std::int32_t* ord = order_of(d, order, m0, count);
        const int n = d.view.norb;
        need(symmap.size(), static_cast<size_t>(n) * n, "symmap");
        const std::int64_t gcount = static_cast<std::int64_t>(G.shape(0));
        check_range(d, g0, gcount);
        const int ldg = static_cast<int>(G.shape(1));
        for (size_t i = 0; i < symmap.size(); ++i)
          if (symmap.data()[i] < 0 || symmap.data()[i] >= ldg)
            throw std::invalid_argument("symmap entries must lie in 0..G.shape[1] - 1");
        std::vector<double> out(static_cast<size_t>(count));
        {
          nb::gil_scoped_release rel;
          for (std::int64_t j = 0; j < count; ++j) {
            const std::int64_t k = ord ? ord[m0 + j] - m0 : j;
            out[k] = split ? sigma_split(d.view, m0 + k, symmap.data(), G.data(), ldg, g0, gcount)
                           : csk::guga::sigma_row<kMaxOrb>(d.view, m0 + k, symmap.data(), G.data(),
                                                           ldg, g0, gcount);
          }
        }
        return to_numpy(std::move(out), {static_cast<size_t>(count)});
      },
      "drt"_a, "m0"_a, "count"_a, "symmap"_a, "G"_a, "g0"_a, "split"_a = false,
      "order"_a = nb::none(),
      "sigma_row of CSFs m0 .. m0 + count - 1 over the rows g0 .. g0 + len(G) - 1 of G.");

  m.def(
      "scatter",
      [](const RowsDrt& d, std::int64_t k0, HostVector<std::int32_t> symmap,
         nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu> G, int e,
         HostVector<std::int64_t> acc) {
        const std::int64_t count = static_cast<std::int64_t>(G.shape(0));
        check_range(d, k0, count);
        const int n = d.view.norb;
        need(symmap.size(), static_cast<size_t>(n) * n, "symmap");
        need(acc.size(), 2 * static_cast<size_t>(d.view.ncsf), "acc");
        const int ldg = static_cast<int>(G.shape(1));
        for (size_t i = 0; i < symmap.size(); ++i)
          if (symmap.data()[i] < 0 || symmap.data()[i] >= ldg)
            throw std::invalid_argument("symmap entries must lie in 0..G.shape[1] - 1");
        std::vector<std::int64_t> out(acc.data(), acc.data() + acc.size());
        {
          nb::gil_scoped_release rel;
          csk_i64* lo = reinterpret_cast<csk_i64*>(out.data());
          auto add = [](csk_i64* p, csk_i64 v) { *p += v; };
          for (std::int64_t j = 0; j < count; ++j)
            csk::guga::scatter_row<kMaxOrb>(d.view, k0 + j, symmap.data(), G.data() + j * ldg, e,
                                            lo, lo + d.view.ncsf, add);
        }
        return to_numpy(std::move(out), {acc.size()});
      },
      "drt"_a, "k0"_a, "symmap"_a, "G"_a, "e"_a, "acc"_a,
      "acc after scatter_row of the kets k0 .. k0 + len(G) - 1 (row j of G is ket k0 + j's): "
      "the fixed-point sums (fixed_add), the lo words of every CSF, then the hi words.");
  m.def(
      "fixed_values",
      [](HostVector<std::int64_t> acc, int e) {
        if (acc.size() % 2 != 0) throw std::invalid_argument("acc must hold 2 words per output");
        const size_t count = acc.size() / 2;
        std::vector<double> out(count);
        const csk_i64* w = reinterpret_cast<const csk_i64*>(acc.data());
        for (size_t j = 0; j < count; ++j) out[j] = csk::guga::fixed_value(w[j], w[count + j], e);
        return to_numpy(std::move(out), {count});
      },
      "acc"_a, "e"_a,
      "The doubles of the fixed-point sums acc (the lo words, then the hi words; fixed_value).");

  m.def(
      "couplings",
      [](const RowsDrt& d, HostVector<std::int64_t> kets) {
        std::vector<std::int32_t> src, code;
        std::vector<std::int64_t> bra;
        std::vector<double> w;
        {
          nb::gil_scoped_release rel;
          const int n = d.view.norb;
          for (size_t j = 0; j < kets.size(); ++j) {
            const std::int64_t k = kets.data()[j];
            if (k < 0 || k >= d.view.ncsf)
              throw std::invalid_argument("kets must lie in 0..ncsf - 1");
            int steps[kMaxOrb], verts[kMaxOrb + 1];
            csk::guga::unrank_csf(d.view, k, steps, verts);
            auto emit = [&](std::int64_t m, int c, double v) {
              src.push_back(static_cast<std::int32_t>(j));
              bra.push_back(m);
              code.push_back(c);
              w.push_back(v);
            };
            for (int r = 0; r < n; ++r)
              if (steps[r] != 0) emit(k, r * n + r, csk::guga::step_occupation(steps[r]));
            csk::guga::for_each_coupling<kMaxOrb>(d.view, steps, verts, k, emit);
          }
        }
        const size_t nnz = w.size();
        return nb::make_tuple(to_numpy(std::move(src), {nnz}), to_numpy(std::move(bra), {nnz}),
                              to_numpy(std::move(code), {nnz}), to_numpy(std::move(w), {nnz}));
      },
      "drt"_a, "kets"_a,
      "Every <m|E_pq|k> != 0 of the kets k (the diagonal E_rr = n_r first, then the loops): "
      "(index into kets, m, p * norb + q, value).");

  m.def(
      "coupling_counts",
      [](const RowsDrt& d, std::int64_t k0, std::int64_t count) {
        check_range(d, k0, count);
        std::vector<std::int32_t> out(static_cast<size_t>(count));
        for (std::int64_t k = 0; k < count; ++k)
          out[k] = csk::guga::coupling_count<kMaxOrb>(d.view, k0 + k);
        return to_numpy(std::move(out), {static_cast<size_t>(count)});
      },
      "drt"_a, "k0"_a, "count"_a, "coupling_count of CSFs k0 .. k0 + count - 1.");

  m.def(
      "diagonal",
      [](const RowsDrt& d, std::int64_t k0, std::int64_t count, HostVector<double> hp,
         HostVector<double> J, HostVector<double> K) {
        check_range(d, k0, count);
        const size_t n = d.view.norb;
        need(hp.size(), n, "hp");
        need(J.size(), n * n, "J");
        need(K.size(), n * n, "K");
        std::vector<double> out(static_cast<size_t>(count));
        {
          nb::gil_scoped_release rel;
          for (std::int64_t k = 0; k < count; ++k)
            out[k] =
                csk::guga::diagonal_row<kMaxOrb>(d.view, k0 + k, hp.data(), J.data(), K.data());
        }
        return to_numpy(std::move(out), {static_cast<size_t>(count)});
      },
      "drt"_a, "k0"_a, "count"_a, "hp"_a, "J"_a, "K"_a,
      "diagonal_row of CSFs k0 .. k0 + count - 1.");
}
