// The memory read-bandwidth reference of the kernel benchmarks: a SIMD sum of a buffer, the
// cheapest way to pull every byte into the core, with runtime dispatch like the kernels.
#ifndef K3_BENCH_KERNELS_READ_BANDWIDTH_H_
#define K3_BENCH_KERNELS_READ_BANDWIDTH_H_

#include <cstddef>
#include <cstdint>

namespace k3::bench {

// Sum of n 32-bit floats at p (a result, so the reads cannot be optimised away).
float SumFloats(const float* p, size_t n);

}  // namespace k3::bench

#endif  // K3_BENCH_KERNELS_READ_BANDWIDTH_H_
