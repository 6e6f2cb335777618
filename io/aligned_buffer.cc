#include "io/aligned_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace k3::io {
namespace {

constexpr size_t kHugePageBytes = 2u << 20;

size_t RoundUpToHugePage(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

void* MapAnonymous(size_t bytes, int extra_flags) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | extra_flags, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// A 2 MiB-aligned region inside a larger normal mapping, so that transparent huge pages can
// back it; the unaligned head and tail are unmapped again.
uint8_t* MapAlignedNormal(size_t bytes) {
  const size_t over = bytes + kHugePageBytes;
  auto* base = static_cast<uint8_t*>(MapAnonymous(over, 0));
  if (base == nullptr) return nullptr;
  const uintptr_t addr = reinterpret_cast<uintptr_t>(base);
  auto* aligned = reinterpret_cast<uint8_t*>((addr + kHugePageBytes - 1) & ~(kHugePageBytes - 1));
  const size_t head = static_cast<size_t>(aligned - base);
  if (head > 0) ::munmap(base, head);
  const size_t tail = over - head - bytes;
  if (tail > 0) ::munmap(aligned + bytes, tail);
  return aligned;
}

}  // namespace

const char* PageKindName(PageKind kind) {
  switch (kind) {
    case PageKind::kHugeTlb:
      return "hugetlb";
    case PageKind::kTransparent:
      return "transparent huge pages";
    case PageKind::kNormal:
      return "4 KiB pages";
  }
  return "?";
}

absl::StatusOr<std::unique_ptr<BufferArena>> BufferArena::Create(size_t bytes) {
  return Create(bytes, Options{});
}

absl::StatusOr<std::unique_ptr<BufferArena>> BufferArena::Create(size_t bytes,
                                                                 const Options& options) {
  if (bytes == 0) return absl::InvalidArgumentError("a buffer arena needs at least one byte");
  const size_t mapped = RoundUpToHugePage(bytes);
  PageKind kind = PageKind::kNormal;
  uint8_t* p = nullptr;
  if (options.huge_pages) {
    p = static_cast<uint8_t*>(MapAnonymous(mapped, MAP_HUGETLB));
    if (p != nullptr) kind = PageKind::kHugeTlb;
  }
  if (p == nullptr) {
    p = MapAlignedNormal(mapped);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot map ", mapped, " bytes of read buffers: ", std::strerror(errno)));
    }
    if (options.huge_pages && ::madvise(p, mapped, MADV_HUGEPAGE) == 0) {
      kind = PageKind::kTransparent;
    }
  }
  return std::unique_ptr<BufferArena>(new BufferArena(p, mapped, kind));
}

BufferArena::~BufferArena() { ::munmap(data_, size_); }

std::span<uint8_t> BufferArena::Slice(size_t offset, size_t bytes) const {
  if (offset > size_ || bytes > size_ - offset) return {};
  return {data_ + offset, bytes};
}

}  // namespace k3::io
