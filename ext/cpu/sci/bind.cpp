// nanobind bindings of the selected-CI kernels in `cuscikit._core` (Hamiltonian tables, coupled
// generation, CSR, key de-dup). Python validates shapes and dtypes before calling in; these
// bindings check them again and release the GIL around the work.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <memory>
#include <stdexcept>
#include <string>

#include "../bindings.hpp"
#include "cuscikit/numpy_out.hpp"
#include "kernels.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace {

using csk::to_numpy;

using ConfigArray = nb::ndarray<const std::uint64_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using F64Array = nb::ndarray<const double, nb::c_contig, nb::device::cpu>;

template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(csk::Buffer<T>&& b, std::initializer_list<size_t> shape) {
  T* raw = b.data.release();
  nb::capsule owner(raw, [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return nb::ndarray<nb::numpy, T>(raw, shape, owner);
}

void check_words(const csk::Hamiltonian& H, const ConfigArray& c, const char* what) {
  if (static_cast<int>(c.shape(1)) != H.nwords())
    throw std::invalid_argument(std::string(what) + " must have " + std::to_string(H.nwords()) +
                                " words per configuration for norb=" + std::to_string(H.norb()));
}

// Owns a copy of the keys so the index cannot outlive them.
struct PyKeyIndex {
  std::vector<std::uint64_t> keys;
  int nwords;
  std::unique_ptr<csk::KeyIndex> index;
};

}  // namespace

void bind_sci(nb::module_& m) {
  m.def("build_info", []() {
    nb::dict d;
    d["flags"] = CSK_BUILD_FLAGS;
#ifdef CSK_HAVE_OPENMP
    d["openmp"] = true;
#else
    d["openmp"] = false;
#endif
    d["max_threads"] = csk::max_threads();
    d["max_words"] = csk::kMaxWords;
    return d;
  });

  nb::class_<csk::Hamiltonian>(m, "Hamiltonian")
      .def(
          "__init__",
          [](csk::Hamiltonian* self, F64Array h1, F64Array eri, double e_core, double table_eps) {
            if (h1.ndim() != 2 || h1.shape(0) != h1.shape(1))
              throw std::invalid_argument("h1 must be a square (norb, norb) array");
            const int norb = static_cast<int>(h1.shape(0));
            if (eri.ndim() != 4 || eri.shape(0) != static_cast<size_t>(norb) ||
                eri.shape(1) != static_cast<size_t>(norb) ||
                eri.shape(2) != static_cast<size_t>(norb) ||
                eri.shape(3) != static_cast<size_t>(norb))
              throw std::invalid_argument("eri must be the full (norb, norb, norb, norb) array");
            std::vector<double> h(h1.data(), h1.data() + h1.size());
            std::vector<double> g(eri.data(), eri.data() + eri.size());
            nb::gil_scoped_release nogil;
            new (self) csk::Hamiltonian(norb, std::move(h), std::move(g), e_core, table_eps);
          },
          "h1"_a, "eri"_a, "e_core"_a, "table_eps"_a)
      .def_prop_ro("norb", &csk::Hamiltonian::norb)
      .def_prop_ro("nwords", &csk::Hamiltonian::nwords)
      .def_prop_ro("e_core", &csk::Hamiltonian::e_core)
      .def_prop_ro("table_eps", &csk::Hamiltonian::table_eps)
      .def_prop_ro("max_single_size", &csk::Hamiltonian::max_single_size)
      .def_prop_ro("max_double_size",
                   [](const csk::Hamiltonian& H) { return H.doubles().max_size; })
      .def_prop_ro("n_double_entries",
                   [](const csk::Hamiltonian& H) { return H.doubles().offsets.back(); })
      .def("double_table", [](const csk::Hamiltonian& H) {
        const auto& T = H.doubles();
        auto off = T.offsets;
        auto tgt = T.targets;
        auto val = T.values;
        const size_t np = off.size(), ne = tgt.size();
        return nb::make_tuple(to_numpy(std::move(off), {np}), to_numpy(std::move(tgt), {ne}),
                              to_numpy(std::move(val), {ne}));
      });

  m.def("diagonal_energies", [](const csk::Hamiltonian& H, ConfigArray c) {
    check_words(H, c, "configs");
    std::vector<double> out(c.shape(0));
    {
      nb::gil_scoped_release nogil;
      csk::diagonal_energies(H, c.data(), c.shape(0), out.data());
    }
    const size_t n = out.size();
    return to_numpy(std::move(out), {n});
  });

  m.def("matrix_elements", [](const csk::Hamiltonian& H, ConfigArray bra, ConfigArray ket) {
    check_words(H, bra, "bra");
    check_words(H, ket, "ket");
    if (bra.shape(0) != ket.shape(0)) throw std::invalid_argument("bra and ket differ in length");
    std::vector<double> out(bra.shape(0));
    {
      nb::gil_scoped_release nogil;
      csk::matrix_elements(H, bra.data(), ket.data(), bra.shape(0), out.data());
    }
    const size_t n = out.size();
    return to_numpy(std::move(out), {n});
  });

  m.def("coupled_counts", [](const csk::Hamiltonian& H, ConfigArray c, double eps) {
    check_words(H, c, "configs");
    std::vector<std::int64_t> out(c.shape(0));
    {
      nb::gil_scoped_release nogil;
      csk::coupled_counts(H, c.data(), c.shape(0), eps, out.data());
    }
    const size_t n = out.size();
    return to_numpy(std::move(out), {n});
  });

  m.def("coupled_configurations", [](const csk::Hamiltonian& H, ConfigArray c, double eps) {
    check_words(H, c, "configs");
    csk::CoupledSet s;
    {
      nb::gil_scoped_release nogil;
      s = csk::coupled_configurations(H, c.data(), c.shape(0), eps);
    }
    const size_t m = s.values.size, w = H.nwords();
    return nb::make_tuple(to_numpy(std::move(s.source), {m}),
                          to_numpy(std::move(s.configs), {m, w}),
                          to_numpy(std::move(s.values), {m}));
  });

  m.def(
      "hamiltonian_csr",
      [](const csk::Hamiltonian& H, ConfigArray space, double eps, bool upper,
         std::optional<std::tuple<int, int>> sector) {
        check_words(H, space, "space");
        if (space.shape(0) >= (1ULL << 31))
          throw std::invalid_argument("spaces beyond 2^31 configurations are not supported");
        csk::CsrMatrix a;
        {
          nb::gil_scoped_release nogil;
          if (sector) {
            csk::SectorIndex idx(H.norb(), std::get<0>(*sector), std::get<1>(*sector));
            idx.attach(space.data(), space.shape(0), H.nwords());
            a = csk::hamiltonian_csr(H, space.data(), space.shape(0), eps, upper, &idx);
          } else {
            a = csk::hamiltonian_csr(H, space.data(), space.shape(0), eps, upper);
          }
        }
        const size_t n1 = a.indptr.size(), nnz = a.data.size();
        return nb::make_tuple(to_numpy(std::move(a.indptr), {n1}),
                              to_numpy(std::move(a.indices), {nnz}),
                              to_numpy(std::move(a.data), {nnz}));
      },
      "hamiltonian"_a, "space"_a, "eps"_a, "upper"_a = false, "sector"_a = nb::none());

  m.def("symmetric_csr_matvec",
        [](nb::ndarray<const std::int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> indptr,
           nb::ndarray<const std::int32_t, nb::ndim<1>, nb::c_contig, nb::device::cpu> indices,
           nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu> data,
           nb::ndarray<const double, nb::ndim<2>, nb::c_contig, nb::device::cpu> x) {
          const std::int64_t n = static_cast<std::int64_t>(indptr.shape(0)) - 1;
          if (static_cast<std::int64_t>(x.shape(0)) != n)
            throw std::invalid_argument("x has the wrong number of rows");
          if (indices.shape(0) != data.shape(0))
            throw std::invalid_argument("indices and data differ in length");
          const int k = static_cast<int>(x.shape(1));
          std::vector<double> y(static_cast<size_t>(n) * k);
          {
            nb::gil_scoped_release nogil;
            csk::symmetric_csr_matvec(indptr.data(), indices.data(), data.data(), n, x.data(), k,
                                      y.data());
          }
          return to_numpy(std::move(y), {static_cast<size_t>(n), static_cast<size_t>(k)});
        });

  m.def("unique_keys", [](ConfigArray keys) {
    const int nw = static_cast<int>(keys.shape(1));
    csk::UniqueResult r;
    {
      nb::gil_scoped_release nogil;
      r = csk::unique_keys(keys.data(), keys.shape(0), nw);
    }
    const size_t n = r.inverse.size(), u = r.counts.size();
    return nb::make_tuple(to_numpy(std::move(r.keys), {u, static_cast<size_t>(nw)}),
                          to_numpy(std::move(r.inverse), {n}), to_numpy(std::move(r.counts), {u}));
  });

  nb::class_<PyKeyIndex>(m, "KeyIndex")
      .def(
          "__init__",
          [](PyKeyIndex* self, ConfigArray keys) {
            new (self) PyKeyIndex();
            self->nwords = static_cast<int>(keys.shape(1));
            self->keys.assign(keys.data(), keys.data() + keys.size());
            nb::gil_scoped_release nogil;
            self->index =
                std::make_unique<csk::KeyIndex>(self->keys.data(), keys.shape(0), self->nwords);
          },
          "keys"_a)
      .def_prop_ro("has_duplicates", [](const PyKeyIndex& s) { return s.index->has_duplicates(); })
      .def("find", [](const PyKeyIndex& s, ConfigArray q) {
        if (static_cast<int>(q.shape(1)) != s.nwords)
          throw std::invalid_argument("queries and keys differ in words per configuration");
        std::vector<std::int64_t> out(q.shape(0));
        {
          nb::gil_scoped_release nogil;
          csk::lookup_keys(*s.index, q.data(), q.shape(0), s.nwords, out.data());
        }
        const size_t n = out.size();
        return to_numpy(std::move(out), {n});
      });
}
