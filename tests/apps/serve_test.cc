// k3 serve with real clients: the OpenAI Node SDK and curl. Every answer's token ids equal
// `k3 generate` of the same prompt alone, streamed or not, one client or eight at once, with a
// resumed (prefix-reused) state or without; a client that disconnects frees its place; a full
// queue answers 429 with Retry-After. The bad-request catalogue is in serve_errors_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cctype>
#include <cstdio>
#include <thread>

#include "tests/apps/serve_harness.h"
#include "tests/util/sanitizers.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::json;
using testing::RunK3;
using testing::ServeProcess;

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new testing::TempDir;
    ASSERT_EQ(testing::SynthServeModel(model()), 0);
    ASSERT_EQ(testing::SynthServeModel(demo(), /*layers=*/0), 0);
  }
  static void TearDownTestSuite() { delete dir_; }
  static std::string model() { return *dir_ / "m"; }
  static std::string demo() { return *dir_ / "demo"; }  // the whole demo model

  // The sampling flags of `k3 generate` that match a request's.
  static std::vector<std::string> Sampling(const json& params) {
    const double t = params.value("temperature", 1.0);
    if (t == 0) return {"--greedy"};
    return {"--temp",  std::to_string(t),
            "--top-p", std::to_string(params.value("top_p", 1.0)),
            "--top-k", "0",
            "--seed",  std::to_string(params.at("seed").get<int64_t>())};
  }
  // The answer's ids, against `k3 generate` of its prompt ids alone.
  static void ExpectExact(const json& request, const json& result,
                          const std::string& model_dir = model()) {
    ASSERT_TRUE(result.value("ok", false)) << result.dump();
    EXPECT_TRUE(result["done"].get<bool>()) << result.dump();
    const json& p = request["params"];
    const json alone = testing::GenerateAlone(model_dir, result["prompt_token_ids"],
                                              p["max_tokens"].get<int>(), Sampling(p));
    EXPECT_EQ(result["token_ids"], alone) << request.dump();
    EXPECT_EQ(result["usage"]["completion_tokens"], alone.size()) << result.dump();
  }
  // A request for serve_client.cjs: `input` is the chat's messages or the completion's prompt.
  static json Request(const char* endpoint, const char* field, json input, int n, bool stream,
                      const json& sampling) {
    json params = {{"model", "m"},
                   {field, std::move(input)},
                   {"max_tokens", n},
                   {"return_token_ids", true},
                   {"stream", stream}};
    params.update(sampling);
    if (stream) params["stream_options"] = {{"include_usage", true}};
    return {{"endpoint", endpoint}, {"params", params}};
  }
  static json Chat(const std::string& text, int n, bool stream,
                   json sampling = {{"temperature", 0}}) {
    return Request("chat", "messages", {{{"role", "user"}, {"content", text}}}, n, stream,
                   sampling);
  }
  static json Completion(const json& prompt, int n, bool stream,
                         json sampling = {{"temperature", 0}}) {
    return Request("completions", "prompt", prompt, n, stream, sampling);
  }

  static testing::TempDir* dir_;
};

testing::TempDir* ServeTest::dir_ = nullptr;

TEST_F(ServeTest, OpenAiSdkChatAndCompletionsStreamedOrNotEqualGenerateAlone) {
  ServeProcess server({"-m", model()});
  const json requests = json::array(
      {Chat("Hello there", 7, false), Chat("Hello there", 7, true),
       Completion("The capital of France is", 6, false),
       Completion("The capital of France is", 6, true, {{"temperature", 0.8}, {"seed", 7}}),
       Completion(json::array({5, 6, 7}), 5, true,
                  {{"temperature", 1.1}, {"top_p", 0.9}, {"seed", 3}})});
  const json results = testing::NodeClients(server, requests);
  ASSERT_EQ(results.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) ExpectExact(requests[i], results[i]);
  EXPECT_EQ(results[0]["object"], "chat.completion");
  EXPECT_EQ(results[1]["object"], "chat.completion.chunk");
  EXPECT_EQ(results[2]["object"], "text_completion");
  // Streamed or not, the same answer; text as `k3 generate` prints it.
  EXPECT_EQ(results[0]["token_ids"], results[1]["token_ids"]);
  EXPECT_EQ(results[0]["reasoning"].get<std::string>() + results[0]["content"].get<std::string>(),
            results[1]["reasoning"].get<std::string>() + results[1]["content"].get<std::string>());
  EXPECT_EQ(results[0]["finish_reason"], "length");
  EXPECT_EQ(results[1]["usage"]["prompt_tokens"], results[0]["usage"]["prompt_tokens"]);
  const testing::K3Result gen =
      RunK3({"generate", "-m", model(), "--quiet", "-p", "The capital of France is", "-n", "6"});
  EXPECT_EQ(results[2]["content"].get<std::string>() + "\n", gen.out);  // generate ends the line
  EXPECT_EQ(results[3]["prompt_token_ids"], results[2]["prompt_token_ids"]);
  EXPECT_EQ(server.Stop(), 0) << server.log();
}

TEST_F(ServeTest, AStopStringEndsTheTextBeforeItStreamedOrNot) {
  ServeProcess server({"-m", model()});
  const json plain = testing::NodeClients(server, json::array({Completion("Tell me", 24, false)}));
  ASSERT_EQ(plain.size(), 1u);
  const std::string text = plain[0]["content"];
  // A stop string from the middle of the greedy text: two printable characters.
  size_t at = text.size() / 2;
  while (at + 2 < text.size() && !(std::isalnum(static_cast<unsigned char>(text[at])) &&
                                   std::isalnum(static_cast<unsigned char>(text[at + 1])))) {
    ++at;
  }
  ASSERT_LT(at + 2, text.size()) << text;
  const std::string stop = text.substr(at, 2);
  json requests = json::array();
  for (bool stream : {false, true}) {
    json r = Completion("Tell me", 24, stream);
    r["params"]["stop"] = json::array({stop, "never-in-the-text"});
    requests.push_back(r);
  }
  const json cut = testing::NodeClients(server, requests);
  ASSERT_EQ(cut.size(), 2u);
  for (const json& r : cut) {
    EXPECT_EQ(r["content"], text.substr(0, text.find(stop))) << stop;
    EXPECT_EQ(r["finish_reason"], "stop");
    EXPECT_LT(r["token_ids"].size(), plain[0]["token_ids"].size());
  }
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(ServeTest, EightStreamingClientsAtOnceAreEachCompleteAndExactAndCounted) {
  ServeProcess server({"-m", demo(), "--batch", "8"});
  json requests = json::array();
  for (int i = 0; i < 8; ++i) {
    const json sampling = {{"temperature", 0.7 + 0.05 * i}, {"seed", 100 + i}};
    requests.push_back(
        i % 2 ? Chat("client " + std::to_string(i), 12 + i, true, sampling)
              : Completion("stream number " + std::to_string(i), 12 + i, true, sampling));
  }
  const json results = testing::NodeClients(server, requests);
  ASSERT_EQ(results.size(), 8u);
  int64_t tokens = 0;
  for (size_t i = 0; i < 8; ++i) {
    ExpectExact(requests[i], results[i], demo());
    tokens += results[i]["token_ids"].size();
  }
  EXPECT_EQ(testing::Metric(server, "k3_requests_total{outcome=\"finished\"}"), 8);
  EXPECT_EQ(testing::Metric(server, "k3_tokens_total{kind=\"completion\"}"), tokens);
  EXPECT_EQ(
      testing::Metric(server, "k3_http_requests_total{path=\"/v1/chat/completions\",code=\"200\"}"),
      4);
  EXPECT_EQ(
      testing::Metric(server, "k3_http_requests_total{path=\"/v1/completions\",code=\"200\"}"), 4);
  EXPECT_EQ(testing::Metric(server, "k3_live_sequences"), 0);
  EXPECT_EQ(testing::Metric(server, "k3_queue_length"), 0);
  // Whether an expert arrives by demand or by prefetch depends on timing; their sum does not.
  double read = 0;
  for (const char* kind :
       {"trunk", "expert_demand", "expert_prefetch_used", "expert_prefetch_wasted"}) {
    read += testing::Metric(server, std::string("k3_read_bytes_total{kind=\"") + kind + "\"}");
  }
  EXPECT_GT(read, 0);
  EXPECT_GE(testing::Metric(server, "k3_expert_cache_hit_ratio"), 0);
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(ServeTest, AClientThatDisconnectsMidStreamIsCancelledAndFreesItsPlace) {
  ServeProcess server({"-m", model(), "--batch", "1"});
  json gone = Completion("a long story", 4000, true);
  gone["abort_after_chunks"] = 3;
  const json results = testing::NodeClients(server, json::array({gone}));
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].value("aborted", false)) << results[0].dump();
  // Its sequence ends at a step soon after, long before its 4000 tokens, and the one place of
  // the batch is free for the next request.
  EXPECT_TRUE(testing::WaitForMetric(server, "k3_requests_total{outcome=\"cancelled\"}", 1))
      << testing::Curl(server.url("/metrics")).body;
  EXPECT_TRUE(testing::WaitForMetric(server, "k3_live_sequences", 0));
  EXPECT_EQ(testing::Metric(server, "k3_requests_total{outcome=\"finished\"}"), 0);
  const json next = Completion("after it", 5, false);
  const json after = testing::NodeClients(server, json::array({next}));
  ASSERT_EQ(after.size(), 1u);
  ExpectExact(next, after[0]);
  EXPECT_EQ(server.Stop(), 0);
}

// Cancel mid-prompt: with one place in the batch, a 4000-token prompt run in one step (about
// 5 s on the demo model's 8 layers here) whose client gives up after 1.5 s leaves the engine at
// the next layer, and the request queued behind it runs. Counted in layers, never seconds: the
// engine runs at most one layer between the cancellation and the place freeing.
TEST_F(ServeTest, AClientGoneMidPromptFreesItsPlaceWithinOneLayer) {
  ServeProcess server({"-m", demo(), "--batch", "1", "--prefill-chunk", "4096"});
  json ids = json::array();
  for (int i = 0; i < 4000; ++i) ids.push_back(10 + (i * 37) % 4000);
  const json gone = {{"prompt", ids}, {"max_tokens", 4}, {"stream", true}};
  std::thread client([&] {
    testing::PostJson(server, "/v1/completions", gone.dump(), {"-N", "--max-time", "1.5"});
  });
  // Admitted (its prompt counted) before the next request comes to wait behind it.
  EXPECT_TRUE(testing::WaitForMetric(server, "k3_tokens_total{kind=\"prompt\"}", 4000));
  const json next = Completion("after it", 5, false);
  const json after = testing::NodeClients(server, json::array({next}));
  client.join();
  ASSERT_EQ(after.size(), 1u);
  ExpectExact(next, after[0], demo());
  EXPECT_EQ(testing::Metric(server, "k3_requests_total{outcome=\"cancelled\"}"), 1);
  EXPECT_LE(testing::Metric(server, "k3_cancel_layers_max"), 1);
  // For the record: whole steps run 8 layers each, so the rest modulo 8 is where the cut fell.
  const double layers = testing::Metric(server, "k3_layers_total");
  std::printf("layers run: %.0f, the cut step's: %d\n", layers, static_cast<int>(layers) % 8);
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(ServeTest, AFullQueueAnswers429WithRetryAfter) {
  ServeProcess server({"-m", model(), "--batch", "1", "--max-queue", "1"});
  // One stream holds the batch's place and one waits (curl in the background, each reading
  // an endless stream: no stop id may end it early); a third request finds the queue full.
  const std::string body =
      R"({"prompt": "hold", "max_tokens": 4000, "stream": true, "ignore_eos": true})";
  testing::TempDir io;
  for (int i = 0; i < 2; ++i) {
    const std::string cmd = "curl -sN -H 'Content-Type: application/json' --data-binary " +
                            testing::ShellQuote(body) + " " + server.url("/v1/completions") +
                            " > " + io / std::to_string(i) + " 2>&1 & echo $! >> " + io / "pids";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  ASSERT_TRUE(testing::WaitForMetric(server, "k3_live_sequences", 1));
  ASSERT_TRUE(testing::WaitForMetric(server, "k3_queue_length", 1));
  const testing::HttpResult full =
      testing::PostJson(server, "/v1/completions", R"({"prompt": "one more", "max_tokens": 2})");
  EXPECT_EQ(full.status, 429) << full.body;
  EXPECT_THAT(full.headers, HasSubstr("Retry-After: 1"));
  EXPECT_EQ(json::parse(full.body)["error"]["type"], "rate_limit_error");
  // The clients go away; both sequences end and the server takes requests again.
  ASSERT_EQ(std::system(("kill $(cat " + io / "pids" + ")").c_str()), 0);
  EXPECT_TRUE(testing::WaitForMetric(server, "k3_requests_total{outcome=\"cancelled\"}", 2));
  const testing::HttpResult ok =
      testing::PostJson(server, "/v1/completions", R"({"prompt": "one more", "max_tokens": 2})");
  EXPECT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(server.Stop(), 0);
}

// With no time to drain (serve_gateway_test.cc drains).
TEST_F(ServeTest, SigtermEndsTheLiveStreamsWithAnErrorEventAndExitsZero) {
  ServeProcess server({"-m", model(), "--batch", "1", "--drain-seconds", "0"});
  testing::TempDir io;
  const std::string cmd =
      "curl -sN -H 'Content-Type: application/json' --data-binary " +
      testing::ShellQuote(
          R"({"prompt": "hold", "max_tokens": 4000, "stream": true, "ignore_eos": true})") +
      " " + server.url("/v1/completions") + " > " + io / "stream" + " 2>&1 & echo $! > " +
      io / "pid";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  ASSERT_TRUE(testing::WaitForMetric(server, "k3_live_sequences", 1));
  EXPECT_EQ(server.Stop(), 0) << server.log();
  // curl ends once the server has closed the stream.
  const std::string wait = "for i in $(seq 1200); do kill -0 $(cat " + io / "pid" +
                           ") 2>/dev/null || exit 0; sleep 0.05; done; exit 1";
  ASSERT_EQ(std::system(wait.c_str()), 0) << "curl still running a minute after the stop";
  const std::string stream = testing::ReadAll(io / "stream");
  EXPECT_THAT(stream, HasSubstr(R"("code":"unavailable")"));
  EXPECT_THAT(stream, ::testing::Not(HasSubstr("[DONE]")));
  EXPECT_THAT(server.log(), HasSubstr("terminated, stopping"));
}

// The next turn of a chat resumes the state of the first one's end: from memory
// (--saved-states), from the prompt cache's directory, and from that directory after a restart.
TEST_F(ServeTest, AChatThatExtendsAnEarlierOneResumesItsStateWithTheSameTokens) {
  const json first = Chat("My name is Ada.", 6, false);
  testing::TempDir cache;
  json second;
  for (const auto& [saved, dir] :
       {std::pair<std::string, std::string>{"4", "none"}, {"0", "none"}, {"0", cache.path()}}) {
    const std::string where = "--saved-states " + saved + " --prompt-cache " + dir;
    ServeProcess server({"-m", model(), "--saved-states", saved, "--prompt-cache", dir});
    const json r1 = testing::NodeClients(server, json::array({first}));
    ASSERT_EQ(r1.size(), 1u) << where;
    ExpectExact(first, r1[0]);
    // The next turn: the conversation so far, the reply as the client got it, a new message.
    second = first;
    second["params"]["messages"] = {{{"role", "user"}, {"content", "My name is Ada."}},
                                    {{"role", "assistant"},
                                     {"content", r1[0]["content"]},
                                     {"reasoning_content", r1[0]["reasoning"]}},
                                    {{"role", "user"}, {"content", "What is my name?"}}};
    second["params"]["max_tokens"] = 8;
    const json r2 = testing::NodeClients(server, json::array({second}));
    ASSERT_EQ(r2.size(), 1u) << where;
    ExpectExact(second, r2[0]);
    const int64_t cached = r2[0]["usage"]["prompt_tokens_details"]["cached_tokens"];
    if (saved == "0" && dir == "none") {
      EXPECT_EQ(cached, 0) << where;
    } else {
      // At least the whole first prompt was not run again.
      EXPECT_GE(cached, r1[0]["usage"]["prompt_tokens"].get<int64_t>()) << where << r2[0].dump();
      EXPECT_EQ(testing::Metric(server, "k3_tokens_total{kind=\"cached\"}"), cached) << where;
    }
    EXPECT_EQ(server.Stop(), 0);
  }
  // A restart over the same directory: the second turn again resumes all but its last token.
  ServeProcess server({"-m", model(), "--saved-states", "0", "--prompt-cache", cache.path()});
  const json r3 = testing::NodeClients(server, json::array({second}));
  ASSERT_EQ(r3.size(), 1u);
  ExpectExact(second, r3[0]);
  EXPECT_EQ(r3[0]["usage"]["prompt_tokens_details"]["cached_tokens"].get<int64_t>(),
            r3[0]["usage"]["prompt_tokens"].get<int64_t>() - 1);
  EXPECT_THAT(server.log(), HasSubstr("prompt cache " + cache.path()));
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(ServeTest, ModelsHealthAndMetricsAnswer) {
  ServeProcess server({"-m", model(), "--model-id", "kimi-test"});
  const testing::HttpResult models = testing::Curl(server.url("/v1/models"));
  ASSERT_EQ(models.status, 200);
  EXPECT_EQ(json::parse(models.body)["data"][0]["id"], "kimi-test");
  const testing::HttpResult health = testing::Curl(server.url("/health"));
  EXPECT_EQ(health.status, 200);
  EXPECT_EQ(json::parse(health.body)["status"], "ok");
  const testing::HttpResult metrics = testing::Curl(server.url("/metrics"));
  EXPECT_EQ(metrics.status, 200);
  for (const char* name : {"k3_queue_length", "k3_seconds_per_token", "k3_read_bytes_total",
                           "k3_expert_cache_hit_ratio", "k3_disk_busy_ratio", "k3_tokens_total",
                           "k3_device_read_bytes_total", "k3_device_busy_seconds_total",
                           "k3_device_rate_bytes_per_second", "k3_device_failovers_total"}) {
    EXPECT_THAT(metrics.body, HasSubstr(std::string("# TYPE ") + name)) << name;
  }
  // One drive: the model's directory, labelled by its device.
  EXPECT_THAT(metrics.body, HasSubstr("k3_device_read_bytes_total{device=\""));
  EXPECT_THAT(server.log(), HasSubstr("listening on http://127.0.0.1:"));
  EXPECT_EQ(server.Stop(), 0);
  EXPECT_THAT(server.log(), HasSubstr("k3 serve: stopped"));
}

// Default flags (--max-context auto): /v1/models reports a context an agent's prompt fits in,
// and a chat past the old default of 4096 tokens (about 4,400) is served, on the 2-layer model
// to keep CI short (a 40,700-token chat on the whole demo model took 149 s by hand). Under a
// sanitizer, ten times slower, the context only.
TEST_F(ServeTest, DefaultFlagsServeAChatLongerThanTheOldContext) {
  ServeProcess server({"-m", model()});
  const testing::HttpResult models = testing::Curl(server.url("/v1/models"));
  ASSERT_EQ(models.status, 200) << models.body;
  const json m = json::parse(models.body).at("data").at(0);
  EXPECT_GE(m.at("max_model_len").get<int64_t>(), 40000);
  EXPECT_EQ(m.at("context_length"), m.at("max_model_len"));
  if (testing::kSanitized) GTEST_SKIP() << "the long prompt: not under a sanitizer";
  std::string words;
  for (int i = 0; i < 2200; ++i) words += "apple banana ";
  const json body = {
      {"model", "m"}, {"max_tokens", 1}, {"messages", {{{"role", "user"}, {"content", words}}}}};
  const testing::HttpResult r = testing::PostJson(server, "/v1/chat/completions", body.dump());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(json::parse(r.body).at("usage").at("prompt_tokens").get<int64_t>(), 4096);
}

}  // namespace
}  // namespace k3
