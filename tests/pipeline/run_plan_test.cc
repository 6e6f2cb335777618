// --max-context auto (pipeline/run_plan.h): the longest context whose growing state takes a
// quarter of the budget, or what the budget holds beside the whole model, up to the model's
// limit; the batch sized first so that each sequence gets an agent's context; a number given
// wins; a warning below kAgentContext; monotonic in the budget. --prefill-chunk auto under an
// explicit --trunk-gb/--cache-gb split: a whole prompt's chunk on top of the split.
#include "pipeline/run_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/checkpoint.h"
#include "pipeline/engine.h"
#include "tests/pipeline/engine_run.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::testing::HasSubstr;

double state_of(const ModelFootprint& one, int64_t tokens) {
  return static_cast<double>(one.state_bytes_per_token) * static_cast<double>(tokens);
}

class ContextPlanTest : public ::k3::testing::TinyModelSuite {
 protected:
  ModelFootprint One(int64_t chunk = kSmallPrefillChunk) const {
    auto ckpt = Checkpoint::Open(ModelDir());
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    return MeasureFootprint(**ckpt, 1, chunk);
  }
  // A budget `times` the model's minimum at one token of context.
  static MemoryRequest Ram(const ModelFootprint& one, double times) {
    auto least = PlanMemory(one, {.preset = "ultra"}, 0);
    EXPECT_TRUE(least.ok()) << least.status();
    return {.ram_gb = times * static_cast<double>(least->minimum_bytes) / 1e9};
  }
};

// Where the whole model does not fit (1.5 times the minimum, for the tiny model) the quarter
// binds; above, the budget's rest once the whole model and the prompt chunks' quarter are held.
TEST_F(ContextPlanTest, TheLargestWhoseStateTakesAQuarterOfTheBudget) {
  const ModelFootprint one = One();
  ASSERT_GT(one.state_bytes_per_token, 0u);
  for (int n : {1, 3}) {
    const MemoryRequest ram = Ram(one, 1.5);
    const int64_t got = AutoContext(one, ram, 0, int64_t{1} << 40, n);
    ASSERT_GT(got, 0);
    auto plan = PlanMemory(one.WithContext(got).WithSequences(n), ram, 0);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_LE(plan->planned_bytes(), plan->budget_bytes);
    // The quarter holds `got` tokens a sequence and not one more.
    const double quarter = kAutoContextShare * static_cast<double>(plan->budget_bytes);
    const auto state = [&](int64_t tokens) {
      return static_cast<double>(one.state_bytes_per_token) * static_cast<double>(tokens) * n;
    };
    EXPECT_LE(state(got), quarter) << n;
    EXPECT_GT(state(got + 1), quarter) << n;
    EXPECT_LT(plan->cache_bytes, one.all_experts_bytes);  // not the whole model
  }
  const MemoryRequest roomy = Ram(one, 20);
  const int64_t got = AutoContext(one, roomy, 0, int64_t{1} << 40, 1);
  auto whole = PlanMemory(one.WithContext(got), roomy, 0);
  auto over = PlanMemory(one.WithContext(got + 1), roomy, 0);
  ASSERT_TRUE(whole.ok() && over.ok());
  EXPECT_GT(state_of(one, got), kAutoContextShare * static_cast<double>(whole->budget_bytes));
  EXPECT_LE(whole->everything_bytes, 0.75 * static_cast<double>(whole->budget_bytes));
  EXPECT_GT(over->everything_bytes, 0.75 * static_cast<double>(over->budget_bytes));
}

TEST_F(ContextPlanTest, CappedAtTheModelsLimit) {
  const ModelFootprint one = One();
  const MemoryRequest ram = Ram(one, 3);
  const int64_t free = AutoContext(one, ram, 0, int64_t{1} << 40, 1);
  ASSERT_GT(free, 100);
  EXPECT_EQ(AutoContext(one, ram, 0, free / 2, 1), free / 2);
  const ContextChoice c = ChooseContext(one, ram, 0, free / 2, 1, 1);
  EXPECT_EQ(c.context, free / 2);
  EXPECT_THAT(c.source, HasSubstr("the model's limit"));
}

TEST_F(ContextPlanTest, MonotonicInTheBudget) {
  const ModelFootprint one = One();
  int64_t last = 0;
  for (double times = 1.05; times < 40; times *= 1.3) {
    const int64_t got = AutoContext(one, Ram(one, times), 0, int64_t{1} << 40, 2);
    EXPECT_GE(got, last) << times;
    last = got;
  }
  EXPECT_GT(last, 0);
}

TEST_F(ContextPlanTest, TheBatchIsTheMostThatEachGetAnAgentsContext) {
  const ModelFootprint one = One();
  // A budget whose quarter holds an agent's context for about three sequences.
  auto least = PlanMemory(one, {.preset = "ultra"}, 0);
  ASSERT_TRUE(least.ok());
  const double quarter = 3.5 * kAgentContext * static_cast<double>(one.state_bytes_per_token);
  const MemoryRequest ram{.ram_gb = std::max(4 * quarter, 1.2 * least->minimum_bytes) / 1e9};
  const ContextChoice c = ChooseContext(one, ram, 0, int64_t{1} << 40, 1, 8);
  EXPECT_GE(c.context, kAgentContext);
  EXPECT_EQ(AutoContext(one, ram, 0, int64_t{1} << 40, c.sequences), c.context);
  if (c.sequences < 8) {
    EXPECT_LT(AutoContext(one, ram, 0, int64_t{1} << 40, c.sequences + 1), kAgentContext);
  }
  // A budget that holds an agent's context for none: the fewest asked for.
  const MemoryRequest tight{.ram_gb = 1.05 * static_cast<double>(least->minimum_bytes) / 1e9};
  if (AutoContext(one, tight, 0, int64_t{1} << 40, 2) < kAgentContext) {
    EXPECT_EQ(ChooseContext(one, tight, 0, int64_t{1} << 40, 2, 8).sequences, 2);
  }
  EXPECT_TRUE(c.warning.empty()) << c.warning;
}

TEST_F(ContextPlanTest, BelowAnAgentsContextWarnsAndStillRuns) {
  EngineOptions o = ::k3::testing::OptionsFor(ModelDir());
  o.max_context = kAutoMaxContext;
  const ModelFootprint one = One();
  // A quarter that holds about 2000 tokens.
  auto least = PlanMemory(one, {.preset = "ultra"}, 0);
  ASSERT_TRUE(least.ok());
  const double quarter = 2000.0 * static_cast<double>(one.state_bytes_per_token);
  o.memory = {.ram_gb = std::max(4 * quarter, 1.5 * least->minimum_bytes) / 1e9};
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const int64_t context = (*engine)->max_context();
  ASSERT_LT(context, kAgentContext);
  EXPECT_THAT((*engine)->context_warning(),
              HasSubstr(absl::StrCat("a context of only ", context, " tokens")));
  EXPECT_THAT((*engine)->context_warning(), HasSubstr("--ram-gb"));
  EXPECT_THAT((*engine)->plan().Describe(),
              HasSubstr(absl::StrCat(context, "  tokens a sequence (auto")));
  SequenceState state = (*engine)->NewState();
  std::vector<float> logits;
  EXPECT_TRUE((*engine)->Prefill(::k3::testing::kPrompt, state, logits).ok());
}

TEST_F(ContextPlanTest, ANumberGivenWins) {
  EngineOptions o = ::k3::testing::OptionsFor(ModelDir());
  o.max_context = 77;
  o.memory = Ram(One(), 3);
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->max_context(), 77);
  EXPECT_TRUE((*engine)->context_warning().empty());
  EXPECT_THAT((*engine)->plan().Describe(), HasSubstr("tokens a sequence (--max-context 77)"));
  o.max_context = kAutoMaxContext;
  auto chosen = Engine::Open(o);
  ASSERT_TRUE(chosen.ok()) << chosen.status();
  EXPECT_EQ((*chosen)->max_context(), AutoContext(One(o.prefill_chunk), o.memory, 0, 1048576, 1));
}

TEST_F(ContextPlanTest, ABudgetThatGrowsWithWhatRunsGetsAnAgentsContext) {
  EngineOptions o = ::k3::testing::OptionsFor(ModelDir());
  o.max_context = kAutoMaxContext;
  o.memory = {.preset = "max"};
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->max_context(), kAgentContext);
  EXPECT_TRUE((*engine)->context_warning().empty());
  EXPECT_THAT((*engine)->plan().Describe(), HasSubstr("grows with what runs"));
}

// --preset ultra is for the least memory: auto keeps a chat's context there, and says so.
TEST_F(ContextPlanTest, TheUltraPresetKeepsAChatsContextAndWarns) {
  EngineOptions o = ::k3::testing::OptionsFor(ModelDir());
  o.max_context = kAutoMaxContext;
  o.memory = {.preset = "ultra"};
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->max_context(), kUltraContext);
  EXPECT_THAT((*engine)->context_warning(), HasSubstr("--max-context 32768"));
  EXPECT_THAT((*engine)->plan().Describe(), HasSubstr("(--preset ultra)"));
}

// --prefill-chunk auto under an explicit --trunk-gb/--cache-gb split: the split stays what it
// says, and the chunk's activations come on top of it, taking a quarter of the total they make
// (the chunk --ram-gb of that total plans); the plan's budget grows by them and its text says so.
class SplitPrefillChunkTest : public ::k3::testing::TinyModelSuite {
 protected:
  static constexpr int64_t kContext = 1 << 14;
  void SetUp() override {
    auto c = Checkpoint::Open(ModelDir());
    ASSERT_TRUE(c.ok()) << c.status();
    ckpt_ = *std::move(c);
    small_ = MeasureFootprint(*ckpt_, kContext, kSmallPrefillChunk);
    per_token_ = small_.prefill_bytes_per_token;
    ASSERT_GT(per_token_, 0u);
  }
  RunRequest Request(const MemoryRequest& memory) const {
    RunRequest r;
    r.memory = memory;
    r.max_context = kContext;
    r.prefill_chunk = kAutoPrefillChunk;
    return r;
  }
  // A split whose total before the chunk is `tokens` chunk tokens' activations (its third holds
  // tokens / 3), half of it trunk and half expert cache.
  MemoryRequest Split(int64_t tokens) const {
    auto fixed = PlanMemory(small_, {.trunk_gb = 1, .cache_gb = 1}, 0);
    EXPECT_TRUE(fixed.ok()) << fixed.status();
    const double rest = static_cast<double>(per_token_) * static_cast<double>(tokens);
    const double parts = rest - static_cast<double>(fixed->budget_bytes - 2'000'000'000) +
                         static_cast<double>(per_token_ * kSmallPrefillChunk);
    return {.trunk_gb = parts / 2 / 1e9, .cache_gb = parts / 2 / 1e9};
  }

  std::unique_ptr<Checkpoint> ckpt_;
  ModelFootprint small_;
  uint64_t per_token_ = 0;
};

TEST_F(SplitPrefillChunkTest, AWholePromptsChunkComesOnTopOfTheSplit) {
  const MemoryRequest split = Split(18'000);  // a chunk of about 6,000 tokens
  auto at_small = PlanMemory(small_, split, 0);
  ASSERT_TRUE(at_small.ok()) << at_small.status();
  auto run = PlanRun(*ckpt_, Request(split), 0);
  ASSERT_TRUE(run.ok()) << run.status();
  const MemoryPlan& plan = run->memory;
  const int64_t chunk = plan.prefill_chunk;
  EXPECT_GE(chunk, 2048);  // a 2,048-token prompt in one pass (chunks of 64 before)
  EXPECT_LT(chunk, kContext);
  // The most whose activations take a quarter of the budget they join.
  const auto activations = [&](int64_t tokens) {
    return static_cast<double>(per_token_) * static_cast<double>(tokens);
  };
  const double before = static_cast<double>(at_small->budget_bytes) - activations(64);
  EXPECT_LE(activations(chunk), kAutoPrefillShare * (before + activations(chunk)));
  EXPECT_GT(activations(chunk + 1), kAutoPrefillShare * (before + activations(chunk + 1)));
  // The split stays what it says; the budget grows by the activations.
  EXPECT_EQ(plan.budget_bytes - at_small->budget_bytes,
            per_token_ * static_cast<uint64_t>(chunk - kSmallPrefillChunk));
  EXPECT_EQ(plan.cache_slots, at_small->cache_slots);
  EXPECT_EQ(plan.pinned, at_small->pinned);
  EXPECT_EQ(plan.ring_slots, at_small->ring_slots);
  EXPECT_LE(plan.planned_bytes(), plan.budget_bytes);
  EXPECT_EQ(plan.minimum_bytes, at_small->minimum_bytes);
  const std::string text = plan.Describe();
  EXPECT_THAT(text, HasSubstr(absl::StrCat("prompt chunks of ", chunk,
                                           " tokens: auto, the most whose activations of ")));
  EXPECT_THAT(text, HasSubstr(" take a quarter of the budget; its "));
  EXPECT_THAT(text, HasSubstr(" of activations come on top of the --trunk-gb/--cache-gb split)"));
  // --ram-gb of the same total plans the same chunk (to a token: the GB figure rounds).
  auto ram = PlanRun(*ckpt_, Request({.ram_gb = static_cast<double>(plan.budget_bytes) / 1e9}), 0);
  ASSERT_TRUE(ram.ok()) << ram.status();
  EXPECT_NEAR(static_cast<double>(ram->memory.prefill_chunk), static_cast<double>(chunk), 1);
}

TEST_F(SplitPrefillChunkTest, CappedAtTheContextAndSaysSo) {
  auto run = PlanRun(*ckpt_, Request({.trunk_gb = 1, .cache_gb = 1}), 0);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->memory.prefill_chunk, kContext);
  EXPECT_THAT(run->memory.Describe(),
              HasSubstr(absl::StrCat("auto, capped at --max-context ", kContext, "; its ")));
}

// The RAM available holds the activations beside the rest of the plan: the split is the user's,
// what auto adds on top of it is not.
TEST_F(SplitPrefillChunkTest, NoMoreThanTheRamAvailableHolds) {
  const MemoryRequest split = Split(18'000);
  auto at_small = PlanMemory(small_, split, 0);
  ASSERT_TRUE(at_small.ok()) << at_small.status();
  const uint64_t rest = at_small->budget_bytes - per_token_ * kSmallPrefillChunk;
  const uint64_t available = rest + kProcessOverheadBytes + 1000 * per_token_;
  auto run = PlanRun(*ckpt_, Request(split), available);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->memory.prefill_chunk, 1000);
  EXPECT_THAT(run->memory.Describe(), HasSubstr(" available beside the rest of the plan; its "));
  auto tight = PlanRun(*ckpt_, Request(split), rest);
  ASSERT_TRUE(tight.ok()) << tight.status();
  EXPECT_EQ(tight->memory.prefill_chunk, kSmallPrefillChunk);
  EXPECT_THAT(tight->memory.Describe(), HasSubstr("available hold no more beside the --trunk-gb"));
}

// --preset ultra is for the least memory: the small chunks.
TEST_F(SplitPrefillChunkTest, TheUltraPresetKeepsTheSmallChunks) {
  auto run = PlanRun(*ckpt_, Request({.preset = "ultra"}), 0);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->memory.prefill_chunk, kSmallPrefillChunk);
  EXPECT_THAT(run->memory.Describe(), HasSubstr("the least memory (--preset ultra)"));
}

// The engine runs a 2,048-token prompt under a split whose trunk streams in one pass: the trunk
// read once, as one decode step reads it (chunks of 64 read it 32 times).
TEST_F(SplitPrefillChunkTest, ALongPromptReadsTheStreamedTrunkOnce) {
  EngineOptions o = ::k3::testing::OptionsFor(ModelDir());
  o.prefill_chunk = kAutoPrefillChunk;
  o.max_context = 4096;
  auto least = PlanMemory(small_, {.preset = "ultra"}, 0);
  ASSERT_TRUE(least.ok()) << least.status();
  o.memory = {.trunk_gb = static_cast<double>(least->ring_bytes()) / 1e9 + 1e-6,
              .cache_gb = 2 * Split(18'000).cache_gb};
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_GT((*engine)->plan().streamed_layers(), 0);
  ASSERT_GE((*engine)->prefill_chunk(), 2048);
  std::vector<int32_t> prompt(2048);
  for (size_t t = 0; t < prompt.size(); ++t) prompt[t] = static_cast<int32_t>((t * 37 + 5) % 250);
  SequenceState state = (*engine)->NewState();
  std::vector<float> logits;
  StepMetrics prefill, decode;
  ASSERT_TRUE((*engine)->Prefill(prompt, state, logits, &prefill).ok());
  ASSERT_TRUE((*engine)->Decode(7, state, logits, &decode).ok());
  ASSERT_GT(decode.trunk_bytes, 0u);
  EXPECT_LT(prefill.trunk_bytes, 2 * decode.trunk_bytes);
}

}  // namespace
}  // namespace k3
