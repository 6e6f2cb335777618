// A prompt's progress while its chunk runs (BatchEvents::on_prompt_progress): a report after
// every layer, the chunk counted by the share of the layers done, rising, the whole prompt by
// the first token; and hearing it changes no bit of any token or logit.
#include <gtest/gtest.h>

#include <map>

#include "pipeline/batch_scheduler.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::BitIdentical;

struct Report {
  size_t index = 0;
  size_t run = 0;
  double seconds = 0;
  size_t tokens_before = 0;  // of the request, sampled when the report came
};

class PromptProgressTest : public ::k3::testing::TinyModelSuite {
 protected:
  static std::unique_ptr<Engine> Open(int prefill_chunk) {
    EngineOptions o;
    o.model_dir = ModelDir();
    o.prefill_chunk = prefill_chunk;
    o.max_context = 48;
    o.sequences = 2;
    auto engine = Engine::Open(o);
    EXPECT_TRUE(engine.ok()) << engine.status();
    return engine.ok() ? *std::move(engine) : nullptr;
  }

  static BatchRequest Request(size_t prompt_tokens, int32_t max_tokens) {
    BatchRequest r;
    for (size_t i = 0; i < prompt_tokens; ++i) r.prompt.push_back(static_cast<int32_t>(3 + i % 29));
    r.max_tokens = max_tokens;
    r.sampler.greedy = true;
    return r;
  }

  // Runs `requests` in a batch of two, hearing the progress when `listen`: the reports in
  // order, and every token's logits by request.
  static std::vector<Report> Run(Engine& engine, const std::vector<BatchRequest>& requests,
                                 bool listen, std::map<size_t, std::vector<float>>* logits) {
    std::vector<Report> reports;
    std::map<size_t, size_t> tokens;
    BatchEvents events;
    events.on_token = [&](size_t index, int32_t, std::span<const float> l, const StepMetrics&) {
      ++tokens[index];
      std::vector<float>& all = (*logits)[index];
      all.insert(all.end(), l.begin(), l.end());
    };
    if (listen) {
      events.on_prompt_progress = [&](size_t index, size_t run, double seconds) {
        reports.push_back({index, run, seconds, tokens[index]});
      };
    }
    BatchScheduler scheduler(engine, {.batch = 2}, std::move(events));
    for (const BatchRequest& r : requests) EXPECT_TRUE(scheduler.Add(r).ok());
    EXPECT_TRUE(scheduler.Run().ok());
    return reports;
  }

  // The reports of request `index`.
  static std::vector<Report> Of(const std::vector<Report>& reports, size_t index) {
    std::vector<Report> out;
    for (const Report& r : reports) {
      if (r.index == index) out.push_back(r);
    }
    return out;
  }
};

TEST_F(PromptProgressTest, APromptInOneChunkIsReportedAfterEveryLayerBeforeItsFirstToken) {
  const std::unique_ptr<Engine> engine = Open(32);
  ASSERT_NE(engine, nullptr);
  const auto layers = static_cast<size_t>(engine->config().num_layers);
  ASSERT_GT(layers, 1u);
  const size_t prompt = 20;  // one chunk
  std::map<size_t, std::vector<float>> logits;
  const std::vector<Report> reports = Run(*engine, {Request(prompt, 3)}, true, &logits);
  ASSERT_EQ(reports.size(), layers);
  for (size_t l = 0; l < layers; ++l) {
    EXPECT_EQ(reports[l].run, prompt * (l + 1) / layers) << "after layer " << l;
    EXPECT_EQ(reports[l].tokens_before, 0u) << "after layer " << l;
    if (l > 0) {
      EXPECT_GE(reports[l].run, reports[l - 1].run);
      EXPECT_GE(reports[l].seconds, reports[l - 1].seconds);
    }
  }
  EXPECT_EQ(reports.back().run, prompt);
}

// Chunks of 4 prompt tokens a step, two prompts sharing them (the earlier one first): each
// chunk of each prompt reports after every layer, from where the chunk before left off.
TEST_F(PromptProgressTest, EachChunkOfEachPromptIsReportedLayerByLayerFromItsStart) {
  const std::unique_ptr<Engine> engine = Open(4);
  ASSERT_NE(engine, nullptr);
  const auto layers = static_cast<size_t>(engine->config().num_layers);
  const std::vector<BatchRequest> requests = {Request(10, 2), Request(7, 2)};
  // Steps of 4: [4 | 0], [4 | 0], [2 | 2], [decode | 4], [decode | 1].
  const std::vector<std::vector<size_t>> chunks = {{4, 4, 2}, {2, 4, 1}};
  std::map<size_t, std::vector<float>> logits;
  const std::vector<Report> reports = Run(*engine, requests, true, &logits);
  for (size_t i = 0; i < requests.size(); ++i) {
    std::vector<size_t> expected;
    size_t start = 0;
    for (const size_t chunk : chunks[i]) {
      for (size_t l = 1; l <= layers; ++l) expected.push_back(start + chunk * l / layers);
      start += chunk;
    }
    ASSERT_EQ(start, requests[i].prompt.size());
    std::vector<size_t> got;
    for (const Report& r : Of(reports, i)) {
      got.push_back(r.run);
      EXPECT_EQ(r.tokens_before, 0u) << "request " << i;
    }
    EXPECT_EQ(got, expected) << "request " << i;
  }
}

// Progress is observation only: every token's logits are those of a run that does not listen.
TEST_F(PromptProgressTest, ListeningChangesNoBit) {
  const std::unique_ptr<Engine> engine = Open(4);
  ASSERT_NE(engine, nullptr);
  const std::vector<BatchRequest> requests = {Request(10, 4), Request(3, 5), Request(13, 3)};
  std::map<size_t, std::vector<float>> heard, silent;
  EXPECT_FALSE(Run(*engine, requests, true, &heard).empty());
  EXPECT_TRUE(Run(*engine, requests, false, &silent).empty());
  ASSERT_EQ(heard.size(), requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    EXPECT_TRUE(BitIdentical(heard[i], silent[i])) << "request " << i;
  }
}

}  // namespace
}  // namespace k3
