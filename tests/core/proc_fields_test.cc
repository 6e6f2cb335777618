#include "core/util/proc_fields.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

TEST(ProcFieldTest, ReadsKbAsBytesAndCountsAsWritten) {
  testing::TempDir dir;
  const std::string path = dir / "meminfo";
  std::ofstream(path) << "MemTotal:       16384 kB\n"
                         "MemFree:         1024 kB\n"
                         "MemAvailable:    8192 kB\n"
                         "HugePages_Total:       3\n"
                         "Hugepagesize:       2048 kB\n";
  EXPECT_EQ(ProcField(path, "MemTotal"), 16384u * 1024);
  EXPECT_EQ(ProcField(path, "MemAvailable"), 8192u * 1024);
  EXPECT_EQ(ProcField(path, "HugePages_Total"), 3u);
  EXPECT_EQ(ProcField(path, "Hugepagesize"), 2048u * 1024);
  EXPECT_EQ(ProcField(path, "Mem"), 0u);  // a whole name, not a prefix
  EXPECT_EQ(ProcField(path, "SwapTotal"), 0u);
  EXPECT_EQ(ProcField(dir / "missing", "MemTotal"), 0u);
}

TEST(ProcFieldTest, ThisMachineHasMemory) {
  EXPECT_GT(MeminfoBytes("MemTotal"), 0u);
  EXPECT_GT(MeminfoBytes("MemAvailable"), 0u);
  EXPECT_LE(MeminfoBytes("MemAvailable"), MeminfoBytes("MemTotal"));
}

}  // namespace
}  // namespace k3
