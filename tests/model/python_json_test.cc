// JSON as the reference renderer's Python writes and reads it (TOOLS.md sections 4 and 5).
#include "core/text/tools/python_json.h"

#include <gtest/gtest.h>

namespace k3 {
namespace {

using json = nlohmann::json;

TEST(PythonJsonTest, FloatsAreWrittenAsPythonsRepr) {
  for (const auto& [value, text] :
       std::vector<std::pair<double, std::string>>{{1e16, "1e+16"},
                                                   {1e-5, "1e-05"},
                                                   {0.0001, "0.0001"},
                                                   {100.0, "100.0"},
                                                   {1.5e-7, "1.5e-07"},
                                                   {-0.0, "-0.0"},
                                                   {1e15, "1000000000000000.0"},
                                                   {0.1, "0.1"},
                                                   {123.456, "123.456"},
                                                   {1.5e300, "1.5e+300"},
                                                   {2.5, "2.5"}}) {
    EXPECT_EQ(PythonJsonDumps(json(value), true), text) << value;
  }
}

TEST(PythonJsonTest, CompactSortedEscapedRaw) {
  const json v = json::parse(R"({"b":[1,2.0,"é\u0001\n/"],"a":{"z":null,"y":true}})");
  EXPECT_EQ(PythonJsonDumps(v, true),
            "{\"a\":{\"y\":true,\"z\":null},\"b\":[1,2.0,\"é\\u0001\\n/\"]}");
  const nlohmann::ordered_json o = nlohmann::ordered_json::parse(R"({"b":[1,2],"a":1})");
  EXPECT_EQ(PythonJsonDumps(o, false), "{\"b\": [1, 2], \"a\": 1}");
}

TEST(PythonJsonTest, OneLevelParseKeepsLiteralsAndDuplicates) {
  auto pairs = ParseArgumentsOneLevel(
      " {\"a\": 1e2, \"b\":[1,2] ,\"a\":\"x\\\"y\", \"c\": 1.50,"
      "\"d\":{\"k\": [ ]}, \"e\": null, \"f\":true} trailing");
  ASSERT_TRUE(pairs.has_value());
  ASSERT_EQ(pairs->size(), 7u);
  EXPECT_EQ((*pairs)[0].value, "1e2");
  EXPECT_EQ((*pairs)[0].type, "number");
  EXPECT_EQ((*pairs)[1].value, "[1,2]");
  EXPECT_EQ((*pairs)[1].type, "array");
  EXPECT_EQ((*pairs)[2].key, "a");
  EXPECT_EQ((*pairs)[2].value, "x\"y");
  EXPECT_EQ((*pairs)[2].type, "string");
  EXPECT_EQ((*pairs)[3].value, "1.50");
  EXPECT_EQ((*pairs)[4].value, "{\"k\": [ ]}");
  EXPECT_EQ((*pairs)[4].type, "object");
  EXPECT_EQ((*pairs)[5].type, "null");
  EXPECT_EQ((*pairs)[6].type, "boolean");
  EXPECT_TRUE(ParseArgumentsOneLevel("{}")->empty());
  EXPECT_EQ(ParseArgumentsOneLevel("{\"n\":7}")->at(0).value, "7");
}

TEST(PythonJsonTest, AnythingElseIsNotAnObject) {
  for (const char* text : {"", "   ", "[1,2]", "7", "{\"a\":1,}", "{\"a\":1", "{\"path\": \"x\"",
                           "{a:1}", "{\"a\" 1}", "{\"a\":}", "nope"}) {
    EXPECT_FALSE(ParseArgumentsOneLevel(text).has_value()) << text;
  }
}

}  // namespace
}  // namespace k3
