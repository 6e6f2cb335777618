#include "kernels/internal/scratch.h"

#include <array>
#include <memory>
#include <new>

namespace k3::kernels::internal {
namespace {

struct AlignedDeleter {
  void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
};

struct Buffer {
  std::unique_ptr<float[], AlignedDeleter> data;
  size_t capacity = 0;
};

}  // namespace

float* ThreadScratch(ScratchSlot slot, size_t count) {
  thread_local std::array<Buffer, kNumScratchSlots> buffers;
  Buffer& b = buffers[static_cast<int>(slot)];
  if (b.capacity < count) {
    // Grow geometrically so a sequence of slightly larger requests does not reallocate each time.
    const size_t capacity = count + count / 2;
    b.data.reset(
        static_cast<float*>(::operator new[](capacity * sizeof(float), std::align_val_t{64})));
    b.capacity = capacity;
  }
  return b.data.get();
}

}  // namespace k3::kernels::internal
