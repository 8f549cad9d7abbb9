// Portability macro: functions marked CSK_HD compile as host code in the C++ extension and as
// host+device code under nvcc/NVRTC, so a physics rule is written once for both backends.
#pragma once
#if defined(__CUDACC__) || defined(__CUDACC_RTC__)
#define CSK_HD __host__ __device__ __forceinline__
#else
#define CSK_HD inline
#endif

#if defined(__CUDACC_RTC__)
typedef unsigned long long csk_u64;
typedef long long csk_i64;
#else
#include <cstdint>
typedef std::uint64_t csk_u64;
typedef std::int64_t csk_i64;
#endif

namespace csk {
constexpr int kMaxWords = 4;  // 256 spin orbitals
}
