// Which SIMD instruction set the kernels run with. The best one the CPU supports is picked at
// run time (Highway dynamic dispatch); tests and benchmarks can force a lesser one.
#ifndef K3_KERNELS_DISPATCH_H_
#define K3_KERNELS_DISPATCH_H_

#include <cstdint>
#include <string_view>
#include <vector>

namespace k3::kernels {

// Name of the target the kernels dispatch to now, e.g. "AVX3" (AVX-512), "AVX2", "NEON".
std::string_view ActiveKernelTarget();

// Targets compiled into the kernels and supported by this CPU, best first. Opaque ids.
std::vector<int64_t> AvailableKernelTargets();
std::string_view KernelTargetName(int64_t target);

// For tests and benchmarks: make every kernel use `target` (one of AvailableKernelTargets());
// 0 restores the automatic choice. Not thread-safe with concurrent kernel calls.
void ForceKernelTarget(int64_t target);

}  // namespace k3::kernels

#endif  // K3_KERNELS_DISPATCH_H_
