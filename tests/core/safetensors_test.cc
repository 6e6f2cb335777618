#include "core/checkpoint/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/json_reader.h"
#include "io/file.h"
#include "nlohmann/json.hpp"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

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

// A header read from a file into a reader that an earlier, longer header left its memory in:
// nothing of the earlier one may show through.
TEST(SafetensorsTest, ReadsHeadersFromFilesThroughOneReader) {
  testing::TempDir dir;
  JsonReader reader;
  for (int count : {200, 3}) {
    std::vector<TensorInfo> tensors;
    uint64_t data = 0;
    for (int i = 0; i < count; ++i) {
      tensors.push_back({"t." + std::to_string(i),
                         DType::kF16,
                         {i + 1, 3},
                         0,
                         0,
                         static_cast<uint64_t>((i + 1) * 3 * 2)});
      data += tensors.back().byte_size;
    }
    const std::string bytes = BuildSafetensorsHeader(tensors) + std::string(data, '\0');
    const std::string path = dir / ("a" + std::to_string(count) + ".safetensors");
    ASSERT_TRUE(io::WriteFileAtomically(path, bytes).ok());
    auto file = io::RandomAccessFile::Open(path);
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
    absl::Status s =
        ScanSafetensorsHeader(HeaderSource(**file, length, reader), bytes.size(), path, keep);
    ASSERT_TRUE(s.ok()) << s;
    auto in_memory = ParseSafetensorsHeader(bytes.substr(8, length), bytes.size(), 0, "m");
    ASSERT_TRUE(in_memory.ok());
    ASSERT_EQ(keep.got.size(), static_cast<size_t>(count));
    ASSERT_EQ(keep.got.size(), in_memory->size());
    for (size_t i = 0; i < keep.got.size(); ++i) {
      EXPECT_EQ(keep.got[i].name, (*in_memory)[i].name);
      EXPECT_EQ(keep.got[i].shape, (*in_memory)[i].shape);
      EXPECT_EQ(keep.got[i].file_offset, (*in_memory)[i].file_offset);
    }
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

// JSON documents of every kind, valid and not, judged by nlohmann's strict parser (which k3
// used before simdjson): simdjson On-Demand checks only what it is asked to read, so each is
// tried where the reader looks at it (the whole header) and where it only steps over it (the
// metadata, an unknown key of an entry, a dimension of a shape).
const std::vector<std::string>& JsonDocuments() {
  static const std::vector<std::string> docs = {
      R"({})",
      R"([])",
      R"({"a":1,"b":[true,false,null],"c":{"d":"e"}})",
      R"(  {"x" : [ 1 , -2 , 3.5e+7 , 0.25 , -0 , 1E2 ] }  )",
      R"("escapes \" \\ \/ \b \f \n \r \t \u00e9 \u4e2d \ud83d\ude00")",
      "\"utf-8 \xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80\"",
      R"(18446744073709551615)",
      R"(18446744073709551616)",
      R"(0e99999999999999999999)",
      R"(1e-99999999999999999999)",
      R"(1e999)",
      R"(-1e999)",
      R"([[[[[[[[[[1]]]]]]]]]])",
      R"({"a":1,})",
      R"([1,2,])",
      R"({"a" 1})",
      R"({"a":1 "b":2})",
      R"({1:2})",
      R"("unterminated)",
      R"("bad escape \x")",
      R"("lone \udc00")",
      R"("half \ud800 pair")",
      R"("short \u12")",
      "\"control \x01 char\"",
      "\"bad utf-8 \xc0\xaf\"",
      "\"surrogate in utf-8 \xed\xa0\x80\"",
      "\"truncated \xe4\xb8\"",
      "\"past U+10FFFF \xf4\x90\x80\x80\"",
      R"(01)",
      R"(1.)",
      R"(.5)",
      R"(1e)",
      R"(-)",
      R"(+1)",
      R"(tru)",
      R"(nulls)",
      R"(falsey)",
      R"({"a":1}})",
      R"({"a":1} x)",
      R"()",
      R"(   )",
      R"([1 2])",
      R"([}])",
      R"({"a":[1,{"b":}]})",
      R"({"\ud800":1})",
  };
  return docs;
}

std::string Prefixed(const std::string& header) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header;
}

// Entries are checked as they are read, so a header whose JSON goes wrong after an entry that
// is wrong already is refused for that entry: "not valid JSON" is expected only where nothing
// comes before the fault.
TEST(SafetensorsTest, AcceptsExactlyTheJsonAStrictParserAccepts) {
  const std::string entry = R"("t":{"dtype":"U8","shape":[2],"data_offsets":[0,2]})";
  for (const std::string& doc : JsonDocuments()) {
    const bool valid = nlohmann::json::accept(doc);
    auto message = [](const absl::StatusOr<std::vector<TensorInfo>>& r) {
      return r.ok() ? std::string() : std::string(r.status().message());
    };
    // The whole header: a valid document that is not an object is named as such.
    auto whole = Parse(doc, 2);
    if (!valid) {
      EXPECT_FALSE(whole.ok()) << doc;
      if (doc.find('{') != 0) {
        EXPECT_THAT(message(whole), HasSubstr("not valid JSON")) << doc;
      }
    } else if (!nlohmann::json::parse(doc).is_object()) {
      EXPECT_THAT(message(whole), HasSubstr("header JSON is not an object")) << doc;
    }
    // The metadata, which is only stepped over.
    auto metadata = Parse(absl::StrCat(R"({"__metadata__":)", doc, ",", entry, "}"), 2);
    EXPECT_EQ(metadata.ok(), valid) << doc << ": " << metadata.status();
    if (!valid) {
      EXPECT_THAT(message(metadata),
                  AllOf(HasSubstr("x.safetensors"), HasSubstr("header is not valid JSON")))
          << doc;
    }
    // An unknown key of an entry.
    auto extra = Parse(absl::StrCat(R"({"t":{"dtype":"U8","extra":)", doc,
                                    R"(,"shape":[2],"data_offsets":[0,2]}})"),
                       2);
    EXPECT_EQ(extra.ok(), valid) << doc << ": " << extra.status();
    // A dimension: a valid value that is not a non-negative integer is a bad shape (or, for
    // 2^64 - 1, too large).
    auto dim = Parse(
        absl::StrCat(R"({"t":{"dtype":"U8","shape":[2,)", doc, R"(],"data_offsets":[0,2]}})"), 2);
    EXPECT_FALSE(dim.ok()) << doc;
    if (valid) {
      EXPECT_THAT(message(dim), AllOf(HasSubstr("t: "), Not(HasSubstr("JSON")))) << doc;
    } else {
      EXPECT_THAT(message(dim), HasSubstr("header is not valid JSON")) << doc;
    }
  }
}

TEST(SafetensorsTest, ErrorsSayWhereInTheHeader) {
  EXPECT_THAT(
      Error(R"({"a":[1,2,}  )", 0),
      AllOf(HasSubstr("header is not valid JSON (at byte 10: "), HasSubstr("improper structure")));
  EXPECT_THAT(Error("{\"a\":\"\x01\"}", 0), HasSubstr("must be escaped"));
}

TEST(SafetensorsTest, DeepNestingIsRefusedNotACrash) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  // Valid JSON, but no header nests like this: refused, and not called invalid.
  EXPECT_THAT(Error(deep, 0), HasSubstr("nests values more than 512 levels deep"));
  EXPECT_THAT(Error(absl::StrCat(R"({"__metadata__":)", deep, "}"), 0),
              AllOf(HasSubstr("more than 512 levels deep"), Not(HasSubstr("not valid JSON"))));
  const std::string ok = std::string(500, '[') + std::string(500, ']');
  auto r = Parse(absl::StrCat(R"({"__metadata__":)", ok, "}"), 0);
  EXPECT_TRUE(r.ok()) << r.status();
}

// nlohmann took a NUL byte for the end of the input: headers padded with NULs opened, and
// still do; what follows the NUL is not read, and a NUL inside the JSON cuts it short.
TEST(SafetensorsTest, ANulByteEndsTheHeader) {
  const std::string entry = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  for (const std::string& header :
       {entry + std::string(6, '\0'), entry + " \n\t" + '\0' + "junk", "\xef\xbb\xbf" + entry}) {
    auto r = Parse(header, 2);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_EQ(r->size(), 1u);
    EXPECT_EQ((*r)[0].file_offset, 8 + header.size());
  }
  EXPECT_THAT(Error(std::string(R"({"a":)") + '\0' + entry.substr(5), 2),
              HasSubstr("header is not valid JSON"));
  EXPECT_THAT(Error(std::string(8, '\0'), 0), HasSubstr("header is not valid JSON"));
}

TEST(SafetensorsTest, EscapedNamesAndKeysAreUnescaped) {
  auto r = Parse(R"({"caf\u00e9 \ud83d\ude00":{"d\u0074ype":"U\u0038","shape":[2],)"
                 R"("data_offsets":[0,2]}})",
                 2);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)[0].name, "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_EQ((*r)[0].dtype, DType::kU8);
}

TEST(SafetensorsTest, AReadErrorNamesTheFile) {
  testing::TempDir dir;
  const std::string header = R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})";
  ASSERT_TRUE(io::WriteFileAtomically(dir / "short.safetensors", Prefixed(header)).ok());
  auto file = io::RandomAccessFile::Open(dir / "short.safetensors");
  ASSERT_TRUE(file.ok());
  class Ignore : public SafetensorsSink {
    absl::Status Add(const TensorEntry&) override { return absl::OkStatus(); }
  } ignore;
  JsonReader reader;
  // A length the file cannot hold (Open checks it first; a file can shrink after).
  absl::Status s = ScanSafetensorsHeader(HeaderSource(**file, header.size() + 10, reader),
                                         (*file)->size() + 10, "short.safetensors", ignore);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr("short.safetensors"));
}

}  // namespace
}  // namespace k3
