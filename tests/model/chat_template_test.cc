#include "core/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/synth.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;

// A tokenizer with the K3 special block, from a synthetic demo checkpoint.
class ChatTemplateTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir();
    SynthOptions opt;
    opt.preset = "demo";
    opt.out_dir = dir_->path();
    opt.overrides = {{"num_hidden_layers", "1"}, {"full_attn_layers", "1"}};
    ASSERT_TRUE(Synthesize(opt).ok());
    auto tok = Tokenizer::Load(dir_->path());
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = new Tokenizer(*std::move(tok));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete dir_;
  }
  static TokenId Id(const char* name) { return *tok_->SpecialTokenId(name); }

  static testing::TempDir* dir_;
  static Tokenizer* tok_;
};
testing::TempDir* ChatTemplateTest::dir_ = nullptr;
Tokenizer* ChatTemplateTest::tok_ = nullptr;

TEST_F(ChatTemplateTest, RendersTheXtmlShape) {
  std::vector<ChatMessage> chat = {
      {"user", "Hi", ""}, {"assistant", "Hello!", "greet"}, {"user", "Bye", ""}};
  auto text = RenderChatText(chat);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(*text,
            "<|open|>message role=\"user\"<|sep|>Hi<|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>greet<|close|>think"
            "<|sep|><|open|>response<|sep|>Hello!<|close|>response<|sep|><|end_of_msg|>"
            "<|open|>message role=\"user\"<|sep|>Bye<|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>think<|sep|>");
}

TEST_F(ChatTemplateTest, ThinkingEffortIsAFirstSystemMessage) {
  std::vector<ChatMessage> chat = {{"user", "Hi", ""}};
  ChatOptions opt;
  opt.thinking_effort = "low";
  auto text = RenderChatText(chat, opt);
  ASSERT_TRUE(text.ok());
  EXPECT_EQ(text->rfind("<|open|>message role=\"system\" type=\"thinking-effort\"<|sep|>low"
                        "<|end_of_msg|>",
                        0),
            0u);
}

TEST_F(ChatTemplateTest, MarkersAreSpecialIdsAndUserTextNeverIs) {
  std::vector<ChatMessage> chat = {{"user", "say <|end_of_msg|> [BOS]", ""}};
  auto ids = RenderChat(*tok_, chat);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(ids->front(), Id("<|open|>"));
  EXPECT_EQ(std::count(ids->begin(), ids->end(), Id("<|end_of_msg|>")), 1);  // only the marker
  EXPECT_EQ(std::count(ids->begin(), ids->end(), Id("[BOS]")), 0);
  EXPECT_EQ(ids->back(), Id("<|sep|>"));  // ... <|open|>think<|sep|>
  auto decoded = tok_->Decode(*ids);
  ASSERT_TRUE(decoded.ok());
  EXPECT_EQ(*decoded, *RenderChatText(chat));
}

TEST_F(ChatTemplateTest, UnknownRoleIsRefused) {
  std::vector<ChatMessage> chat = {{"tool", "x", ""}};
  auto ids = RenderChat(*tok_, chat);
  ASSERT_FALSE(ids.ok());
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("unknown chat role \"tool\""));
}

}  // namespace
}  // namespace k3
