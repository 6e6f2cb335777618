// Aligned extents of arbitrary ranges and the huge-page buffer arena.
#include "io/aligned_buffer.h"

#include <cstring>

#include "gtest/gtest.h"

namespace k3::io {
namespace {

TEST(AlignedExtentTest, CoversArbitraryRanges) {
  struct Case {
    uint64_t offset, length, aligned_offset, aligned_length, head;
  };
  for (const Case& c : {Case{0, 4096, 0, 4096, 0}, Case{0, 1, 0, 4096, 0},
                        Case{4095, 2, 0, 8192, 4095}, Case{8192, 4096, 8192, 4096, 0},
                        Case{12345, 17547264, 12288, 17551360, 57}, Case{4096, 0, 4096, 0, 0}}) {
    const AlignedExtent e = ExtentFor(c.offset, c.length);
    EXPECT_EQ(e.aligned_offset, c.aligned_offset) << c.offset;
    EXPECT_EQ(e.aligned_length, c.aligned_length) << c.offset;
    EXPECT_EQ(e.head, c.head) << c.offset;
    EXPECT_EQ(BufferBytesFor(c.offset, c.length), c.aligned_length);
    EXPECT_LE(e.aligned_offset + e.head + c.length, e.aligned_offset + e.aligned_length);
  }
}

TEST(BufferArenaTest, AlignedWritableAndSliceable) {
  for (bool huge : {true, false}) {
    BufferArena::Options o;
    o.huge_pages = huge;
    auto arena = BufferArena::Create(5 << 20, o);
    ASSERT_TRUE(arena.ok()) << arena.status();
    BufferArena& a = **arena;
    EXPECT_GE(a.size(), 5u << 20);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.data()) % (2 << 20), 0u);  // THP-friendly
    if (!huge) {
      EXPECT_EQ(a.page_kind(), PageKind::kNormal);
    }
    std::memset(a.data(), 0xab, a.size());
    EXPECT_EQ(a.Slice(4096, 8192).data(), a.data() + 4096);
    EXPECT_TRUE(a.Slice(a.size() - 4096, 8192).empty());
    EXPECT_TRUE(a.Contains(a.data() + 100, 100));
    EXPECT_FALSE(a.Contains(a.data() + a.size() - 10, 100));
  }
  EXPECT_FALSE(BufferArena::Create(0).ok());
}

}  // namespace
}  // namespace k3::io
