// k3 serve's bad-request catalogue (docs/RELIABILITY.md, "Server requests"): every row sent
// with curl, answered with the status and the OpenAI error shape it names, and none of them
// changes the answer of a good request sent after them.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "tests/apps/serve_harness.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::json;
using testing::RunK3;
using testing::ServeProcess;

struct BadRequest {
  const char* name;
  const char* path;
  std::string body;
  int status;
  const char* type;
  const char* param;  // "" for null
  const char* code;   // "" for null
  const char* says;   // a part of the message
};

void PrintTo(const BadRequest& row, std::ostream* os) { *os << row.name; }

std::string LongPrompt(int ids) {
  std::string s = R"({"prompt": [)";
  for (int i = 0; i < ids; ++i) s += (i ? ",5" : "5");
  return s + "]}";
}

const std::string kWeatherTool =
    R"({"type": "function", "function": {"name": "get_weather", "parameters": {"type": )"
    R"("object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})";

const BadRequest kCatalogue[] = {
    {"malformed_json", "/v1/completions", R"({"prompt": )", 400, "invalid_request_error", "", "",
     "not valid JSON"},
    {"body_not_an_object", "/v1/completions", "[1, 2]", 400, "invalid_request_error", "", "",
     "JSON object"},
    {"wrong_type", "/v1/completions", R"({"prompt": "x", "max_tokens": "ten"})", 400,
     "invalid_request_error", "max_tokens", "", "integer"},
    {"out_of_range", "/v1/chat/completions",
     R"({"messages": [{"role": "user", "content": "x"}], "temperature": 5})", 400,
     "invalid_request_error", "temperature", "", "[0, 2]"},
    {"unknown_field", "/v1/completions", R"({"prompt": "x", "bogus": 1})", 400,
     "invalid_request_error", "bogus", "", "Unrecognized request argument"},
    {"unsupported_n", "/v1/completions", R"({"prompt": "x", "n": 2})", 400, "invalid_request_error",
     "n", "unsupported_parameter", "only 1"},
    {"tool_without_function", "/v1/chat/completions",
     R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", 400,
     "invalid_request_error", "tools[0].function", "", "must be an object"},
    {"tool_choice_unknown_tool", "/v1/chat/completions",
     R"({"messages": [{"role": "user", "content": "x"}], "tools": [)" + kWeatherTool +
         R"(], "tool_choice": {"type": "function", "function": {"name": "get_time"}}})",
     400, "invalid_request_error", "tool_choice", "", "'get_time'"},
    {"schema_not_an_object", "/v1/chat/completions",
     R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", )"
     R"("function": {"name": "f", "parameters": "string"}}]})",
     400, "invalid_request_error", "tools[0].function.parameters", "", "JSON schema"},
    {"unsupported_schema_keyword", "/v1/chat/completions",
     R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", )"
     R"("function": {"name": "f", "parameters": {"type": "object", "properties": {"city": )"
     R"({"type": "string", "pattern": "^[A-Z]"}}}}}]})",
     400, "invalid_request_error", "tools[0].function.parameters", "",
     "unsupported JSON-schema keyword \"pattern\" at tools[0].function.parameters.properties.city"},
    {"tool_message_without_id", "/v1/chat/completions",
     R"({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "y"}]})", 400,
     "invalid_request_error", "messages[1].tool_call_id", "", "required"},
    {"response_schema_not_an_object", "/v1/chat/completions",
     R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": )"
     R"("json_schema", "json_schema": {"name": "a", "schema": true}}})",
     400, "invalid_request_error", "response_format.json_schema.schema", "", "JSON schema"},
    {"medium_effort", "/v1/chat/completions",
     R"({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "medium"})", 400,
     "invalid_request_error", "reasoning_effort", "", "\"low\", \"high\" or \"max\""},
    {"missing_messages", "/v1/chat/completions", R"({"model": "m"})", 400, "invalid_request_error",
     "messages", "", "required"},
    {"unknown_role", "/v1/chat/completions",
     R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "invalid_request_error",
     "messages[0].role", "", "wizard"},
    {"image_content", "/v1/chat/completions",
     R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})",
     400, "invalid_request_error", "messages[0].content[0]", "unsupported_parameter", "image_url"},
    {"id_outside_vocabulary", "/v1/completions", R"({"prompt": [1, 99999999]})", 400,
     "invalid_request_error", "prompt", "", "outside the vocabulary"},
    {"prompt_beyond_context", "/v1/completions", LongPrompt(200), 400, "invalid_request_error",
     "prompt", "", "--max-context"},
    {"too_many_stops", "/v1/completions", R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})",
     400, "invalid_request_error", "stop", "", "up to 4"},
    {"stream_not_a_bool", "/v1/completions", R"({"prompt": "x", "stream": "yes"})", 400,
     "invalid_request_error", "stream", "", "true or false"},
    {"empty_prompt", "/v1/completions", R"({"prompt": ""})", 400, "invalid_request_error", "prompt",
     "", "empty"},
    {"body_too_large", "/v1/completions", R"({"prompt": ")" + std::string(20000, 'a') + R"("})",
     413, "invalid_request_error", "", "request_too_large", "larger than"},
    {"unknown_url", "/v1/embeddings", R"({"input": "x"})", 404, "invalid_request_error", "",
     "unknown_url", "/v1/embeddings"},
};

class ServeErrorsTest : public ::testing::TestWithParam<BadRequest> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir;
    ASSERT_EQ(testing::SynthServeModel(*dir_ / "m"), 0);
    server_ = new ServeProcess(
        {"-m", *dir_ / "m", "--max-context", "64", "--max-body-mb", "0.01", "--quiet"});
  }
  static void TearDownTestSuite() {
    // Nothing sent above changed a good request's answer, and the server stops cleanly.
    const testing::HttpResult good = testing::PostJson(
        *server_, "/v1/completions",
        R"({"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0, "return_token_ids": true})");
    EXPECT_EQ(good.status, 200) << good.body;
    if (good.status == 200) {
      EXPECT_EQ(json::parse(good.body)["choices"][0]["token_ids"],
                testing::GenerateAlone(*dir_ / "m", json::array({5, 6, 7}), 6, {"--greedy"}));
    }
    EXPECT_EQ(server_->Stop(), 0) << server_->log();
    delete server_;
    delete dir_;
  }
  static testing::TempDir* dir_;
  static ServeProcess* server_;
};

testing::TempDir* ServeErrorsTest::dir_ = nullptr;
ServeProcess* ServeErrorsTest::server_ = nullptr;

TEST_P(ServeErrorsTest, AnsweredWithTheStatusAndTheApiErrorShape) {
  const BadRequest& row = GetParam();
  const testing::HttpResult r = testing::PostJson(*server_, row.path, row.body);
  EXPECT_EQ(r.status, row.status) << r.body;
  const json body = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(body.is_object() && body.contains("error")) << r.body;
  const json& e = body["error"];
  EXPECT_EQ(e["type"], row.type);
  EXPECT_EQ(e["param"], *row.param ? json(row.param) : json(nullptr)) << r.body;
  EXPECT_EQ(e["code"], *row.code ? json(row.code) : json(nullptr)) << r.body;
  EXPECT_THAT(e["message"].get<std::string>(), HasSubstr(row.says));
}

INSTANTIATE_TEST_SUITE_P(Catalogue, ServeErrorsTest, ::testing::ValuesIn(kCatalogue),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(ServeAuthTest, WithAnApiKeyMissingOrWrongKeysGet401AndHealthAndMetricsStayOpen) {
  testing::TempDir dir;
  ASSERT_EQ(testing::SynthServeModel(dir / "m"), 0);
  ServeProcess server({"-m", dir / "m", "--api-key", "sesame", "--quiet"});
  const std::string body = R"({"prompt": "x", "max_tokens": 1})";
  for (const auto& [header, status] :
       std::vector<std::pair<std::string, int>>{{"", 401},
                                                {"Authorization: Bearer wrong", 401},
                                                {"Authorization: Bearer sesame", 200}}) {
    std::vector<std::string> extra;
    if (!header.empty()) extra = {"-H", header};
    const testing::HttpResult r = testing::PostJson(server, "/v1/completions", body, extra);
    EXPECT_EQ(r.status, status) << header << ": " << r.body;
    if (status == 401) {
      EXPECT_EQ(json::parse(r.body)["error"]["code"], "invalid_api_key");
    }
  }
  EXPECT_EQ(testing::Curl(server.url("/v1/models")).status, 401);
  EXPECT_EQ(testing::Curl(server.url("/health")).status, 200);
  EXPECT_EQ(testing::Curl(server.url("/metrics")).status, 200);  // the gateway's scrapes
  EXPECT_EQ(server.Stop(), 0);
}

TEST(ServeStartTest, APortInUseIsRefusedNamingTheAddress) {
  testing::TempDir dir;
  ASSERT_EQ(testing::SynthServeModel(dir / "m"), 0);
  ServeProcess first({"-m", dir / "m", "--quiet"});
  const testing::K3Result second =
      RunK3({"serve", "-m", dir / "m", "--quiet", "--port", std::to_string(first.port())});
  EXPECT_EQ(second.exit_code, 1) << second.err;
  EXPECT_THAT(second.err, HasSubstr("127.0.0.1:" + std::to_string(first.port())));
  const testing::K3Result bad_port = RunK3({"serve", "-m", dir / "m", "--port", "70000"});
  EXPECT_EQ(bad_port.exit_code, 2) << bad_port.err;
  EXPECT_THAT(bad_port.err, HasSubstr("--port"));
}

// A loopback port whose last connection the listening side closed first: that side's socket
// stays in TIME_WAIT for a minute, as after `k3 serve` is stopped and its clients are gone.
int PortWithAClosedConnection() {
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  const int yes = 1;
  setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  EXPECT_EQ(listen(listener, 1), 0);
  EXPECT_EQ(getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const int client = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&addr), len), 0);
  const int accepted = accept(listener, nullptr, nullptr);
  close(accepted);  // the server's side closes first
  char byte;
  EXPECT_EQ(read(client, &byte, 1), 0);  // the end of the stream, then the client's close
  close(client);
  close(listener);
  return ntohs(addr.sin_port);
}

// A service manager restarting k3 serve on its port finds it free although the previous run's
// connections are still in TIME_WAIT there.
TEST(ServeStartTest, ARestartListensOnThePortOfItsClosedConnections) {
  testing::TempDir dir;
  ASSERT_EQ(testing::SynthServeModel(dir / "m"), 0);
  const int port = PortWithAClosedConnection();
  // The precondition: a bind without SO_REUSEADDR is refused there.
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const int plain = socket(AF_INET, SOCK_STREAM, 0);
  const int bound = bind(plain, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  const int bind_errno = errno;
  close(plain);
  ASSERT_NE(bound, 0);
  ASSERT_EQ(bind_errno, EADDRINUSE);

  ServeProcess restarted({"-m", dir / "m", "--quiet", "--port", std::to_string(port)});
  EXPECT_EQ(restarted.port(), port);
  EXPECT_EQ(testing::Curl(restarted.url("/health")).status, 200);
}

}  // namespace
}  // namespace k3
