// The output parser as a stream: when text and calls come out, whole UTF-8 characters only, and
// the ids that close a reply cut short (TOOLS.md section 10).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/text/tools/turn_parser.h"
#include "tests/tools/turn_fixture.h"

namespace k3 {
namespace {

using ::testing::IsEmpty;

class TurnStreamTest : public testing::TurnFixture {};

TEST_F(TurnStreamTest, TextFlowsAtOnceAndACallComesWholeAtItsClose) {
  const std::string head =
      "Think<|close|>think<|sep|><|open|>response<|sep|>Say<|close|>response<|sep|>"
      "<|open|>tools<|sep|><|open|>call tool=\"get_time\"<|sep|><|open|>argument key=\"tz\" "
      "type=\"string\"<|sep|>UTC<|close|>argument<|sep|><|close|>call";
  const std::vector<TokenId> before = Ids(head);
  const std::vector<TokenId> all = Ids(head + "<|sep|><|close|>tools<|sep|>");
  TurnParser parser(*tok_, Weather(), 1);
  std::string reasoning, content;
  int ended = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    TurnDelta d = parser.Feed(all[i]);
    reasoning += d.reasoning;
    content += d.content;
    ended += d.reasoning_ended;
    if (i + 1 == before.size() + 1) {
      ASSERT_EQ(d.tool_calls.size(), 1u) << "the call comes at <|sep|> after <|close|>call";
      EXPECT_EQ(d.tool_calls[0].arguments, R"({"tz":"UTC"})");
    } else {
      EXPECT_THAT(d.tool_calls, IsEmpty()) << i;
    }
    // Text is never held back: it is all out as soon as its token is.
    if (i + 1 == Ids("Think").size()) {
      EXPECT_EQ(reasoning, "Think");
    }
  }
  EXPECT_EQ(reasoning, "Think");
  EXPECT_EQ(content, "Say");
  EXPECT_EQ(ended, 1);
  EXPECT_TRUE(parser.Finish().empty());
}

TEST_F(TurnStreamTest, ACharacterSplitAcrossTokensIsNeverEmittedHalf) {
  const std::string text = "d\xC3\xA9j\xC3\xA0 \xE2\x82\xAC \xF0\x9F\x98\x80!";
  const std::string xtml =
      text + "<|close|>think<|sep|><|open|>response<|sep|>" + text + "<|close|>response<|sep|>";
  TurnParser parser(*tok_, OutputSpec{}, 1);
  std::vector<std::string> pieces;
  for (TokenId id : Ids(xtml, Split::kBytes)) {
    TurnDelta d = parser.Feed(id);
    for (const std::string* s : {&d.reasoning, &d.content}) {
      if (!s->empty()) pieces.push_back(*s);
    }
  }
  EXPECT_GT(pieces.size(), 10u);
  for (const std::string& p : pieces) {
    EXPECT_EQ(CompleteUtf8Prefix(p), p.size()) << p;
    EXPECT_NE(static_cast<unsigned char>(p[0]) & 0xC0, 0x80) << p;
  }
  EXPECT_EQ(parser.result().reasoning_content, text);
  EXPECT_EQ(parser.result().content, text);
}

TEST_F(TurnStreamTest, AnUnfinishedCharacterComesOutWhenItsChannelEnds) {
  TurnParser parser(*tok_, OutputSpec{}, 1);
  std::string reasoning;
  for (TokenId id : Ids("a\xE2\x82<|close|>think<|sep|>b\xC3", Split::kBytes)) {
    reasoning += parser.Feed(id).reasoning;
  }
  EXPECT_EQ(reasoning, "a\xE2\x82");
  EXPECT_EQ(parser.result().content, "b");
  EXPECT_EQ(parser.Finish().content, "\xC3");
  EXPECT_EQ(parser.result().content, "b\xC3");
}

// ClosingIds from each place a reply can be cut: feeding them ends the message, adds no text
// and leaves nothing more to close. (A call cut short is closed as it stands: its ids are in
// the sequence already, and the history must stay well formed.)
TEST_F(TurnStreamTest, ClosingIdsCloseTheTurnFromEveryState) {
  const std::string end = "<|close|>message<|sep|><|end_of_msg|>";
  const std::string call = "<|open|>tools<|sep|><|open|>call tool=\"get_time\"<|sep|>";
  const struct {
    std::string reply, closing;
    bool thinking = true;
  } cases[] = {
      {"Hm", "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>" + end},
      {"Hm<|close|>think<|sep|>", "<|open|>response<|sep|><|close|>response<|sep|>" + end},
      {"Hm<|close|>think<|sep|>Yes", "<|close|>response<|sep|>" + end},
      {"Hm<|close|>think<|sep|><|open|>response<|sep|>Yes", "<|close|>response<|sep|>" + end},
      {"Yes", "<|close|>response<|sep|>" + end, false},
      {"<|close|>response<|sep|>", end, false},
      {"<|close|>response<|sep|><|open|>tools<|sep|>", "<|close|>tools<|sep|>" + end, false},
      {"<|close|>response<|sep|>" + call, "<|close|>call<|sep|><|close|>tools<|sep|>" + end, false},
      {"<|close|>response<|sep|>" + call + "<|open|>argument key=\"a\" type=\"string\"<|sep|>x",
       "<|close|>argument<|sep|><|close|>call<|sep|><|close|>tools<|sep|>" + end, false},
      {"<|close|>response<|sep|>" + call + "<|open|>json type=\"object\"<|sep|>{",
       "<|close|>json<|sep|><|close|>call<|sep|><|close|>tools<|sep|>" + end, false},
      {"<|close|>response<|sep|>" + call + "<|close|>call<|sep|><|close|>tools<|sep|>", end, false},
      {"Hm<|open|>response", "<|sep|><|close|>response<|sep|>" + end},
      {"Hm<|open|>resp",  // an unknown tag, once its header ends
       "<|sep|><|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>" + end},
      {"Hm<|close|>message<|sep|>", "<|end_of_msg|>"},
      {"Hm" + end, ""},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.reply);
    OutputSpec spec = Weather();
    spec.thinking = c.thinking;
    TurnParser parser(*tok_, spec, 1);
    for (TokenId id : Ids(c.reply)) parser.Feed(id);
    const std::vector<TokenId> closing = parser.ClosingIds();
    EXPECT_EQ(closing, Ids(c.closing));
    const ParsedTurn before = parser.result();
    for (TokenId id : closing) {
      const TurnDelta d = parser.Feed(id);
      EXPECT_TRUE(d.content.empty() && d.reasoning.empty());
    }
    EXPECT_TRUE(parser.result().ended);
    EXPECT_EQ(parser.result().content.value_or(""), before.content.value_or(""));
    EXPECT_THAT(parser.ClosingIds(), IsEmpty());
  }
}

TEST_F(TurnStreamTest, ClosingIdsAfterFinishStillCloseTheCutReply) {
  TurnParser parser(*tok_, Weather(), 1);
  for (TokenId id : Ids("Hm<|close|>think<|sep|><|open|>response<|sep|>Yes")) parser.Feed(id);
  parser.Finish();
  EXPECT_EQ(parser.ClosingIds(), Ids("<|close|>response<|sep|><|close|>message<|sep|>"
                                     "<|end_of_msg|>"));
  // Cut inside a header, which Finish dropped: it is still the first thing to end.
  TurnParser cut(*tok_, Weather(), 1);
  for (TokenId id : Ids("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"get_time\""
                        "<|sep|><|close|>call")) {
    cut.Feed(id);
  }
  EXPECT_TRUE(cut.Finish().tool_calls.empty());
  EXPECT_EQ(cut.ClosingIds(), Ids("<|sep|><|close|>tools<|sep|><|close|>message<|sep|>"
                                  "<|end_of_msg|>"));
}

}  // namespace
}  // namespace k3
