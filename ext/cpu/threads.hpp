// OpenMP thread counts for every system of the CPU extension (defined once, in
// sci/coupled.cpp); without OpenMP one thread.
#pragma once

namespace csk {

int max_threads();
int thread_id();  // OpenMP thread number inside a parallel region, 0 without OpenMP

}  // namespace csk
