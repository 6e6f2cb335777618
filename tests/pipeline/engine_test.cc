// The streaming engine against the plain synchronous model: identical tokens and bit-identical
// logits at every memory budget, queue depth, lookahead distance, thread count and overlap
// setting (DESIGN.md invariant 1); prefill reads each needed expert once per chunk; faults are
// retried to the same answer or surface as errors naming file and offset (invariant 2).
#include "pipeline/engine.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <tbb/global_control.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/trunk_pack.h"
#include "core/model/model.h"
#include "core/model/step_scratch.h"
#include "core/synth/synth.h"
#include "tests/pipeline/engine_run.h"
#include "tests/util/pairwise.h"
#include "tests/util/permute_experts.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

using ::k3::testing::Argmax;
using ::k3::testing::Baseline;
using ::k3::testing::CountingProvider;
using ::k3::testing::GridMemory;
using ::k3::testing::kDecodeSteps;
using ::k3::testing::kPrefillChunk;
using ::k3::testing::kPrompt;
using ::k3::testing::MemorySetting;
using ::k3::testing::OptionsFor;
using ::k3::testing::PackCompressed;
using ::k3::testing::Stream;
using ::k3::testing::StreamRun;

using ::k3::testing::BitIdentical;

class EngineTest : public ::k3::testing::TinyModelSuite {
 protected:
  EngineOptions Options() const { return OptionsFor(ModelDir()); }

  // The prompt's prefill with every expert cacheable (preset max) and the given lookahead
  // distances; the engine stays open for the caller's questions.
  void PrefillWithLookahead(int decode_distance, int prefill_distance,
                            std::unique_ptr<Engine>* engine, StepMetrics* m) const {
    EngineOptions o = Options();
    o.memory.preset = "max";
    o.prefetch_distance = decode_distance;
    o.prefill_prefetch_distance = prefill_distance;
    auto opened = Engine::Open(o);
    ASSERT_TRUE(opened.ok()) << opened.status();
    *engine = *std::move(opened);
    SequenceState state = (*engine)->NewState();
    std::vector<float> logits;
    ASSERT_TRUE((*engine)->Prefill(kPrompt, state, logits, m).ok());
  }
};

// The grid of DESIGN.md invariant 1: memory settings (above) x queue depth {1, 8, 32} x
// distance {0, 1, 3} (for decode and prefill, with the prompt chunk {1, 4, auto}) x threads
// {1, 2} x overlap on/off, 216 settings.
// A sanitizer build runs a pairwise covering subset (tests/util/pairwise.h; K3_FULL_GRID=1 runs
// all): every value of each dimension with every value of every other at least once.
constexpr int kGridQueueDepths[] = {1, 8, 32};
constexpr int kGridDistances[] = {0, 1, 3};
// The prompt's chunks go with the distance: token at a time, chunks of 4 of the 9 prompt tokens
// and auto (the whole prompt in one chunk), so that each meets every other dimension's values.
constexpr int kGridChunks[] = {1, kPrefillChunk, kAutoPrefillChunk};
constexpr int kGridThreads[] = {1, 2};
constexpr bool kGridOverlap[] = {true, false};
const std::vector<int> kGridSizes = {6, 3, 3, 2, 2};  // the memory settings first

// Runs the grid's settings on `dir`: the tokens and every logit those of the synchronous model.
void ExpectGridBitIdentical(const std::string& dir, const EngineOptions& base_options) {
  const StreamRun base = Baseline(dir);
  TempDir pack;
  ASSERT_NO_FATAL_FAILURE(PackCompressed(dir, pack.path()));
  const std::vector<MemorySetting> memories = GridMemory(dir);
  ASSERT_EQ(memories.size(), static_cast<size_t>(kGridSizes[0]));
  const std::vector<::k3::testing::GridPoint> grid = ::k3::testing::TestGrid(kGridSizes);
  for (const ::k3::testing::GridPoint& p : grid) {
    const MemorySetting& memory = memories[p[0]];
    EngineOptions o = base_options;
    o.model_dir = dir;
    o.memory = memory.memory;
    o.ring_piece_bytes = memory.piece_bytes;
    o.ring_slots = memory.ring_slots;
    if (memory.compressed) o.trunk_dir = pack.path();
    o.queue_depth = kGridQueueDepths[p[1]];
    o.prefetch_distance = kGridDistances[p[2]];
    o.prefill_prefetch_distance = kGridDistances[p[2]];
    o.prefill_chunk = kGridChunks[p[2]];
    o.threads = kGridThreads[p[3]];
    o.overlap = kGridOverlap[p[4]];
    const std::string where = absl::StrCat(
        "memory ", memory.name, " qd ", o.queue_depth, " distance ", o.prefetch_distance, " chunk ",
        o.prefill_chunk, " threads ", o.threads, " overlap ", o.overlap);
    auto run = Stream(o);
    ASSERT_TRUE(run.ok()) << where << ": " << run.status();
    ASSERT_EQ(run->ids, base.ids) << where;
    for (size_t i = 0; i < base.logits.size(); ++i) {
      ASSERT_TRUE(BitIdentical(run->logits[i], base.logits[i])) << where << " step " << i;
    }
    // The products ask for pieces in the order the ring reads them.
    ASSERT_EQ(run->prefill.trunk_pieces_out_of_order + run->decode.trunk_pieces_out_of_order, 0u)
        << where;
  }
  std::cout << "determinism grid: " << grid.size() << " of 216 settings\n";
}

// The subset a sanitizer build runs covers every pair of values of any two dimensions, and the
// full grid is every one of the 216 settings once.
TEST(DeterminismGridTest, ThePairwiseSubsetCoversEveryPairAndTheFullGridEverySetting) {
  const auto full = ::k3::testing::FullGrid(kGridSizes);
  EXPECT_EQ(std::set<::k3::testing::GridPoint>(full.begin(), full.end()).size(), 216u);
  std::set<std::tuple<int, int, int, int>> all, covered;
  for (const auto& p : full) {
    for (const auto& pair : ::k3::testing::PairsOf(p)) all.insert(pair);
  }
  const auto pairwise = ::k3::testing::PairwiseGrid(kGridSizes);
  for (const auto& p : pairwise) {
    for (const auto& pair : ::k3::testing::PairsOf(p)) covered.insert(pair);
  }
  EXPECT_EQ(covered, all);
  EXPECT_LE(pairwise.size(), 24u);  // near 6 x 3 = 18, the least any covering set can have
}

TEST_F(EngineTest, DeterminismGridTokensAndLogitsBitIdentical) {
  ExpectGridBitIdentical(ModelDir(), Options());
}

// The same grid on the demo model (a few minutes): run with K3_DEMO_GRID=1, outside CI.
TEST_F(EngineTest, DeterminismGridOnTheDemoModel) {
  if (std::getenv("K3_DEMO_GRID") == nullptr) GTEST_SKIP() << "set K3_DEMO_GRID=1 to run";
  SynthOptions opt;
  opt.preset = "demo";
  opt.out_dir = dir_->path() + "/demo";
  opt.router_skew = 1.0;
  ASSERT_TRUE(Synthesize(opt).ok());
  ExpectGridBitIdentical(opt.out_dir, Options());
}

// --prefill-chunk auto: the most tokens whose activations take a quarter of the budget, at most
// --max-context, held by the plan's buffers and said in its text; a number given wins.
TEST_F(EngineTest, AutoPrefillChunkIsTheMostAQuarterOfTheBudgetHolds) {
  EngineOptions o = Options();
  o.prefill_chunk = kAutoPrefillChunk;
  o.max_context = 1 << 14;
  auto ckpt = Checkpoint::Open(ModelDir());
  ASSERT_TRUE(ckpt.ok());
  const ModelFootprint small = MeasureFootprint(**ckpt, o.max_context, kPrefillChunk);
  const uint64_t per_token = small.prefill_bytes_per_token;
  ASSERT_GT(per_token, 0u);
  auto max = PlanMemory(small, {.preset = "max"}, 0);
  ASSERT_TRUE(max.ok()) << max.status();
  for (double share : {3.0, 6.0}) {
    o.memory = {.ram_gb = share * max->budget_bytes / 1e9};
    auto engine = Engine::Open(o);
    ASSERT_TRUE(engine.ok()) << engine.status();
    const MemoryPlan& plan = (*engine)->plan();
    const int64_t want =
        std::min<int64_t>(o.max_context, static_cast<int64_t>(plan.budget_bytes / 4 / per_token));
    ASSERT_GT(want, kSmallPrefillChunk);
    EXPECT_EQ((*engine)->prefill_chunk(), want) << o.memory.ram_gb << " GB";
    EXPECT_GE(plan.buffer_bytes, per_token * want);
    EXPECT_LE(plan.planned_bytes(), plan.budget_bytes);
    EXPECT_THAT(plan.Describe(),
                HasSubstr(absl::StrCat("prompt chunks of ", want, " tokens: auto")));
  }
  o.max_context = 64;
  auto capped = Engine::Open(o);
  ASSERT_TRUE(capped.ok()) << capped.status();
  EXPECT_EQ((*capped)->prefill_chunk(), 64);
  o.prefill_chunk = 7;
  auto given = Engine::Open(o);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ((*given)->prefill_chunk(), 7);
  EXPECT_THAT((*given)->plan().Describe(), HasSubstr("--prefill-chunk 7"));
}

// A chunk's token is planned as the forward pass's step scratch (StepScratch::Bytes, which
// tests/model/step_scratch_test.cc checks against what the scratch allocates) and one streamed
// piece's products: at `tiny`'s shapes every matrix is one piece, the most rows (lm_head apart)
// 128 (MLA's q_b, 4 heads of 32; the fused shared experts' gate and up, 2 of 64).
TEST_F(EngineTest, AChunkTokenIsPlannedAsTheStepScratchAndOnePiecesProducts) {
  auto ckpt = Checkpoint::Open(ModelDir());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const ModelFootprint small = MeasureFootprint(**ckpt, 64, 4),
                       large = MeasureFootprint(**ckpt, 64, 12);
  EXPECT_EQ(small.prefill_bytes_per_token, StepScratch::BytesPerToken((*ckpt)->config()) + 4 * 128);
  EXPECT_EQ(large.buffer_bytes - small.buffer_bytes, 8 * small.prefill_bytes_per_token);
}

TEST_F(EngineTest, MinimumBudgetStreamsTheTrunkAndTheExperts) {
  EngineOptions o = Options();
  o.memory.preset = "ultra";
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  const MemoryPlan& plan = (*engine)->plan();
  EXPECT_EQ(plan.streamed_layers(), (*engine)->config().num_layers);
  EXPECT_FALSE(plan.embedding_resident);
  EXPECT_FALSE(plan.lm_head_resident);
  EXPECT_FALSE(plan.routers_resident);
  EXPECT_EQ(plan.cache_slots, (*engine)->config().num_experts_per_token);
  auto run = Stream(o);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_GT(run->decode.trunk_bytes, 0u);
  EXPECT_GT(run->decode.expert_demand_bytes, 0u);
}

// The floor's parts, each against the whole model resident: the embedding read row by row, the
// routers and lm_head streamed with the layers, every matrix in pieces of a few rows through a
// ring of two slots; the tokens and every logit are the resident run's.
TEST_F(EngineTest, TheFloorGivesTheResidentBits) {
  const StreamRun base = Baseline(ModelDir());
  EngineOptions o = Options();
  o.memory.preset = "ultra";
  o.ring_piece_bytes = 4096;
  o.ring_slots = 2;
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  EXPECT_EQ((*engine)->plan().ring_slots, 2);
  EXPECT_EQ((*engine)->plan().piece_bytes, 4096u);
  // A ring of two 4 KiB pieces (plus alignment) is far smaller than one layer.
  EXPECT_LT((*engine)->plan().ring_slots * (*engine)->plan().ring_slot_bytes,
            MeasureFootprint((*engine)->checkpoint(), 64, kPrefillChunk).layer_bytes[0]);
  engine->reset();
  auto run = Stream(o);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->ids, base.ids);
  for (size_t i = 0; i < base.logits.size(); ++i) {
    EXPECT_TRUE(BitIdentical(run->logits[i], base.logits[i])) << "step " << i;
  }
  EXPECT_EQ(run->decode.trunk_pieces_out_of_order, 0u);
}

// Between the minimum and everything: the routers are resident before any layer is pinned, and
// each layer is pinned whole or streamed whole.
TEST_F(EngineTest, RoutersComeBeforeTheLayers) {
  auto ckpt = Checkpoint::Open(ModelDir());
  ASSERT_TRUE(ckpt.ok());
  const ModelFootprint f = MeasureFootprint(**ckpt, 64, kPrefillChunk);
  auto floor = PlanMemory(f, {.preset = "ultra"}, 0);
  ASSERT_TRUE(floor.ok());
  const double just_routers = (floor->budget_bytes + f.all_router_bytes()) / 1e9;
  auto plan = PlanMemory(f, {.ram_gb = just_routers + 1e-6}, 0);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->routers_resident);
  EXPECT_EQ(plan->streamed_layers(), (*ckpt)->config().num_layers);
  EXPECT_LE(plan->planned_bytes(), plan->budget_bytes);
  auto max = PlanMemory(f, {.preset = "max"}, 0);
  ASSERT_TRUE(max.ok());
  EXPECT_TRUE(max->embedding_resident && max->lm_head_resident && max->routers_resident);
  EXPECT_EQ(max->ring_slots, 0);
  EXPECT_EQ(max->streamed_layers(), 0);
}

TEST_F(EngineTest, PrefillReadsEachNeededExpertOncePerChunk) {
  uint64_t union_sizes = 0;
  Baseline(ModelDir(), &union_sizes);
  EngineOptions o = Options();
  o.memory.preset = "max";
  o.prefetch_distance = 0;
  o.prefill_prefetch_distance = 0;
  auto run = Stream(o);
  ASSERT_TRUE(run.ok()) << run.status();
  // Cold cache: every expert of every chunk's union is demanded once; nothing twice.
  EXPECT_EQ(run->prefill.cache_requests, union_sizes);
  EXPECT_LE(run->prefill.experts_demand_read, union_sizes);
  EXPECT_EQ(run->prefill.experts_demand_read + run->prefill.cache_hits, union_sizes);
}

// With lookahead in the prompt (the default), the next layer's experts are read during this
// layer's compute: still each needed expert once, now mostly by prefetch.
TEST_F(EngineTest, PrefillLookaheadReadsEachNeededExpertOnce) {
  uint64_t union_sizes = 0;
  Baseline(ModelDir(), &union_sizes);
  std::unique_ptr<Engine> engine;
  StepMetrics m;
  ASSERT_NO_FATAL_FAILURE(PrefillWithLookahead(0, 1, &engine, &m));
  const uint64_t expert = engine->config().expert_bytes();
  EXPECT_EQ(m.cache_requests, union_sizes);
  EXPECT_GT(m.prefetch_predicted, 0u);
  EXPECT_GT(m.expert_prefetch_used_bytes, 0u);
  // Needed experts read once: by demand, or by a prefetch that a demand then used.
  EXPECT_LE(m.experts_demand_read + m.expert_prefetch_used_bytes / expert, union_sizes);
}

// The figures by distance describe decoding: of the prompt's chunks (4, 4 and 1 tokens) only the
// single-token one is scored there, at most top-k guesses per MoE layer.
TEST_F(EngineTest, PromptChunksAreNotScoredAsDecodeLookahead) {
  std::unique_ptr<Engine> engine;
  StepMetrics m;
  ASSERT_NO_FATAL_FAILURE(PrefillWithLookahead(1, 1, &engine, &m));
  const ModelConfig& c = engine->config();
  uint64_t one_pass = 0;
  for (int64_t l = 0; l < c.num_layers; ++l)
    one_pass += c.is_dense(l) ? 0 : c.num_experts_per_token;
  const auto accuracy = engine->prefetch_accuracy();
  ASSERT_EQ(accuracy.size(), 1u);
  EXPECT_GT(accuracy[0].predicted, 0u);
  EXPECT_LE(accuracy[0].predicted, one_pass);
}

TEST_F(EngineTest, StreamingFromATrunkPackGivesTheSameAnswer) {
  const StreamRun base = Baseline(ModelDir());
  TempDir pack_dir;
  auto ckpt = Checkpoint::Open(ModelDir());
  ASSERT_TRUE(ckpt.ok());
  ASSERT_TRUE(WriteTrunkPack(**ckpt, pack_dir.path(), {}).ok());
  EngineOptions o = Options();
  o.memory.preset = "ultra";
  o.trunk_dir = pack_dir.path();
  auto run = Stream(o);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->ids, base.ids);
  for (size_t i = 0; i < base.logits.size(); ++i) {
    EXPECT_TRUE(BitIdentical(run->logits[i], base.logits[i])) << "step " << i;
  }
  EXPECT_GT(run->decode.trunk_bytes, 0u);
}

TEST_F(EngineTest, LookaheadPredictsAndIsScored) {
  EngineOptions o = Options();
  o.memory.preset = "max";
  o.prefetch_distance = 2;
  auto engine = Engine::Open(o);
  ASSERT_TRUE(engine.ok());
  SequenceState state = (*engine)->NewState();
  std::vector<float> logits;
  StepMetrics m;
  ASSERT_TRUE((*engine)->Prefill(kPrompt, state, logits, &m).ok());
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE((*engine)->Decode(Argmax(logits), state, logits, &m).ok());
  const auto accuracy = (*engine)->prefetch_accuracy();
  ASSERT_EQ(accuracy.size(), 2u);
  for (const auto& a : accuracy) {
    EXPECT_GT(a.predicted, 0u);
    EXPECT_GT(a.actual, 0u);
    EXPECT_LE(a.correct, std::min(a.predicted, a.actual));
  }
  EXPECT_GT(m.prefetch_predicted, 0u);
}

TEST_F(EngineTest, TransientFaultsAreRetriedToTheSameTokens) {
  const StreamRun base = Baseline(ModelDir());
  EngineOptions o = Options();
  o.memory.preset = "ultra";
  o.faults = std::make_shared<io::FaultPlan>();
  o.faults->FailAttempts(3, 2, EIO).ShortReads(1000, 10, 5).FailAttempts(40, 1, EINTR);
  auto run = Stream(o);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->ids, base.ids);
  for (size_t i = 0; i < base.logits.size(); ++i) {
    EXPECT_TRUE(BitIdentical(run->logits[i], base.logits[i])) << "step " << i;
  }
  EXPECT_GT(o.faults->injected(), 0);
}

TEST_F(EngineTest, PermanentFaultNamesFileAndOffset) {
  auto ckpt = Checkpoint::Open(ModelDir());
  ASSERT_TRUE(ckpt.ok());
  // A bad sector inside every expert of one layer's shard, so some read must hit it.
  const ExpertLocation& loc = (*ckpt)->expert(1, 0);
  const std::string shard = (*ckpt)->shard_paths()[loc.spans[0].shard];
  EngineOptions o = Options();
  o.memory.preset = "ultra";
  o.faults = std::make_shared<io::FaultPlan>();
  for (int e = 0; e < (*ckpt)->config().num_experts; ++e) {
    const ByteSpan& s = (*ckpt)->expert(1, e).spans[0];
    o.faults->FailAtOffset(s.offset + 100, EIO, -1, shard.substr(shard.rfind('/')));
  }
  auto run = Stream(o);
  ASSERT_FALSE(run.ok());
  const std::string message(run.status().message());
  EXPECT_NE(message.find(shard.substr(shard.rfind('/') + 1)), std::string::npos) << message;
  EXPECT_NE(message.find("offset"), std::string::npos) << message;
}

// A bad sector inside a streamed trunk matrix, and one inside the embedding's rows: each fails
// the token with the shard and offset named, never a token computed without those bytes.
TEST_F(EngineTest, PermanentFaultInTheStreamedTrunkNamesFileAndOffset) {
  auto ckpt = Checkpoint::Open(ModelDir());
  ASSERT_TRUE(ckpt.ok());
  const TensorNames& n = (*ckpt)->names();
  for (const std::string& name :
       {n.Layer(2, "self_attn.v_proj.weight"), n.Global("model.embed_tokens.weight")}) {
    const TensorInfo* t = (*ckpt)->Find(name);
    ASSERT_NE(t, nullptr) << name;
    const std::string shard = (*ckpt)->shard_paths()[t->shard];
    const std::string file = shard.substr(shard.rfind('/') + 1);
    EngineOptions o = Options();
    o.memory.preset = "ultra";
    o.ring_piece_bytes = 4096;
    o.faults = std::make_shared<io::FaultPlan>();
    // The embedding: the row of every token id the run can see.
    for (uint64_t at = 0; at < t->byte_size; at += t->byte_size / t->shape[0]) {
      o.faults->FailAtOffset(t->file_offset + at + 2, EIO, -1, "/" + file);
    }
    auto run = Stream(o);
    ASSERT_FALSE(run.ok()) << name;
    const std::string message(run.status().message());
    EXPECT_NE(message.find(file), std::string::npos) << name << ": " << message;
    EXPECT_NE(message.find("offset"), std::string::npos) << name << ": " << message;
  }
}

// Experts whose six tensors lie in another order within their range: one read each, streamed
// to the same tokens and bit-identical logits as the layout in name order.
TEST_F(EngineTest, ExpertPartsInAnyOrderAreOneReadWithTheSameTokens) {
  TempDir copy;
  const std::string dir = copy.path() + "/m";
  SynthOptions opt = ::k3::testing::TinyModel(dir);
  opt.router_skew = 1.0;  // the suite's model
  ASSERT_TRUE(Synthesize(opt).ok());
  ASSERT_TRUE(::k3::testing::PermuteExpertParts(dir, {4, 1, 5, 0, 3, 2}).ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  for (int64_t l = 1; l < (*ckpt)->config().num_layers; ++l) {
    for (int64_t e = 0; e < (*ckpt)->config().num_experts; ++e) {
      ASSERT_TRUE((*ckpt)->expert(l, e).contiguous()) << l << "/" << e;
      ASSERT_NE((*ckpt)->expert(l, e).part_offset[0], 0u);  // not in name order
    }
  }
  const StreamRun base = Baseline(ModelDir());
  for (const char* preset : {"ultra", "max"}) {
    EngineOptions o = Options();
    o.model_dir = dir;
    o.memory.preset = preset;
    auto run = Stream(o);
    ASSERT_TRUE(run.ok()) << preset << ": " << run.status();
    EXPECT_EQ(run->ids, base.ids) << preset;
    for (size_t i = 0; i < base.logits.size(); ++i) {
      EXPECT_TRUE(BitIdentical(run->logits[i], base.logits[i])) << preset << " step " << i;
    }
  }
  EXPECT_EQ(Baseline(dir).logits, base.logits);  // the synchronous provider too
}

TEST_F(EngineTest, CorruptExpertScaleIsAnErrorNotAToken) {
  TempDir copy;
  const std::string dir = copy.path() + "/m";
  ASSERT_TRUE(Synthesize(::k3::testing::TinyModel(dir)).ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  // Every expert of layer 1 gets a NaN scale byte (0xFF) in w1's scales.
  for (int e = 0; e < (*ckpt)->config().num_experts; ++e) {
    const ExpertLocation& loc = (*ckpt)->expert(1, e);
    const uint64_t at = loc.spans[0].offset + loc.part_offset[1];
    FILE* f = std::fopen((*ckpt)->shard_paths()[loc.spans[0].shard].c_str(), "r+b");
    ASSERT_NE(f, nullptr);
    std::fseek(f, static_cast<long>(at), SEEK_SET);
    std::fputc(0xFF, f);
    std::fclose(f);
  }
  EngineOptions o = Options();
  o.model_dir = dir;
  o.memory.preset = "max";
  auto run = Stream(o);
  ASSERT_FALSE(run.ok());
  EXPECT_NE(std::string(run.status().message()).find("0xFF"), std::string::npos) << run.status();
}

TEST_F(EngineTest, BudgetBelowMinimumIsRefusedWithTheMinimum) {
  EngineOptions o = Options();
  o.memory.ram_gb = 0.0001;
  auto engine = Engine::Open(o);
  ASSERT_FALSE(engine.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(engine.status()));
  EXPECT_NE(std::string(engine.status().message()).find("minimum"), std::string::npos);
}

}  // namespace
}  // namespace k3
