// k3 serve's live figures over HTTP: the prompt's progress in the OpenAI streams when a request
// asks for it (and nothing new when it does not), the charset of every event stream, and
// GET /k3/events: the plan on connect, then per-step events with each MoE layer's figures, at
// most four a second, behind the API key. The hub's merging alone, on an injected clock:
// tests/server/engine_events_test.cc.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <set>
#include <sstream>

#include "tests/apps/serve_harness.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::json;
using testing::ServeProcess;

constexpr int kChunk = 16;  // --prefill-chunk of the servers here
constexpr char kEventStream[] = "Content-Type: text/event-stream; charset=utf-8\r\n";

// The `data:` objects of a server-sent event stream, with the `event:` name before each (empty:
// none), [DONE] left out.
std::vector<std::pair<std::string, json>> Events(const std::string& body) {
  std::vector<std::pair<std::string, json>> out;
  size_t at = 0;
  while (at < body.size()) {
    size_t end = body.find("\n\n", at);
    if (end == std::string::npos) break;  // cut off by the client's stop
    std::string name;
    std::istringstream lines(body.substr(at, end - at));
    for (std::string line; std::getline(lines, line);) {
      if (line.starts_with("event: ")) name = line.substr(7);
      if (line.starts_with("data: ") && line != "data: [DONE]") {
        out.emplace_back(name, json::parse(line.substr(6)));
      }
    }
    at = end + 2;
  }
  return out;
}

// `curl -N URL` in the background, its body to a file, until Stop: how long it listened.
class Listener {
 public:
  explicit Listener(const std::string& url) {
    started_ = std::chrono::steady_clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      execlp("curl", "curl", "-s", "-N", "-o", out_.c_str(), url.c_str(), nullptr);
      _exit(127);
    }
  }
  ~Listener() { Stop(); }
  double Stop() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
      pid_ = -1;
      seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
    }
    return seconds_;
  }
  std::string body() const { return testing::ReadAll(out_); }
  // Waits for the plan event (a minute at most, for a loaded machine): the stream is on.
  bool Connected() const {
    for (int i = 0; i < 1200; ++i) {
      if (body().find("event: plan") != std::string::npos) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  testing::TempDir dir_;
  std::string out_ = dir_ / "events";
  pid_t pid_ = -1;
  std::chrono::steady_clock::time_point started_;
  double seconds_ = 0;
};

class ServeEventsTest : public testing::ServeModelSuite {
 protected:
  // A streamed chat of a long prompt (a few hundred tokens).
  static json LongChat(bool progress, int max_tokens = 4) {
    std::string text;
    for (int i = 0; i < 120; ++i) text += "word" + std::to_string(i) + " ";
    json body = {{"model", "m"},
                 {"messages", {{{"role", "user"}, {"content", text}}}},
                 {"max_tokens", max_tokens},
                 {"temperature", 0},
                 {"stream", true}};
    if (progress) body["return_progress"] = true;
    return body;
  }
  // A streamed completion asking for its progress, of a prompt of `words` words.
  static json LongCompletion(int words) {
    std::string prompt;
    for (int i = 0; i < words; ++i) prompt += "token" + std::to_string(i) + " ";
    return {{"model", "m"},
            {"prompt", prompt},
            {"max_tokens", 3},
            {"stream", true},
            {"return_progress", true}};
  }
  static std::vector<std::pair<std::string, json>> Post(const ServeProcess& s,
                                                        const std::string& path, const json& body,
                                                        std::string* headers = nullptr) {
    const testing::HttpResult r = testing::PostJson(s, path, body.dump());
    EXPECT_EQ(r.status, 200) << r.body;
    if (headers != nullptr) *headers = r.headers;
    return Events(r.body);
  }

  // The prompt_progress chunks of a stream, checked against the contract: total, cache and
  // processed consistent, processed rising, at least one per chunk of the prompt the engine ran
  // (`chunk`: the server's --prefill-chunk), the whole prompt reported before the first token.
  // Returns them.
  static std::vector<json> CheckProgress(const std::vector<std::pair<std::string, json>>& events,
                                         int64_t chunk = kChunk) {
    std::vector<json> progress;
    bool token_seen = false;
    const json& first = events.at(0).second;
    for (const auto& [name, e] : events) {
      EXPECT_EQ(e["id"], first["id"]);
      EXPECT_EQ(e["object"], first["object"]);
      EXPECT_EQ(e["model"], first["model"]);
      if (!e.contains("prompt_progress")) {
        const json& c = e["choices"];
        const json delta = c.empty() ? json::object() : c[0].value("delta", json::object());
        token_seen |=
            !c.empty() && (c[0].value("text", "") != "" || delta.value("content", "") != "" ||
                           delta.value("reasoning_content", "") != "");
        continue;
      }
      EXPECT_FALSE(token_seen) << "progress after the first token: " << e.dump();
      EXPECT_EQ(e["choices"], json::array());
      const json& p = e["prompt_progress"];
      const int64_t total = p["total"], cache = p["cache"], processed = p["processed"];
      EXPECT_LE(cache, processed) << p.dump();
      EXPECT_LE(processed, total) << p.dump();
      EXPECT_GE(p["time_ms"].get<int64_t>(), 0);
      if (!progress.empty()) {
        const json& before = progress.back()["prompt_progress"];
        EXPECT_EQ(before["total"], total);
        EXPECT_EQ(before["cache"], cache);
        EXPECT_LT(before["processed"].get<int64_t>(), processed);
        EXPECT_LE(before["time_ms"].get<int64_t>(), p["time_ms"].get<int64_t>());
      }
      progress.push_back(e);
    }
    EXPECT_TRUE(token_seen);
    if (progress.empty()) {
      ADD_FAILURE() << "no prompt_progress";
      return progress;
    }
    const json& last = progress.back()["prompt_progress"];
    EXPECT_EQ(last["processed"], last["total"]);
    const int64_t run = last["total"].get<int64_t>() - last["cache"].get<int64_t>();
    // One when the request is admitted (the cached tokens), then at least one per chunk.
    EXPECT_GE(static_cast<int64_t>(progress.size()), 1 + (run + chunk - 1) / chunk);
    return progress;
  }
};

TEST_F(ServeEventsTest, ReturnProgressReportsEachPromptChunkAndACachedPrefix) {
  ServeProcess server({"-m", model(), "--prefill-chunk", std::to_string(kChunk)});
  const std::vector<json> cold =
      CheckProgress(Post(server, "/v1/chat/completions", LongChat(true)));
  ASSERT_FALSE(cold.empty());
  const json& whole = cold.back()["prompt_progress"];
  EXPECT_GT(whole["total"].get<int64_t>(), 8 * kChunk);  // many chunks
  EXPECT_EQ(whole["cache"], 0);
  EXPECT_EQ(cold.front()["object"], "chat.completion.chunk");

  // The same prompt again resumes the saved state: the cached part counts from the start.
  const std::vector<json> warm =
      CheckProgress(Post(server, "/v1/chat/completions", LongChat(true)));
  ASSERT_FALSE(warm.empty());
  const json& resumed = warm.front()["prompt_progress"];
  EXPECT_GT(resumed["cache"].get<int64_t>(), 0);
  EXPECT_EQ(resumed["processed"], resumed["cache"]);
  EXPECT_EQ(resumed["total"], whole["total"]);

  // The completions stream too.
  const std::vector<json> completion =
      CheckProgress(Post(server, "/v1/completions", LongCompletion(60)));
  ASSERT_FALSE(completion.empty());
  EXPECT_EQ(completion.front()["object"], "text_completion");
  EXPECT_EQ(server.Stop(), 0);
}

// A prompt run in one chunk still moves while it runs: after the first of the model's two
// layers (ServeModelSuite), half its tokens. A completion's prompt (no chat turns to cut it)
// runs in one chunk, or two where the prompt cache keeps the state one token short of its end.
TEST_F(ServeEventsTest, APromptInOneChunkMovesLayerByLayer) {
  constexpr int64_t kWhole = 1024;
  ServeProcess server({"-m", model(), "--prefill-chunk", std::to_string(kWhole)});
  const std::vector<json> progress =
      CheckProgress(Post(server, "/v1/completions", LongCompletion(100)), kWhole);
  ASSERT_GE(progress.size(), 3u);  // admitted, then a point after each layer
  const int64_t total = progress.back()["prompt_progress"]["total"];
  ASSERT_LT(total, kWhole);
  const int64_t half = progress[1]["prompt_progress"]["processed"];
  EXPECT_TRUE(half == total / 2 || half == (total - 1) / 2) << progress[1].dump();
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(ServeEventsTest, AClientThatDoesNotAskSeesNoProgress) {
  ServeProcess server({"-m", model(), "--prefill-chunk", std::to_string(kChunk)});
  const auto events = Post(server, "/v1/chat/completions", LongChat(false));
  ASSERT_GE(events.size(), 3u);
  for (const auto& [name, e] : events) {
    EXPECT_FALSE(e.contains("prompt_progress")) << e.dump();
    EXPECT_EQ(e["choices"].size(), 1u) << e.dump();
  }
  // A request that asks without streaming gets the usual answer.
  json plain = LongChat(true);
  plain["stream"] = false;
  const testing::HttpResult r = testing::PostJson(server, "/v1/chat/completions", plain.dump());
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(json::parse(r.body).contains("prompt_progress"));
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(ServeEventsTest, EveryEventStreamSaysUtf8AndIsNeverCompressed) {
  ServeProcess server({"-m", model()});
  // A browser accepts compressed bodies; a compressed stream would hold its events back.
  const std::vector<std::string> browser = {"-H", "Accept-Encoding: gzip, deflate, br"};
  const std::string text = "héllo wörld ✓ 日本";
  const json completion = {
      {"model", "m"}, {"prompt", text}, {"max_tokens", 2}, {"stream", true}, {"echo", true}};
  testing::HttpResult r = testing::PostJson(server, "/v1/completions", completion.dump(), browser);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.headers, HasSubstr(kEventStream));
  EXPECT_THAT(r.headers, ::testing::Not(HasSubstr("Content-Encoding")));
  // The multi-byte prompt comes back as UTF-8 bytes, as the header says.
  const auto events = Events(r.body);
  ASSERT_FALSE(events.empty());
  EXPECT_THAT(events[0].second["choices"][0]["text"].get<std::string>(), HasSubstr(text));
  EXPECT_THAT(r.body, HasSubstr(text));

  const json chat = {{"model", "m"},
                     {"messages", {{{"role", "user"}, {"content", text}}}},
                     {"max_tokens", 2},
                     {"stream", true}};
  r = testing::PostJson(server, "/v1/chat/completions", chat.dump(), browser);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.headers, HasSubstr(kEventStream));
  EXPECT_THAT(r.headers, ::testing::Not(HasSubstr("Content-Encoding")));
  const json message = {{"model", "m"},
                        {"max_tokens", 2},
                        {"messages", {{{"role", "user"}, {"content", text}}}},
                        {"stream", true}};
  r = testing::PostJson(server, "/v1/messages", message.dump(), browser);
  EXPECT_EQ(r.status, 200) << r.body;
  EXPECT_THAT(r.headers, HasSubstr(kEventStream));
  EXPECT_THAT(r.headers, ::testing::Not(HasSubstr("Content-Encoding")));
  EXPECT_EQ(server.Stop(), 0);
}

TEST_F(ServeEventsTest, EventsGiveThePlanThenStepsWithLayerFiguresAtMostFourASecond) {
  ServeProcess server({"-m", model(), "--prefill-chunk", std::to_string(kChunk)});
  Listener listener(server.url("/k3/events"));
  ASSERT_TRUE(listener.Connected());
  // Two requests of many steps: a long prompt, then a few hundred decode steps.
  json request = LongChat(false, 300);
  request["ignore_eos"] = true;
  for (int i = 0; i < 2; ++i) Post(server, "/v1/chat/completions", request);
  const double steps_run = testing::Metric(server, "k3_steps_total");
  // What was merged after the last event goes out within a quarter second.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  const double seconds = listener.Stop();

  const auto events = Events(listener.body());
  ASSERT_GE(events.size(), 2u) << listener.body();
  ASSERT_EQ(events[0].first, "plan");
  const json& plan = events[0].second;
  EXPECT_EQ(plan["model"], "m");
  EXPECT_EQ(plan["layers"], 2);
  EXPECT_EQ(plan["experts_per_token"], 8);
  ASSERT_FALSE(plan["moe_layers"].empty());
  EXPECT_GT(plan["experts_per_layer"].get<int>(), 8);
  EXPECT_GT(plan["memory"]["budget_bytes"].get<uint64_t>(), 0u);
  EXPECT_GT(plan["memory"]["cache_bytes"].get<uint64_t>(), 0u);
  ASSERT_EQ(plan["drives"].size(), 1u);
  EXPECT_TRUE(plan["drives"][0].contains("name") && plan["drives"][0].contains("dirs"));
  EXPECT_GE(plan["max_batch"].get<int>(), 1);
  EXPECT_GT(plan["context"].get<int64_t>(), 300);

  int64_t steps = 0, seq = 0;
  std::set<std::string> kinds;
  for (size_t i = 1; i < events.size(); ++i) {
    const auto& [name, e] = events[i];
    ASSERT_EQ(name, "step") << e.dump();
    EXPECT_GT(e["seq"].get<int64_t>(), seq);
    seq = e["seq"];
    steps += e["steps"].get<int64_t>();
    kinds.insert(e["kind"].get<std::string>());
    EXPECT_GT(e["tokens"].get<int64_t>(), 0);
    EXPECT_GT(e["seconds"].get<double>(), 0);
    EXPECT_GE(e["stall_seconds"].get<double>(), 0);
    const double hit = e["hit_rate"], busy = e["disk"]["busy_fraction"];
    EXPECT_TRUE(hit >= 0 && hit <= 1 && busy >= 0 && busy <= 1) << e.dump();
    EXPECT_EQ(e["devices"].size(), 1u) << e.dump();
    for (const char* key : {"queue", "prompt_cache", "requests"}) EXPECT_TRUE(e.contains(key));
    // Every step runs every MoE layer: each one's experts came from the cache or the disk.
    ASSERT_EQ(e["layers"].size(), plan["moe_layers"].size()) << e.dump();
    for (size_t l = 0; l < e["layers"].size(); ++l) {
      const json& layer = e["layers"][l];
      EXPECT_EQ(layer["layer"], plan["moe_layers"][l]);
      const int64_t asked = layer["asked"], cached = layer["cached"], read = layer["read"];
      EXPECT_GE(asked, 8);
      EXPECT_EQ(asked, cached + read) << layer.dump();
      EXPECT_LE(layer["prefetched"].get<int64_t>(), cached);
      EXPECT_LE(layer["compute_start_ms"].get<double>(), layer["compute_end_ms"].get<double>());
      if (read > 0) {
        EXPECT_FALSE(layer["bytes_first_ms"].is_null()) << layer.dump();
      }
    }
  }
  // The first step the listener saw, the first prompt chunk, went out alone at once.
  EXPECT_EQ(events[1].second["kind"], "prefill");
  EXPECT_EQ(events[1].second["steps"], 1);
  EXPECT_EQ(events[1].second["tokens"], kChunk);
  EXPECT_GT(events[1].second["disk"]["read_bytes"].get<uint64_t>(), 0u);  // a cold cache's reads
  EXPECT_EQ(events[1].second["disk"]["read_bytes"], events[1].second["devices"][0]["bytes"]);
  for (const std::string& kind : kinds)
    EXPECT_THAT(kind, ::testing::AnyOf("prefill", "decode", "mixed"));
  // Every step counted once (2 x 299 decode steps and the prompts' chunks).
  EXPECT_EQ(steps, steps_run);
  EXPECT_GT(steps, 600);
  // At most 4 a second over the time the test listened, however many steps ran.
  const auto step_events = static_cast<double>(events.size() - 1);
  EXPECT_LE(step_events, 4 * seconds + 1) << steps << " steps in " << seconds << " s";
  // A stream still listening ends with the server.
  Listener last(server.url("/k3/events"));
  ASSERT_TRUE(last.Connected());
  EXPECT_EQ(server.Stop(), 0) << server.log();
}

TEST_F(ServeEventsTest, EventsNeedTheKeyAsAHeaderOrAQueryParameter) {
  ServeProcess server({"-m", model(), "--api-key", "sekrit"});
  const std::vector<std::string> brief = {"--max-time", "1"};
  EXPECT_EQ(testing::Curl(server.url("/k3/events"), brief).status, 401);
  EXPECT_EQ(testing::Curl(server.url("/k3/events?key=wrong"), brief).status, 401);
  for (const auto& [url, args] : std::vector<std::pair<std::string, std::vector<std::string>>>{
           {server.url("/k3/events?key=sekrit"), brief},
           {server.url("/k3/events"), {"--max-time", "1", "-H", "Authorization: Bearer sekrit"}}}) {
    const testing::HttpResult r = testing::Curl(url, args);
    EXPECT_EQ(r.status, 200) << url;
    EXPECT_THAT(r.headers, HasSubstr(kEventStream));
    EXPECT_TRUE(r.body.starts_with("event: plan\ndata: {")) << r.body;
  }
  // The query parameter opens the event stream only.
  json chat = {{"model", "m"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  EXPECT_EQ(testing::PostJson(server, "/v1/chat/completions?key=sekrit", chat.dump()).status, 401);
  EXPECT_EQ(server.Stop(), 0);
}

}  // namespace
}  // namespace k3
