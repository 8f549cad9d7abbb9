// Host-side interface of the GUGA CI kernels. Plain C++ (no CUDA headers); every pointer is a
// device pointer owned by the caller (PyTorch's caching allocator), every call is asynchronous
// on `stream` unless it says otherwise. The per-CSF logic is cuscikit/guga_loops.hpp's.
#pragma once
#include <cstdint>

#include "cuscikit/guga_loops.hpp"

namespace csk::gpu::guga {

using csk::guga::DrtView;
using i64 = std::int64_t;

// Fills the device segment table `seg` (segment_table_size(bmax) doubles); synchronous.
void upload_segments(double* seg, int bmax);

// T[k, :] = gather_row(k0 + k) for k < count (T rows of ld doubles). split: one CSF per warp
// (its searches over the lanes), else one per thread; the same terms, summed in another order.
// order (or null): thread j takes CSF order[k0 + j] (the order must map k0 .. k0 + count - 1
// onto itself; per thread only, the split variant ignores it). symmetric: colmap is symmetric in
// (p, q) (the pair map; see gather_row).
void gather(const DrtView& d, i64 k0, i64 count, const std::int32_t* colmap, int ncol, int ld,
            const double* c, double* T, bool split, const std::int32_t* order, bool symmetric,
            void* stream);

// out[j] (+)= sigma_row(m0 + j) over the rows g0 .. g0 + gcount - 1 of G (stride ldg); split and
// order as for gather.
void sigma(const DrtView& d, i64 m0, i64 count, const std::int32_t* symmap, const double* G,
           int ldg, i64 g0, i64 gcount, double* out, bool accumulate, bool split,
           const std::int32_t* order, void* stream);

// The scatter form of sigma's second half: scatter_row(k0 + j) with row j of G (stride ldg)
// for j < count, into the fixed-point sums acc (2 ncsf words: the lo words of every CSF, then the
// hi words; zero before the first tile).
void scatter(const DrtView& d, i64 k0, i64 count, const std::int32_t* symmap, const double* G,
             int ldg, int e, std::int64_t* acc, void* stream);

// out[j] = fixed_value(acc[j], acc[count + j], e) for j < count (acc holds 2 count words).
void fixed_values(i64 count, const std::int64_t* acc, int e, double* out, void* stream);

// out[j] = coupling_count(k0 + j).
void coupling_counts(const DrtView& d, i64 k0, i64 count, std::int32_t* out, void* stream);

// out[j] = diagonal_row(k0 + j).
void diagonal(const DrtView& d, i64 k0, i64 count, const double* hp, const double* J,
              const double* K, double* out, void* stream);

}  // namespace csk::gpu::guga
