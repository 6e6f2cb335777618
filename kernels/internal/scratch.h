// Per-thread scratch memory for the kernels (the MXFP4 products' permuted activations, decoded
// weight panels and accumulators).
// Kernels are called from many threads at once, so each thread owns its buffers; they grow on
// demand and are reused, so steady-state calls do not allocate.
#ifndef K3_KERNELS_INTERNAL_SCRATCH_H_
#define K3_KERNELS_INTERNAL_SCRATCH_H_

#include <cstddef>

namespace k3::kernels::internal {

enum class ScratchSlot { kActivations = 0, kDecodedPanel, kAccumulators };
inline constexpr int kNumScratchSlots = 3;

// A 64-byte aligned buffer of at least `count` floats owned by the calling thread. Contents are
// unspecified. Valid until the next call with the same slot on the same thread.
float* ThreadScratch(ScratchSlot slot, size_t count);

}  // namespace k3::kernels::internal

#endif  // K3_KERNELS_INTERNAL_SCRATCH_H_
