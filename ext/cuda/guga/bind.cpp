// nanobind bindings of the GUGA CI kernels, `cuscikit._cuda.guga`. Every buffer is a typed CUDA
// ndarray (torch tensors pass through DLPack without a copy); sizes and the device are checked
// here, the kernels run on the caller's stream. Python (cuscikit.guga.gpu) builds the DRT, the
// column maps and every buffer.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <string>

#include "../arrays.hpp"
#include "../bindings.hpp"
#include "api.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using csk::gpu::common_device;
using csk::gpu::DeviceMatrix;
using csk::gpu::DeviceVector;
using csk::gpu::require;
using csk::gpu::stream_of;
using csk::gpu::guga::DrtView;
using csk::gpu::guga::i64;

namespace {

// The device DRT: the kernels' view plus the arrays it points into (kept alive here).
struct PyDrt {
  DrtView view;
  DeviceVector<const std::int32_t> up, down, b;
  DeviceVector<const std::int64_t> y;
  DeviceVector<double> seg;
  int device = -1;
};

void check_range(const PyDrt& d, i64 k0, i64 count, const char* what) {
  require(k0 >= 0 && count >= 0 && k0 + count <= d.view.ncsf,
          std::string(what) + ": CSF range outside 0.." + std::to_string(d.view.ncsf));
}

// The order's pointer (null without one) after checking its size.
const std::int32_t* order_of(const PyDrt& d,
                             const std::optional<DeviceVector<const std::int32_t>>& o) {
  if (!o) return nullptr;
  require(o->shape(0) == static_cast<size_t>(d.view.ncsf), "order must hold ncsf entries");
  require(d.view.ncsf < (i64{1} << 31), "order needs fewer than 2^31 CSFs");
  return o->data();
}

void check_map(const PyDrt& d, const DeviceVector<const std::int32_t>& map, const char* what) {
  require(map.shape(0) == static_cast<size_t>(d.view.norb) * d.view.norb,
          std::string(what) + " must hold norb^2 entries");
}

}  // namespace

void bind_guga(nb::module_& m) {
  nb::class_<PyDrt>(m, "Drt")
      .def(
          "__init__",
          [](PyDrt* self, int norb, int head, DeviceVector<const std::int32_t> up,
             DeviceVector<const std::int32_t> down, DeviceVector<const std::int32_t> b,
             DeviceVector<const std::int64_t> y, DeviceVector<double> seg, i64 ncsf) {
            require(norb >= 1 && norb <= 64, "norb must be in 1..64");
            const size_t nv = b.shape(0);
            require(up.shape(0) == 4 * nv && down.shape(0) == 4 * nv && y.shape(0) == 4 * nv,
                    "up, down and y must hold 4 entries per vertex");
            require(head >= 0 && static_cast<size_t>(head) < nv, "head outside the vertices");
            const int bmax = norb + 3;
            require(seg.shape(0) == static_cast<size_t>(csk::guga::segment_table_size(bmax)),
                    "seg must hold segment_table_size(norb + 3) entries");
            require(ncsf > 0, "ncsf must be positive");
            const int dev = common_device("Drt", up, down, b, y, seg);
            csk::gpu::guga::upload_segments(seg.data(), bmax);
            new (self) PyDrt{DrtView{norb, head, bmax, up.data(), down.data(), b.data(), y.data(),
                                     seg.data(), ncsf},
                             up,
                             down,
                             b,
                             y,
                             seg,
                             dev};
          },
          "norb"_a, "head"_a, "up"_a, "down"_a, "b"_a, "y"_a, "seg"_a, "ncsf"_a)
      .def_prop_ro("ncsf", [](const PyDrt& d) { return d.view.ncsf; })
      .def_prop_ro("norb", [](const PyDrt& d) { return d.view.norb; })
      .def_prop_ro("device", [](const PyDrt& d) { return d.device; });

  m.def(
      "gather",
      [](const PyDrt& d, i64 k0, DeviceVector<const std::int32_t> colmap, int ncol,
         DeviceVector<const double> c, DeviceMatrix<double> T, bool split,
         std::optional<DeviceVector<const std::int32_t>> order, bool symmetric,
         std::uintptr_t stream) {
        const i64 count = static_cast<i64>(T.shape(0));
        check_range(d, k0, count, "gather");
        check_map(d, colmap, "colmap");
        require(c.shape(0) == static_cast<size_t>(d.view.ncsf), "c must hold ncsf entries");
        require(ncol >= 1 && T.shape(1) >= static_cast<size_t>(ncol), "T needs >= ncol columns");
        common_device("gather", colmap, c, T, d.seg);
        const std::int32_t* ord = order_of(d, order);
        if (ord) common_device("gather", *order, T);
        nb::gil_scoped_release release;
        csk::gpu::guga::gather(d.view, k0, count, colmap.data(), ncol, static_cast<int>(T.shape(1)),
                               c.data(), T.data(), split, ord, symmetric, stream_of(stream));
      },
      "drt"_a, "k0"_a, "colmap"_a, "ncol"_a, "c"_a, "T"_a, "split"_a, "order"_a.none(),
      "symmetric"_a, "stream"_a,
      "T[k] = gather_row(k0 + k) for every row of T (split: one CSF per warp; order: thread j "
      "takes CSF order[k0 + j], a permutation of the tile; symmetric: colmap is symmetric in "
      "(p, q), as the pair map is).");
  m.def(
      "sigma",
      [](const PyDrt& d, i64 m0, DeviceVector<const std::int32_t> symmap,
         DeviceMatrix<const double> G, i64 g0, DeviceVector<double> out, bool accumulate,
         bool split, std::optional<DeviceVector<const std::int32_t>> order, std::uintptr_t stream) {
        const i64 count = static_cast<i64>(out.shape(0));
        const i64 gcount = static_cast<i64>(G.shape(0));
        check_range(d, m0, count, "sigma");
        check_range(d, g0, gcount, "sigma (G rows)");
        check_map(d, symmap, "symmap");
        const size_t npair = static_cast<size_t>(d.view.norb) * (d.view.norb + 1) / 2;
        require(G.shape(1) >= npair, "G needs norb (norb + 1) / 2 columns");
        common_device("sigma", symmap, G, out, d.seg);
        const std::int32_t* ord = order_of(d, order);
        if (ord) common_device("sigma", *order, out);
        nb::gil_scoped_release release;
        csk::gpu::guga::sigma(d.view, m0, count, symmap.data(), G.data(),
                              static_cast<int>(G.shape(1)), g0, gcount, out.data(), accumulate,
                              split, ord, stream_of(stream));
      },
      "drt"_a, "m0"_a, "symmap"_a, "G"_a, "g0"_a, "out"_a, "accumulate"_a, "split"_a,
      "order"_a.none(), "stream"_a,
      "out[j] (+)= sigma_row(m0 + j) over the rows g0 .. g0 + len(G) - 1 (split: one CSF per "
      "warp).");
  m.def(
      "scatter",
      [](const PyDrt& d, i64 k0, DeviceVector<const std::int32_t> symmap,
         DeviceMatrix<const double> G, int e, DeviceVector<std::int64_t> acc,
         std::uintptr_t stream) {
        const i64 count = static_cast<i64>(G.shape(0));
        check_range(d, k0, count, "scatter");
        check_map(d, symmap, "symmap");
        const size_t npair = static_cast<size_t>(d.view.norb) * (d.view.norb + 1) / 2;
        require(G.shape(1) >= npair, "G needs norb (norb + 1) / 2 columns");
        require(acc.shape(0) == 2 * static_cast<size_t>(d.view.ncsf), "acc must hold 2 ncsf words");
        common_device("scatter", symmap, G, acc, d.seg);
        nb::gil_scoped_release release;
        csk::gpu::guga::scatter(d.view, k0, count, symmap.data(), G.data(),
                                static_cast<int>(G.shape(1)), e, acc.data(), stream_of(stream));
      },
      "drt"_a, "k0"_a, "symmap"_a, "G"_a, "e"_a, "acc"_a, "stream"_a,
      "Adds scatter_row(k0 + j) with row j of G into the fixed-point sums acc (the lo words of "
      "every CSF, then the hi words).");
  m.def(
      "fixed_values",
      [](DeviceVector<const std::int64_t> acc, int e, DeviceVector<double> out,
         std::uintptr_t stream) {
        require(acc.shape(0) == 2 * out.shape(0), "acc must hold 2 words per output");
        common_device("fixed_values", acc, out);
        nb::gil_scoped_release release;
        csk::gpu::guga::fixed_values(static_cast<i64>(out.shape(0)), acc.data(), e, out.data(),
                                     stream_of(stream));
      },
      "acc"_a, "e"_a, "out"_a, "stream"_a,
      "out[j] = the value of the fixed-point sum (acc[j], acc[len(out) + j]).");
  m.def(
      "coupling_counts",
      [](const PyDrt& d, i64 k0, DeviceVector<std::int32_t> out, std::uintptr_t stream) {
        const i64 count = static_cast<i64>(out.shape(0));
        check_range(d, k0, count, "coupling_counts");
        common_device("coupling_counts", out, d.seg);
        nb::gil_scoped_release release;
        csk::gpu::guga::coupling_counts(d.view, k0, count, out.data(), stream_of(stream));
      },
      "drt"_a, "k0"_a, "out"_a, "stream"_a, "out[j] = the number of couplings of CSF k0 + j.");
  m.def(
      "diagonal",
      [](const PyDrt& d, i64 k0, DeviceVector<const double> hp, DeviceVector<const double> J,
         DeviceVector<const double> K, DeviceVector<double> out, std::uintptr_t stream) {
        const i64 count = static_cast<i64>(out.shape(0));
        check_range(d, k0, count, "diagonal");
        const size_t n = d.view.norb;
        require(hp.shape(0) == n && J.shape(0) == n * n && K.shape(0) == n * n,
                "hp must hold norb entries, J and K norb^2");
        common_device("diagonal", hp, J, K, out, d.seg);
        nb::gil_scoped_release release;
        csk::gpu::guga::diagonal(d.view, k0, count, hp.data(), J.data(), K.data(), out.data(),
                                 stream_of(stream));
      },
      "drt"_a, "k0"_a, "hp"_a, "J"_a, "K"_a, "out"_a, "stream"_a,
      "out[j] = <k0 + j|H - ecore|k0 + j>.");
}
