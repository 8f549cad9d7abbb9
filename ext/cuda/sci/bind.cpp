// nanobind bindings of the selected-CI kernels in `cuscikit._cuda`. Every buffer is a typed CUDA
// ndarray (torch tensors pass through DLPack without a copy): shapes, dtypes, contiguity and the
// device are checked here, and the kernels run on the arrays' device and on the caller's stream.
// Outputs are allocated by the caller (PyTorch's caching allocator: one memory pool).
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
using csk::gpu::DeviceArray;
using csk::gpu::DeviceMatrix;
using csk::gpu::DeviceVector;
using csk::gpu::i64;
using csk::gpu::require;
using csk::gpu::stream_of;
using csk::gpu::u64;

namespace {

// The kernels' view of the Hamiltonian plus the arrays it points into (kept alive here).
struct PyTables {
  csk::gpu::Tables t;
  DeviceMatrix<const double> h1;
  nb::ndarray<const double, nb::device::cuda, nb::c_contig, nb::ndim<4>> eri;
  DeviceVector<const i64> offsets;
  DeviceVector<const std::int32_t> targets;
  DeviceVector<const double> values;
  DeviceVector<const std::int32_t> cut;
  int device = -1;
};

using Configs = DeviceMatrix<const std::int64_t>;  // uint64 bits in int64 tensors

const u64* bits(const Configs& c) { return reinterpret_cast<const u64*>(c.data()); }

void check_configs(const PyTables& T, const Configs& c, const char* what) {
  require(
      static_cast<int>(c.shape(1)) == T.t.nwords,
      std::string(what) + " must have " + std::to_string(T.t.nwords) + " words per configuration");
  common_device(what, c, T.h1);
}

}  // namespace

void bind_sci(nb::module_& m) {
  nb::class_<PyTables>(m, "Tables")
      .def(
          "__init__",
          [](PyTables* self, DeviceMatrix<const double> h1,
             nb::ndarray<const double, nb::device::cuda, nb::c_contig, nb::ndim<4>> eri,
             double e_core, DeviceVector<const i64> offsets,
             DeviceVector<const std::int32_t> targets, DeviceVector<const double> values,
             DeviceVector<const std::int32_t> cut) {
            const size_t norb = h1.shape(0);
            require(h1.shape(1) == norb, "h1 must be square");
            for (int k = 0; k < 4; ++k) require(eri.shape(k) == norb, "eri must be (n, n, n, n)");
            require(offsets.shape(0) == cut.shape(0) + 1, "cut needs one entry per pair");
            require(targets.shape(0) == values.shape(0), "targets and values differ in length");
            const int dev = common_device("Tables", h1, eri, offsets, targets, values, cut);
            const int nwords = static_cast<int>((2 * norb + 63) / 64);
            new (self) PyTables{
                csk::gpu::Tables{static_cast<int>(norb), nwords, h1.data(), eri.data(), e_core,
                                 offsets.data(), targets.data(), values.data(), cut.data()},
                h1,
                eri,
                offsets,
                targets,
                values,
                cut,
                dev};
          },
          "h1"_a, "eri"_a, "e_core"_a, "offsets"_a, "targets"_a, "values"_a, "cut"_a)
      .def_prop_ro("norb", [](const PyTables& s) { return s.t.norb; })
      .def_prop_ro("nwords", [](const PyTables& s) { return s.t.nwords; })
      .def_prop_ro("device", [](const PyTables& s) { return s.device; });

  m.def(
      "coupled_counts",
      [](const PyTables& T, Configs configs, int n_elec, double eps, DeviceVector<i64> counts,
         std::uintptr_t stream) {
        check_configs(T, configs, "configs");
        require(counts.shape(0) == configs.shape(0), "counts needs one entry per source");
        nb::gil_scoped_release release;
        csk::gpu::coupled_counts(T.t, bits(configs), static_cast<i64>(configs.shape(0)), n_elec,
                                 eps, counts.data(), stream_of(stream));
      },
      "tables"_a, "configs"_a, "n_elec"_a, "eps"_a, "counts"_a, "stream"_a);
  m.def(
      "coupled_write",
      [](const PyTables& T, Configs configs, int n_elec, double eps,
         DeviceVector<const i64> offsets, DeviceMatrix<std::int64_t> out_configs,
         DeviceVector<double> out_values, std::uintptr_t stream) {
        check_configs(T, configs, "configs");
        require(offsets.shape(0) == configs.shape(0) + 1, "offsets needs n + 1 entries");
        require(out_configs.shape(0) == out_values.shape(0),
                "out_configs and out_values differ in length");
        require(static_cast<int>(out_configs.shape(1)) == T.t.nwords,
                "out_configs has the wrong number of words");
        common_device("coupled_write", configs, offsets, out_configs, out_values);
        nb::gil_scoped_release release;
        csk::gpu::coupled_write(T.t, bits(configs), static_cast<i64>(configs.shape(0)), n_elec, eps,
                                offsets.data(), reinterpret_cast<u64*>(out_configs.data()),
                                out_values.data(), stream_of(stream));
      },
      "tables"_a, "configs"_a, "n_elec"_a, "eps"_a, "offsets"_a, "out_configs"_a, "out_values"_a,
      "stream"_a);
  m.def(
      "diagonal",
      [](const PyTables& T, Configs configs, DeviceVector<double> out, std::uintptr_t stream) {
        check_configs(T, configs, "configs");
        require(out.shape(0) == configs.shape(0), "out needs one entry per configuration");
        nb::gil_scoped_release release;
        csk::gpu::diagonal(T.t, bits(configs), static_cast<i64>(configs.shape(0)), out.data(),
                           stream_of(stream));
      },
      "tables"_a, "configs"_a, "out"_a, "stream"_a);
  m.def("sort_unique_workspace", &csk::gpu::sort_unique_workspace, "n"_a, "words"_a,
        "with_inverse"_a);
  m.def(
      "sort_unique",
      [](Configs keys, int end_bit, DeviceMatrix<std::int64_t> unique,
         std::optional<DeviceVector<i64>> inverse, DeviceVector<std::uint8_t> workspace,
         std::uintptr_t stream) {
        const i64 n = static_cast<i64>(keys.shape(0));
        const int words = static_cast<int>(keys.shape(1));
        require(unique.shape(0) >= keys.shape(0) && unique.shape(1) == keys.shape(1),
                "unique needs room for every key");
        if (inverse) require(inverse->shape(0) == keys.shape(0), "inverse needs n entries");
        common_device("sort_unique", keys, unique, workspace);
        i64* inv = inverse ? inverse->data() : nullptr;
        nb::gil_scoped_release release;
        return csk::gpu::sort_unique(bits(keys), n, words, end_bit,
                                     reinterpret_cast<u64*>(unique.data()), inv, workspace.data(),
                                     workspace.shape(0), stream_of(stream));
      },
      "keys"_a, "end_bit"_a, "unique"_a, "inverse"_a.none(), "workspace"_a, "stream"_a);
  m.def(
      "search_keys",
      [](Configs sorted, Configs queries, DeviceVector<i64> out, std::uintptr_t stream) {
        require(sorted.shape(1) == queries.shape(1), "sorted keys and queries differ in words");
        require(out.shape(0) == queries.shape(0), "out needs one entry per query");
        common_device("search_keys", sorted, queries, out);
        nb::gil_scoped_release release;
        csk::gpu::search_keys(bits(sorted), static_cast<i64>(sorted.shape(0)), bits(queries),
                              static_cast<i64>(queries.shape(0)), static_cast<int>(sorted.shape(1)),
                              out.data(), stream_of(stream));
      },
      "sorted"_a, "queries"_a, "out"_a, "stream"_a);
  m.def(
      "local_energy_sums",
      [](DeviceVector<const i64> offsets, DeviceVector<const double> values,
         DeviceVector<const i64> index, DeviceMatrix<const double> psi,
         DeviceVector<const std::uint8_t> in_space, DeviceMatrix<double> num_coupled,
         DeviceMatrix<double> num_variational, std::uintptr_t stream) {
        const size_t n = offsets.shape(0) - 1;
        require(values.shape(0) == index.shape(0), "values and index differ in length");
        require(psi.shape(1) == 2 && num_coupled.shape(1) == 2 && num_variational.shape(1) == 2,
                "complex arrays travel as (n, 2) float64 views");
        require(in_space.shape(0) == psi.shape(0), "in_space needs one entry per psi");
        require(num_coupled.shape(0) == n && num_variational.shape(0) == n,
                "the numerators need one entry per source");
        common_device("local_energy_sums", offsets, values, index, psi, in_space, num_coupled,
                      num_variational);
        nb::gil_scoped_release release;
        csk::gpu::local_energy_sums(offsets.data(), static_cast<i64>(n), values.data(),
                                    index.data(), psi.data(), in_space.data(), num_coupled.data(),
                                    num_variational.data(), stream_of(stream));
      },
      "offsets"_a, "values"_a, "index"_a, "psi"_a, "in_space"_a, "num_coupled"_a,
      "num_variational"_a, "stream"_a);

  m.def("amplitude_layer_floats", &csk::gpu::amplitude_layer_floats, "d_model"_a);
  m.def("amplitude_default_rows", &csk::gpu::amplitude_default_rows, "d_model"_a);
  m.def(
      "amplitude_stage",
      [](Configs configs, int k0, int k1, int norb, int na, int nb_, int d_model, int head_dim,
         float scale, DeviceMatrix<const float> layers, DeviceMatrix<const float> tok_emb,
         DeviceMatrix<const float> pos_emb, DeviceVector<const float> lnfw,
         DeviceVector<const float> lnfb, DeviceMatrix<const float> wh,
         DeviceMatrix<const float> bias16, std::optional<DeviceVector<const std::int32_t>> parent,
         std::optional<DeviceVector<const double>> pamp,
         std::optional<DeviceArray<const float, nb::ndim<6>>> pkv,
         std::optional<DeviceArray<float, nb::ndim<6>>> store,
         std::optional<DeviceVector<double>> out64, std::optional<DeviceVector<float>> out32,
         std::uintptr_t stream, int rows, int products,
         std::optional<DeviceMatrix<const float>> layers_tc) {
        csk::gpu::AmplitudeNet net;
        net.norb = norb;
        net.na = na;
        net.nb = nb_;
        net.words = static_cast<int>(configs.shape(1));
        net.dp = static_cast<int>(tok_emb.shape(1));
        net.head_dim = head_dim;
        net.n_layers = static_cast<int>(layers.shape(0));
        net.scale = scale;
        const i64 n = static_cast<i64>(configs.shape(0));
        require(net.words >= 1 && net.words <= 2 && 2 * norb <= 64 * net.words,
                "configs need 1 or 2 words covering norb orbitals");
        const int d = d_model;
        require(csk::gpu::amplitude_layer_floats(d) > 0 && d <= net.dp,
                "no amplitude kernel is compiled for this d_model");
        require(static_cast<int>(layers.shape(1)) == csk::gpu::amplitude_layer_floats(d),
                "layers must be (n_layers, amplitude_layer_floats(d_model))");
        net.d_model = d;
        require(tok_emb.shape(0) == 5, "tok_emb must have 5 rows");
        require(static_cast<int>(pos_emb.shape(0)) >= norb && pos_emb.shape(1) == tok_emb.shape(1),
                "pos_emb must be (>= norb, dp)");
        require(static_cast<int>(lnfw.shape(0)) >= d && static_cast<int>(lnfb.shape(0)) >= d,
                "lnfw, lnfb need d_model entries");
        require(static_cast<int>(wh.shape(0)) >= d && wh.shape(1) == 16, "wh must be (>= d, 16)");
        require(static_cast<int>(bias16.shape(0)) >= norb && bias16.shape(1) == 16,
                "bias16 must be (>= norb, 16)");
        require(out64.has_value() != out32.has_value(), "give exactly one of out64, out32");
        require((out64 ? out64->shape(0) : out32->shape(0)) == static_cast<size_t>(n),
                "out needs one entry per configuration");
        require(parent.has_value() == pamp.has_value() && parent.has_value() == pkv.has_value(),
                "parent, pamp and pkv come together");
        const int ngr = (d + 15) / 16;
        csk::gpu::AmplitudeStage st;
        st.configs = bits(configs);
        st.n = n;
        st.k0 = k0;
        st.k1 = k1;
        if (parent) {
          require(parent->shape(0) == static_cast<size_t>(n), "parent needs n entries");
          require(static_cast<int>(pkv->shape(1)) == net.n_layers && pkv->shape(2) == 2 &&
                      static_cast<int>(pkv->shape(3)) == ngr &&
                      static_cast<int>(pkv->shape(4)) >= k0 && pkv->shape(5) == 16,
                  "pkv must be (prefixes, n_layers, 2, groups, >= k0, 16)");
          require(pkv->shape(0) == pamp->shape(0), "pkv and pamp differ in prefixes");
          st.parent = parent->data();
          st.pamp = pamp->data();
          st.pkv = pkv->data();
          st.lpc = static_cast<int>(pkv->shape(4));
        } else {
          require(k0 == 0, "a stage without a parent starts at position 0");
        }
        if (store) {
          require(store->shape(0) == static_cast<size_t>(n) &&
                      static_cast<int>(store->shape(1)) == net.n_layers && store->shape(2) == 2 &&
                      static_cast<int>(store->shape(3)) == ngr &&
                      static_cast<int>(store->shape(4)) >= k1 && store->shape(5) == 16,
                  "store must be (n, n_layers, 2, groups, >= k1, 16)");
          st.store = store->data();
          st.lps = static_cast<int>(store->shape(4));
        }
        st.out64 = out64 ? out64->data() : nullptr;
        st.out32 = out32 ? out32->data() : nullptr;
        st.rows = rows;  // checked by amplitude_stage before any launch
        st.products = products;
        if (layers_tc) {
          require(layers_tc->shape(0) == layers.shape(0) &&
                      layers_tc->shape(1) == layers.shape(1) + static_cast<size_t>(12 * d * d),
                  "layers_tc must be (n_layers, amplitude_layer_floats(d_model) + 12 d_model^2)");
          net.layers_tc = layers_tc->data();
        }
        require(products == 0 || layers_tc.has_value(), "products 1 and 2 need layers_tc");
        net.layers = layers.data();
        net.tok_emb = tok_emb.data();
        net.pos_emb = pos_emb.data();
        net.lnfw = lnfw.data();
        net.lnfb = lnfb.data();
        net.wh = wh.data();
        net.bias16 = bias16.data();
        common_device("amplitude_stage", configs, layers, tok_emb, pos_emb, lnfw, lnfb, wh, bias16);
        if (layers_tc) common_device("amplitude_stage", configs, *layers_tc);
        nb::gil_scoped_release release;
        csk::gpu::amplitude_stage(net, st, stream_of(stream));
      },
      "configs"_a, "k0"_a, "k1"_a, "norb"_a, "na"_a, "nb"_a, "d_model"_a, "head_dim"_a, "scale"_a,
      "layers"_a, "tok_emb"_a, "pos_emb"_a, "lnfw"_a, "lnfb"_a, "wh"_a, "bias16"_a,
      "parent"_a.none(), "pamp"_a.none(), "pkv"_a.none(), "store"_a.none(), "out64"_a.none(),
      "out32"_a.none(), "stream"_a, "rows"_a = 0, "products"_a = 0,
      "layers_tc"_a.none() = nb::none());
}
