#include "core/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/file.h"
#include "nlohmann/json.hpp"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Parses `header` as the header of a file with `data_bytes` of data after it.
absl::StatusOr<std::vector<TensorInfo>> Parse(const std::string& header, uint64_t data_bytes) {
  return ParseSafetensorsHeader(header, 8 + header.size() + data_bytes, 0, "x.safetensors");
}

std::string Error(const std::string& header, uint64_t data_bytes) {
  auto r = Parse(header, data_bytes);
  EXPECT_FALSE(r.ok()) << header;
  if (r.ok()) return "";
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  return std::string(r.status().message());
}

TEST(SafetensorsTest, BuiltHeaderIsWhatAJsonLibraryWrites) {
  std::vector<TensorInfo> tensors = {
      {"plain.weight", DType::kBF16, {64, 128}, 0, 0, 64 * 128 * 2},
      {"quote\" back\\slash \x01 caf\xc3\xa9", DType::kF32, {3}, 0, 0, 12},
      {"scalar", DType::kU8, {}, 0, 0, 1},
  };
  const std::string built = BuildSafetensorsHeader(tensors);
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  uint64_t offset = 0;
  for (const TensorInfo& t : tensors) {
    j[t.name] = {{"dtype", DTypeName(t.dtype)},
                 {"shape", t.shape},
                 {"data_offsets", {offset, offset + t.byte_size}}};
    offset += t.byte_size;
  }
  std::string text = j.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  ASSERT_EQ(built.size(), 8 + text.size());
  EXPECT_EQ(built.substr(8), text);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(built[i]);
  EXPECT_EQ(n, text.size());
  auto parsed = Parse(built.substr(8), offset);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->size(), 3u);
  EXPECT_EQ((*parsed)[1].name, tensors[1].name);
}

TEST(SafetensorsTest, ReadsAHeaderFromAFileThroughASmallWindow) {
  std::vector<TensorInfo> tensors;
  uint64_t data = 0;
  for (int i = 0; i < 200; ++i) {
    tensors.push_back({"t." + std::to_string(i),
                       DType::kF16,
                       {i + 1, 3},
                       0,
                       0,
                       static_cast<uint64_t>((i + 1) * 3 * 2)});
    data += tensors.back().byte_size;
  }
  const std::string bytes = BuildSafetensorsHeader(tensors) + std::string(data, '\0');
  testing::TempDir dir;
  ASSERT_TRUE(io::WriteFileAtomically(dir / "a.safetensors", bytes).ok());
  auto file = io::RandomAccessFile::Open(dir / "a.safetensors");
  ASSERT_TRUE(file.ok());
  const uint64_t length = bytes.size() - 8 - data;

  class Keep : public SafetensorsSink {
   public:
    absl::Status Add(const TensorEntry& e) override {
      got.push_back({std::string(e.name),
                     e.dtype,
                     {e.shape.begin(), e.shape.end()},
                     0,
                     e.file_offset,
                     e.byte_size});
      return absl::OkStatus();
    }
    std::vector<TensorInfo> got;
  } keep;
  std::vector<char> window(13);  // a prime: tokens straddle refills everywhere
  ASSERT_TRUE(ScanSafetensorsHeader(HeaderSource(**file, length, window), bytes.size(),
                                    "a.safetensors", keep)
                  .ok());
  auto in_memory = ParseSafetensorsHeader(bytes.substr(8, length), bytes.size(), 0, "m");
  ASSERT_TRUE(in_memory.ok());
  ASSERT_EQ(keep.got.size(), in_memory->size());
  for (size_t i = 0; i < keep.got.size(); ++i) {
    EXPECT_EQ(keep.got[i].name, (*in_memory)[i].name);
    EXPECT_EQ(keep.got[i].shape, (*in_memory)[i].shape);
    EXPECT_EQ(keep.got[i].file_offset, (*in_memory)[i].file_offset);
  }
}

TEST(SafetensorsTest, EntriesListedOutOfOffsetOrderAreSortedAndChecked) {
  const std::string header =
      R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]},)"
      R"("__metadata__":{"format":"pt","nested":{"x":[1,2]}},)"
      R"("a":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"extra":[{"k":null}]}})";
  auto ok = Parse(header, 8);
  ASSERT_TRUE(ok.ok()) << ok.status();
  ASSERT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[0].name, "a");
  EXPECT_EQ((*ok)[0].file_offset, 8 + header.size());
  // Out of order and overlapping: both names in the message, found by a later pass.
  const std::string overlapping = R"({"z":{"dtype":"U8","shape":[4],"data_offsets":[6,10]},)"
                                  R"("y":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                                  R"("x":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})";
  EXPECT_THAT(Error(overlapping, 10),
              AllOf(HasSubstr("x.safetensors"), HasSubstr("tensors x and z overlap")));
}

TEST(SafetensorsTest, LaterKeysOfAnEntryWinAsInAParsedObject) {
  auto r = Parse(R"({"a":{"dtype":"F32","shape":[9],"dtype":"U8","shape":[2],)"
                 R"("data_offsets":[0,2]}})",
                 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].dtype, DType::kU8);
  EXPECT_EQ((*r)[0].shape, (std::vector<int64_t>{2}));
}

TEST(SafetensorsTest, BadEntriesAreRefusedWithTheTensorNamed) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"a":{"dtype":"U8","shape":[2],)"
       R"("data_offsets":[2,4]}})",
       "tensor a is listed twice"},
      {R"({"a":{"dtype":"U8","shape":[-2],"data_offsets":[0,2]}})", "a: bad shape"},
      {R"({"a":{"dtype":"U8","shape":[2.0],"data_offsets":[0,2]}})", "a: bad shape"},
      {R"({"a":{"dtype":"U8","shape":"2","data_offsets":[0,2]}})", "a: missing shape"},
      {R"({"a":{"dtype":8,"shape":[2],"data_offsets":[0,2]}})", "a: missing dtype"},
      {R"({"a":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})", "unsupported dtype \"F64\""},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,4]}})", "a: data_offsets must be"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0]}})", "a: data_offsets must be"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[4,2]}})", "out of order"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,20]}})", "past the end of the file"},
      {R"({"a":{"dtype":"U8","shape":[3],"data_offsets":[0,2]}})", "needs 3"},
      {R"({"a":{"dtype":"U8","shape":[65536,65536,65536,65536],"data_offsets":[0,2]}})",
       "shape too large"},
      {R"({"a":[1]})", "a: entry is not an object"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}} trailing)", "not valid JSON"},
      {R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]})", "not valid JSON"},
      {R"(["a"])", "header JSON is not an object"},
  };
  for (const auto& [header, want] : cases) {
    EXPECT_THAT(Error(header, 4), AllOf(HasSubstr("x.safetensors"), HasSubstr(want))) << header;
  }
}

}  // namespace
}  // namespace k3
