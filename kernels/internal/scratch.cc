#include "kernels/internal/scratch.h"

#include <array>

#include "hwy/aligned_allocator.h"

namespace k3::kernels::internal {
namespace {

struct Buffer {
  hwy::AlignedFreeUniquePtr<float[]> data;  // HWY_ALIGNMENT (64) bytes aligned
  size_t capacity = 0;
};

}  // namespace

float* ThreadScratch(ScratchSlot slot, size_t count) {
  thread_local std::array<Buffer, kNumScratchSlots> buffers;
  Buffer& b = buffers[static_cast<int>(slot)];
  if (b.capacity < count) {
    // Grow geometrically so a sequence of slightly larger requests does not reallocate each time.
    const size_t capacity = count + count / 2;
    b.data = hwy::AllocateAligned<float>(capacity);
    b.capacity = capacity;
  }
  return b.data.get();
}

}  // namespace k3::kernels::internal
