// The CPU extension `cuscikit._core`: selected-CI kernels at the top level, each further system
// in a submodule of its own (`_core.guga`, `_core.ising`), bound where its sources exist.
#include "bindings.hpp"

NB_MODULE(_core, m) {
  m.doc() = "cuscikit CPU kernels (C++17, OpenMP)";
  bind_sci(m);
#ifdef CSK_SYSTEM_GUGA
  nanobind::module_ guga = m.def_submodule("guga", "GUGA CI kernels");
  bind_guga(guga);
  // the CUDA kernels' per-CSF rows over a host loop (ext/cpu/guga/rows_twin.cpp)
  nanobind::module_ rows = m.def_submodule("guga_rows", "GUGA device rows on the host");
  bind_guga_rows(rows);
#endif
#ifdef CSK_SYSTEM_ISING
  nanobind::module_ ising = m.def_submodule("ising", "dSB Ising kernels");
  bind_ising(ising);
#endif
}
