// Reading expert traces: the format (little-endian int32 pairs) and errors that name the file.
#include "pipeline/cache/trace.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;

TEST(TraceTest, RoundTripsLittleEndianPairs) {
  const std::vector<ExpertKey> trace = {{1, 498}, {92, 895}, {0, 0}, {7, 65536}};
  const std::string bytes = EncodeExpertTrace(trace);
  ASSERT_EQ(bytes.size(), 32u);
  EXPECT_EQ(static_cast<uint8_t>(bytes[4]), 498 & 0xff);  // expert of the first pair, LSB first
  EXPECT_EQ(static_cast<uint8_t>(bytes[5]), 498 >> 8);
  auto parsed = ParseExpertTrace(bytes, "t.bin");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, trace);
}

TEST(TraceTest, SizeNotAMultipleOfEightNamesFileAndSize) {
  auto parsed = ParseExpertTrace(std::string(12, '\0'), "odd.bin");
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("odd.bin"));
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("12 bytes"));
}

TEST(TraceTest, NegativeIdsAreRejectedWithTheirPosition) {
  const std::string bytes = EncodeExpertTrace({{1, 2}, {3, -4}});
  auto parsed = ParseExpertTrace(bytes, "neg.bin");
  ASSERT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("neg.bin"));
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("request 1"));
  EXPECT_THAT(std::string(parsed.status().message()), HasSubstr("expert -4"));
}

TEST(TraceTest, EmptyTraceIsAnError) {
  EXPECT_EQ(ParseExpertTrace("", "empty.bin").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TraceTest, MissingFileIsNotFound) {
  testing::TempDir dir;
  auto read = ReadExpertTrace(dir / "absent.bin");
  ASSERT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(read.status().message()), HasSubstr("absent.bin"));
}

TEST(TraceTest, ReadsAFile) {
  testing::TempDir dir;
  const std::vector<ExpertKey> trace = {{1, 2}, {3, 4}};
  {
    std::ofstream out(dir / "t.bin", std::ios::binary);
    out << EncodeExpertTrace(trace);
  }
  auto read = ReadExpertTrace(dir / "t.bin");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, trace);
}

}  // namespace
}  // namespace k3
