// The turn grammar (core/text/grammar/output_grammar.h) on hand-written outputs: TOOLS.md example E
// and its variants under each tool choice, thinking on and off, JSON responses, non-strict
// tools, attribute escaping; the spec checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/grammar/grammar_test_util.h"

namespace k3::grammar {
namespace {

using ::k3::grammar::testing::Accepts;
using ::k3::grammar::testing::GetTime;
using ::k3::grammar::testing::GetWeather;
using ::k3::grammar::testing::MustBuild;
using ::testing::HasSubstr;

// TOOLS.md section 11 E, one line.
constexpr std::string_view kExampleE =
    "Check.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools<|sep|>"
    "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" "
    "type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key=\"days\" "
    "type=\"number\"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
    "<|close|>message<|sep|><|end_of_msg|>";

// Example E with each `from` replaced by `to`.
std::string E(std::initializer_list<std::pair<std::string, std::string>> edits) {
  std::string out(kExampleE);
  for (const auto& [from, to] : edits) {
    for (size_t at = 0; (at = out.find(from, at)) != std::string::npos; at += to.size()) {
      out.replace(at, from.size(), to);
    }
  }
  return out;
}

OutputSpec Weather(ToolChoice choice = ToolChoice::kAuto) {
  OutputSpec spec;
  spec.tools = {GetWeather()};
  spec.tool_choice = choice;
  return spec;
}

constexpr std::string_view kNoCall =
    "Hmm.<|close|>think<|sep|><|open|>response<|sep|>Hello <b>!<|close|>response<|sep|>"
    "<|close|>message<|sep|><|end_of_msg|>";

TEST(OutputGrammarTest, AcceptsExampleEAndRefusesItsCorruptions) {
  const Grammar g = MustBuild(Weather());
  EXPECT_TRUE(Accepts(g, kExampleE));
  EXPECT_TRUE(Accepts(g, kNoCall));
  EXPECT_TRUE(Accepts(g, E({{"index=\"1\"", "index=\"17\""}})));  // index is never pinned
  EXPECT_TRUE(Accepts(g, E({{">2<", "> 2 <"}})));                 // ws value ws
  // days is optional; city alone is a call.
  EXPECT_TRUE(Accepts(g, E({{"<|open|>argument key=\"days\" type=\"number\"<|sep|>2<|close|>"
                             "argument<|sep|>",
                             ""}})));
  EXPECT_FALSE(Accepts(g, E({{"get_weather", "get_weathr"}})));  // undeclared tool
  EXPECT_FALSE(Accepts(g, E({{"key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
                              "<|open|>argument ",
                              ""}})));                                    // required city missing
  EXPECT_FALSE(Accepts(g, E({{"type=\"number\"", "type=\"string\""}})));  // days is a number
  EXPECT_FALSE(Accepts(g, E({{">2<", ">2.5<"}})));                        // an integer
  EXPECT_FALSE(Accepts(g, E({{">2<", ">\"2\"<"}})));
  EXPECT_FALSE(Accepts(g, E({{"key=\"days\"", "key=\"hours\""}})));  // undeclared key
  EXPECT_FALSE(Accepts(g, E({{"index=\"1\"", "index=\"\""}})));
  EXPECT_FALSE(Accepts(g, E({{"<|end_of_msg|>", ""}})));  // unfinished
  // The keys come in schema order.
  EXPECT_FALSE(Accepts(
      g,
      E({{"<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
          "<|open|>argument key=\"days\" type=\"number\"<|sep|>2<|close|>argument<|sep|>",
          "<|open|>argument key=\"days\" type=\"number\"<|sep|>2<|close|>argument<|sep|>"
          "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"}})));
  // A special inside a body.
  EXPECT_FALSE(Accepts(g, E({{"Paris", "Pa<|open|>ris"}})));
}

TEST(OutputGrammarTest, ToolChoiceDecidesTheToolsBlock) {
  EXPECT_FALSE(Accepts(MustBuild(Weather(ToolChoice::kNone)), kExampleE));
  EXPECT_TRUE(Accepts(MustBuild(Weather(ToolChoice::kNone)), kNoCall));
  EXPECT_FALSE(Accepts(MustBuild(OutputSpec{}), kExampleE));  // no tools declared
  EXPECT_TRUE(Accepts(MustBuild(Weather(ToolChoice::kRequired)), kExampleE));
  EXPECT_FALSE(Accepts(MustBuild(Weather(ToolChoice::kRequired)), kNoCall));
  const std::string two_calls =
      E({{"<|close|>call<|sep|><|close|>tools",
          "<|close|>call<|sep|><|open|>call tool=\"get_time\" index=\"2\"<|sep|><|close|>call"
          "<|sep|><|close|>tools"}});
  OutputSpec both = Weather(ToolChoice::kRequired);
  both.tools.push_back(GetTime());
  EXPECT_TRUE(Accepts(MustBuild(both), two_calls));
  both.parallel_tool_calls = false;
  EXPECT_FALSE(Accepts(MustBuild(both), two_calls));
  EXPECT_TRUE(Accepts(MustBuild(both), kExampleE));
  OutputSpec named = both;
  named.parallel_tool_calls = true;
  named.tool_choice = ToolChoice::kNamed;
  named.named_tool = "get_time";
  EXPECT_FALSE(Accepts(MustBuild(named), kExampleE));
  EXPECT_FALSE(Accepts(MustBuild(named), two_calls));
  EXPECT_FALSE(Accepts(MustBuild(named), kNoCall));
  EXPECT_TRUE(Accepts(
      MustBuild(named),
      "<|close|>think<|sep|><|open|>response<|sep|>ok<|close|>response<|sep|><|open|>tools<|sep|>"
      "<|open|>call tool=\"get_time\" index=\"0\"<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
      "<|close|>message<|sep|><|end_of_msg|>"));
}

TEST(OutputGrammarTest, ThinkingOffStartsInsideTheResponse) {
  OutputSpec spec = Weather();
  spec.thinking = false;
  const Grammar g = MustBuild(spec);
  EXPECT_FALSE(Accepts(g, kExampleE));
  EXPECT_TRUE(Accepts(g, E({{"Check.<|close|>think<|sep|><|open|>response<|sep|>", "Sure."}})));
  EXPECT_TRUE(Accepts(g, "Hi<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>"));
}

TEST(OutputGrammarTest, JsonResponses) {
  OutputSpec spec;
  spec.response_format = ResponseFormat::kJsonObject;
  const std::string head = "t<|close|>think<|sep|><|open|>response<|sep|>";
  const std::string tail = "<|close|>response<|sep|><|close|>message<|sep|><|end_of_msg|>";
  Grammar g = MustBuild(spec);
  EXPECT_TRUE(Accepts(g, head + R"({"a": [1, 2], "b": {}})" + tail));
  EXPECT_TRUE(Accepts(g, head + " {} " + tail));
  EXPECT_FALSE(Accepts(g, head + "[1]" + tail));
  EXPECT_FALSE(Accepts(g, head + "Sure: {}" + tail));
  EXPECT_FALSE(Accepts(g, head + tail));
  spec.response_format = ResponseFormat::kJsonSchema;
  spec.response_schema =
      Schema::parse(R"({"type":"object","properties":{"n":{"type":"integer"}},"required":["n"]})");
  g = MustBuild(spec);
  EXPECT_TRUE(Accepts(g, head + R"({"n":3})" + tail));
  EXPECT_FALSE(Accepts(g, head + R"({"n":"3"})" + tail));
  // With tools, a calling turn may leave the body empty; a silent turn may not.
  spec.tools = {GetWeather()};
  g = MustBuild(spec);
  EXPECT_TRUE(Accepts(g, kExampleE));
  EXPECT_FALSE(Accepts(g, kNoCall));
  EXPECT_FALSE(Accepts(g, head + tail));
}

TEST(OutputGrammarTest, EnumsConstsAnyOfAndNonStrictTools) {
  OutputSpec spec;
  spec.tools = {{"set", Schema::parse(R"({"type":"object","properties":{
      "unit":{"enum":["C","F"]},"mode":{"const":3},"v":{"anyOf":[{"type":"string"},
      {"type":"array","items":{"type":"boolean"}}]}},"required":["unit","v"]})"),
                 true},
                {"a&\"b", Schema::object(), false}};
  const Grammar g = MustBuild(spec);
  auto turn = [](const std::string& calls) {
    return "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools"
           "<|sep|>" +
           calls + "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";
  };
  auto arg = [](const std::string& key, const std::string& type, const std::string& value) {
    return "<|open|>argument key=\"" + key + "\" type=\"" + type + "\"<|sep|>" + value +
           "<|close|>argument<|sep|>";
  };
  auto call = [](const std::string& name, const std::string& args) {
    return "<|open|>call tool=\"" + name + "\" index=\"1\"<|sep|>" + args + "<|close|>call<|sep|>";
  };
  EXPECT_TRUE(Accepts(g, turn(call("set", arg("unit", "string", "C") + arg("v", "string", "x")))));
  EXPECT_TRUE(Accepts(g, turn(call("set", arg("unit", "string", "F") + arg("mode", "number", "3") +
                                              arg("v", "array", "[true, false]")))));
  EXPECT_FALSE(Accepts(g, turn(call("set", arg("unit", "string", "K") + arg("v", "string", "")))));
  EXPECT_FALSE(
      Accepts(g, turn(call("set", arg("unit", "string", "\"C\"") + arg("v", "string", "")))));
  EXPECT_FALSE(Accepts(g, turn(call("set", arg("unit", "string", "C") + arg("mode", "number", "4") +
                                               arg("v", "string", "")))));
  EXPECT_FALSE(Accepts(g, turn(call("set", arg("unit", "string", "C") + arg("v", "number", "1")))));
  // The non-strict tool: its name escaped, identifier keys, any type with a matching value.
  const std::string loose = "a&amp;&quot;b";
  EXPECT_TRUE(Accepts(g, turn(call(loose, arg("x_1", "number", "1.5") + arg("y", "string", "z") +
                                              arg("o", "object", "{\"k\": [null]}")))));
  EXPECT_FALSE(Accepts(g, turn(call("a&\"b", ""))));
  EXPECT_FALSE(Accepts(g, turn(call(loose, arg("1x", "number", "1")))));
  EXPECT_FALSE(Accepts(g, turn(call(loose, arg("x", "number", "one")))));
  EXPECT_FALSE(Accepts(g, turn(call(loose, arg("x", "integer", "1")))));
}

TEST(OutputGrammarTest, ChecksTheSpec) {
  OutputSpec spec = Weather(ToolChoice::kNamed);
  spec.named_tool = "nope";
  EXPECT_THAT(CheckOutputSpec(spec).message(), HasSubstr("\"nope\""));
  spec = Weather();
  spec.tools.push_back({"bad", Schema::parse(R"({"type":"object","properties":{
      "q":{"type":"string","pattern":"x"}}})"),
                        true});
  EXPECT_EQ(BuildOutputGrammar(spec).status().message(),
            "unsupported JSON-schema keyword \"pattern\" at "
            "tools[1].function.parameters.properties.q");
  spec.tools.back().strict = false;  // not checked: its schema is not enforced
  EXPECT_TRUE(CheckOutputSpec(spec).ok());
  OutputSpec required;
  required.tool_choice = ToolChoice::kRequired;
  EXPECT_FALSE(CheckOutputSpec(required).ok());
  OutputSpec response;
  response.response_format = ResponseFormat::kJsonSchema;
  response.response_schema = Schema::parse(R"({"type":"object","format":"x"})");
  EXPECT_THAT(CheckOutputSpec(response).message(),
              HasSubstr("\"format\" at response_format.json_schema.schema"));
}

}  // namespace
}  // namespace k3::grammar
