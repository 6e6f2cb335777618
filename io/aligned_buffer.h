// Memory for direct (O_DIRECT) reads: 4 KiB-aligned buffers, backed by huge pages where the
// system has them, and the arithmetic that maps an arbitrary byte range of a file onto the
// aligned range that O_DIRECT can read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/statusor.h"

namespace k3::io {

// O_DIRECT needs file offset, length and memory address aligned to the device's logical block
// size; 4 KiB covers every device in use (512-byte and 4Kn), so we align to that everywhere.
inline constexpr uint64_t kDirectAlignment = 4096;

inline constexpr uint64_t AlignDown(uint64_t x) { return x & ~(kDirectAlignment - 1); }
inline constexpr uint64_t AlignUp(uint64_t x) { return AlignDown(x + kDirectAlignment - 1); }
// `x` rounded up to a multiple of `alignment` (any positive value).
inline constexpr uint64_t AlignUpTo(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

// The aligned superset of the file range [offset, offset + length): the engine reads
// [aligned_offset, aligned_offset + aligned_length) into the buffer, so the requested bytes
// start `head` bytes into it. Checkpoint offsets are arbitrary (safetensors headers have any
// length), hence the indirection.
struct AlignedExtent {
  uint64_t aligned_offset = 0;
  uint64_t aligned_length = 0;
  uint64_t head = 0;
};

inline constexpr AlignedExtent ExtentFor(uint64_t offset, uint64_t length) {
  const uint64_t begin = AlignDown(offset);
  return {begin, AlignUp(offset + length) - begin, offset - begin};
}

// Buffer bytes a read of [offset, offset + length) needs.
inline constexpr uint64_t BufferBytesFor(uint64_t offset, uint64_t length) {
  return ExtentFor(offset, length).aligned_length;
}

enum class PageKind {
  kHugeTlb,      // explicit 2 MiB huge pages (MAP_HUGETLB): needs vm.nr_hugepages
  kTransparent,  // normal mapping with MADV_HUGEPAGE: the kernel uses huge pages when it can
  kNormal,       // 4 KiB pages
};

const char* PageKindName(PageKind kind);

// One large anonymous mapping, 2 MiB-aligned (so transparent huge pages can back it), used as
// the memory that reads land in. A ReadEngine created with an arena registers it with io_uring
// once (fixed buffers: no page pinning per read). Slicing it into slots is the caller's
// business (the expert cache knows its slot size; io does not). The pages are not prefaulted:
// registering the arena with io_uring faults (and pins) every page anyway, and on a virtio disk
// with 4 KiB pages a prefaulted arena read ~40 % slower than one faulted by the registration
// (measured, docs/PERFORMANCE.md).
class BufferArena {
 public:
  struct Options {
    bool huge_pages = true;  // try MAP_HUGETLB, then MADV_HUGEPAGE; fall back silently
  };

  static absl::StatusOr<std::unique_ptr<BufferArena>> Create(size_t bytes);
  static absl::StatusOr<std::unique_ptr<BufferArena>> Create(size_t bytes, const Options& options);
  ~BufferArena();
  BufferArena(const BufferArena&) = delete;
  BufferArena& operator=(const BufferArena&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  PageKind page_kind() const { return kind_; }
  // `bytes` at `offset`; empty when that is not inside the arena.
  std::span<uint8_t> Slice(size_t offset, size_t bytes) const;
  bool Contains(const uint8_t* p, size_t bytes) const {
    return p >= data_ && bytes <= size_ && static_cast<size_t>(p - data_) <= size_ - bytes;
  }

 private:
  BufferArena(uint8_t* data, size_t size, PageKind kind) : data_(data), size_(size), kind_(kind) {}

  uint8_t* data_;  // one mapping of size_ bytes (the request rounded up to 2 MiB)
  size_t size_;
  PageKind kind_;
};

}  // namespace k3::io
