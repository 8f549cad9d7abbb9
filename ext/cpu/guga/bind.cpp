// nanobind bindings of the GUGA CI kernels, `cuscikit._core.guga`. Python (cuscikit.guga)
// builds the DRT and validates shapes; these bindings check sizes again and release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <stdexcept>
#include <string>
#include <utility>

#include "../bindings.hpp"
#include "cuscikit/numpy_out.hpp"
#include "kernels.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using csk::to_numpy;

using csk::guga::BlockView;
using csk::guga::Drt;
using csk::guga::LoopTable;

template <typename T>
using In = nb::ndarray<const T, nb::c_contig, nb::device::cpu>;

template <typename T>
std::vector<T> copy_of(const In<T>& a, size_t expect, const char* what) {
  if (a.size() != expect)
    throw std::invalid_argument(std::string(what) + " has " + std::to_string(a.size()) +
                                " entries, expected " + std::to_string(expect));
  return std::vector<T>(a.data(), a.data() + a.size());
}

BlockView view_of(const Drt& drt, const In<std::int64_t>& offsets, const In<std::int32_t>& bra,
                  const In<std::uint16_t>& code, const In<double>& w, const In<std::uint8_t>& steps,
                  std::int64_t k0) {
  const std::int64_t count = static_cast<std::int64_t>(offsets.size()) - 1;
  if (count < 0) throw std::invalid_argument("offsets must hold count + 1 entries");
  // offsets index bra, code and w; a row range of a larger block passes its slice of offsets
  const std::int64_t total = offsets.data()[count];
  if (static_cast<std::int64_t>(code.size()) != static_cast<std::int64_t>(bra.size()) ||
      static_cast<std::int64_t>(w.size()) != static_cast<std::int64_t>(bra.size()) ||
      static_cast<std::int64_t>(bra.size()) < total || (count > 0 && offsets.data()[0] < 0))
    throw std::invalid_argument("bra, code and w must hold at least offsets[-1] entries");
  if (static_cast<std::int64_t>(steps.size()) != count * drt.norb)
    throw std::invalid_argument("steps must be (count, norb)");
  if (k0 < 0 || k0 + count > drt.ncsf) throw std::invalid_argument("block outside the CSFs");
  return BlockView{offsets.data(), bra.data(), code.data(), w.data(), steps.data(), k0, count};
}

void check_range(const Drt& drt, std::int64_t k0, std::int64_t count) {
  if (k0 < 0 || count < 0 || k0 + count > drt.ncsf)
    throw std::invalid_argument("CSF range outside 0.." + std::to_string(drt.ncsf));
}

using Out2 = nb::ndarray<double, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Out1 = nb::ndarray<double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// The loop kernels split a pair row into a head's and an entry's part: they need the packed pair
// map P(p, q) = max (max + 1) / 2 + min (cuscikit.guga.sigma.pair_index).
void check_pair_map(const Drt& d, const In<std::int32_t>& symmap, int npair) {
  const int n = d.norb;
  if (npair != n * (n + 1) / 2 || symmap.size() != static_cast<size_t>(n * n))
    throw std::invalid_argument("the loop kernels need npair = norb (norb + 1) / 2 pairs");
  for (int p = 0; p < n; ++p)
    for (int q = 0; q < n; ++q) {
      const int hi = p > q ? p : q, lo = p > q ? q : p;
      if (symmap.data()[p * n + q] != hi * (hi + 1) / 2 + lo)
        throw std::invalid_argument("the loop kernels need symmap = pair_index(norb)");
    }
}

}  // namespace

void bind_guga(nb::module_& m) {
  nb::class_<Drt>(m, "DrtCore")
      .def(
          "__init__",
          [](Drt* self, int norb, int head, In<std::int32_t> up, In<std::int32_t> down,
             In<std::int32_t> b, In<std::int64_t> L, In<std::int64_t> y) {
            const size_t nv = b.size();
            if (head < 0 || static_cast<size_t>(head) >= nv)
              throw std::invalid_argument("head outside the vertices");
            Drt* d = new (self) Drt();
            d->norb = norb;
            d->nvert = static_cast<int>(nv);
            d->head = head;
            d->up = copy_of(up, 4 * nv, "up");
            d->down = copy_of(down, 4 * nv, "down");
            d->b = copy_of(b, nv, "b");
            d->L = copy_of(L, nv, "L");
            d->y = copy_of(y, 4 * nv, "y");
            d->finish();
          },
          "norb"_a, "head"_a, "up"_a, "down"_a, "b"_a, "L"_a, "y"_a)
      .def_prop_ro("ncsf", [](const Drt& d) { return d.ncsf; })
      .def_prop_ro("norb", [](const Drt& d) { return d.norb; })
      .def(
          "steps",
          [](const Drt& d, std::int64_t k0, std::int64_t count, int nthreads) {
            check_range(d, k0, count);
            std::vector<std::uint8_t> s;
            {
              nb::gil_scoped_release rel;
              s = csk::guga::csf_steps(d, k0, count, nthreads);
            }
            return to_numpy(std::move(s), {static_cast<size_t>(count), size_t(d.norb)});
          },
          "k0"_a, "count"_a, "nthreads"_a = 0, "Step vectors (count, norb) of CSFs k0...")
      .def(
          "counts",
          [](const Drt& d, std::int64_t k0, std::int64_t count, int nthreads) {
            check_range(d, k0, count);
            std::vector<std::int64_t> c;
            {
              nb::gil_scoped_release rel;
              c = csk::guga::count_lists(d, k0, count, nthreads);
            }
            return to_numpy(std::move(c), {static_cast<size_t>(count)});
          },
          "k0"_a, "count"_a, "nthreads"_a = 0, "Coupling entries per ket.")
      .def(
          "lists",
          [](const Drt& d, std::int64_t k0, std::int64_t count, int nthreads,
             std::optional<In<std::int64_t>> counts) {
            check_range(d, k0, count);
            if (counts && static_cast<std::int64_t>(counts->size()) != count)
              throw std::invalid_argument("counts must hold count entries");
            const std::int64_t* known = counts ? counts->data() : nullptr;
            if (d.ncsf >= (std::int64_t(1) << 31))
              throw std::invalid_argument("more than 2^31 - 1 CSFs");
            csk::guga::Lists l;
            {
              nb::gil_scoped_release rel;
              l = csk::guga::build_lists(d, k0, count, nthreads, known);
            }
            const size_t total = l.w.size();
            return nb::make_tuple(to_numpy(std::move(l.offsets), {static_cast<size_t>(count) + 1}),
                                  to_numpy(std::move(l.bra), {total}),
                                  to_numpy(std::move(l.code), {total}),
                                  to_numpy(std::move(l.w), {total}));
          },
          "k0"_a, "count"_a, "nthreads"_a = 0, "counts"_a = nb::none(),
          "(offsets, bra, code, w): w = <bra|E_pq|k0 + k>, code = p * norb + q.");

  nb::class_<LoopTable>(m, "LoopTable")
      .def(
          "__init__",
          [](LoopTable* self, const Drt& d, int split) {
            if (d.ncsf >= (std::int64_t(1) << 31))
              throw std::invalid_argument("more than 2^31 - 1 CSFs");
            if (split >= d.norb) throw std::invalid_argument("split must be below norb");
            LoopTable t;
            {
              nb::gil_scoped_release rel;
              t = csk::guga::build_loops(d, split);
            }
            new (self) LoopTable(std::move(t));
          },
          "drt"_a, "split"_a = -1,
          "Every raising loop of the DRT, factored at level `split` (-1: the level of the "
          "smallest table, 0: none), by top vertex, and the upper walks.")
      .def_prop_ro("nbytes", &LoopTable::bytes)
      .def_prop_ro("nloops", [](const LoopTable& t) { return t.nloops; })
      .def_prop_ro("split", [](const LoopTable& t) { return t.split; })
      .def(
          "cells",
          [](const LoopTable& t) {
            std::vector<std::int64_t> c = t.cells;
            const size_t n = c.size();
            return to_numpy(std::move(c), {n});
          },
          "First CSF of every walk from the head to the split level (block borders).")
      .def_prop_ro("nheads", [](const LoopTable& t) { return t.hw.size(); })
      .def_prop_ro("nentries", [](const LoopTable& t) { return t.w.size(); })
      .def_prop_ro("nupper", [](const LoopTable& t) { return t.uoff.size(); });

  m.def(
      "loop_gather_pairs",
      [](const Drt& d, const LoopTable& t, In<std::int32_t> symmap, int npair, In<double> c, Out2 T,
         std::int64_t k0, std::int64_t count, int nthreads) {
        check_pair_map(d, symmap, npair);
        check_range(d, k0, count);
        if (T.shape(0) < size_t(npair) || static_cast<std::int64_t>(T.shape(1)) < count)
          throw std::invalid_argument("T must be at least (npair, count)");
        if (static_cast<std::int64_t>(c.size()) != d.ncsf)
          throw std::invalid_argument("c must hold ncsf entries");
        nb::gil_scoped_release rel;
        csk::guga::loop_gather_pairs(d, t, symmap.data(), npair, static_cast<int>(T.shape(0)),
                                     c.data(), T.data(), static_cast<std::int64_t>(T.shape(1)), k0,
                                     count, nthreads);
      },
      "drt"_a, "table"_a, "symmap"_a, "npair"_a, "c"_a, "T"_a, "k0"_a, "count"_a, "nthreads"_a = 0,
      "Fill the columns 0 .. count - 1 of T (npair [+ 1], >= count) in place.");

  m.def(
      "loop_scatter_pairs",
      [](const Drt& d, const LoopTable& t, In<std::int32_t> symmap, int npair, Out2 G,
         std::int64_t k0, std::int64_t count, Out2 sigma, int nthreads) {
        check_pair_map(d, symmap, npair);
        check_range(d, k0, count);
        if (G.shape(0) < size_t(npair) || static_cast<std::int64_t>(G.shape(1)) < count)
          throw std::invalid_argument("G must be at least (npair, count)");
        if (static_cast<std::int64_t>(sigma.shape(1)) != d.ncsf || sigma.shape(0) < 1)
          throw std::invalid_argument("sigma must be (nbuf, ncsf): one buffer per thread");
        nb::gil_scoped_release rel;
        csk::guga::loop_scatter_pairs(d, t, symmap.data(), npair, G.data(),
                                      static_cast<std::int64_t>(G.shape(1)), k0, count,
                                      sigma.data(), static_cast<int>(sigma.shape(0)), nthreads);
      },
      "drt"_a, "table"_a, "symmap"_a, "npair"_a, "G"_a, "k0"_a, "count"_a, "sigma"_a,
      "nthreads"_a = 0);

  m.def(
      "loop_sigma",
      [](const Drt& d, const LoopTable& t, In<std::int32_t> symmap, int npair, In<double> c,
         int rows, Out2 W1, std::optional<Out2> W2, Out2 sigma, nb::capsule gemm,
         std::int64_t range, int nthreads, std::optional<Out1> first) {
        check_pair_map(d, symmap, npair);
        if (static_cast<std::int64_t>(c.size()) != d.ncsf)
          throw std::invalid_argument("c must hold ncsf entries");
        if (rows != npair && rows != npair + 1)
          throw std::invalid_argument("rows must be npair or npair + 1");
        const int mid = W2 ? static_cast<int>(W2->shape(1)) : 0;
        if (W1.shape(1) != size_t(rows) || W1.shape(0) != size_t(W2 ? mid : npair))
          throw std::invalid_argument("W1 must be (npair, rows), or (mid, rows) with W2");
        if (W2 && W2->shape(0) != size_t(npair))
          throw std::invalid_argument("W2 must be (npair, mid)");
        const int nbuf = static_cast<int>(sigma.shape(0)) + (first ? 1 : 0);
        if (static_cast<std::int64_t>(sigma.shape(1)) != d.ncsf || nbuf < 1)
          throw std::invalid_argument("sigma must be (nbuf, ncsf): one buffer per thread");
        if (first && static_cast<std::int64_t>(first->size()) != d.ncsf)
          throw std::invalid_argument("first must hold ncsf entries");
        if (range < 1) throw std::invalid_argument("range must be positive");
        auto fn = reinterpret_cast<csk::guga::Dgemm>(
            PyCapsule_GetPointer(gemm.ptr(), PyCapsule_GetName(gemm.ptr())));
        if (!fn) throw nb::python_error();
        nb::gil_scoped_release rel;
        csk::guga::loop_sigma(d, t, symmap.data(), npair, c.data(), rows, W1.data(), mid,
                              W2 ? W2->data() : nullptr, sigma.data(), nbuf, nthreads, fn, range,
                              first ? first->data() : nullptr);
      },
      "drt"_a, "table"_a, "symmap"_a, "npair"_a, "c"_a, "rows"_a, "W1"_a, "W2"_a.none(), "sigma"_a,
      "dgemm"_a, "range"_a = 4096, "nthreads"_a = 0, "first"_a.none() = nb::none(),
      "sigma += H c by loops: gather, GEMM with W1 (and W2) and scatter per range of CSFs; dgemm "
      "is a capsule of Fortran dgemm (scipy.linalg.cython_blas.__pyx_capi__['dgemm']). With "
      "first (ncsf entries) thread 0 adds into it and the rows of sigma serve threads 1, 2, ...");

  m.def(
      "loop_exchange_diagonal",
      [](const Drt& d, const LoopTable& t, In<double> K, std::int64_t k0, std::int64_t count,
         int nthreads) {
        check_range(d, k0, count);
        if (K.size() != static_cast<size_t>(d.norb * d.norb))
          throw std::invalid_argument("K must be (norb, norb)");
        std::vector<double> out(static_cast<size_t>(count));
        {
          nb::gil_scoped_release rel;
          csk::guga::loop_exchange_diagonal(d, t, K.data(), out.data(), k0, count, nthreads);
        }
        return to_numpy(std::move(out), {static_cast<size_t>(count)});
      },
      "drt"_a, "table"_a, "K"_a, "k0"_a, "count"_a, "nthreads"_a = 0);

  m.def(
      "loop_gather_generators",
      [](const Drt& d, const LoopTable& t, In<double> c, std::int64_t k0, std::int64_t count,
         int nthreads) {
        check_range(d, k0, count);
        if (static_cast<std::int64_t>(c.size()) != d.ncsf)
          throw std::invalid_argument("c must hold ncsf entries");
        const size_t nn = static_cast<size_t>(d.norb) * d.norb;
        std::vector<double> out(static_cast<size_t>(count) * nn);
        {
          nb::gil_scoped_release rel;
          csk::guga::loop_gather_generators(d, t, c.data(), out.data(), k0, count, nthreads);
        }
        return to_numpy(std::move(out), {static_cast<size_t>(count), nn});
      },
      "drt"_a, "table"_a, "c"_a, "k0"_a, "count"_a, "nthreads"_a = 0);

  m.def(
      "gather_pairs",
      [](const Drt& d, In<std::int64_t> offsets, In<std::int32_t> bra, In<std::uint16_t> code,
         In<double> w, In<std::uint8_t> steps, std::int64_t k0, In<std::int32_t> symmap, int npair,
         In<double> c, nb::ndarray<double, nb::ndim<2>, nb::c_contig, nb::device::cpu> T,
         int nthreads) {
        BlockView v = view_of(d, offsets, bra, code, w, steps, k0);
        if (static_cast<std::int64_t>(c.size()) != d.ncsf)
          throw std::invalid_argument("c must hold ncsf entries");
        if (symmap.size() != static_cast<size_t>(d.norb * d.norb))
          throw std::invalid_argument("symmap must hold norb^2 entries");
        if (static_cast<std::int64_t>(T.shape(0)) < v.count ||
            T.shape(1) < static_cast<size_t>(npair))
          throw std::invalid_argument("T must be at least (count, npair)");
        nb::gil_scoped_release rel;
        csk::guga::gather_pairs(d, v, symmap.data(), npair, c.data(), T.data(),
                                static_cast<int>(T.shape(1)), nthreads);
      },
      "drt"_a, "offsets"_a, "bra"_a, "code"_a, "w"_a, "steps"_a, "k0"_a, "symmap"_a, "npair"_a,
      "c"_a, "T"_a, "nthreads"_a = 0, "Fill T (count, ld) in place.");

  m.def(
      "scatter_pairs",
      [](const Drt& d, In<std::int64_t> offsets, In<std::int32_t> bra, In<std::uint16_t> code,
         In<double> w, In<std::uint8_t> steps, std::int64_t k0, In<std::int32_t> symmap, int npair,
         In<double> G, nb::ndarray<double, nb::c_contig, nb::device::cpu> sigma, int nthreads) {
        BlockView v = view_of(d, offsets, bra, code, w, steps, k0);
        if (G.size() != static_cast<size_t>(v.count) * npair)
          throw std::invalid_argument("G must be (count, npair)");
        if (sigma.ndim() != 2 || static_cast<std::int64_t>(sigma.shape(1)) != d.ncsf ||
            sigma.shape(0) < 1)
          throw std::invalid_argument("sigma must be (nbuf, ncsf): one buffer per thread");
        if (symmap.size() != static_cast<size_t>(d.norb * d.norb))
          throw std::invalid_argument("symmap must hold norb^2 entries");
        nb::gil_scoped_release rel;
        csk::guga::scatter_pairs(d, v, symmap.data(), npair, G.data(), sigma.data(), d.ncsf,
                                 static_cast<int>(sigma.shape(0)), nthreads);
      },
      "drt"_a, "offsets"_a, "bra"_a, "code"_a, "w"_a, "steps"_a, "k0"_a, "symmap"_a, "npair"_a,
      "G"_a, "sigma"_a, "nthreads"_a = 0);

  m.def(
      "gather_generators",
      [](const Drt& d, In<std::int64_t> offsets, In<std::int32_t> bra, In<std::uint16_t> code,
         In<double> w, In<std::uint8_t> steps, std::int64_t k0, In<double> c, int nthreads) {
        BlockView v = view_of(d, offsets, bra, code, w, steps, k0);
        if (static_cast<std::int64_t>(c.size()) != d.ncsf)
          throw std::invalid_argument("c must hold ncsf entries");
        const size_t nn = static_cast<size_t>(d.norb) * d.norb;
        std::vector<double> t(static_cast<size_t>(v.count) * nn);
        {
          nb::gil_scoped_release rel;
          csk::guga::gather_generators(d, v, c.data(), t.data(), nthreads);
        }
        return to_numpy(std::move(t), {static_cast<size_t>(v.count), nn});
      },
      "drt"_a, "offsets"_a, "bra"_a, "code"_a, "w"_a, "steps"_a, "k0"_a, "c"_a, "nthreads"_a = 0);

  m.def(
      "exchange_diagonal",
      [](const Drt& d, In<std::int64_t> offsets, In<std::int32_t> bra, In<std::uint16_t> code,
         In<double> w, In<std::uint8_t> steps, std::int64_t k0, In<double> K, int nthreads) {
        BlockView v = view_of(d, offsets, bra, code, w, steps, k0);
        if (K.size() != static_cast<size_t>(d.norb * d.norb))
          throw std::invalid_argument("K must be (norb, norb)");
        std::vector<double> out(static_cast<size_t>(v.count));
        {
          nb::gil_scoped_release rel;
          csk::guga::exchange_diagonal(d, v, K.data(), out.data(), nthreads);
        }
        return to_numpy(std::move(out), {static_cast<size_t>(v.count)});
      },
      "drt"_a, "offsets"_a, "bra"_a, "code"_a, "w"_a, "steps"_a, "k0"_a, "K"_a, "nthreads"_a = 0);

  m.def("max_threads", &csk::max_threads);
}
