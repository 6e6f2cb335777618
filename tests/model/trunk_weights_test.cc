// The resident trunk as loaded: large matrices land in one arena, read past the page cache,
// byte for byte what the checkpoint holds; small ones stay in vectors.
#include <gtest/gtest.h>

#include <cstring>

#include "core/checkpoint/checkpoint.h"
#include "core/model/weights.h"
#include "core/synth/synth.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

bool InArena(const TrunkWeights& w, const Matrix& m) {
  return w.arena != nullptr &&
         w.arena->Contains(static_cast<const uint8_t*>(m.data), m.rows * m.cols * 2);
}

void ExpectStoredBytes(const Checkpoint& ckpt, const std::string& name, const Matrix& m) {
  const TensorInfo* t = ckpt.Find(name);
  ASSERT_NE(t, nullptr) << name;
  std::vector<uint8_t> want(t->byte_size);
  ASSERT_TRUE(ckpt.ReadTensor(*t, want).ok());
  ASSERT_NE(m.data, nullptr) << name;
  EXPECT_EQ(std::memcmp(m.data, want.data(), want.size()), 0) << name;
}

TEST(TrunkWeightsTest, LargeMatricesAreReadIntoOneArenaAndHoldTheStoredBytes) {
  testing::TempDir dir;
  SynthOptions opt = testing::TinyModel(dir.path() + "/m");
  opt.overrides = {{"vocab_size", "4096"}};  // embedding and lm_head: 4096 x 128 BF16, 1 MiB
  ASSERT_TRUE(Synthesize(opt).ok());
  auto ckpt = Checkpoint::Open(opt.out_dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto trunk = LoadTrunkWeights(**ckpt);
  ASSERT_TRUE(trunk.ok()) << trunk.status();
  const TrunkWeights& w = **trunk;
  const TensorNames& n = (*ckpt)->names();

  ASSERT_NE(w.arena, nullptr);
  EXPECT_TRUE(InArena(w, w.embed));
  EXPECT_TRUE(InArena(w, w.lm_head));
  ExpectStoredBytes(**ckpt, n.Global("model.embed_tokens.weight"), w.embed);
  ExpectStoredBytes(**ckpt, n.Global("lm_head.weight"), w.lm_head);
  // A layer's projections (128 x 128 at most) are under the arena's 1 MiB floor.
  const Matrix& q = w.layers[0].kda.q.data != nullptr ? w.layers[0].kda.q : w.layers[0].mla.q_a;
  EXPECT_FALSE(InArena(w, q));
}

TEST(TrunkWeightsTest, ATrunkOfSmallMatricesNeedsNoArena) {
  testing::TempDir dir;
  ASSERT_TRUE(Synthesize(testing::TinyModel(dir.path() + "/m")).ok());
  auto ckpt = Checkpoint::Open(dir.path() + "/m");
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto trunk = LoadTrunkWeights(**ckpt);
  ASSERT_TRUE(trunk.ok()) << trunk.status();
  EXPECT_EQ((*trunk)->arena, nullptr);
  ExpectStoredBytes(**ckpt, (*ckpt)->names().Global("lm_head.weight"), (*trunk)->lm_head);
}

}  // namespace
}  // namespace k3
