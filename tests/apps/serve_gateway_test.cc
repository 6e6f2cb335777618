// k3 serve behind an inference gateway (docs/SCALE.md): the gauges the endpoint picker routes
// by, under vLLM's names, follow the queue, the batch and the states it holds; /health answers
// 503 while SIGTERM drains, the requests in flight (live and waiting) finish and the server
// exits 0. Every wait polls for a condition with a generous bound, never a fixed sleep.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <optional>

#include "tests/apps/serve_harness.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;
using testing::json;
using testing::MetricIn;
using ::testing::Not;
using testing::ServeProcess;

// A stream that never ends by itself: far more tokens than the test lives, no stop id.
const json kEndless = {
    {"prompt", "hold"}, {"max_tokens", 100000}, {"stream", true}, {"ignore_eos", true}};

// The gateway's gauges and k3's own, all from one scrape of /metrics.
struct Gauges {
  double waiting = -1, running = -1, usage = -1;
  double queue_length = -1, live_sequences = -1;
  double live_bytes = -1, capacity_bytes = -1;
};

Gauges Scrape(const ServeProcess& server) {
  const std::string text = testing::Curl(server.url("/metrics")).body;
  Gauges g;
  g.waiting = MetricIn(text, "vllm:num_requests_waiting");
  g.running = MetricIn(text, "vllm:num_requests_running");
  g.usage = MetricIn(text, "vllm:kv_cache_usage_perc");
  g.queue_length = MetricIn(text, "k3_queue_length");
  g.live_sequences = MetricIn(text, "k3_live_sequences");
  g.live_bytes = MetricIn(text, "k3_state_bytes{kind=\"live\"}");
  g.capacity_bytes = MetricIn(text, "k3_state_bytes{kind=\"capacity\"}");
  return g;
}

// Scrapes until `holds` (a minute at most, for a loaded machine): the scrape where it held.
std::optional<Gauges> ScrapeUntil(const ServeProcess& server,
                                  const std::function<bool(const Gauges&)>& holds) {
  for (int i = 0; i < 1200; ++i) {
    const Gauges g = Scrape(server);
    if (holds(g)) return g;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return std::nullopt;
}

class ServeGatewayTest : public testing::ServeModelSuite {};

// Two places in the batch, four endless requests: the first two run, the other two wait. The
// usage gauge is the larger of the places taken and the live states' bytes over what the plan
// reserves for the two places: 0 when idle, at least a half with one live sequence, 1 with both
// places taken, however little of the planned context the states hold yet.
TEST_F(ServeGatewayTest, TheGaugesFollowTheQueueTheBatchAndItsStates) {
  ServeProcess server({"-m", model(), "--batch", "2", "--max-queue", "8"});
  const std::string text = testing::Curl(server.url("/metrics")).body;
  for (const char* name : {"vllm:num_requests_waiting", "vllm:num_requests_running",
                           "vllm:kv_cache_usage_perc", "vllm:cache_config_info"}) {
    EXPECT_THAT(text, HasSubstr(std::string("# TYPE ") + name + " gauge\n")) << name;
  }
  // The labels the endpoint picker's prefix scorer reads.
  EXPECT_THAT(text, HasSubstr("vllm:cache_config_info{block_size=\"64\",num_gpu_blocks=\""));
  EXPECT_EQ(MetricIn(text, "k3_batch_places"), 2);
  const Gauges idle = Scrape(server);
  EXPECT_EQ(idle.waiting, 0);
  EXPECT_EQ(idle.running, 0);
  EXPECT_EQ(idle.usage, 0);
  EXPECT_GT(idle.capacity_bytes, 0);

  testing::Streams streams;
  streams.Start(server, kEndless);
  const std::optional<Gauges> one =
      ScrapeUntil(server, [](const Gauges& g) { return g.running == 1; });
  ASSERT_TRUE(one.has_value()) << testing::Curl(server.url("/metrics")).body;
  EXPECT_EQ(one->waiting, 0);
  EXPECT_GE(one->usage, 0.5);
  EXPECT_LE(one->usage, 1);

  streams.Start(server, kEndless);
  const std::optional<Gauges> two =
      ScrapeUntil(server, [](const Gauges& g) { return g.running == 2; });
  ASSERT_TRUE(two.has_value()) << testing::Curl(server.url("/metrics")).body;
  EXPECT_EQ(two->waiting, 0);
  EXPECT_GT(two->usage, 0.5);
  EXPECT_GT(two->usage, one->usage);
  EXPECT_LE(two->usage, 1);

  // Past the batch: the next two wait, the two live ones keep their places.
  streams.Start(server, kEndless);
  streams.Start(server, kEndless);
  const std::optional<Gauges> full =
      ScrapeUntil(server, [](const Gauges& g) { return g.waiting == 2; });
  ASSERT_TRUE(full.has_value()) << testing::Curl(server.url("/metrics")).body;
  EXPECT_EQ(full->running, 2);
  EXPECT_EQ(full->live_sequences, full->running);
  EXPECT_EQ(full->queue_length, full->waiting);
  EXPECT_GE(full->usage, two->usage);
  EXPECT_LE(full->usage, 1);
  // What the gauge means: the larger of the places taken and the live states' bytes over the
  // places' planned bytes (printed to six significant digits).
  const double places = full->running / MetricIn(text, "k3_batch_places");
  EXPECT_NEAR(full->usage / std::max(places, full->live_bytes / full->capacity_bytes), 1, 1e-4);
  EXPECT_EQ(full->usage, 1);

  // The clients go away: every sequence ends, waiting ones included, and the gauges fall to 0.
  streams.Kill();
  const std::optional<Gauges> after =
      ScrapeUntil(server, [](const Gauges& g) { return g.running == 0 && g.waiting == 0; });
  ASSERT_TRUE(after.has_value()) << testing::Curl(server.url("/metrics")).body;
  EXPECT_EQ(after->usage, 0);
  EXPECT_EQ(server.Stop(), 0) << server.log();
}

// SIGTERM with one request live and one waiting: /health turns 503 (a readiness probe takes
// the replica out of the pool), a new request gets 503, both requests run to their end and the
// server exits 0.
TEST_F(ServeGatewayTest, SigtermDrainsHealthAnswers503AndTheRequestsInFlightFinish) {
  ServeProcess server({"-m", model(), "--batch", "1", "--drain-seconds", "600"});
  const testing::HttpResult ready = testing::Curl(server.url("/health"));
  EXPECT_EQ(ready.status, 200);
  EXPECT_EQ(json::parse(ready.body)["status"], "ok");
  const json finite = {
      {"prompt", "drain"}, {"max_tokens", 1500}, {"stream", true}, {"ignore_eos", true}};
  testing::Streams streams;
  streams.Start(server, finite);
  streams.Start(server, finite);
  ASSERT_TRUE(ScrapeUntil(server, [](const Gauges& g) {
                return g.running == 1 && g.waiting == 1;
              }).has_value());

  server.Signal(SIGTERM);
  ASSERT_TRUE(testing::WaitForStatus(server, "/health", 503)) << server.log();
  EXPECT_EQ(json::parse(testing::Curl(server.url("/health")).body)["status"], "draining");
  EXPECT_EQ(testing::Metric(server, "k3_draining"), 1);
  const testing::HttpResult refused =
      testing::PostJson(server, "/v1/completions", R"({"prompt": "late", "max_tokens": 2})");
  EXPECT_EQ(refused.status, 503) << refused.body;
  EXPECT_EQ(json::parse(refused.body)["error"]["code"], "unavailable");

  EXPECT_EQ(server.Wait(), 0) << server.log();
  ASSERT_TRUE(streams.WaitAll());
  for (int i = 0; i < 2; ++i) {
    const std::string out = streams.Output(i);
    EXPECT_THAT(out, HasSubstr(R"("finish_reason":"length")")) << i;
    EXPECT_THAT(out, HasSubstr("data: [DONE]")) << i;
    EXPECT_THAT(out, Not(HasSubstr("unavailable"))) << i;
  }
  // Both, unless the first had finished before the signal: then the second alone.
  EXPECT_THAT(server.log(), ::testing::ContainsRegex("draining: [12] requests in flight"));
  EXPECT_THAT(server.log(), HasSubstr("drained, stopping"));
}

// The drain is bounded: what still runs when --drain-seconds are up ends as on Ctrl-C (a
// stream gets an error event), and the server still exits 0.
TEST_F(ServeGatewayTest, WhatStillRunsWhenTheDrainIsUpEndsWithAnErrorEvent) {
  ServeProcess server({"-m", model(), "--batch", "1", "--drain-seconds", "1"});
  testing::Streams streams;
  streams.Start(server, kEndless);
  ASSERT_TRUE(ScrapeUntil(server, [](const Gauges& g) { return g.running == 1; }).has_value());
  EXPECT_EQ(server.Stop(), 0) << server.log();
  ASSERT_TRUE(streams.WaitAll()) << "curl still running a minute after the stop";
  EXPECT_THAT(streams.Output(0), HasSubstr(R"("code":"unavailable")"));
  EXPECT_THAT(streams.Output(0), Not(HasSubstr("[DONE]")));
  EXPECT_THAT(server.log(), HasSubstr("drain time up, ending 1 requests"));
}

TEST_F(ServeGatewayTest, ANegativeDrainIsAUsageError) {
  const testing::K3Result r =
      testing::RunK3({"serve", "-m", model(), "--port", "0", "--drain-seconds", "-1"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--drain-seconds must be in [0, 86400]"));
}

}  // namespace
}  // namespace k3
