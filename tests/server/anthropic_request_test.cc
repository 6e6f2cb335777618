// Anthropic's Messages API below HTTP: the body read into a CompletionRequest (blocks to chat
// messages, tools and tool_choice, the thinking switch off by default), its field errors, the
// error shape, and the message's blocks and events. With real clients: serve_anthropic_test.
#include "apps/server/anthropic_request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "apps/server/anthropic_reply.h"
#include "core/text/chat_template.h"

namespace k3::server {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kTools[] = R"("tools": [{"name": "get_time", "description": "The time.",
    "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}])";

CompletionRequest Parsed(const std::string& body, bool count_tokens = false) {
  const ParseResult r = ParseMessagesRequest(body, count_tokens);
  EXPECT_TRUE(r.request) << body << "\n" << (r.error ? r.error->message : "");
  return r.request.value_or(CompletionRequest{});
}

TEST(AnthropicRequestTest, BlocksBecomeTheChatMessagesOfTheOpenAiPath) {
  const CompletionRequest r = Parsed(std::string(R"({"model": "m", "max_tokens": 9,
      "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
      "messages": [{"role": "user", "content": "Time?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "ask", "signature": "x"},
          {"type": "redacted_thinking", "data": "zz"}, {"type": "text", "text": "Checking."},
          {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"zone": "UTC"}}]},
        {"role": "user", "content": [
          {"type": "tool_result", "tool_use_id": "toolu_1", "content": "noon", "is_error": false},
          {"type": "text", "text": "Thanks."}]}],
      "stop_sequences": ["END"], "metadata": {"user_id": "u"}, )") +
                                     kTools + "}");
  ASSERT_EQ(r.messages.size(), 5u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[0].parts, std::vector<std::string>{"Be brief."});
  EXPECT_EQ(r.messages[1].content, "Time?");
  const ChatMessage& assistant = r.messages[2];
  EXPECT_EQ(assistant.thinking, "ask");
  EXPECT_EQ(assistant.content, "Checking.");
  ASSERT_EQ(assistant.tool_calls.size(), 1u);
  EXPECT_EQ(assistant.tool_calls[0].id, "toolu_1");
  EXPECT_EQ(assistant.tool_calls[0].arguments, nlohmann::ordered_json({{"zone", "UTC"}}));
  EXPECT_EQ(r.messages[3].role, "tool");
  EXPECT_EQ(r.messages[3].tool_call_id, "toolu_1");
  EXPECT_EQ(r.messages[3].name, "get_time");
  EXPECT_EQ(r.messages[3].content, "noon");
  EXPECT_EQ(r.messages[4].role, "user");
  EXPECT_EQ(r.messages[4].content, "Thanks.");
  EXPECT_EQ(*r.max_tokens, 9);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  // The API's defaults: thinking off, temperature 1, tools callable at the model's choice.
  EXPECT_FALSE(r.chat.thinking);
  EXPECT_FALSE(r.output.thinking);
  EXPECT_FALSE(r.reasoning_budget.has_value());
  EXPECT_FALSE(r.sampler.greedy);
  EXPECT_EQ(r.sampler.temperature, 1.0);
  EXPECT_EQ(r.output.tool_choice, ToolChoice::kAuto);
  ASSERT_EQ(r.output.tools.size(), 1u);
  EXPECT_EQ(r.chat.tools[0], nlohmann::json::parse(R"({"type": "function", "function": {
      "name": "get_time", "description": "The time.",
      "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}})"));
}

TEST(AnthropicRequestTest, ThinkingAndToolChoices) {
  const std::string user = R"("max_tokens": 5, "messages": [{"role": "user", "content": "x"}])";
  CompletionRequest r =
      Parsed("{" + user + R"(, "thinking": {"type": "enabled", "budget_tokens": 2048}})");
  EXPECT_TRUE(r.chat.thinking && r.output.thinking);
  EXPECT_EQ(r.reasoning_budget, 2048);
  EXPECT_FALSE(Parsed("{" + user + R"(, "thinking": {"type": "disabled"}})").chat.thinking);

  r = Parsed("{" + user + "," + kTools + R"(, "tool_choice": {"type": "any"}})");
  EXPECT_EQ(r.output.tool_choice, ToolChoice::kRequired);
  EXPECT_EQ(r.chat.tool_choice, "required");
  EXPECT_TRUE(r.output.parallel_tool_calls);
  r = Parsed("{" + user + "," + kTools +
             R"(, "tool_choice": {"type": "tool", "name": "get_time",
                 "disable_parallel_tool_use": true}})");
  EXPECT_EQ(r.output.tool_choice, ToolChoice::kNamed);
  EXPECT_EQ(r.output.named_tool, "get_time");
  EXPECT_FALSE(r.output.parallel_tool_calls);
  r = Parsed("{" + user + "," + kTools + R"(, "tool_choice": {"type": "none"}})");
  EXPECT_EQ(r.output.tool_choice, ToolChoice::kNone);
  EXPECT_EQ(r.chat.tool_choice, "none");
  r = Parsed("{" + user + R"(, "temperature": 0, "top_k": 5, "top_p": 0.5})");
  EXPECT_TRUE(r.sampler.greedy);
  EXPECT_EQ(r.sampler.top_k, 5);
  // count_tokens takes no max_tokens.
  EXPECT_FALSE(Parsed(R"({"messages": [{"role": "user", "content": "x"}]})", true).max_tokens);
}

TEST(AnthropicRequestTest, ErrorsNameTheField) {
  const std::string user = R"("messages": [{"role": "user", "content": "x"}])";
  const std::string call = R"("messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "b"}]}])";
  const std::pair<std::string, std::string> cases[] = {
      {"{" + user + "}", "max_tokens"},
      {R"({"max_tokens": 0, )" + user + "}", "max_tokens"},
      {R"({"max_tokens": "9", )" + user + "}", "max_tokens"},
      {R"({"max_tokens": 9, "seed": 1, )" + user + "}", "seed"},
      {R"({"max_tokens": 9, "temperature": 1.5, )" + user + "}", "temperature"},
      {R"({"max_tokens": 9})", "messages"},
      {R"({"max_tokens": 9, "messages": "hi"})", "messages"},
      {R"({"max_tokens": 9, "messages": [{"role": "system", "content": "x"}]})", "messages.0.role"},
      {R"({"max_tokens": 9, "messages": [{"role": "user", "content": [{"type": "image"}]}]})",
       "messages.0.content.0"},
      {R"({"max_tokens": 9, "messages": [{"role": "user", "content": [{"text": "x"}]}]})",
       "messages.0.content.0.type"},
      {R"({"max_tokens": 9, "messages": [{"role": "user", "content": "x", "name": "n"}]})",
       "messages.0.name"},
      {R"({"max_tokens": 9, )" + call + "}", "messages.2.content.0.tool_use_id"},
      {R"({"max_tokens": 9, "messages": [{"role": "assistant", "content": "x"}]})", "messages.0"},
      {R"({"max_tokens": 9, "system": 7, )" + user + "}", "system"},
      {R"({"max_tokens": 9, "tools": [{"name": "f"}], )" + user + "}", "tools.0.input_schema"},
      {R"({"max_tokens": 9, "tools": [{"type": "web_search_20250305", "name": "w"}], )" + user +
           "}",
       "tools.0.type"},
      {R"({"max_tokens": 9, "tool_choice": {"type": "tool", "name": "f"}, )" + user + "}",
       "tool_choice.name"},
      {R"({"max_tokens": 9, "tool_choice": {"type": "any"}, )" + user + "}", "tool_choice"},
      {R"({"max_tokens": 9, "thinking": {"type": "enabled"}, )" + user + "}",
       "thinking.budget_tokens"},
      {R"({"max_tokens": 9, "thinking": {"type": "enabled", "budget_tokens": 0}, )" + user + "}",
       "thinking.budget_tokens"},
      {R"({"max_tokens": 9, "stop_sequences": [""], )" + user + "}", "stop_sequences.0"},
      {"[1, 2]", ""},
      {"{not json", ""},
  };
  for (const auto& [body, field] : cases) {
    const ParseResult r = ParseMessagesRequest(body, false);
    ASSERT_TRUE(r.error) << body;
    EXPECT_EQ(r.error->http_status, 400) << body;
    EXPECT_EQ(r.error->param, field) << body << "\n" << r.error->message;
    const nlohmann::json shape = AnthropicErrorJson(*r.error);
    EXPECT_EQ(shape["type"], "error");
    EXPECT_EQ(shape["error"]["type"], "invalid_request_error");
    EXPECT_THAT(shape["error"]["message"].get<std::string>(), StartsWith(field)) << body;
  }
}

TEST(AnthropicRequestTest, ErrorTypesFollowTheStatus) {
  const std::pair<int, const char*> cases[] = {{401, "authentication_error"},
                                               {404, "not_found_error"},
                                               {429, "rate_limit_error"},
                                               {500, "api_error"},
                                               {503, "overloaded_error"}};
  for (const auto& [status, type] : cases) {
    const nlohmann::json j = AnthropicErrorJson({status, "m", "whatever", "", ""});
    EXPECT_EQ(j["error"]["type"], type);
    EXPECT_EQ(j["error"]["message"], "m");
  }
}

// An Anthropic request and its OpenAI twin render the same prompt.
TEST(AnthropicRequestTest, RendersAsItsOpenAiTwin) {
  const CompletionRequest ours = Parsed(std::string(R"({"max_tokens": 9, "system": "Be brief.",
      "thinking": {"type": "enabled", "budget_tokens": 1024}, "messages": [
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "ask"},
          {"type": "tool_use", "id": "toolu_1", "name": "get_time", "input": {"zone": "UTC"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
          "content": [{"type": "text", "text": "noon"}]}]}], )") +
                                        kTools + "}");
  const ParseResult twin = ParseCompletionRequest(
      R"({"messages": [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Time?"},
        {"role": "assistant", "content": null, "reasoning_content": "ask", "tool_calls": [
          {"id": "toolu_1", "type": "function",
           "function": {"name": "get_time", "arguments": {"zone": "UTC"}}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": [{"type": "text", "text": "noon"}]}],
      "tools": [{"type": "function", "function": {"name": "get_time", "description": "The time.",
        "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}}}]})",
      Endpoint::kChat);
  ASSERT_TRUE(twin.request) << twin.error->message;
  auto a = RenderChatText(ours.messages, ours.chat);
  auto b = RenderChatText(twin.request->messages, twin.request->chat);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  EXPECT_THAT(*a, HasSubstr("<|open|>think<|sep|>ask<|close|>think<|sep|>"));
}

TEST(MessageBuilderTest, BlocksInOrderAndTheirEvents) {
  MessageBuilder b("msg_1", "kimi-k3", /*thinking=*/true);
  std::string events = b.Start({10, 0, 4});
  events += b.Add("hm", "", {});
  events += b.Add("m", "Hi", {});
  ToolCall call{.index = 0, .id = "call_abc", .name = "f", .arguments = R"({"b": 1, "a": 2})"};
  events += b.Add("", "", {call});
  events += b.Finish("tool_use", std::nullopt, {10, 7, 4});
  const nlohmann::ordered_json& m = b.message();
  ASSERT_EQ(m["content"].size(), 3u);
  EXPECT_EQ(m["content"][0]["thinking"], "hmm");
  EXPECT_EQ(m["content"][0]["signature"], ThinkingSignature("hmm"));
  EXPECT_EQ(m["content"][1]["text"], "Hi");
  EXPECT_EQ(m["content"][2]["id"], "toolu_abc");
  EXPECT_EQ(m["content"][2]["input"].dump(), R"({"b":1,"a":2})");  // the model's key order
  EXPECT_EQ(m["stop_reason"], "tool_use");
  EXPECT_EQ(m["usage"]["output_tokens"], 7);
  EXPECT_EQ(m["usage"]["cache_read_input_tokens"], 4);
  // The signature closes the thinking block; each block starts, takes deltas and stops.
  const size_t signature = events.find("signature_delta");
  ASSERT_NE(signature, std::string::npos);
  EXPECT_LT(signature, events.find(R"("type":"content_block_stop","index":0)"));
  EXPECT_LT(events.find(R"("type":"content_block_stop","index":0)"),
            events.find(R"("index":1,"content_block")"));
  EXPECT_THAT(events, HasSubstr(R"("partial_json":"{\"b\":1,\"a\":2}")"));
  EXPECT_THAT(events, StartsWith("event: message_start\ndata: "));
  EXPECT_THAT(events, HasSubstr("event: message_delta\n"));
  EXPECT_TRUE(events.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"));
}

}  // namespace
}  // namespace k3::server
