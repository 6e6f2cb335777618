// --max-context auto (pipeline/run_plan.h): the longest context whose growing state takes a
// quarter of the budget, or what the budget holds beside the whole model, up to the model's
// limit; the batch sized first so that each sequence gets an agent's context; a number given
// wins; a warning below kAgentContext; monotonic in the budget.
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

}  // namespace
}  // namespace k3
