// The CUDA extension `cuscikit._cuda`: selected-CI kernels at the top level, each further system
// in a submodule of its own (`_cuda.guga`, `_cuda.ising`), bound where its sources exist.
#include <nanobind/nanobind.h>

#include "bindings.hpp"
#include "device.hpp"

namespace nb = nanobind;

NB_MODULE(_cuda, m) {
  m.doc() = "cuscikit CUDA kernels";
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
  bind_sci(m);
#ifdef CSK_SYSTEM_GUGA
  nanobind::module_ guga = m.def_submodule("guga", "GUGA CI kernels");
  bind_guga(guga);
#endif
#ifdef CSK_SYSTEM_ISING
  nanobind::module_ ising = m.def_submodule("ising", "dSB Ising kernels");
  bind_ising(ising);
  bind_ising_stream_gpu(ising);
#ifdef __linux__
  bind_ising_service(ising);
#endif
#endif
}
