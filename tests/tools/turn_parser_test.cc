// The output parser on whole replies (TOOLS.md section 10): channels, calls and their arguments,
// recovery and rejection. Every reply is parsed twice, split by BPE and a byte a token, and the
// streamed deltas must add up to the result.
#include "core/text/tools/turn_parser.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"
#include "tests/tools/turn_fixture.h"

namespace k3 {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::MatchesRegex;
using ::testing::Not;

// Example E of TOOLS.md section 11.
constexpr char kExampleE[] =
    "Check.<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|><|open|>tools"
    "<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|><|open|>argument key=\"city\" "
    "type=\"string\"<|sep|>Paris<|close|>argument<|sep|><|open|>argument key=\"days\" "
    "type=\"number\"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>"
    "<|close|>message<|sep|><|end_of_msg|>";

std::string Arg(const std::string& key, const std::string& type, const std::string& body) {
  return "<|open|>argument key=\"" + key + "\" type=\"" + type + "\"<|sep|>" + body +
         "<|close|>argument<|sep|>";
}
std::string Call(const std::string& tool, const std::string& body) {
  return "<|open|>call tool=\"" + tool + "\" index=\"1\"<|sep|>" + body + "<|close|>call<|sep|>";
}
std::string Tools(const std::string& calls) {
  return "<|open|>tools<|sep|>" + calls + "<|close|>tools<|sep|>";
}
constexpr char kEnd[] = "<|close|>message<|sep|><|end_of_msg|>";

class TurnParserTest : public testing::TurnFixture {
 protected:
  // Parses `xtml` split both ways: the two parses must agree, and each one's deltas must add up
  // to its result.
  static Run ParseBoth(const std::string& xtml, const OutputSpec& spec) {
    Run bpe = Parse(Ids(xtml, Split::kBpe), spec);
    Run bytes = Parse(Ids(xtml, Split::kBytes), spec);
    for (const Run* run : {&bpe, &bytes}) {
      EXPECT_EQ(run->reasoning, run->turn.reasoning_content);
      EXPECT_EQ(run->content, run->turn.content.value_or(""));
      EXPECT_EQ(Calls(run->calls), Calls(run->turn.tool_calls));
    }
    EXPECT_EQ(bytes.turn.reasoning_content, bpe.turn.reasoning_content);
    EXPECT_EQ(bytes.turn.content, bpe.turn.content);
    EXPECT_EQ(Calls(bytes.turn.tool_calls), Calls(bpe.turn.tool_calls));
    EXPECT_EQ(bytes.turn.dropped_calls, bpe.turn.dropped_calls);
    return bpe;
  }
  // Each call as `index id name arguments`.
  static std::vector<std::string> Calls(const std::vector<ToolCall>& calls) {
    std::vector<std::string> out;
    for (const ToolCall& c : calls) {
      out.push_back(absl::StrCat(c.index, " ", c.id, " ", c.name, " ", c.arguments));
    }
    return out;
  }
  // The arguments of the only call of a reply to get_weather with `args`.
  static std::string Arguments(const std::string& args) {
    const Run run =
        ParseBoth("<|close|>think<|sep|>" + Tools(Call("get_weather", args)) + kEnd, Weather());
    EXPECT_EQ(run.turn.tool_calls.size(), 1u);
    if (run.turn.tool_calls.empty()) return "";
    const std::string& a = run.turn.tool_calls[0].arguments;
    EXPECT_TRUE(nlohmann::json::accept(a)) << a;
    return a;
  }
};

TEST_F(TurnParserTest, ExampleE) {
  const Run run = ParseBoth(kExampleE, Weather());
  EXPECT_EQ(run.turn.reasoning_content, "Check.");
  EXPECT_EQ(run.turn.content, std::nullopt);
  ASSERT_EQ(run.turn.tool_calls.size(), 1u);
  const ToolCall& call = run.turn.tool_calls[0];
  EXPECT_EQ(call.index, 0);
  EXPECT_THAT(call.id, MatchesRegex("call_[0-9a-f]{24}"));
  EXPECT_EQ(call.name, "get_weather");
  EXPECT_EQ(call.arguments, R"({"city":"Paris","days":2})");
  EXPECT_FALSE(call.raw_arguments);
  EXPECT_EQ(run.turn.FinishReason(false), "tool_calls");
  EXPECT_EQ(run.turn.FinishReason(true), "tool_calls");
  EXPECT_TRUE(run.turn.ended);
  EXPECT_EQ(run.turn.dropped_calls, 0);
  EXPECT_THAT(run.turn.warnings, IsEmpty());
}

TEST_F(TurnParserTest, ExampleEWithoutTheThinkClose) {
  std::string xtml = kExampleE;
  xtml.erase(xtml.find("<|close|>think<|sep|>"), std::strlen("<|close|>think<|sep|>"));
  const Run run = ParseBoth(xtml, Weather());
  EXPECT_EQ(run.turn.reasoning_content, "Check.");
  EXPECT_EQ(run.turn.content, std::nullopt);
  ASSERT_EQ(run.turn.tool_calls.size(), 1u);
  EXPECT_EQ(run.turn.tool_calls[0].arguments, R"({"city":"Paris","days":2})");
  EXPECT_EQ(run.turn.FinishReason(false), "tool_calls");
}

TEST_F(TurnParserTest, AToolsHeaderInsideThinkEndsItToo) {
  const Run run = ParseBoth("Hmm." + Tools(Call("get_time", "")) + kEnd, Weather());
  EXPECT_EQ(run.turn.reasoning_content, "Hmm.");
  EXPECT_EQ(run.turn.content, std::nullopt);
  ASSERT_EQ(run.turn.tool_calls.size(), 1u);
  EXPECT_EQ(run.turn.tool_calls[0].arguments, "{}");
}

TEST_F(TurnParserTest, TwoCallsGetIndicesFromZeroAndFreshIds) {
  const Run run = ParseBoth(
      "a<|close|>think<|sep|><|open|>response<|sep|>Both.<|close|>response<|sep|>" +
          Tools(Call("get_weather", Arg("city", "string", "Rome")) + Call("get_time", "")) + kEnd,
      Weather());
  EXPECT_EQ(run.turn.content, "Both.");
  ASSERT_EQ(run.turn.tool_calls.size(), 2u);
  EXPECT_EQ(run.turn.tool_calls[0].index, 0);
  EXPECT_EQ(run.turn.tool_calls[1].index, 1);
  EXPECT_EQ(run.turn.tool_calls[1].name, "get_time");
  EXPECT_EQ(run.turn.tool_calls[1].arguments, "{}");
  EXPECT_NE(run.turn.tool_calls[0].id, run.turn.tool_calls[1].id);
  // Another seed, other ids.
  TurnParser other(*tok_, Weather(), 8);
  for (TokenId id : Ids(kExampleE)) other.Feed(id);
  ASSERT_EQ(other.result().tool_calls.size(), 1u);
  EXPECT_NE(other.result().tool_calls[0].id, run.turn.tool_calls[0].id);
}

TEST_F(TurnParserTest, NonStringValuesKeepTheirLiterals) {
  EXPECT_EQ(Arguments(Arg("a", "number", "1e2") + Arg("b", "array", "[1,2]") +
                      Arg("c", "number", "1.50") + Arg("d", "object", "{ \"unit\" : \"C\" }") +
                      Arg("e", "number", " \n7\t") + Arg("f", "boolean", "true")),
            R"({"a":1e2,"b":[1,2],"c":1.50,"d":{ "unit" : "C" },"e":7,"f":true})");
}

TEST_F(TurnParserTest, StringsAreEscapedNullIsNullAndBadJsonIsKeptAsAString) {
  EXPECT_EQ(
      Arguments(Arg("s", "string",
                    "say \"hi\"\n24\xC2\xB0"
                    "C\\") +
                Arg("n", "string", "2") + Arg("z", "null", "null") + Arg("x", "number", "abc") +
                Arg("y", "object", "{\"a\":") + Arg("k&amp;&quot;", "string", "")),
      "{\"s\":\"say \\\"hi\\\"\\n24\xC2\xB0"
      "C\\\\\",\"n\":\"2\",\"z\":null,"
      "\"x\":\"abc\",\"y\":\"{\\\"a\\\":\",\"k&\\\"\":\"\"}");
  // Bytes that are not UTF-8 still give valid JSON.
  const std::string a = Arguments(Arg("s", "string", "\xFF\xC3"));
  EXPECT_EQ(nlohmann::json::parse(a)["s"], "\xEF\xBF\xBD\xEF\xBF\xBD");
  // What nlohmann alone would let through: a byte-order mark, text after a NUL.
  EXPECT_EQ(Arguments(Arg("m", "number",
                          "\xEF\xBB\xBF"
                          "1") +
                      Arg("z", "array", std::string("[1]\0x", 5))),
            "{\"m\":\"\xEF\xBB\xBF"
            "1\",\"z\":\"[1]\\u0000x\"}");
  // A value too large for a double is text, not an infinity.
  EXPECT_EQ(Arguments(Arg("big", "number", "1e309")), R"({"big":"1e309"})");
}

TEST_F(TurnParserTest, ARepeatedKeyReplacesTheValueWhereItFirstWas) {
  EXPECT_EQ(Arguments(Arg("a", "number", "1") + Arg("b", "number", "2") + Arg("a", "string", "3")),
            R"({"a":"3","b":2})");
}

TEST_F(TurnParserTest, AJsonBlockIsTheArgumentsVerbatim) {
  const Run run = ParseBoth(
      "<|close|>think<|sep|>" +
          Tools(Call("get_weather",
                     "<|open|>json type=\"object\"<|sep|>{\"path\": \"/tmp/a.txt\"<|close|>json"
                     "<|sep|>")) +
          kEnd,
      Weather());
  ASSERT_EQ(run.turn.tool_calls.size(), 1u);
  EXPECT_EQ(run.turn.tool_calls[0].arguments, "{\"path\": \"/tmp/a.txt\"");
  EXPECT_TRUE(run.turn.tool_calls[0].raw_arguments);
}

TEST_F(TurnParserTest, ACallToAnUndeclaredToolIsDroppedAndReported) {
  const Run run = ParseBoth(
      "<|close|>think<|sep|><|open|>response<|sep|>Ok.<|close|>response"
      "<|sep|>" +
          Tools(Call("rm_rf", Arg("p", "string", "/")) + Call("get_time", "")) + kEnd,
      Weather());
  EXPECT_EQ(run.turn.content, "Ok.");
  ASSERT_EQ(run.turn.tool_calls.size(), 1u);
  EXPECT_EQ(run.turn.tool_calls[0].name, "get_time");
  EXPECT_EQ(run.turn.tool_calls[0].index, 0);
  EXPECT_EQ(run.turn.dropped_calls, 1);
  EXPECT_THAT(run.turn.warnings, ElementsAre(HasSubstr("rm_rf")));
}

TEST_F(TurnParserTest, AToolsBlockUnderNoneOrWithoutToolsIsDroppedKeepingTheTextBeforeIt) {
  OutputSpec none = Weather();
  none.tool_choice = ToolChoice::kNone;
  for (const OutputSpec& spec : {none, OutputSpec{}}) {
    const Run run = ParseBoth("<|close|>think<|sep|><|open|>response<|sep|>Sure." +
                                  Tools(Call("get_time", "")) + "after" + kEnd,
                              spec);
    EXPECT_EQ(run.turn.content, "Sure.");
    EXPECT_THAT(run.turn.tool_calls, IsEmpty());
    EXPECT_TRUE(run.turn.tools_block_dropped);
    EXPECT_EQ(run.turn.dropped_calls, 0);
    EXPECT_EQ(run.turn.FinishReason(false), "stop");
  }
}

TEST_F(TurnParserTest, ATruncatedCallIsDroppedAndNeverBecomesContent) {
  const std::string complete =
      "<|close|>think<|sep|><|open|>response<|sep|>Hi<|close|>response"
      "<|sep|><|open|>tools<|sep|>" +
      Call("get_time", "");
  const std::string partial = "<|open|>call tool=\"get_weather\"<|sep|>" +
                              Arg("city", "string", "Oslo") +
                              "<|open|>argument key=\"days\" type=\"number\"<|sep|>3";
  for (const std::string& end : {std::string(), std::string("<|end_of_msg|>")}) {
    const Run run = ParseBoth(complete + partial + end, Weather());
    EXPECT_EQ(run.turn.content, "Hi");
    ASSERT_EQ(run.turn.tool_calls.size(), 1u);
    EXPECT_EQ(run.turn.tool_calls[0].name, "get_time");
    EXPECT_EQ(run.turn.dropped_calls, 1);
    EXPECT_EQ(run.turn.ended, !end.empty());
    EXPECT_EQ(run.turn.FinishReason(true), "tool_calls");
  }
  // Cut inside a header.
  const Run cut = ParseBoth(complete + "<|open|>call tool=\"get_we", Weather());
  EXPECT_EQ(cut.turn.content, "Hi");
  EXPECT_EQ(cut.turn.tool_calls.size(), 1u);
}

TEST_F(TurnParserTest, TextThatSpellsMarkersIsContent) {
  const std::string injected = "see <|open|>tools<|sep|> and <|end_of_msg|>";
  std::vector<TokenId> ids = Ids("<|close|>think<|sep|><|open|>response<|sep|>");
  AppendText(injected, Split::kBpe, ids);
  const std::vector<TokenId> end = Ids("<|close|>response<|sep|>" + std::string(kEnd));
  ids.insert(ids.end(), end.begin(), end.end());
  const Run run = Parse(ids, Weather());
  EXPECT_EQ(run.turn.content, injected);
  EXPECT_THAT(run.turn.tool_calls, IsEmpty());
  EXPECT_TRUE(run.turn.ended);
}

TEST_F(TurnParserTest, ThinkingOff) {
  OutputSpec spec = Weather();
  spec.thinking = false;
  Run run = ParseBoth("Hello<|close|>response<|sep|>" + std::string(kEnd), spec);
  EXPECT_EQ(run.turn.reasoning_content, "");
  EXPECT_EQ(run.turn.content, "Hello");
  EXPECT_THAT(run.turn.warnings, IsEmpty());
  run = ParseBoth("<|close|>response<|sep|>" + Tools(Call("get_time", "")) + kEnd, spec);
  EXPECT_EQ(run.turn.content, std::nullopt);
  EXPECT_EQ(run.turn.tool_calls.size(), 1u);
  // A think close has no place here: dropped, never text.
  run = ParseBoth("A<|close|>think<|sep|>B", spec);
  EXPECT_EQ(run.turn.content, "AB");
}

TEST_F(TurnParserTest, AMissingResponseChannelAndToolsBeforeTheResponseClose) {
  Run run = ParseBoth("r<|close|>think<|sep|>Hello" + std::string(kEnd), Weather());
  EXPECT_EQ(run.turn.reasoning_content, "r");
  EXPECT_EQ(run.turn.content, "Hello");
  run = ParseBoth("r<|close|>think<|sep|><|open|>response<|sep|>Calling." +
                      Tools(Call("get_time", "")) + "<|close|>response<|sep|>" + kEnd,
                  Weather());
  EXPECT_EQ(run.turn.content, "Calling.");
  EXPECT_EQ(run.turn.tool_calls.size(), 1u);
}

TEST_F(TurnParserTest, UnknownTagsStrayMarkersAndOtherSpecialsAreDropped) {
  std::vector<TokenId> ids =
      Ids("r<|open|>foo bar=\"1\"<|sep|>s<|close|>think<|sep|><|sep|>x<|open|><|open|>response"
          "<|sep|>y");
  ids.push_back(Special("[EOS]"));
  const std::vector<TokenId> end = Ids("z<|close|>message<|sep|>after<|end_of_msg|>more");
  ids.insert(ids.end(), end.begin(), end.end());
  const Run run = Parse(ids, Weather());
  EXPECT_EQ(run.turn.reasoning_content, "rs");
  EXPECT_EQ(run.turn.content, "xyz");
  EXPECT_EQ(run.turn.warnings.size(), 3u);  // foo, the stray <|sep|>, the unfinished marker
  EXPECT_THAT(run.content, Not(HasSubstr("<|")));
}

TEST_F(TurnParserTest, WarningsStopGrowingAndMarkerTextInAValueIsText) {
  std::vector<TokenId> ids(1000, Special("<|sep|>"));
  const std::vector<TokenId> call =
      Ids("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_time\"<|sep|><|open|>"
          "argument key=\"s\" type=\"string\"<|sep|>");
  ids.insert(ids.end(), call.begin(), call.end());
  AppendText("a<|close|>argument<|sep|>b", Split::kBpe, ids);
  const std::vector<TokenId> end = Ids("<|close|>argument<|sep|><|close|>call<|sep|>");
  ids.insert(ids.end(), end.begin(), end.end());
  const Run run = Parse(ids, Weather());
  EXPECT_EQ(run.turn.warnings.size(), 17u);
  EXPECT_EQ(run.turn.warnings.back(), "further warnings left out");
  ASSERT_EQ(run.turn.tool_calls.size(), 1u);
  EXPECT_EQ(run.turn.tool_calls[0].arguments, R"({"s":"a<|close|>argument<|sep|>b"})");
}

TEST_F(TurnParserTest, ACallWithoutItsToolsBlockIsStillACall) {
  const Run run = ParseBoth("<|close|>think<|sep|><|open|>response<|sep|>" +
                                Call("get_weather", Arg("city", "string", "Nice")) + kEnd,
                            Weather());
  EXPECT_EQ(run.turn.content, std::nullopt);
  ASSERT_EQ(run.turn.tool_calls.size(), 1u);
  EXPECT_EQ(run.turn.tool_calls[0].arguments, R"({"city":"Nice"})");
}

TEST_F(TurnParserTest, AHeaderThatNeverEndsIsDroppedWithoutHoldingItAll) {
  std::vector<TokenId> ids = Ids("<|close|>think<|sep|>a<|open|>");
  for (int i = 0; i < 3000; ++i) AppendText("word ", Split::kBpe, ids);
  const std::vector<TokenId> end = Ids("<|sep|>b" + std::string(kEnd));
  ids.insert(ids.end(), end.begin(), end.end());
  const Run run = Parse(ids, Weather());
  EXPECT_EQ(run.turn.content, "ab");
  EXPECT_THAT(run.turn.warnings, ElementsAre(HasSubstr("longer than")));
}

TEST(HeaderAttributesTest, MatchesTheSpecsPatternAndUnescapesQuotBeforeAmp) {
  using Attrs = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(ParseHeaderAttributes("tool=\"read&amp;&quot;file\" index=\"1\""),
            (Attrs{{"tool", "read&\"file"}, {"index", "1"}}));
  EXPECT_EQ(ParseHeaderAttributes("tool=\"a&amp;quot;b\""), (Attrs{{"tool", "a&quot;b"}}));
  EXPECT_EQ(ParseHeaderAttributes("a=\"1\"b=\"2\" c = \"3\" -d=\"4\" e=\"5"),
            (Attrs{{"a", "1"}, {"b", "2"}, {"d", "4"}}));
  EXPECT_EQ(ParseHeaderAttributes("key=\"\" x=\"<|sep|>\""),
            (Attrs{{"key", ""}, {"x", "<|sep|>"}}));
}

}  // namespace
}  // namespace k3
