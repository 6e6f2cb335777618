// RandomAccessFile::ReadDirect: any byte range, read past the page cache into aligned memory
// (or through it where the file system refuses O_DIRECT), equals the file's bytes; a range
// past the end is refused naming the file and offset.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "io/aligned_buffer.h"
#include "io/file.h"
#include "tests/io/io_test_util.h"
#include "tests/util/temp_dir.h"

namespace k3::io {
namespace {

using testing::MakeArena;
using testing::MakeFile;
using testing::SameBytes;

void ExpectRangesRead(const std::string& path) {
  // Ends on no 4 KiB boundary, so the last aligned extent runs past the end of the file.
  const testing::TestFile f = MakeFile(path, 3 * 1024 * 1024 + 1234);
  auto file = RandomAccessFile::Open(f.path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto arena = MakeArena(8 << 20);
  const std::pair<uint64_t, uint64_t> ranges[] = {{0, 4096},
                                                  {1, 1},
                                                  {4095, 2},
                                                  {88920, 1 << 20},
                                                  {12345, f.bytes.size() - 12345},
                                                  {f.bytes.size() - 1, 1}};
  for (auto [offset, length] : ranges) {
    auto got = (*file)->ReadDirect(offset, length, arena->Slice(0, BufferBytesFor(offset, length)));
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->size(), length);
    EXPECT_TRUE(SameBytes(f, offset, *got)) << "offset " << offset << " length " << length;
  }
}

TEST(DirectReadTest, AnyRangeReadsTheFilesBytes) {
  k3::testing::TempDir dir;
  ExpectRangesRead(dir.path() + "/data");
}

TEST(DirectReadTest, WhereODirectIsRefusedTheReadGoesThroughThePageCache) {
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  // Linux >= 6.6 accepts O_DIRECT on tmpfs, older kernels refuse it: right either way.
  const std::string path = "/dev/shm/k3-direct-read-test-" + std::to_string(::getpid());
  ExpectRangesRead(path);
  std::filesystem::remove(path);
}

// A 10,000-byte file opened for reading, and a buffer arena.
class SmallFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto f = RandomAccessFile::Open(bytes_.path);
    ASSERT_TRUE(f.ok()) << f.status();
    file_ = *std::move(f);
  }
  k3::testing::TempDir dir_;
  const testing::TestFile bytes_ = MakeFile(dir_.path() + "/data", 10000);
  std::unique_ptr<RandomAccessFile> file_;
  std::unique_ptr<BufferArena> arena_ = MakeArena(1 << 20);
};

TEST_F(SmallFileTest, ARangePastTheEndIsDataLossNamingTheFile) {
  auto got = file_->ReadDirect(9000, 2000, arena_->Slice(0, BufferBytesFor(9000, 2000)));
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(got.status().message().find(bytes_.path), absl::string_view::npos) << got.status();
}

TEST_F(SmallFileTest, ABufferTooSmallOrUnalignedIsRefused) {
  EXPECT_FALSE(file_->ReadDirect(100, 5000, arena_->Slice(0, 4096)).ok());
  EXPECT_FALSE(file_->ReadDirect(100, 100, arena_->Slice(8, 8192)).ok());
}

}  // namespace
}  // namespace k3::io
