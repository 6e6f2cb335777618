// Continuous batching (pipeline/batch_scheduler.h): every sequence's tokens and logits are
// bit-identical to running it alone, for any batch size, order of arrival, prefill share,
// memory budget and engine setting, with sequences joining and leaving mid-run; a step reads
// the trunk once for all of them; the plan refuses a batch it cannot hold, naming the maximum.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "core/synth/synth.h"
#include "pipeline/batch_scheduler.h"
#include "tests/util/pairwise.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

struct Output {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;  // the logits each token was sampled from
  FinishReason finish = FinishReason::kLength;
};

using ::k3::testing::BitIdentical;

class BatchTest : public ::k3::testing::TinyModelSuite {
 protected:
  static EngineOptions Options() {
    EngineOptions o;
    o.model_dir = ModelDir();
    o.prefill_chunk = 4;
    o.max_context = 48;
    return o;
  }

  // The footprint of one sequence with Options(), as the engine measures it.
  static ModelFootprint OneSequence() {
    auto ckpt = Checkpoint::Open(Options().model_dir);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    return ckpt.ok() ? MeasureFootprint(**ckpt, Options().max_context, Options().prefill_chunk)
                     : ModelFootprint();
  }

  // Options whose budget holds two sequences' state and buffers beside the minimum, not three.
  static EngineOptions RoomForTwo(const ModelFootprint& one) {
    auto minimum = PlanMemory(one, {.preset = "ultra"}, 0);
    EXPECT_TRUE(minimum.ok()) << minimum.status();
    const uint64_t per = one.state_bytes_per_sequence + one.buffer_bytes_per_sequence;
    EngineOptions o = Options();
    o.memory.ram_gb = ((minimum.ok() ? minimum->minimum_bytes : 0) + per * 3 / 2) / 1e9;
    return o;
  }

  // Requests of different lengths, limits and samplers; one stops at a stop id (chosen from
  // its own run alone), one at the context, one samples nothing.
  static std::vector<BatchRequest> Requests() {
    std::vector<BatchRequest> r(7);
    const std::vector<std::vector<int32_t>> prompts = {{3, 7, 11, 5, 9, 2, 30, 41, 17},
                                                       {1},
                                                       {8, 8, 8},
                                                       {12, 40, 2, 6, 6, 1, 9, 33, 21, 4, 5},
                                                       {60, 2},
                                                       {5, 4, 3, 2, 1, 0, 7},
                                                       {9, 9}};
    const int max_tokens[] = {6, 9, 4, 3, 12, 0, 60};
    for (size_t i = 0; i < r.size(); ++i) {
      r[i].prompt = prompts[i];
      r[i].max_tokens = max_tokens[i];
      r[i].sampler.greedy = i % 2 == 0;
      r[i].sampler.temperature = 0.9;
      r[i].sampler.seed = 100 + i;
    }
    return r;
  }

  // The reference: one sequence alone, Prefill then Decode, as `k3 generate` runs it.
  static Output Alone(Engine& engine, const BatchRequest& r, int64_t max_context) {
    Output out;
    SequenceState state = engine.NewState();
    Sampler sampler(r.sampler);
    std::vector<float> logits;
    EXPECT_TRUE(engine.Prefill(r.prompt, state, logits).ok());
    const int64_t room = max_context - static_cast<int64_t>(r.prompt.size());
    const int64_t limit = std::min<int64_t>(r.max_tokens, room);
    for (int64_t i = 0; i < limit; ++i) {
      const int32_t id = sampler.Sample(logits);
      out.ids.push_back(id);
      out.logits.push_back(logits);
      if (std::find(r.stop_ids.begin(), r.stop_ids.end(), id) != r.stop_ids.end()) {
        out.finish = FinishReason::kStop;
        return out;
      }
      if (i + 1 == limit) break;
      EXPECT_TRUE(engine.Decode(id, state, logits).ok());
    }
    if (r.max_tokens > room) out.finish = FinishReason::kContext;
    return out;
  }

  // The requests with a stop id from request 0's own run (its third token), and their runs
  // alone on `engine`.
  static std::vector<BatchRequest> RequestsWithStop(Engine& engine, std::vector<Output>& alone) {
    std::vector<BatchRequest> requests = Requests();
    requests[0].stop_ids = {Alone(engine, requests[0], Options().max_context).ids[2]};
    alone.clear();
    for (const BatchRequest& r : requests) alone.push_back(Alone(engine, r, Options().max_context));
    return requests;
  }

  // Runs `requests` (added in `order`) through a scheduler; outputs by request.
  static std::map<size_t, Output> Batched(Engine& engine, const std::vector<BatchRequest>& requests,
                                          const std::vector<size_t>& order,
                                          const BatchOptions& options,
                                          BatchTotals* totals = nullptr) {
    std::map<size_t, size_t> request_of;  // scheduler index -> request
    std::map<size_t, Output> out;
    BatchEvents events;
    events.on_token = [&](size_t index, int32_t, std::span<const float> logits,
                          const StepMetrics&) {
      out[request_of[index]].logits.emplace_back(logits.begin(), logits.end());
    };
    events.on_done = [&](const BatchResult& r) {
      out[request_of[r.index]].ids = r.ids;
      out[request_of[r.index]].finish = r.finish;
    };
    BatchScheduler scheduler(engine, options, std::move(events));
    for (size_t i : order) {
      auto index = scheduler.Add(requests[i]);
      EXPECT_TRUE(index.ok()) << index.status();
      request_of[*index] = i;
    }
    const absl::Status status = scheduler.Run();
    EXPECT_TRUE(status.ok()) << status;
    if (totals != nullptr) *totals = scheduler.totals();
    return out;
  }

  static void ExpectSame(const std::vector<Output>& alone, std::map<size_t, Output>& batched,
                         const std::string& where) {
    ASSERT_EQ(batched.size(), alone.size()) << where;
    for (size_t i = 0; i < alone.size(); ++i) {
      EXPECT_EQ(batched[i].ids, alone[i].ids) << where << " request " << i;
      EXPECT_EQ(batched[i].finish, alone[i].finish) << where << " request " << i;
      ASSERT_EQ(batched[i].logits.size(), alone[i].logits.size()) << where << " request " << i;
      for (size_t t = 0; t < alone[i].logits.size(); ++t) {
        ASSERT_TRUE(BitIdentical(batched[i].logits[t], alone[i].logits[t]))
            << where << " request " << i << " token " << t;
      }
    }
  }
};

TEST_F(BatchTest, EverySequenceMatchesRunningItAloneAtEveryBatchSizeAndOrder) {
  auto engine = Engine::Open(Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<Output> alone;
  const std::vector<BatchRequest> requests = RequestsWithStop(**engine, alone);
  ASSERT_EQ(alone[0].finish, FinishReason::kStop);
  ASSERT_EQ(alone[6].finish, FinishReason::kContext);
  ASSERT_TRUE(alone[5].ids.empty());
  const std::vector<size_t> forward = {0, 1, 2, 3, 4, 5, 6}, shuffled = {3, 0, 6, 2, 5, 1, 4};
  const std::vector<size_t> backward(forward.rbegin(), forward.rend());
  const int batches[] = {1, 2, 3, 8}, shares[] = {1, 5, 64};
  const std::vector<size_t>* orders[] = {&forward, &backward, &shuffled};
  // All 36 settings; a pairwise covering subset of them under a sanitizer (tests/util/pairwise.h).
  for (const ::k3::testing::GridPoint& p : ::k3::testing::TestGrid({4, 3, 3})) {
    const int batch = batches[p[0]], share = shares[p[1]];
    const std::string where =
        absl::StrCat("batch ", batch, " share ", share, " order ", p[2] == 0 ? "forward" : "other");
    auto batched = Batched(**engine, requests, *orders[p[2]],
                           {.batch = batch, .prefill_tokens_per_step = share});
    ExpectSame(alone, batched, where);
  }
}

// The determinism grid's memory settings and engine settings, with a batch of three.
TEST_F(BatchTest, EverySequenceMatchesRunningItAloneAtEveryBudgetAndSetting) {
  std::vector<Output> alone;
  std::vector<BatchRequest> requests;
  {
    EngineOptions o = Options();
    o.memory.preset = "max";
    auto engine = Engine::Open(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    requests = RequestsWithStop(**engine, alone);
  }
  struct Memory {
    MemoryRequest request;
    uint64_t piece_bytes = 0;
    int slots = 0;
  };
  const Memory memories[] = {{{.preset = "ultra"}},
                             {{.preset = "ultra"}, 4096, 2},
                             {{.preset = "laptop"}},
                             {{.preset = "max"}}};
  const std::vector<size_t> order = {2, 0, 1, 6, 4, 3, 5};
  const int thread_counts[] = {1, 2};
  // Overlap with lookahead, and the serial baseline.
  const std::pair<bool, int> overlaps[] = {{true, 2}, {false, 0}};
  // All 16 settings; a pairwise covering subset of them under a sanitizer.
  for (const ::k3::testing::GridPoint& p : ::k3::testing::TestGrid({4, 2, 2})) {
    const Memory& m = memories[p[0]];
    const int threads = thread_counts[p[1]];
    const auto [overlap, distance] = overlaps[p[2]];
    EngineOptions o = Options();
    o.memory = m.request;
    o.ring_piece_bytes = m.piece_bytes;
    o.ring_slots = m.slots;
    o.threads = threads;
    o.overlap = overlap;
    o.prefetch_distance = distance;
    o.sequences = 3;
    const std::string where = absl::StrCat(m.request.preset, " pieces ", m.piece_bytes, " threads ",
                                           threads, " overlap ", overlap, " distance ", distance);
    auto engine = Engine::Open(o);
    ASSERT_TRUE(engine.ok()) << where << ": " << engine.status();
    BatchTotals totals;
    auto batched =
        Batched(**engine, requests, order, {.batch = 3, .prefill_tokens_per_step = 6}, &totals);
    ExpectSame(alone, batched, where);
    EXPECT_EQ(totals.max_live, 3) << where;
    EXPECT_EQ(totals.steps.trunk_pieces_out_of_order, 0u) << where;
  }
}

// Where the trunk streams, four sequences decoding together read it once a step, not four times.
TEST_F(BatchTest, AStepReadsTheTrunkOnceForEverySequence) {
  EngineOptions o = Options();
  o.memory.preset = "ultra";
  o.sequences = 4;
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<BatchRequest> requests(4);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].prompt = {static_cast<int32_t>(i + 1)};
    requests[i].max_tokens = 8;
  }
  BatchTotals together, alone;
  Batched(**engine, requests, {0, 1, 2, 3}, {.batch = 4}, &together);
  Batched(**engine, requests, {0, 1, 2, 3}, {.batch = 1}, &alone);
  EXPECT_EQ(together.step_count, 8);  // a prompt step, then 7 decode steps, all four in each
  EXPECT_EQ(alone.step_count, 32);
  EXPECT_EQ(together.sampled_tokens, alone.sampled_tokens);
  // The embedding rows differ (one per token either way); the matrices are read per step.
  EXPECT_LT(together.steps.trunk_bytes, alone.steps.trunk_bytes * 3 / 10);
  EXPECT_GT(together.steps.trunk_bytes, alone.steps.trunk_bytes / 5);
}

TEST_F(BatchTest, ABatchBeyondTheBudgetIsRefusedNamingTheMaximum) {
  const ModelFootprint one = OneSequence();
  EngineOptions o = RoomForTwo(one);
  EXPECT_EQ(MaxSequences(one, o.memory, 0, 64), 2);
  o.sequences = 2;
  auto fits = Engine::Open(o);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ((*fits)->plan().sequences, 2);
  EXPECT_NE((*fits)->plan().Describe().find("(2 sequences of"), std::string::npos);
  o.sequences = 5;
  auto refused = Engine::Open(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("--batch 5: the budget holds at most 2 sequences"),
            std::string::npos)
      << refused.status();
}

// Without a count the engine plans what the budget holds (up to max_sequences) with the
// footprint it runs with, and says both; a least count beyond it is refused naming the most.
TEST_F(BatchTest, TheEnginePlansAsManySequencesAsTheBudgetHolds) {
  EngineOptions o = RoomForTwo(OneSequence());
  o.sequences = 0;
  for (int cap : {1, 8}) {
    o.max_sequences = cap;
    auto engine = Engine::Open(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    EXPECT_EQ((*engine)->sequences(), std::min(cap, 2));
    EXPECT_EQ((*engine)->plan().sequences, std::min(cap, 2));
    EXPECT_EQ((*engine)->sequences_budget_holds(), 2);
  }
  o.min_sequences = 3;
  o.sequences_source = "--saved-states 2 beside a batch of 1";
  auto refused = Engine::Open(o);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find(
                "--saved-states 2 beside a batch of 1: the budget holds at most 2 sequences"),
            std::string::npos)
      << refused.status();
  // "ultra" is the minimum of whatever runs: it holds any number, counted up to the cap.
  o.memory = {.preset = "ultra"};
  o.min_sequences = 1;
  auto ultra = Engine::Open(o);
  ASSERT_TRUE(ultra.ok()) << ultra.status();
  EXPECT_EQ((*ultra)->sequences(), 8);
  EXPECT_EQ((*ultra)->sequences_budget_holds(), kMaxSequences);
}

// Interrupted between steps: the live sequences end as interrupted with what they had (a
// prefix of their run alone); the waiting ones are not reported.
TEST_F(BatchTest, AStopBetweenStepsReportsTheLiveSequencesWithWhatTheyHave) {
  auto engine = Engine::Open(Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<Output> alone;
  const std::vector<BatchRequest> requests = RequestsWithStop(**engine, alone);
  int polls = 0;
  std::vector<BatchResult> done;
  BatchScheduler scheduler(**engine, {.batch = 2},
                           {.on_done = [&](const BatchResult& r) { done.push_back(r); },
                            .stop = [&] { return ++polls > 4; }});
  for (const BatchRequest& r : requests) ASSERT_TRUE(scheduler.Add(r).ok());
  ASSERT_TRUE(scheduler.Run().ok());
  ASSERT_FALSE(done.empty());
  EXPECT_LT(done.size(), requests.size());
  EXPECT_EQ(done.back().finish, FinishReason::kInterrupted);
  for (const BatchResult& r : done) {
    const auto& full = alone[r.index].ids;
    ASSERT_LE(r.ids.size(), full.size());
    EXPECT_TRUE(std::equal(r.ids.begin(), r.ids.end(), full.begin())) << "request " << r.index;
  }
}

TEST_F(BatchTest, RequestsThatCannotRunAreRefusedWhenAdded) {
  EngineOptions o = Options();
  o.max_context = 8;
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  BatchScheduler scheduler(**engine, {.batch = 2}, {});
  EXPECT_FALSE(scheduler.Add({}).ok());
  BatchRequest too_long;
  too_long.prompt.assign(8, 1);
  EXPECT_FALSE(scheduler.Add(too_long).ok());
  BatchRequest bad_sampler;
  bad_sampler.prompt = {1};
  bad_sampler.sampler.greedy = false;
  bad_sampler.sampler.top_p = 2;
  EXPECT_FALSE(scheduler.Add(bad_sampler).ok());
}

// Prefix reuse (k3 serve): a request that resumes the state kept after an earlier prompt, or at
// an earlier sequence's end, runs only the tokens after it, with the ids and logits of running
// everything from scratch.
TEST_F(BatchTest, AResumedStateGivesTheTokensAndLogitsOfTheWholePrompt) {
  auto engine = Engine::Open(Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  BatchRequest first = Requests()[0];
  first.keep_prompt_state = first.keep_final_state = true;
  std::optional<SequenceState> after_prompt, at_end;
  std::vector<int32_t> first_ids;
  BatchEvents events;
  events.on_prompt_state = [&](size_t, const SequenceState& s) { after_prompt = s; };
  events.on_done = [&](BatchResult& r) {
    first_ids = r.ids;
    at_end = std::move(r.state);
  };
  BatchScheduler scheduler(**engine, {.batch = 2}, std::move(events));
  ASSERT_TRUE(scheduler.Add(first).ok());
  ASSERT_TRUE(scheduler.Run().ok());
  ASSERT_TRUE(after_prompt && at_end);
  EXPECT_EQ(after_prompt->tokens(), first.prompt);
  // The final state holds every token but the last sampled one, which was never decoded.
  std::vector<int32_t> ran = first.prompt;
  ran.insert(ran.end(), first_ids.begin(), first_ids.end() - 1);
  EXPECT_EQ(at_end->tokens(), ran);

  for (const SequenceState* saved : {&*after_prompt, &*at_end}) {
    BatchRequest whole = Requests()[1];
    whole.prompt = saved->tokens();
    for (int32_t id : {first_ids.back(), 21, 22, 23, 24, 25}) whole.prompt.push_back(id);
    BatchRequest resumed = whole;
    resumed.resume = *saved;
    resumed.prompt.erase(resumed.prompt.begin(), resumed.prompt.begin() + saved->position());
    const Output alone = Alone(**engine, whole, Options().max_context);
    std::map<size_t, Output> batched =
        Batched(**engine, {resumed}, {0}, {.batch = 2, .prefill_tokens_per_step = 3});
    ExpectSame({alone}, batched, absl::StrCat("resumed after ", saved->position(), " tokens"));
  }
}

// Snapshots inside a prompt (a prompt cache's): the state at each asked position, cut there
// without changing a bit, and the same prompt resumed from the one a token short of its end.
TEST_F(BatchTest, SnapshotsInsideAPromptHoldItsPrefixesAndChangeNoBit) {
  auto engine = Engine::Open(Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  BatchRequest first = Requests()[0];  // 9 prompt tokens
  first.snapshot_at = {8, 3};
  const Output alone = Alone(**engine, Requests()[0], Options().max_context);
  std::map<int64_t, SequenceState> snapshots;
  std::map<size_t, Output> batched;
  {
    BatchEvents events;
    events.on_prompt_state = [&](size_t, const SequenceState& s) {
      snapshots.emplace(s.position(), s);
    };
    events.on_token = [&](size_t i, int32_t id, std::span<const float> logits, const StepMetrics&) {
      batched[i].ids.push_back(id);
      batched[i].logits.emplace_back(logits.begin(), logits.end());
    };
    events.on_done = [&](BatchResult& r) { batched[r.index].finish = r.finish; };
    BatchScheduler scheduler(**engine, {.batch = 2}, std::move(events));
    ASSERT_TRUE(scheduler.Add(Requests()[3]).ok());
    ASSERT_TRUE(scheduler.Add(first).ok());
    ASSERT_TRUE(scheduler.Run().ok());
  }
  ASSERT_EQ(snapshots.size(), 2u);
  for (const auto& [at, state] : snapshots) {
    EXPECT_EQ(state.tokens(),
              std::vector<int32_t>(first.prompt.begin(), first.prompt.begin() + at));
  }
  ExpectSame({Alone(**engine, Requests()[3], Options().max_context), alone}, batched,
             "snapshots at 3 and 8");
  BatchRequest again = Requests()[0];
  again.resume = snapshots.at(8);
  again.prompt.erase(again.prompt.begin(), again.prompt.begin() + 8);
  std::map<size_t, Output> resumed = Batched(**engine, {again}, {0}, {.batch = 1});
  ExpectSame({alone}, resumed, "resumed a token short of the prompt's end");
}

TEST_F(BatchTest, ACancelledRequestEndsAtTheNextStepAndTheOthersAreUnchanged) {
  auto engine = Engine::Open(Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<Output> alone;
  const std::vector<BatchRequest> requests = RequestsWithStop(**engine, alone);
  std::map<size_t, BatchResult> done;
  std::map<size_t, Output> out;
  BatchEvents events;
  events.on_token = [&](size_t i, int32_t, std::span<const float> logits, const StepMetrics&) {
    out[i].logits.emplace_back(logits.begin(), logits.end());
  };
  events.on_done = [&](BatchResult& r) { done[r.index] = r; };
  BatchScheduler scheduler(**engine, {.batch = 2}, std::move(events));
  for (const BatchRequest& r : requests) ASSERT_TRUE(scheduler.Add(r).ok());
  // Request 1 is live from the first step (batch 2); request 4 is still waiting then.
  for (int step = 0; step < 3; ++step) ASSERT_TRUE(scheduler.RunStep().ok());
  scheduler.Cancel(1);
  scheduler.Cancel(4);
  EXPECT_EQ(scheduler.live(), 2u);
  for (;;) {
    auto ran = scheduler.RunStep();
    ASSERT_TRUE(ran.ok()) << ran.status();
    if (!*ran) break;
  }
  ASSERT_EQ(done.size(), requests.size());
  EXPECT_EQ(done[1].finish, FinishReason::kInterrupted);
  EXPECT_LT(done[1].ids.size(), alone[1].ids.size());
  EXPECT_EQ(done[4].finish, FinishReason::kInterrupted);
  EXPECT_TRUE(done[4].ids.empty());
  for (size_t i : {0, 2, 3, 5, 6}) {
    out[i].ids = done[i].ids;
    out[i].finish = done[i].finish;
    EXPECT_EQ(out[i].ids, alone[i].ids) << i;
    EXPECT_EQ(out[i].finish, alone[i].finish) << i;
  }
}

// `k3 generate`, `k3 chat` and `k3 bench` run one sequence through RunSequence (a batch of
// one): its tokens and logits are those of Prefill then Decode, the prompt's logits come to
// on_prompt_end (also when nothing is sampled), and each token's figures are the steps since
// the one before (the whole prompt's for the first token).
TEST_F(BatchTest, ASequenceRunAloneThroughTheSchedulerMatchesPrefillThenDecode) {
  auto engine = Engine::Open(Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  std::vector<Output> alone;
  const std::vector<BatchRequest> requests = RequestsWithStop(**engine, alone);
  for (size_t i = 0; i < requests.size(); ++i) {
    const BatchRequest& r = requests[i];
    SequenceState state = (*engine)->NewState();
    std::vector<float> prompt_logits;
    ASSERT_TRUE((*engine)->Prefill(r.prompt, state, prompt_logits).ok());
    Output run;
    std::vector<float> seen_prompt_logits;
    std::vector<int64_t> step_tokens;
    BatchEvents events;
    events.on_prompt_end = [&](size_t, std::span<const float> logits, const StepMetrics& prompt) {
      seen_prompt_logits.assign(logits.begin(), logits.end());
      EXPECT_EQ(prompt.tokens, static_cast<int64_t>(r.prompt.size()));
    };
    events.on_token = [&](size_t, int32_t, std::span<const float> logits,
                          const StepMetrics& steps) {
      run.logits.emplace_back(logits.begin(), logits.end());
      step_tokens.push_back(steps.tokens);
    };
    auto result = RunSequence(**engine, r, events);
    ASSERT_TRUE(result.ok()) << result.status();
    run.ids = result->ids;
    run.finish = result->finish;
    std::map<size_t, Output> one = {{0, run}};
    ExpectSame({alone[i]}, one, absl::StrCat("request ", i));
    EXPECT_TRUE(BitIdentical(seen_prompt_logits, prompt_logits)) << "request " << i;
    for (size_t t = 0; t < step_tokens.size(); ++t) {
      EXPECT_EQ(step_tokens[t], t == 0 ? static_cast<int64_t>(r.prompt.size()) : 1)
          << "request " << i << " token " << t;
    }
  }
}

TEST_F(BatchTest, ASequenceRunAloneStopsAsInterruptedWhenAskedBetweenSteps) {
  auto engine = Engine::Open(Options());
  ASSERT_TRUE(engine.ok()) << engine.status();
  BatchRequest r = Requests()[0];
  r.keep_final_state = true;
  int tokens = 0;
  BatchEvents events;
  events.on_token = [&](size_t, int32_t, std::span<const float>, const StepMetrics&) { ++tokens; };
  events.stop = [&] { return tokens == 2; };
  auto result = RunSequence(**engine, r, events);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->finish, FinishReason::kInterrupted);
  EXPECT_EQ(result->ids.size(), 2u);
  ASSERT_TRUE(result->state.has_value());
  // The last sampled token is not run: the state holds the prompt and the first token.
  EXPECT_EQ(result->state->position(), static_cast<int64_t>(r.prompt.size()) + 1);
}

}  // namespace
}  // namespace k3
