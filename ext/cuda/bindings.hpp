// Each system of the CUDA extension binds its kernels in a function of its own (ext/cuda/
// <system>/bind.cpp); module.cpp calls those that CMake found.
#pragma once
#include <nanobind/nanobind.h>

void bind_sci(nanobind::module_& m);
void bind_guga(nanobind::module_& m);
void bind_ising(nanobind::module_& m);
void bind_ising_service(nanobind::module_& m);     // ising/service_bind.cpp (Linux)
void bind_ising_stream_gpu(nanobind::module_& m);  // ising/stream_bind.cpp
