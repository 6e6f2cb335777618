// The prompt cache in the determinism grid (DESIGN.md invariant 1): at every memory setting of
// the grid and at prompt chunks of 1, 4 and auto, a cold run that stores the prompt's state, a
// warm run that resumes it and a run over a damaged file (a miss, then a cold prefill) give the
// tokens and every logit of the synchronous model.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "pipeline/prompt_cache.h"
#include "tests/pipeline/engine_run.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::BitIdentical;
using ::k3::testing::StreamRun;
using ::k3::testing::TempDir;

class PromptCacheGridTest : public ::k3::testing::TinyModelSuite {};

// Flips one byte in the middle of the file.
void Damage(const std::string& path) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(0, std::ios::end);
  const std::streamoff middle = f.tellg() / 2;
  f.seekg(middle);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(~c);
  f.seekp(middle);
  f.write(&c, 1);
}

void ExpectSameRun(const StreamRun& run, const StreamRun& base, const std::string& where) {
  ASSERT_EQ(run.ids, base.ids) << where;
  ASSERT_EQ(run.logits.size(), base.logits.size()) << where;
  for (size_t i = 0; i < base.logits.size(); ++i) {
    ASSERT_TRUE(BitIdentical(run.logits[i], base.logits[i])) << where << " step " << i;
  }
}

TEST_F(PromptCacheGridTest, ColdWarmAndDamagedGiveTheSynchronousModelsBits) {
  const StreamRun base = ::k3::testing::Baseline(ModelDir());
  TempDir pack;
  ASSERT_NO_FATAL_FAILURE(::k3::testing::PackCompressed(ModelDir(), pack.path()));
  const std::vector<::k3::testing::MemorySetting> memories = ::k3::testing::GridMemory(ModelDir());
  const int chunks[] = {1, ::k3::testing::kPrefillChunk, kAutoPrefillChunk};
  for (size_t m = 0; m < memories.size(); ++m) {
    const ::k3::testing::MemorySetting& memory = memories[m];
    EngineOptions o = ::k3::testing::OptionsFor(ModelDir());
    o.memory = memory.memory;
    o.ring_piece_bytes = memory.piece_bytes;
    o.ring_slots = memory.ring_slots;
    if (memory.compressed) o.trunk_dir = pack.path();
    o.prefill_chunk = chunks[m % 3];
    TempDir dir;
    auto ckpt = Checkpoint::Open(ModelDir());
    ASSERT_TRUE(ckpt.ok());
    auto cache = PromptCache::Open((*ckpt)->config(), "grid", {.dir = dir.path()});
    ASSERT_TRUE(cache.ok()) << cache.status();
    for (const char* kind : {"cold", "warm", "damaged"}) {
      const std::string where =
          absl::StrCat("memory ", memory.name, " chunk ", o.prefill_chunk, ", ", kind);
      if (std::string(kind) == "damaged")
        Damage((*cache)->PathFor(std::span(::k3::testing::kPrompt).first(8)));
      const auto before = (*cache)->stats();
      auto run = ::k3::testing::Stream(o, cache->get());
      ASSERT_TRUE(run.ok()) << where << ": " << run.status();
      ExpectSameRun(*run, base, where);
      const auto after = (*cache)->stats();
      EXPECT_EQ(after.disk_hits - before.disk_hits, std::string(kind) == "warm" ? 1 : 0) << where;
      EXPECT_EQ(after.damaged - before.damaged, std::string(kind) == "damaged" ? 1 : 0) << where;
    }
  }
}

}  // namespace
}  // namespace k3
