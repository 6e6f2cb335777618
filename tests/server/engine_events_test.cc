// The engine seen live (apps/server/engine_events.h): the hub's merging of steps into at most
// four events a second, on an injected clock (no test waits for real time), and the figures a
// GenerationService publishes: each MoE layer's experts and timeline, and the prompt's progress
// a job reports layer by layer.
#include "apps/server/engine_events.h"

#include <gtest/gtest.h>

#include "apps/server/generation_service.h"
#include "tests/util/tiny_model.h"

namespace k3::server {
namespace {

using std::chrono::milliseconds;

// A step of `tokens` decode rows that took `seconds`, with one layer's figures.
StepFigures OneStep(int64_t tokens, double seconds, int32_t layer) {
  StepFigures s;
  s.decode_tokens = tokens;
  s.seconds = seconds;
  s.cache_requests = 4;
  s.cache_hits = 3;
  s.devices = {{.id = "d0", .dirs = {"d0"}, .bytes = 100, .busy_seconds = seconds / 2}};
  s.layers = {{.layer = layer, .asked = 4, .cached = 3, .read = 1}};
  s.running = tokens;
  return s;
}

class EngineEventsTest : public ::testing::Test {
 protected:
  double now_ = 100;  // before hub_, which reads it to start its clock
  EngineEvents hub_{nlohmann::json{{"layers", 3}}, [this] { return now_; }};
};

TEST_F(EngineEventsTest, TheFirstStepGoesOutAtOnceAndTheNextWithinAQuarterSecondAreMerged) {
  EXPECT_FALSE(hub_.has_clients());
  const auto client = hub_.Join();
  EXPECT_TRUE(hub_.has_clients());
  EXPECT_FALSE(hub_.Next(0, milliseconds(0)));  // nothing yet
  hub_.Publish(OneStep(1, 0.05, 1));
  std::optional<EngineEvents::Event> first = hub_.Next(0, milliseconds(0));
  ASSERT_TRUE(first);
  EXPECT_EQ(first->seq, 1);
  EXPECT_EQ(first->time_ms, 0);  // from the hub's start
  EXPECT_EQ(first->figures->steps, 1);

  // Three steps within the quarter second: none goes out, until the quarter second has passed.
  for (int i = 0; i < 3; ++i) {
    now_ += 0.05;
    hub_.Publish(OneStep(2, 0.05, 10 + i));
    EXPECT_FALSE(hub_.Next(1, milliseconds(0))) << i;
  }
  now_ = 100.25;
  std::optional<EngineEvents::Event> merged = hub_.Next(1, milliseconds(0));
  ASSERT_TRUE(merged);  // sent by the waiting client: no step has to come for it
  EXPECT_EQ(merged->seq, 2);
  EXPECT_DOUBLE_EQ(merged->time_ms, 250);
  const StepFigures& m = *merged->figures;
  EXPECT_EQ(m.steps, 3);
  EXPECT_EQ(m.decode_tokens, 6);
  EXPECT_NEAR(m.seconds, 0.15, 1e-12);
  EXPECT_EQ(m.cache_requests, 12u);
  ASSERT_EQ(m.devices.size(), 1u);
  EXPECT_EQ(m.devices[0].bytes, 300u);
  ASSERT_EQ(m.layers.size(), 1u);
  EXPECT_EQ(m.layers[0].layer, 12);  // the last step's timeline
  EXPECT_EQ(m.running, 2);

  // A step a quarter second after the last event goes out at once.
  now_ = 100.5;
  hub_.Publish(OneStep(1, 0.05, 1));
  EXPECT_EQ(hub_.last_seq(), 3);
}

TEST_F(EngineEventsTest, ManyStepsASecondMakeAtMostFourEventsASecond) {
  const auto client = hub_.Join();
  int64_t events = 0;
  int64_t steps = 0;
  int64_t seen = 0;
  // 10 seconds of a step every 7 ms, a client looking after each step.
  for (int i = 0; i < 1430; ++i) {
    now_ = 100 + i * 0.007;
    hub_.Publish(OneStep(1, 0.007, 1));
    if (auto e = hub_.Next(seen, milliseconds(0))) {
      seen = e->seq;
      ++events;
      steps += e->figures->steps;
    }
  }
  EXPECT_LE(events, 4 * 10 + 1);
  EXPECT_GE(events, 4 * 10 - 1);
  now_ += 1;  // the last merged steps go out too
  if (auto e = hub_.Next(seen, milliseconds(0))) steps += e->figures->steps;
  EXPECT_EQ(steps, 1430);  // none lost, none counted twice
}

TEST_F(EngineEventsTest, TheStepEventCarriesTheContractsFields) {
  StepFigures s = OneStep(3, 0.5, 4);
  s.prefill_tokens = 5;
  s.disk_busy_seconds = 0.25;
  s.layers[0].bytes_first_ms = 1.5;
  const nlohmann::json j = s.ToJson(7, 1234);
  EXPECT_EQ(j["seq"], 7);
  EXPECT_EQ(j["time_ms"], 1234);
  EXPECT_EQ(j["kind"], "mixed");
  EXPECT_EQ(j["tokens"], 8);
  EXPECT_DOUBLE_EQ(j["hit_rate"].get<double>(), 0.75);
  EXPECT_DOUBLE_EQ(j["disk"]["busy_fraction"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(j["disk"]["rate_bytes_per_second"].get<double>(), 200);
  EXPECT_EQ(j["devices"][0]["name"], "d0");
  const nlohmann::json& layer = j["layers"][0];
  EXPECT_EQ(layer["layer"], 4);
  EXPECT_EQ(layer["bytes_first_ms"], 1.5);
  EXPECT_TRUE(layer["bytes_last_ms"].is_null());  // nothing of the kind in the step
  for (const char* key : {"asked", "cached", "read", "prefetched", "compute_start_ms"}) {
    EXPECT_TRUE(layer.contains(key)) << key;
  }
  for (const char* key : {"queue", "prompt_cache", "requests", "stall_seconds", "steps"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
}

TEST_F(EngineEventsTest, AtMostEightClientsListenAtOnce) {
  std::vector<std::shared_ptr<EngineEvents::Client>> clients;
  for (int i = 0; i < EngineEvents::kMaxClients; ++i) {
    clients.push_back(hub_.Join());
    ASSERT_NE(clients.back(), nullptr) << i;
  }
  EXPECT_EQ(hub_.Join(), nullptr);
  clients.pop_back();  // one leaves: another may come
  EXPECT_NE(hub_.Join(), nullptr);
}

TEST_F(EngineEventsTest, ClosingEndsEveryWaitAndTheLastClientDropsWhatWasMerged) {
  {
    const auto client = hub_.Join();
    hub_.Publish(OneStep(1, 0.01, 1));
    hub_.Publish(OneStep(1, 0.01, 1));  // merged, waiting for its time
  }
  EXPECT_FALSE(hub_.has_clients());
  now_ += 10;
  EXPECT_FALSE(hub_.Next(1, milliseconds(0)));  // stale: a new client starts afresh
  hub_.Close();
  EXPECT_TRUE(hub_.closed());
  EXPECT_FALSE(hub_.Next(1, milliseconds(60000)));  // at once
}

class ServiceFiguresTest : public testing::TinyModelSuite {
 protected:
  static std::unique_ptr<Engine> Open() {
    EngineOptions o;
    o.model_dir = ModelDir();
    o.prefill_chunk = 4;
    o.max_context = 48;
    auto engine = Engine::Open(o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }
  static BatchRequest Request(int prompt_tokens, int n) {
    BatchRequest r;
    for (int i = 0; i < prompt_tokens; ++i) r.prompt.push_back(3 + i % 20);
    r.max_tokens = n;
    r.sampler.greedy = true;
    return r;
  }
};

TEST_F(ServiceFiguresTest, AJobReportsEachPromptChunkLayerByLayerAndTheWholePromptFirst) {
  auto engine = Open();
  ASSERT_NE(engine, nullptr);
  GenerationService service(*engine, {.batch = {.batch = 1}, .max_queue = 4});
  auto job = service.Submit(Request(18, 3));
  ASSERT_TRUE(job.ok()) << job.status();
  std::vector<Job::PromptPoint> points;
  size_t ids = 0;
  for (bool done = false; !done;) {
    Job::Progress p = (*job)->Wait(ids, milliseconds(1000), points.size());
    points.insert(points.end(), p.prompt_points.begin(), p.prompt_points.end());
    if (ids == 0 && !p.ids.empty()) {  // the whole prompt is reported by the first token
      ASSERT_FALSE(points.empty());
      EXPECT_EQ(points.back().processed, 18);
    }
    ids += p.ids.size();
    done = p.done;
  }
  EXPECT_EQ(ids, 3u);
  // Admitted (0 cached), then the chunks of 4 (4, 4, 4, 4, 2) after each layer, each count that
  // moved once: the layers of a chunk run count its tokens by their share of the layers.
  std::vector<int64_t> expected = {0};
  const int64_t layers = engine->config().num_layers;
  int64_t start = 0;
  for (const int64_t chunk : {4, 4, 4, 4, 2}) {
    for (int64_t l = 1; l <= layers; ++l) {
      const int64_t at = start + chunk * l / layers;
      if (at > expected.back()) expected.push_back(at);
    }
    start += chunk;
  }
  EXPECT_GT(expected.size(), 6u);  // more than one a chunk
  std::vector<int64_t> processed;
  for (const Job::PromptPoint& p : points) processed.push_back(p.processed);
  EXPECT_EQ(processed, expected);
  for (size_t i = 1; i < points.size(); ++i) EXPECT_GE(points[i].ms, points[i - 1].ms);
}

TEST_F(ServiceFiguresTest, AListeningClientGetsEachMoeLayersExpertsAndTimeline) {
  auto engine = Open();
  ASSERT_NE(engine, nullptr);
  GenerationService service(*engine, {.batch = {.batch = 1}, .max_queue = 4});
  const nlohmann::json& plan = service.events().plan();
  const ModelConfig& config = engine->config();
  EXPECT_EQ(plan["layers"], config.num_layers);
  EXPECT_EQ(plan["experts_per_token"], config.num_experts_per_token);
  ASSERT_FALSE(plan["moe_layers"].empty());
  EXPECT_GT(plan["memory"]["cache_bytes"].get<uint64_t>(), 0u);

  const auto client = service.events().Join();
  auto job = service.Submit(Request(9, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  std::optional<EngineEvents::Event> event = service.events().Next(0, milliseconds(60000));
  ASSERT_TRUE(event);  // the first step goes out at once
  const StepFigures& f = *event->figures;
  EXPECT_GE(f.steps, 1);
  ASSERT_EQ(f.layers.size(), plan["moe_layers"].size());
  uint64_t asked = 0;
  for (size_t i = 0; i < f.layers.size(); ++i) {
    const LayerFigures& l = f.layers[i];
    EXPECT_EQ(l.layer, plan["moe_layers"][i]);
    EXPECT_GE(l.asked, static_cast<uint32_t>(config.num_experts_per_token));
    EXPECT_EQ(l.asked, l.cached + l.read) << l.layer;
    EXPECT_LE(l.prefetched, l.cached);
    EXPECT_GE(l.compute_start_ms, 0);
    EXPECT_GE(l.compute_end_ms, l.compute_start_ms);
    if (l.read > 0) {
      EXPECT_GE(l.bytes_first_ms, 0);
      EXPECT_GE(l.bytes_last_ms, l.bytes_first_ms);
    }
    asked += l.asked;
  }
  // The first step is the prompt's (all 9 tokens in chunks of 4: its first chunk), its
  // experts all demanded through the cache.
  EXPECT_EQ(f.prefill_tokens, 4);
  EXPECT_EQ(f.cache_requests, asked);
  EXPECT_EQ(f.running, 1);
  Job::Progress p;
  while (!(p = (*job)->Wait(0, milliseconds(1000))).done) {
  }
}

}  // namespace
}  // namespace k3::server
