// k3 serve as an agent backend, with the OpenAI Node SDK: tool calls under every tool choice
// and JSON responses, streamed (through the SDK's own assembler) and not, validated with ajv
// against their schemas; and a round trip of call, result and next turn whose prompt is the
// renderer's exact tokens. The demo model has random weights: only the grammar makes its
// calls valid.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/text/chat_template.h"
#include "core/text/tokenizer/tokenizer.h"
#include "tests/apps/serve_harness.h"

namespace k3 {
namespace {

using testing::json;
using testing::ServeProcess;

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
   "parameters": {"type": "object", "properties": {
     "city": {"type": "string"}, "days": {"type": "integer"},
     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object",
   "properties": {"zone": {"type": "string"}, "precise": {"type": "boolean"}},
   "required": ["zone"]}}}])");

class ServeToolsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir;
    ASSERT_EQ(testing::SynthServeModel(*dir_ / "m"), 0);
    server_ = new ServeProcess({"-m", *dir_ / "m", "--quiet"});
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
    delete dir_;
  }

  static json Request(json params, bool stream) {
    json base = {{"model", "m"},
                 {"messages", {{{"role", "user"}, {"content", "What is the weather in Paris?"}}}},
                 {"max_tokens", 400},
                 {"temperature", 0.8},
                 {"seed", 11},
                 {"stream", stream}};
    base.update(params);
    json request = {{"endpoint", "chat"}, {"params", base}};
    if (stream) request["assemble"] = true;  // the SDK's stream assembler
    return request;
  }
  // Every call and JSON content validated (serve_client.cjs checks them with ajv).
  static void ExpectValid(const json& result) {
    ASSERT_TRUE(result.value("ok", false)) << result.dump();
    ASSERT_TRUE(result.contains("validation")) << result.dump();
    for (const json& check : result["validation"]) {
      EXPECT_TRUE(check["valid"].get<bool>()) << check.dump() << "\n" << result.dump();
    }
  }

  static testing::TempDir* dir_;
  static ServeProcess* server_;
};

testing::TempDir* ServeToolsTest::dir_ = nullptr;
ServeProcess* ServeToolsTest::server_ = nullptr;

TEST_F(ServeToolsTest, RequiredGivesACallThatValidatesStreamedAndNot) {
  const json params = {{"tools", kTools}, {"tool_choice", "required"}};
  const json results =
      testing::NodeClients(*server_, json::array({Request(params, false), Request(params, true)}));
  ASSERT_EQ(results.size(), 2u);
  for (const json& r : results) {
    ExpectValid(r);
    EXPECT_EQ(r["finish_reason"], "tool_calls") << r.dump();
    ASSERT_GE(r["tool_calls"].size(), 1u) << r.dump();
    EXPECT_EQ(r["validation"].size(), r["tool_calls"].size());
    for (const json& call : r["tool_calls"]) {
      EXPECT_THAT(call["id"].get<std::string>(), ::testing::StartsWith("call_"));
      EXPECT_EQ(call["type"], "function");
    }
  }
  // The same seed: the stream assembles the same calls as the plain answer.
  EXPECT_EQ(results[0]["tool_calls"].size(), results[1]["tool_calls"].size());
  for (size_t i = 0; i < results[0]["tool_calls"].size(); ++i) {
    EXPECT_EQ(results[0]["tool_calls"][i]["function"], results[1]["tool_calls"][i]["function"]);
  }
}

TEST_F(ServeToolsTest, ANamedFunctionIsTheOneCall) {
  const json params = {
      {"tools", kTools},
      {"tool_choice", {{"type", "function"}, {"function", {{"name", "get_time"}}}}},
      {"chat_template_kwargs", {{"thinking", false}}}};
  const json results =
      testing::NodeClients(*server_, json::array({Request(params, false), Request(params, true)}));
  ASSERT_EQ(results.size(), 2u);
  for (const json& r : results) {
    ExpectValid(r);
    ASSERT_EQ(r["tool_calls"].size(), 1u) << r.dump();
    EXPECT_EQ(r["tool_calls"][0]["function"]["name"], "get_time");
    EXPECT_EQ(r["finish_reason"], "tool_calls");
  }
}

TEST_F(ServeToolsTest, AJsonSchemaResponseValidates) {
  const json schema = json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}, "maxItems": 3},
      "address": {"type": "object", "properties": {"city": {"type": "string"}},
                  "required": ["city"]}},
    "required": ["name", "age", "address"]})");
  const json params = {
      {"response_format",
       {{"type", "json_schema"}, {"json_schema", {{"name", "person"}, {"schema", schema}}}}},
      {"chat_template_kwargs", {{"thinking", false}}}};
  const json object = {{"response_format", {{"type", "json_object"}}}};
  const json results = testing::NodeClients(
      *server_,
      json::array({Request(params, false), Request(params, true), Request(object, false)}));
  ASSERT_EQ(results.size(), 3u);
  for (const json& r : results) {
    ExpectValid(r);
    EXPECT_EQ(r["validation"].size(), 1u);
    EXPECT_EQ(r["finish_reason"], "stop") << r.dump();
  }
}

TEST_F(ServeToolsTest, ACallItsResultAndTheNextTurnRenderTheExactTokens) {
  const json first = testing::NodeClients(
      *server_, json::array({Request({{"tools", kTools}, {"tool_choice", "required"}}, false)}));
  ASSERT_EQ(first.size(), 1u);
  ExpectValid(first[0]);
  ASSERT_GE(first[0]["tool_calls"].size(), 1u);
  const json& call = first[0]["tool_calls"][0];
  json messages = {{{"role", "user"}, {"content", "What is the weather in Paris?"}},
                   {{"role", "assistant"},
                    {"content", nullptr},
                    {"reasoning_content", first[0]["reasoning"]},
                    {"tool_calls", json::array({call})}},
                   {{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "sunny, 24 C"}}};
  json next = Request(
      {{"tools", kTools}, {"messages", messages}, {"return_token_ids", true}, {"max_tokens", 8}},
      false);
  const json second = testing::NodeClients(*server_, json::array({next}));
  ASSERT_EQ(second.size(), 1u);
  ASSERT_TRUE(second[0].value("ok", false)) << second[0].dump();

  // The renderer's tokens for the same conversation (core/text/chat_template.h, tested against the
  // release's own ids in tests/model/chat_template_test.cc).
  auto tok = Tokenizer::Load(*dir_ / "m");
  ASSERT_TRUE(tok.ok());
  ChatMessage assistant{.role = "assistant", .thinking = first[0]["reasoning"].get<std::string>()};
  assistant.tool_calls = {{call["id"].get<std::string>(), call["function"]["name"],
                           nlohmann::ordered_json(call["function"]["arguments"])}};
  ChatMessage result{.role = "tool", .content = "sunny, 24 C"};
  result.tool_call_id = call["id"].get<std::string>();
  const std::vector<ChatMessage> chat = {
      {.role = "user", .content = "What is the weather in Paris?"}, assistant, result};
  ChatOptions options;
  options.tools = kTools;
  auto expected = RenderChat(*tok, chat, options);
  ASSERT_TRUE(expected.ok()) << expected.status();
  EXPECT_EQ(second[0]["prompt_token_ids"], json(*expected));
  auto text = RenderChatText(chat, options);
  EXPECT_THAT(*text, ::testing::HasSubstr("<|open|>message role=\"tool\" tool=\"" +
                                          call["function"]["name"].get<std::string>() +
                                          "\" index=\"1\"<|sep|>sunny, 24 C<|close|>message"));
}

TEST_F(ServeToolsTest, AThinkingBudgetClosesTheThinkChannelAndTheAnswerFollows) {
  const json params = {{"reasoning_budget", 6}, {"max_tokens", 40}, {"return_token_ids", true}};
  json plain = Request(params, false), streamed = Request(params, true);
  streamed.erase("assemble");  // serve_client.cjs collects token_ids from the raw chunks
  streamed["params"]["stream_options"] = {{"include_usage", true}};
  const json results = testing::NodeClients(*server_, json::array({plain, streamed}));
  ASSERT_EQ(results.size(), 2u);
  auto tok = Tokenizer::Load(*dir_ / "m");
  ASSERT_TRUE(tok.ok());
  // Six think tokens, then <|close|>think<|sep|><|open|>response<|sep|>, then the response.
  const std::vector<int32_t> closing = testing::ThinkClosingIds(*tok);
  for (const json& r : results) {
    ASSERT_TRUE(r.value("ok", false)) << r.dump();
    const std::vector<int32_t> ids = r["token_ids"];
    ASSERT_GT(ids.size(), 6 + closing.size()) << r.dump();
    EXPECT_TRUE(std::equal(closing.begin(), closing.end(), ids.begin() + 6)) << r.dump();
    EXPECT_FALSE(r["content"].get<std::string>().empty()) << r.dump();
  }
  EXPECT_EQ(results[0]["token_ids"], results[1]["token_ids"]);
}

// The log-softmax of `k3 generate --dump-logits` at `id`, after the prompt `ids`.
double EngineLogprob(const std::string& model, const std::vector<int32_t>& ids, int32_t id) {
  testing::TempDir io;
  std::string list;
  for (const int32_t i : ids) list += (list.empty() ? "" : ",") + std::to_string(i);
  const testing::K3Result gen = testing::RunK3(
      {"generate", "-m", model, "--quiet", "--ids", list, "-n", "1", "--dump-logits", io / "l"});
  EXPECT_EQ(gen.exit_code, 0) << gen.err;
  const std::string bytes = testing::ReadAll(io / "l");
  std::vector<float> logits(bytes.size() / 4);
  std::memcpy(logits.data(), bytes.data(), bytes.size());
  double max = -1e30, sum = 0;
  for (float x : logits) max = std::max(max, static_cast<double>(x));
  for (float x : logits) sum += std::exp(x - max);
  return logits.at(id) - (max + std::log(sum));
}

TEST_F(ServeToolsTest, LogprobsAreTheLogSoftmaxOfTheEnginesLogits) {
  const json body = {{"messages", {{{"role", "user"}, {"content", "Hello"}}}},
                     {"max_tokens", 2},
                     {"temperature", 0},
                     {"logprobs", true},
                     {"top_logprobs", 5},
                     {"return_token_ids", true}};
  const testing::HttpResult r = testing::PostJson(*server_, "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  const json choice = json::parse(r.body)["choices"][0];
  const json& content = choice["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u) << r.body;
  std::vector<int32_t> ids;
  for (const json& id : choice["prompt_token_ids"]) ids.push_back(id.get<int32_t>());
  const int first = choice["token_ids"][0];
  EXPECT_NEAR(content[0]["logprob"].get<double>(), EngineLogprob(*dir_ / "m", ids, first), 1e-5);
  ASSERT_EQ(content[0]["top_logprobs"].size(), 5u);
  EXPECT_EQ(content[0]["top_logprobs"][0]["logprob"], content[0]["logprob"]);  // greedy
  for (const json& alt : content[0]["top_logprobs"]) {
    EXPECT_LE(alt["logprob"].get<double>(), content[0]["logprob"].get<double>() + 1e-9);
  }
}

// Completions with echo, as evaluation harnesses score a continuation: the prompt's text before
// the completion's, and in logprobs one value per prompt token after the first (null for the
// first), each the log-softmax of the engine's logits after the tokens before it; the same
// streamed.
TEST_F(ServeToolsTest, EchoGivesThePromptsLogprobsAsTheEngineComputesThem) {
  const std::vector<int32_t> prompt = {5, 9, 17, 3, 22, 40};
  json body = {{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0},
               {"logprobs", 2},    {"echo", true},    {"return_token_ids", true}};
  const testing::HttpResult plain = testing::PostJson(*server_, "/v1/completions", body.dump());
  ASSERT_EQ(plain.status, 200) << plain.body;
  const json choice = json::parse(plain.body)["choices"][0];
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), prompt.size() + 1) << plain.body;
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  std::string tokens_text;
  for (const json& t : lp["tokens"]) tokens_text += t.get<std::string>();
  EXPECT_EQ(choice["text"], tokens_text);  // the prompt's text, then the completion's
  for (size_t i = 1; i < prompt.size(); ++i) {
    const std::vector<int32_t> before(prompt.begin(), prompt.begin() + i);
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(),
                EngineLogprob(*dir_ / "m", before, prompt[i]), 1e-5)
        << i;
    EXPECT_EQ(lp["top_logprobs"][i].size(), 2u) << i;
  }
  EXPECT_EQ(lp["text_offset"][1], lp["tokens"][0].get<std::string>().size());

  body["stream"] = true;
  const testing::HttpResult streamed = testing::PostJson(*server_, "/v1/completions", body.dump());
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::string text;
  json token_logprobs = json::array();
  for (absl::string_view line : absl::StrSplit(streamed.body, '\n')) {
    if (!absl::ConsumePrefix(&line, "data: ") || line == "[DONE]") continue;
    const json chunk = json::parse(std::string(line));
    if (chunk["choices"].empty()) continue;
    text += chunk["choices"][0]["text"].get<std::string>();
    const json& part = chunk["choices"][0]["logprobs"];
    if (part.is_object()) {
      for (const json& v : part["token_logprobs"]) token_logprobs.push_back(v);
    }
  }
  EXPECT_EQ(text, choice["text"]);
  EXPECT_EQ(token_logprobs, lp["token_logprobs"]);
}

}  // namespace
}  // namespace k3
