// nanobind bindings of `cuscikit._cuda`. Arguments are raw device pointers (integers) and a
// CUDA stream handle: the Python side (cuscikit.gpu.ops) owns every buffer as a torch tensor,
// checks shapes, dtypes and devices, and keeps the buffers alive across the asynchronous calls.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>

#include "api.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using csk::gpu::i64;
using csk::gpu::u64;

namespace {

template <typename T>
T* ptr(std::uintptr_t p) {
  return reinterpret_cast<T*>(p);
}

void* stream(std::uintptr_t s) { return reinterpret_cast<void*>(s); }

}  // namespace

NB_MODULE(_cuda, m) {
  m.doc() = "cuscikit CUDA kernels (coupled generation, de-duplication, local energies)";

  nb::class_<csk::gpu::Tables>(m, "Tables")
      .def(
          "__init__",
          [](csk::gpu::Tables* t, int norb, int nwords, std::uintptr_t h1, std::uintptr_t eri,
             double e_core, std::uintptr_t offsets, std::uintptr_t targets, std::uintptr_t values,
             std::uintptr_t cut) {
            new (t) csk::gpu::Tables{norb,
                                     nwords,
                                     ptr<const double>(h1),
                                     ptr<const double>(eri),
                                     e_core,
                                     ptr<const i64>(offsets),
                                     ptr<const std::int32_t>(targets),
                                     ptr<const double>(values),
                                     ptr<const std::int32_t>(cut)};
          },
          "norb"_a, "nwords"_a, "h1"_a, "eri"_a, "e_core"_a, "offsets"_a, "targets"_a,
          "values"_a, "cut"_a)
      .def_ro("norb", &csk::gpu::Tables::norb)
      .def_ro("nwords", &csk::gpu::Tables::nwords);

  m.def(
      "coupled_counts",
      [](const csk::gpu::Tables& T, std::uintptr_t configs, i64 n, int ne, double eps,
         std::uintptr_t counts, std::uintptr_t s) {
        nb::gil_scoped_release release;
        csk::gpu::coupled_counts(T, ptr<const u64>(configs), n, ne, eps, ptr<i64>(counts),
                                 stream(s));
      },
      "tables"_a, "configs"_a, "n"_a, "n_elec"_a, "eps"_a, "counts"_a, "stream"_a);
  m.def(
      "coupled_write",
      [](const csk::gpu::Tables& T, std::uintptr_t configs, i64 n, int ne, double eps,
         std::uintptr_t offsets, std::uintptr_t out_configs, std::uintptr_t out_values,
         std::uintptr_t s) {
        nb::gil_scoped_release release;
        csk::gpu::coupled_write(T, ptr<const u64>(configs), n, ne, eps, ptr<const i64>(offsets),
                                ptr<u64>(out_configs), ptr<double>(out_values), stream(s));
      },
      "tables"_a, "configs"_a, "n"_a, "n_elec"_a, "eps"_a, "offsets"_a, "out_configs"_a,
      "out_values"_a, "stream"_a);
  m.def(
      "diagonal",
      [](const csk::gpu::Tables& T, std::uintptr_t configs, i64 n, std::uintptr_t out,
         std::uintptr_t s) {
        nb::gil_scoped_release release;
        csk::gpu::diagonal(T, ptr<const u64>(configs), n, ptr<double>(out), stream(s));
      },
      "tables"_a, "configs"_a, "n"_a, "out"_a, "stream"_a);
  m.def("sort_unique_workspace", &csk::gpu::sort_unique_workspace, "n"_a, "words"_a,
        "with_inverse"_a);
  m.def(
      "sort_unique",
      [](std::uintptr_t keys, i64 n, int words, int end_bit, std::uintptr_t unique,
         std::uintptr_t inverse, std::uintptr_t ws, std::size_t ws_bytes, std::uintptr_t s) {
        nb::gil_scoped_release release;
        return csk::gpu::sort_unique(ptr<const u64>(keys), n, words, end_bit, ptr<u64>(unique),
                                     ptr<i64>(inverse), ptr<void>(ws), ws_bytes, stream(s));
      },
      "keys"_a, "n"_a, "words"_a, "end_bit"_a, "unique"_a, "inverse"_a, "workspace"_a,
      "workspace_bytes"_a, "stream"_a);
  m.def(
      "search_keys",
      [](std::uintptr_t sorted, i64 n_sorted, std::uintptr_t queries, i64 nq, int words,
         std::uintptr_t out, std::uintptr_t s) {
        nb::gil_scoped_release release;
        csk::gpu::search_keys(ptr<const u64>(sorted), n_sorted, ptr<const u64>(queries), nq,
                              words, ptr<i64>(out), stream(s));
      },
      "sorted"_a, "n_sorted"_a, "queries"_a, "n_queries"_a, "words"_a, "out"_a, "stream"_a);
  m.def(
      "local_energy_sums",
      [](std::uintptr_t offsets, i64 n, std::uintptr_t values, std::uintptr_t index,
         std::uintptr_t psi, std::uintptr_t in_space, std::uintptr_t num_c, std::uintptr_t num_v,
         std::uintptr_t s) {
        nb::gil_scoped_release release;
        csk::gpu::local_energy_sums(ptr<const i64>(offsets), n, ptr<const double>(values),
                                    ptr<const i64>(index), ptr<const double>(psi),
                                    ptr<const std::uint8_t>(in_space), ptr<double>(num_c),
                                    ptr<double>(num_v), stream(s));
      },
      "offsets"_a, "n"_a, "values"_a, "index"_a, "psi"_a, "in_space"_a, "num_coupled"_a,
      "num_variational"_a, "stream"_a);
  m.def("device_info", []() {
    const auto d = csk::gpu::device_info();
    nb::dict out;
    out["device"] = d.device;
    out["sm_count"] = d.sm_count;
    out["compute_capability"] = nb::make_tuple(d.major, d.minor);
    out["free_bytes"] = d.free_bytes;
    out["total_bytes"] = d.total_bytes;
    return out;
  });
  m.def("build_arch", &csk::gpu::build_arch);
}
