// k3 chat --tools: a reply under --tool-choice required is a call that parses and validates on
// the demo model's random weights, its result goes back as a tool message whose tokens are the
// renderer's, the same seed gives the same call at every memory budget, and chat renders the
// first turn exactly as k3 serve does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <regex>

#include "core/text/chat_template.h"
#include "core/text/tokenizer/tokenizer.h"
#include "nlohmann/json.hpp"
#include "tests/apps/serve_harness.h"
#include "tests/util/run_k3.h"
#include "tests/util/temp_dir.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;
using Ids = std::vector<int32_t>;

constexpr char kTools[] = R"([{"type": "function", "function": {"name": "get_weather",
  "parameters": {"type": "object", "properties": {"city": {"type": "string"},
  "days": {"type": "integer"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
  "required": ["city", "unit"]}}}])";

class ChatToolsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    models_ = new testing::TempDir;
    ASSERT_EQ(testing::SynthServeModel(*models_ / "m"), 0);
  }
  static void TearDownTestSuite() { delete models_; }
  static std::string Model() { return *models_ / "m"; }

  void SetUp() override { std::ofstream(dir_ / "tools.json") << kTools; }

  testing::K3Result Chat(const std::vector<std::string>& flags, const std::string& input) {
    std::vector<std::string> args = {
        "chat",    "--model", Model(), "--tools",       dir_ / "tools.json",
        "--quiet", "-n",      "300",   "--tool-choice", "required"};
    args.insert(args.end(), flags.begin(), flags.end());
    return testing::RunK3(args, input);
  }
  json Report(const std::string& name) { return json::parse(testing::ReadAll(dir_ / name)); }

  static testing::TempDir* models_;
  testing::TempDir dir_;
};
testing::TempDir* ChatToolsTest::models_ = nullptr;

// The arguments of every "[call get_weather {...}]" line.
std::vector<json> Calls(const std::string& out) {
  std::vector<json> calls;
  static const std::regex kCall(R"(\[call get_weather (\{.*\})\])");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), kCall); it != std::sregex_iterator();
       ++it) {
    calls.push_back(json::parse((*it)[1].str(), nullptr, false));
  }
  return calls;
}

TEST_F(ChatToolsTest, ACallValidatesAndItsResultGoesBackAsAToolMessage) {
  auto r = Chat({"--temp", "0.8", "--seed", "5", "--report-json", dir_ / "r.json"},
                "weather in Paris?\nsunny, 24 C\n");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::vector<json> calls = Calls(r.out);
  ASSERT_GE(calls.size(), 2u) << r.out;  // the first reply, and the reply to its result
  for (const json& args : calls) {
    ASSERT_TRUE(args.is_object()) << r.out;
    EXPECT_TRUE(args["city"].is_string()) << args.dump();
    EXPECT_TRUE(args["unit"] == "celsius" || args["unit"] == "fahrenheit") << args.dump();
    if (args.contains("days")) {
      EXPECT_TRUE(args["days"].is_number_integer()) << args.dump();
    }
    for (const auto& [key, value] : args.items()) {
      EXPECT_TRUE(key == "city" || key == "unit" || key == "days") << key;
    }
  }
  // Turn 2 runs what closes reply 1 (its <|end_of_msg|>, never run) and the tool message, as
  // the renderer writes it.
  const json turns = Report("r.json");
  ASSERT_EQ(turns.size(), 2u);
  auto tok = Tokenizer::Load(Model());
  ASSERT_TRUE(tok.ok());
  const Ids reply1 = turns[0]["generated_ids"];
  ASSERT_EQ(reply1.back(), *tok->SpecialTokenId("<|end_of_msg|>"));
  const std::vector<ChatMessage> result = {
      {.role = "tool", .content = "sunny, 24 C", .name = "get_weather"}};
  ChatOptions options{.head = false, .tool_choice = "required"};
  options.tools = json::parse(kTools);
  Ids expected = {reply1.back()};
  auto rendered = RenderChat(*tok, result, options);
  ASSERT_TRUE(rendered.ok());
  expected.insert(expected.end(), rendered->begin(), rendered->end());
  EXPECT_EQ(turns[1]["prompt_ids"], json(expected));
}

TEST_F(ChatToolsTest, TheSameSeedGivesTheSameCallAtEveryBudget) {
  std::vector<std::string> outs;
  for (const char* ram : {"0.1", "0.3", "2"}) {
    auto r = Chat({"--temp", "0.8", "--seed", "9", "--ram-gb", ram}, "weather?\n");
    ASSERT_EQ(r.exit_code, 0) << ram << ": " << r.err;
    ASSERT_EQ(Calls(r.out).size(), 1u) << r.out;
    outs.push_back(r.out);
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(outs[0], outs[2]);
}

TEST_F(ChatToolsTest, ChatRendersTheFirstTurnAsServeDoes) {
  auto chat = Chat({"--system", "Be brief.", "-n", "1", "--tool-choice", "auto", "--report-json",
                    dir_ / "c.json"},
                   "weather in Paris?\n");
  ASSERT_EQ(chat.exit_code, 0) << chat.err;
  testing::ServeProcess server({"-m", Model(), "--quiet"});
  const json body = {{"messages",
                      {{{"role", "system"}, {"content", "Be brief."}},
                       {{"role", "user"}, {"content", "weather in Paris?"}}}},
                     {"tools", json::parse(kTools)},
                     {"max_tokens", 1},
                     {"return_token_ids", true}};
  const testing::HttpResult served = testing::PostJson(server, "/v1/chat/completions", body.dump());
  ASSERT_EQ(served.status, 200) << served.body;
  EXPECT_EQ(json::parse(served.body)["choices"][0]["prompt_token_ids"],
            Report("c.json")[0]["prompt_ids"]);
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(ChatToolsTest, BadToolFilesAreRefusedNamingTheField) {
  std::ofstream(dir_ / "bad.json") << R"([{"type": "function", "function": {"name": "f",
    "parameters": {"type": "object", "properties": {"a": {"type": "string", "pattern": "x"}}}}}])";
  auto r = testing::RunK3({"chat", "--model", Model(), "--tools", dir_ / "bad.json"}, "hi\n");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.err, HasSubstr("\"pattern\""));
  EXPECT_THAT(r.err, HasSubstr("tools[0].function.parameters.properties.a"));
  auto named = Chat({"--tool-choice", "nope"}, "hi\n");
  EXPECT_NE(named.exit_code, 0);
  EXPECT_THAT(named.err, HasSubstr("--tool-choice nope"));
}

}  // namespace
}  // namespace k3
