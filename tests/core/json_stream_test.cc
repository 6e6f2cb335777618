#include "core/json_stream.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace k3 {
namespace {

using ::testing::HasSubstr;

// The document through a window of `window` bytes (0: all in memory).
struct Reader {
  Reader(std::string text, size_t window) : text(std::move(text)), window(window) {}
  JsonStream Open() {
    if (window == 0) return JsonStream(text);
    buf.resize(window);
    next = 0;
    return JsonStream(
        text.size(),
        [this](std::span<char> out) -> absl::StatusOr<size_t> {
          std::memcpy(out.data(), text.data() + next, out.size());
          next += out.size();
          return out.size();
        },
        buf);
  }
  std::string text;
  size_t window;
  std::vector<char> buf;
  size_t next = 0;
};

bool Accepts(const std::string& doc, size_t window) {
  Reader r(doc, window);
  JsonStream json = r.Open();
  return json.SkipValue() && json.Finish();
}

// Valid and invalid documents of every kind, judged against nlohmann's strict parser, in
// memory and through windows small enough that every token straddles a refill.
TEST(JsonStreamTest, AcceptsExactlyWhatAStrictParserAccepts) {
  const std::vector<std::string> docs = {
      R"({})",
      R"([])",
      R"({"a":1,"b":[true,false,null],"c":{"d":"e"}})",
      R"(  {"x" : [ 1 , -2 , 3.5e+7 , 0.25 , -0 , 1E2 ] }  )",
      R"("escapes \" \\ \/ \b \f \n \r \t \u00e9 \u4e2d \ud83d\ude00")",
      "\"utf-8 \xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80\"",
      R"(18446744073709551615)",
      R"(18446744073709551616)",
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
      R"({"a":1}})",
      R"({"a":1} x)",
      R"()",
      R"(   )",
      R"([1 2])",
      R"({"a":[1,{"b":}]})",
  };
  for (const std::string& doc : docs) {
    const bool expected = nlohmann::json::accept(doc);
    for (size_t window : {0, 1, 2, 3, 7, 64}) {
      EXPECT_EQ(Accepts(doc, window), expected) << doc << " (window " << window << ")";
    }
  }
}

TEST(JsonStreamTest, ReadsValuesAcrossWindowBoundaries) {
  const std::string doc =
      R"({"name":"caf\u00e9 \ud83d\ude00","dims":[3072,1792],"skip":{"x":[1,2,{"y":null}]},)"
      R"("big":18446744073709551615,"neg":-5,"frac":1.5})";
  for (size_t window : {1, 2, 5, 4096}) {
    Reader r(doc, window);
    JsonStream json = r.Open();
    ASSERT_TRUE(json.BeginObject());
    std::string key, value;
    std::vector<std::pair<uint64_t, bool>> numbers;
    while (json.NextMember(key)) {
      if (key == "name") {
        ASSERT_TRUE(json.ReadString(value));
      } else if (key == "dims") {
        ASSERT_TRUE(json.BeginArray());
        while (json.NextElement()) {
          uint64_t v = 0;
          bool u = false;
          ASSERT_TRUE(json.ReadNumber(&v, &u));
          numbers.emplace_back(v, u);
        }
      } else if (key == "skip") {
        EXPECT_EQ(json.Peek(), JsonStream::Type::kObject);
        ASSERT_TRUE(json.SkipValue());
      } else {
        uint64_t v = 0;
        bool u = false;
        ASSERT_TRUE(json.ReadNumber(&v, &u)) << json.error();
        numbers.emplace_back(u ? v : 0, u);
      }
    }
    ASSERT_TRUE(json.ok()) << json.error();
    EXPECT_TRUE(json.Finish());
    EXPECT_EQ(value, "caf\xc3\xa9 \xf0\x9f\x98\x80") << window;
    const std::vector<std::pair<uint64_t, bool>> want = {
        {3072, true}, {1792, true}, {UINT64_MAX, true}, {0, false}, {0, false}};
    EXPECT_EQ(numbers, want) << window;
  }
}

TEST(JsonStreamTest, ErrorsSayWhereAndStick) {
  JsonStream json(R"({"a":[1,2,}  )");
  EXPECT_FALSE(json.SkipValue());
  EXPECT_THAT(json.error(), HasSubstr("at byte 10"));
  std::string key;
  EXPECT_FALSE(json.NextMember(key));
  EXPECT_EQ(json.Peek(), JsonStream::Type::kInvalid);
}

TEST(JsonStreamTest, DeepNestingIsRefusedNotACrash) {
  const std::string doc = std::string(100000, '[') + std::string(100000, ']');
  JsonStream json(doc);
  EXPECT_FALSE(json.SkipValue());
  EXPECT_THAT(json.error(), HasSubstr("nested too deeply"));
}

TEST(JsonStreamTest, AReadErrorIsReported) {
  std::vector<char> window(4);
  JsonStream json(
      100, [](std::span<char>) -> absl::StatusOr<size_t> { return absl::DataLossError("disk"); },
      window);
  EXPECT_FALSE(json.SkipValue());
  EXPECT_THAT(json.error(), HasSubstr("disk"));
}

}  // namespace
}  // namespace k3
