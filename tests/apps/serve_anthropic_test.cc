// k3 serve's Anthropic Messages API with Anthropic's own TypeScript SDK
// (tests/apps/anthropic_client.cjs): plain messages streamed through the SDK's assembler and
// not, system prompts, thinking blocks, a tool round trip whose calls validate with ajv, token
// counts, errors as the SDK's classes, and the prompt an Anthropic request renders to, which
// must be its OpenAI twin's to the id. The demo model has random weights: only the grammar
// makes its calls valid.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/text/tokenizer/tokenizer.h"
#include "tests/apps/serve_harness.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::json;
using testing::ServeProcess;
using ::testing::StartsWith;

constexpr char kKey[] = "test-key";

const json kAnthropicTools = json::parse(R"([
  {"name": "get_weather", "description": "Weather for a city.",
   "input_schema": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer"},
     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": false}},
  {"name": "get_time", "input_schema": {"type": "object",
   "properties": {"zone": {"type": "string"}, "precise": {"type": "boolean"}},
   "required": ["zone"]}}])");

class ServeAnthropicTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir;
    ASSERT_EQ(testing::SynthServeModel(*dir_ / "m"), 0);
    server_ = new ServeProcess({"-m", *dir_ / "m", "--quiet", "--api-key", kKey});
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
    delete dir_;
  }

  // A request through the SDK: `call` is create, stream or count.
  static json Request(const std::string& call, json params) {
    json base = {{"model", "m"},
                 {"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
                 {"max_tokens", 24},
                 {"temperature", 0}};
    base.update(params);
    if (call == "count") base.erase("max_tokens");
    if (call == "count") base.erase("temperature");
    return {{"call", call}, {"params", base}, {"api_key", kKey}};
  }
  static json Run(const json& requests) {
    const json results = testing::AnthropicClients(*server_, requests);
    EXPECT_EQ(results.size(), requests.size());
    return results;
  }
  static void ExpectValid(const json& result) {
    ASSERT_TRUE(result.value("ok", false)) << result.dump();
    for (const json& check : result["validation"]) {
      EXPECT_TRUE(check["valid"].get<bool>()) << check.dump() << "\n" << result.dump();
    }
  }
  // The whole prompt of an answer: Anthropic counts the tokens that ran and those the prompt
  // cache supplied apart.
  static int PromptTokens(const json& message) {
    return message["usage"]["input_tokens"].get<int>() +
           message["usage"]["cache_read_input_tokens"].get<int>();
  }
  static std::vector<std::string> BlockTypes(const json& message) {
    std::vector<std::string> types;
    for (const json& b : message["content"]) types.push_back(b["type"]);
    return types;
  }

  static inline testing::TempDir* dir_ = nullptr;
  static inline ServeProcess* server_ = nullptr;
};

TEST_F(ServeAnthropicTest, APlainMessageIsTheSameStreamedAndNot) {
  const json results = Run({Request("create", json::object()), Request("stream", json::object())});
  ASSERT_EQ(results.size(), 2u);
  for (const json& r : results) {
    ASSERT_TRUE(r.value("ok", false)) << r.dump();
    const json& m = r["message"];
    EXPECT_THAT(m["id"].get<std::string>(), StartsWith("msg_"));
    EXPECT_EQ(m["type"], "message");
    EXPECT_EQ(m["role"], "assistant");
    EXPECT_EQ(BlockTypes(m), std::vector<std::string>{"text"}) << m.dump();  // thinking is off
    EXPECT_EQ(m["stop_reason"], "max_tokens");
    EXPECT_EQ(m["usage"]["output_tokens"], 24);
    EXPECT_EQ(m["usage"]["cache_creation_input_tokens"], 0);
  }
  // Greedy: the same tokens give the same text, whole or assembled from the events.
  EXPECT_EQ(results[0]["message"]["content"], results[1]["message"]["content"]);
  EXPECT_EQ(PromptTokens(results[0]["message"]), PromptTokens(results[1]["message"]));
  // A stop sequence from the middle of that text ends it there, and is named.
  const std::string text = results[0]["message"]["content"][0]["text"];
  size_t at = 2;
  while (at < text.size() && static_cast<unsigned char>(text[at]) >= 0x80) ++at;
  ASSERT_LT(at + 1, text.size()) << text;
  const std::string stop = text.substr(at, 1);
  const json stopped = Run(json::array({Request("stream", {{"stop_sequences", {stop}}})}));
  ASSERT_EQ(stopped.size(), 1u);
  ASSERT_TRUE(stopped[0].value("ok", false)) << stopped[0].dump();
  EXPECT_EQ(stopped[0]["message"]["stop_reason"], "stop_sequence") << stopped[0].dump();
  EXPECT_EQ(stopped[0]["message"]["stop_sequence"], stop);
  const json& blocks = stopped[0]["message"]["content"];
  EXPECT_EQ(blocks.empty() ? "" : blocks[0]["text"].get<std::string>(),
            text.substr(0, text.find(stop)));

  const json& events = results[1]["events"];
  ASSERT_GE(events.size(), 5u);
  EXPECT_EQ(events.front(), "message_start");
  EXPECT_EQ(events[1], "content_block_start");
  EXPECT_EQ(events[events.size() - 2], "message_delta");
  EXPECT_EQ(events.back(), "message_stop");
}

TEST_F(ServeAnthropicTest, ASystemPromptAsAStringOrBlocksAndItsTokenCount) {
  const json blocks = {{{"type", "text"}, {"text", "Answer in French."}}};
  const json results =
      Run({Request("create", {{"system", "Answer in French."}, {"max_tokens", 2}}),
           Request("create", {{"system", blocks}, {"max_tokens", 2}}),
           Request("count", {{"system", "Answer in French."}}), Request("create", json::object())});
  ASSERT_EQ(results.size(), 4u);
  for (const json& r : results) ASSERT_TRUE(r.value("ok", false)) << r.dump();
  const int tokens = PromptTokens(results[0]["message"]);
  EXPECT_EQ(PromptTokens(results[1]["message"]), tokens);
  EXPECT_EQ(results[2]["message"]["input_tokens"], tokens);
  EXPECT_LT(PromptTokens(results[3]["message"]), tokens);
}

TEST_F(ServeAnthropicTest, ThinkingOnGivesASignedThinkingBlockAndOffNone) {
  const json on = {{"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}}};
  const json results = Run({Request("create", on), Request("stream", on),
                            Request("create", {{"thinking", {{"type", "disabled"}}}})});
  ASSERT_EQ(results.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(results[i].value("ok", false)) << results[i].dump();
    const json& m = results[i]["message"];
    ASSERT_FALSE(m["content"].empty()) << m.dump();
    EXPECT_EQ(m["content"][0]["type"], "thinking") << m.dump();
    EXPECT_FALSE(m["content"][0]["signature"].get<std::string>().empty());
  }
  EXPECT_EQ(results[0]["message"]["content"], results[1]["message"]["content"]);
  ASSERT_TRUE(results[2].value("ok", false)) << results[2].dump();
  for (const json& b : results[2]["message"]["content"]) EXPECT_NE(b["type"], "thinking");
}

TEST_F(ServeAnthropicTest, ABudgetOfThinkingTokensEndsTheThinkingAndTheTextFollows) {
  const json params = {{"thinking", {{"type", "enabled"}, {"budget_tokens", 5}}},
                       {"max_tokens", 40}};
  json with_ids = Request("create", params);
  with_ids["params"]["return_token_ids"] = true;  // k3's extension, as on the OpenAI path
  const json results = Run({with_ids, Request("stream", params)});
  ASSERT_EQ(results.size(), 2u);
  auto tok = Tokenizer::Load(*dir_ / "m");
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> closing = testing::ThinkClosingIds(*tok);
  ASSERT_TRUE(results[0].value("ok", false)) << results[0].dump();
  const std::vector<int32_t> ids = results[0]["message"]["token_ids"];
  ASSERT_GT(ids.size(), 5 + closing.size());
  EXPECT_TRUE(std::equal(closing.begin(), closing.end(), ids.begin() + 5));
  for (const json& r : results) {
    ASSERT_TRUE(r.value("ok", false)) << r.dump();
    EXPECT_EQ(BlockTypes(r["message"]), (std::vector<std::string>{"thinking", "text"})) << r.dump();
  }
  EXPECT_EQ(results[0]["message"]["content"], results[1]["message"]["content"]);
}

// An agent's loop through the SDK, five turns with tools: each turn's call validates, and from
// the second turn on the prompt cache supplies the tool declarations, the system prompt and
// every message the turn shares with the turn before, up to the last message boundary the two
// prompts share (the tool-choice message of `any` comes last, so it is the one not shared).
TEST_F(ServeAnthropicTest, AFiveTurnAgentLoopReadsItsPrefixFromThePromptCache) {
  const json setup = {{"system", "You are a travel agent. Call a tool at every step."},
                      {"tools", kAnthropicTools},
                      {"tool_choice", {{"type", "any"}}}};
  json agent = Request("create", setup);
  agent["params"].update({{"max_tokens", 400}, {"return_token_ids", true}});
  agent["call"] = "agent";
  agent["turns"] = 5;
  const json out = Run(json::array({agent}));
  ASSERT_EQ(out.size(), 1u);
  ASSERT_TRUE(out[0].value("ok", false)) << out[0].dump();
  auto tok = Tokenizer::Load(*dir_ / "m");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const int32_t end_of_msg = *tok->SpecialTokenId("<|end_of_msg|>");
  const json& turns = out[0]["turns"];
  ASSERT_EQ(turns.size(), 5u);
  // The head: the tool declarations' message and the system prompt's, the first two.
  size_t head = 0;
  for (int seen = 0; head < turns[0]["prompt_token_ids"].size() && seen < 2; ++head) {
    seen += turns[0]["prompt_token_ids"][head] == end_of_msg;
  }
  for (size_t k = 0; k < turns.size(); ++k) {
    EXPECT_EQ(turns[k]["stop_reason"], "tool_use") << turns[k].dump();
    ASSERT_GE(turns[k]["validation"].size(), 1u) << turns[k].dump();
    for (const json& check : turns[k]["validation"]) EXPECT_TRUE(check["valid"]) << check.dump();
    if (k == 0) continue;
    const json& before = turns[k - 1]["prompt_token_ids"];
    const json& now = turns[k]["prompt_token_ids"];
    size_t shared = 0;  // the last message boundary within the common prefix
    for (size_t i = 0; i < before.size() && i < now.size() && before[i] == now[i]; ++i) {
      if (now[i] == end_of_msg) shared = i + 1;
    }
    const int read = turns[k]["usage"]["cache_read_input_tokens"];
    EXPECT_EQ(read, static_cast<int>(shared)) << k;
    EXPECT_EQ(turns[k]["usage"]["input_tokens"].get<int>() + read, static_cast<int>(now.size()));
    EXPECT_GE(read, static_cast<int>(head)) << k;
    if (k > 1) {
      EXPECT_GT(read, turns[k - 1]["usage"]["cache_read_input_tokens"].get<int>()) << k;
    }
  }
}

TEST_F(ServeAnthropicTest, AToolRoundTripWithAnyAndANamedTool) {
  const json any = {{"tools", kAnthropicTools},
                    {"tool_choice", {{"type", "any"}}},
                    {"max_tokens", 400},
                    {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}}};
  const json named = {{"tools", kAnthropicTools},
                      {"tool_choice", {{"type", "tool"}, {"name", "get_time"}}},
                      {"max_tokens", 400}};
  const json first =
      Run({Request("create", any), Request("stream", any), Request("create", named)});
  ASSERT_EQ(first.size(), 3u);
  for (const json& r : first) {
    ExpectValid(r);
    EXPECT_EQ(r["message"]["stop_reason"], "tool_use") << r.dump();
    ASSERT_GE(r["validation"].size(), 1u) << r.dump();
  }
  // Greedy: the same blocks streamed and not, but for the calls' fresh ids.
  json streamed = first[1]["message"]["content"];
  for (size_t i = 0; i < streamed.size(); ++i) {
    if (streamed[i]["type"] == "tool_use")
      streamed[i]["id"] = first[0]["message"]["content"][i]["id"];
  }
  EXPECT_EQ(first[0]["message"]["content"], streamed);
  const json& time_call = first[2]["message"]["content"].back();
  EXPECT_EQ(time_call["name"], "get_time");

  // The history as the SDK gave it, a result for each call, and the next turn.
  const json& reply = first[0]["message"];
  json results = json::array();
  for (const json& block : reply["content"]) {
    if (block["type"] != "tool_use") continue;
    EXPECT_THAT(block["id"].get<std::string>(), StartsWith("toolu_"));
    results.push_back({{"type", "tool_result"}, {"tool_use_id", block["id"]}, {"content", "24 C"}});
  }
  json messages = {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
                   {{"role", "assistant"}, {"content", reply["content"]}},
                   {{"role", "user"}, {"content", results}}};
  json next = any;
  next.update({{"messages", messages}, {"tool_choice", {{"type", "auto"}}}, {"max_tokens", 8}});
  const json second = Run(json::array({Request("create", next)}));
  ASSERT_EQ(second.size(), 1u);
  ASSERT_TRUE(second[0].value("ok", false)) << second[0].dump();
  EXPECT_GT(PromptTokens(second[0]["message"]), PromptTokens(reply));
}

TEST_F(ServeAnthropicTest, BadRequestsRaiseTheSdkErrorNamingTheField) {
  json no_max = Request("create", json::object());
  no_max["params"].erase("max_tokens");
  json bad_tool = Request("create", {{"tools", kAnthropicTools},
                                     {"tool_choice", {{"type", "tool"}, {"name", "nope"}}}});
  json bad_result =
      Request("create",
              {{"messages",
                {{{"role", "user"}, {"content", "hi"}},
                 {{"role", "assistant"},
                  {"content",
                   {{{"type", "tool_use"},
                     {"id", "toolu_1"},
                     {"name", "get_time"},
                     {"input", json::object()}}}}},
                 {{"role", "user"},
                  {"content",
                   {{{"type", "tool_result"}, {"tool_use_id", "toolu_2"}, {"content", "x"}}}}}}}});
  json wrong_key = Request("create", json::object());
  wrong_key["api_key"] = "wrong";
  const json results =
      Run({Request("create", {{"max_tokens", 0}}), no_max, bad_tool, bad_result, wrong_key});
  ASSERT_EQ(results.size(), 5u);
  const char* fields[] = {"max_tokens", "max_tokens", "tool_choice.name",
                          "messages.2.content.0.tool_use_id"};
  for (int i = 0; i < 4; ++i) {
    const json& r = results[i];
    ASSERT_FALSE(r.value("ok", true)) << r.dump();
    EXPECT_EQ(r["status"], 400) << r.dump();
    EXPECT_EQ(r["class"], "BadRequestError") << r.dump();
    EXPECT_EQ(r["error"]["type"], "error") << r.dump();
    EXPECT_EQ(r["error"]["error"]["type"], "invalid_request_error") << r.dump();
    EXPECT_THAT(r["error"]["error"]["message"].get<std::string>(), StartsWith(fields[i]));
  }
  EXPECT_EQ(results[4]["status"], 401) << results[4].dump();
  EXPECT_EQ(results[4]["class"], "AuthenticationError");
  EXPECT_EQ(results[4]["error"]["error"]["type"], "authentication_error");

  // What httplib answers itself comes in the same shape under /v1/messages.
  const testing::HttpResult unknown = testing::PostJson(*server_, "/v1/messages/nope", "{}",
                                                        {"-H", std::string("x-api-key: ") + kKey});
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(json::parse(unknown.body)["error"]["type"], "not_found_error") << unknown.body;
}

// The same conversation as Anthropic's and as OpenAI's request: the same prompt ids.
TEST_F(ServeAnthropicTest, AnAnthropicRequestRendersAsItsOpenAiTwin) {
  const json input = {{"city", "Paris"}, {"unit", "celsius"}};
  const json anthropic_messages = {
      {{"role", "user"}, {"content", "What is the weather in Paris?"}},
      {{"role", "assistant"},
       {"content",
        {{{"type", "thinking"}, {"thinking", "A tool knows."}, {"signature", "s"}},
         {{"type", "text"}, {"text", "Let me look."}},
         {{"type", "tool_use"}, {"id", "toolu_a"}, {"name", "get_weather"}, {"input", input}}}}},
      {{"role", "user"},
       {"content", {{{"type", "tool_result"}, {"tool_use_id", "toolu_a"}, {"content", "sunny"}}}}}};
  const json anthropic =
      Request("create", {{"system", "Be brief."},
                         {"messages", anthropic_messages},
                         {"tools", kAnthropicTools},
                         {"thinking", {{"type", "enabled"}, {"budget_tokens", 1024}}},
                         {"return_token_ids", true},
                         {"max_tokens", 2}});
  json count = anthropic;
  count["call"] = "count";
  count["params"].erase("max_tokens");
  count["params"].erase("temperature");
  count["params"].erase("return_token_ids");
  const json ours = Run({anthropic, count});
  ASSERT_EQ(ours.size(), 2u);
  ASSERT_TRUE(ours[0].value("ok", false)) << ours[0].dump();
  ASSERT_TRUE(ours[1].value("ok", false)) << ours[1].dump();
  const json& ids = ours[0]["message"]["prompt_token_ids"];
  EXPECT_EQ(ours[1]["message"]["input_tokens"], ids.size());
  EXPECT_EQ(PromptTokens(ours[0]["message"]), static_cast<int>(ids.size()));

  json openai_tools = json::array();
  for (const json& t : kAnthropicTools) {
    json function = {{"name", t["name"]}};
    if (t.contains("description")) function["description"] = t["description"];
    function["parameters"] = t["input_schema"];
    openai_tools.push_back({{"type", "function"}, {"function", function}});
  }
  const json call = {{"id", "toolu_a"},
                     {"type", "function"},
                     {"function", {{"name", "get_weather"}, {"arguments", input}}}};
  const json openai_messages = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "user"}, {"content", "What is the weather in Paris?"}},
      {{"role", "assistant"},
       {"content", {{{"type", "text"}, {"text", "Let me look."}}}},
       {"reasoning_content", "A tool knows."},
       {"tool_calls", {call}}},
      {{"role", "tool"}, {"tool_call_id", "toolu_a"}, {"content", "sunny"}}};
  const json twin = {{"endpoint", "chat"},
                     {"api_key", kKey},
                     {"params",
                      {{"model", "m"},
                       {"messages", openai_messages},
                       {"tools", openai_tools},
                       {"chat_template_kwargs", {{"thinking", true}}},
                       {"return_token_ids", true},
                       {"max_tokens", 2}}}};
  const json theirs = testing::NodeClients(*server_, json::array({twin}));
  ASSERT_EQ(theirs.size(), 1u);
  ASSERT_TRUE(theirs[0].value("ok", false)) << theirs[0].dump();
  EXPECT_EQ(theirs[0]["prompt_token_ids"], ids);
}

}  // namespace
}  // namespace k3
