// Each system of the CPU extension binds its kernels in a function of its own (ext/cpu/<system>/
// bind.cpp); module.cpp calls those that CMake found.
#pragma once
#include <nanobind/nanobind.h>

void bind_sci(nanobind::module_& m);
void bind_guga(nanobind::module_& m);
void bind_guga_rows(nanobind::module_& m);
void bind_ising(nanobind::module_& m);
