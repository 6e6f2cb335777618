// The engine from a compressed trunk pack (docs/PACK.md): the same bits as from the shards at
// every budget, fewer bytes read; a damaged block fails the step naming the pack and offset;
// pinned layers held compressed where the decoded trunk does not fit, so that more layers fit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/trunk_pack.h"
#include "pipeline/engine.h"
#include "pipeline/memory_plan.h"
#include "tests/pipeline/engine_run.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::Baseline;
using ::k3::testing::BitIdentical;
using ::k3::testing::kPrefillChunk;
using ::k3::testing::OptionsFor;
using ::k3::testing::PackCompressed;
using ::k3::testing::Stream;
using ::k3::testing::StreamRun;
using ::k3::testing::TempDir;
using ::testing::AllOf;
using ::testing::HasSubstr;

int PinnedLayers(const MemoryPlan& plan) {
  return static_cast<int>(std::count(plan.pinned.begin(), plan.pinned.end(), true));
}

class CompressedTrunkTest : public ::k3::testing::TinyModelSuite {
 protected:
  EngineOptions Options() const { return OptionsFor(ModelDir()); }

  void SetUp() override {
    auto ckpt = Checkpoint::Open(ModelDir());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
    ASSERT_NO_FATAL_FAILURE(PackCompressed(ModelDir(), pack_dir_.path()));
    auto pack = TrunkPack::Open(pack_dir_.path(), *ckpt_);
    ASSERT_TRUE(pack.ok()) << pack.status();
    pack_ = *std::move(pack);
  }

  // The plans of a budget of `gb` from the raw checkpoint and from the compressed pack; nullopt
  // when either refuses the budget.
  std::optional<std::pair<MemoryPlan, MemoryPlan>> Plans(double gb) const {
    auto raw = PlanMemory(MeasureFootprint(*ckpt_, 64, kPrefillChunk), {.ram_gb = gb}, 0);
    auto packed = PlanMemory(MeasureFootprint(*ckpt_, 64, kPrefillChunk, {.pack = pack_.get()}),
                             {.ram_gb = gb}, 0);
    if (!raw.ok() || !packed.ok()) return std::nullopt;
    return std::make_pair(*raw, *packed);
  }

  // A budget at which the compressed pack pins more layers than the raw checkpoint (0 if none
  // of 64 between the minimum and everything does).
  double BudgetWhereHeldLayersFitMore() const {
    auto lo = PlanMemory(MeasureFootprint(*ckpt_, 64, kPrefillChunk), {.preset = "ultra"}, 0);
    auto hi = PlanMemory(MeasureFootprint(*ckpt_, 64, kPrefillChunk), {.preset = "max"}, 0);
    for (int i = 1; i < 64; ++i) {
      const double gb = (lo->budget_bytes + (hi->budget_bytes - lo->budget_bytes) * i / 64.0) / 1e9;
      const auto plans = Plans(gb);
      if (plans && PinnedLayers(plans->second) > PinnedLayers(plans->first)) return gb;
    }
    return 0;
  }

  // Damages one byte of `block` in the pack, then runs `o` from the pack: the step fails with
  // DataLoss naming the pack and the block's offset.
  void ExpectADamagedBlockFailsTheStep(PackedBlock block, EngineOptions o) {
    {
      std::fstream f(pack_->pack_path(), std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(block.offset + 7));
      f.put('\x5a');
    }
    o.trunk_dir = pack_dir_.path();
    auto run = Stream(o);
    ASSERT_FALSE(run.ok());
    EXPECT_EQ(run.status().code(), absl::StatusCode::kDataLoss) << run.status();
    EXPECT_THAT(run.status().message(),
                AllOf(HasSubstr("trunk.pack"), HasSubstr(absl::StrCat("offset ", block.offset)),
                      HasSubstr("checksum")));
  }

  std::unique_ptr<Checkpoint> ckpt_;
  TempDir pack_dir_;
  std::unique_ptr<TrunkPack> pack_;
};

// A compressed pack's pieces are decoded as they are acquired: same bits, fewer bytes read, the
// decode timed.
TEST_F(CompressedTrunkTest, StreamingFromACompressedPackGivesTheSameBitsFromFewerBytes) {
  const StreamRun base = Baseline(ModelDir());
  TempDir raw, compressed;
  auto ckpt = Checkpoint::Open(ModelDir());
  ASSERT_TRUE(ckpt.ok());
  ASSERT_TRUE(WriteTrunkPack(**ckpt, raw.path(), {}).ok());
  ASSERT_NO_FATAL_FAILURE(PackCompressed(ModelDir(), compressed.path()));
  EngineOptions o = Options();
  o.memory.preset = "ultra";
  o.trunk_dir = raw.path();
  auto from_raw = Stream(o);
  ASSERT_TRUE(from_raw.ok()) << from_raw.status();
  o.trunk_dir = compressed.path();
  auto run = Stream(o);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->ids, base.ids);
  for (size_t i = 0; i < base.logits.size(); ++i) {
    EXPECT_TRUE(BitIdentical(run->logits[i], base.logits[i])) << "step " << i;
  }
  EXPECT_LT(run->decode.trunk_bytes, from_raw->decode.trunk_bytes);
  EXPECT_GT(run->decode.trunk_decode_seconds, 0);
  EXPECT_EQ(from_raw->decode.trunk_decode_seconds, 0);
  // The products decode their pieces block by block; the raw pack decodes nothing.
  EXPECT_GT(run->decode.trunk_pieces_decoded_fused, 0u);
  EXPECT_EQ(
      from_raw->decode.trunk_pieces_decoded_fused + from_raw->decode.trunk_pieces_decoded_whole,
      0u);
}

// A block damaged on disk after the pack was made: the step fails with DataLoss naming the pack
// file and the block's offset; no token comes from it.
TEST_F(CompressedTrunkTest, ADamagedCompressedBlockFailsTheStepNamingFileAndOffset) {
  EngineOptions o = Options();
  o.memory.preset = "ultra";
  ExpectADamagedBlockFailsTheStep(pack_->layer_run(1)->tensors.back().blocks.front(), o);
}

// Where the decoded trunk does not fit, the pinned layers' compressed matrices are held as the
// pack stores them: the plan counts them at their stored size, so some budget pins more layers
// than from the shards; the run gives the same bits, its products decode the held blocks, and it
// reads fewer trunk bytes per token than the plan from the shards would stream.
TEST_F(CompressedTrunkTest, PinnedLayersAreHeldCompressedSoMoreOfTheTrunkFits) {
  const double gb = BudgetWhereHeldLayersFitMore();
  ASSERT_GT(gb, 0) << "no budget pins more layers held compressed";
  const auto plans = Plans(gb);
  ASSERT_TRUE(plans.has_value());
  const auto& [raw, packed] = *plans;
  EXPECT_TRUE(packed.pinned_compressed);
  EXPECT_FALSE(raw.pinned_compressed);
  EXPECT_THAT(packed.Describe(), HasSubstr("held compressed"));
  // The ring's slots hold stored bytes, and the plan says so beside the decoded piece size.
  ASSERT_GT(packed.ring_slots, 0);
  EXPECT_LT(packed.ring_slot_bytes, raw.ring_slot_bytes);
  EXPECT_THAT(packed.Describe(), HasSubstr("for compressed pieces of up to"));
  const std::vector<const TensorInfo*> held = HeldCompressedTensors(*ckpt_, pack_.get(), packed);
  ASSERT_FALSE(held.empty());
  for (const TensorInfo* t : held) EXPECT_TRUE(pack_->Find(t->name)->compressed()) << t->name;

  const StreamRun base = Baseline(ModelDir());
  EngineOptions o = Options();
  o.memory = {.ram_gb = gb};
  o.trunk_dir = pack_dir_.path();
  auto run = Stream(o);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->ids, base.ids);
  for (size_t i = 0; i < base.logits.size(); ++i) {
    EXPECT_TRUE(BitIdentical(run->logits[i], base.logits[i])) << "step " << i;
  }
  EXPECT_GT(run->decode.trunk_pieces_decoded_fused, 0u);
  EXPECT_GT(run->decode.trunk_decode_seconds, 0);
  const uint64_t steps = static_cast<uint64_t>(run->ids.size());
  EXPECT_LT(run->decode.trunk_bytes / steps,
            ForecastReads(MeasureFootprint(*ckpt_, 64, kPrefillChunk), raw).trunk_bytes);
}

// With room for the whole decoded trunk nothing is held compressed and nothing is decoded.
TEST_F(CompressedTrunkTest, ATrunkThatFitsDecodedIsNotHeldCompressed) {
  EngineOptions o = Options();
  o.memory = {.preset = "max"};
  o.trunk_dir = pack_dir_.path();
  auto run = Stream(o);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->decode.trunk_pieces_decoded_fused + run->decode.trunk_pieces_decoded_whole, 0u);
  EXPECT_EQ(run->decode.trunk_decode_seconds, 0);
  const auto plans = Plans(1e3);
  ASSERT_TRUE(plans.has_value());
  EXPECT_FALSE(plans->second.pinned_compressed);
  EXPECT_TRUE(HeldCompressedTensors(*ckpt_, pack_.get(), plans->second).empty());
}

// A block of a matrix held compressed, damaged in the pack before the engine read it: the first
// product that decodes it fails the step with DataLoss naming the pack and the block's offset.
TEST_F(CompressedTrunkTest, ADamagedHeldBlockFailsTheStepNamingFileAndOffset) {
  const double gb = BudgetWhereHeldLayersFitMore();
  ASSERT_GT(gb, 0);
  const std::vector<const TensorInfo*> held =
      HeldCompressedTensors(*ckpt_, pack_.get(), Plans(gb)->second);
  ASSERT_FALSE(held.empty());
  EngineOptions o = Options();
  o.memory = {.ram_gb = gb};
  ExpectADamagedBlockFailsTheStep(pack_->Find(held.front()->name)->blocks.back(), o);
}

}  // namespace
}  // namespace k3
