// The engine tests' runs: the plain synchronous model as the reference (Baseline), a
// streaming engine run over the same prompt (Stream), and a compressed trunk pack to run from.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/checkpoint/checkpoint.h"
#include "core/model/model.h"
#include "core/checkpoint/trunk_codec.h"
#include "core/checkpoint/trunk_pack.h"
#include "pipeline/engine.h"
#include "pipeline/memory_plan.h"
#include "pipeline/prompt_cache.h"

namespace k3::testing {

inline const std::vector<int32_t> kPrompt = {3, 7, 11, 5, 9, 2, 30, 41, 17};
inline constexpr int kDecodeSteps = 6;
inline constexpr int kPrefillChunk = 4;

// Counts the experts the model asks for, per call, on top of the synchronous provider.
class CountingProvider : public ExpertProvider {
 public:
  explicit CountingProvider(const Checkpoint& ckpt) : inner_(ckpt) {}
  absl::Status ForEachExpert(int64_t layer, std::span<const int32_t> experts, const ExpertUse& use,
                             const std::function<void()>& alongside) override {
    requested += experts.size();
    return inner_.ForEachExpert(layer, experts, use, alongside);
  }
  uint64_t requested = 0;

 private:
  CheckpointExpertProvider inner_;
};

struct StreamRun {
  std::vector<int32_t> ids;
  std::vector<std::vector<float>> logits;  // after the prompt, then after each decode step
  StepMetrics prefill;
  StepMetrics decode;
};

inline int32_t Argmax(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The reference: the whole trunk resident and experts read one by one, no pipeline at all.
inline StreamRun Baseline(const std::string& dir, uint64_t* experts_per_prefill = nullptr) {
  auto ckpt = Checkpoint::Open(dir);
  EXPECT_TRUE(ckpt.ok()) << ckpt.status();
  auto trunk = LoadTrunkWeights(**ckpt);
  EXPECT_TRUE(trunk.ok()) << trunk.status();
  CountingProvider provider(**ckpt);
  Model model((*ckpt)->config(), **trunk, provider);
  SequenceState state((*ckpt)->config());
  StreamRun run;
  std::vector<float> logits;
  for (size_t at = 0; at < kPrompt.size(); at += kPrefillChunk) {
    const size_t n = std::min<size_t>(kPrefillChunk, kPrompt.size() - at);
    EXPECT_TRUE(model.Forward({kPrompt.data() + at, n}, state, false, logits).ok());
  }
  if (experts_per_prefill != nullptr) *experts_per_prefill = provider.requested;
  run.logits.push_back(logits);
  for (int i = 0; i < kDecodeSteps; ++i) {
    const int32_t id = Argmax(logits);
    run.ids.push_back(id);
    EXPECT_TRUE(model.Forward({&id, 1}, state, false, logits).ok());
    run.logits.push_back(logits);
  }
  return run;
}

// With a prompt cache: the longest cached prefix of the prompt resumed, and the state a token
// short of the prompt's end stored when it was not (as `k3 generate --prompt-cache` runs).
inline absl::StatusOr<StreamRun> Stream(const EngineOptions& options,
                                        PromptCache* cache = nullptr) {
  auto engine = Engine::Open(options);
  if (!engine.ok()) return engine.status();
  SequenceState state = (*engine)->NewState();
  if (cache != nullptr) {
    if (std::optional<SequenceState> hit = cache->Lookup(kPrompt)) state = *std::move(hit);
  }
  StreamRun run;
  std::vector<float> logits;
  std::span<const int32_t> rest = std::span(kPrompt).subspan(state.position());
  if (cache != nullptr && rest.size() > 1) {
    auto s = (*engine)->Prefill(rest.first(rest.size() - 1), state, logits, &run.prefill);
    if (!s.ok()) return s;
    cache->Store(state);
    rest = rest.last(1);
  }
  if (auto s = (*engine)->Prefill(rest, state, logits, &run.prefill); !s.ok()) return s;
  run.logits.push_back(logits);
  for (int i = 0; i < kDecodeSteps; ++i) {
    const int32_t id = Argmax(logits);
    run.ids.push_back(id);
    if (auto s = (*engine)->Decode(id, state, logits, &run.decode); !s.ok()) return s;
    run.logits.push_back(logits);
  }
  return run;
}

// The options every engine test starts from: the tiny model in `dir`, short prefill chunks.
inline EngineOptions OptionsFor(const std::string& dir) {
  EngineOptions o;
  o.model_dir = dir;
  o.prefill_chunk = kPrefillChunk;
  o.max_context = 64;
  return o;
}

// The memory settings of the grid: the minimum (every matrix streamed through the ring, the
// embedding read row by row), the minimum again with pieces of a few rows in a ring of two slots
// (every product split across pieces), one budget between (some layers pinned, a small cache)
// and everything resident; then the two streaming ones from a compressed trunk pack (blocks of
// 16 KiB, so that pieces hold one block or several).
struct MemorySetting {
  std::string name;
  MemoryRequest memory;
  uint64_t piece_bytes = 0;
  int ring_slots = 0;
  bool compressed = false;
};

inline std::vector<MemorySetting> GridMemory(const std::string& dir) {
  auto ckpt = Checkpoint::Open(dir);
  auto plan_min = PlanMemory(MeasureFootprint(**ckpt, 64, kPrefillChunk), {.preset = "ultra"}, 0);
  auto plan_max = PlanMemory(MeasureFootprint(**ckpt, 64, kPrefillChunk), {.preset = "max"}, 0);
  const double lo = plan_min->budget_bytes / 1e9, hi = plan_max->budget_bytes / 1e9;
  return {{"ultra", {.preset = "ultra"}},
          {"ultra, 4 KiB pieces, 2 slots", {.preset = "ultra"}, 4096, 2},
          {absl::StrCat((lo + hi) / 2, " GB"), {.ram_gb = (lo + hi) / 2}},
          {"max", {.preset = "max"}},
          {"bf16-e3 pack, ultra, 64 KiB pieces, 2 slots", {.preset = "ultra"}, 64 << 10, 2, true},
          {absl::StrCat("bf16-e3 pack, ", (lo + hi) / 2, " GB"),
           {.ram_gb = (lo + hi) / 2},
           0,
           0,
           true}};
}

// A compressed trunk pack of `dir` in `out`, in blocks of 16 KiB.
inline void PackCompressed(const std::string& dir, const std::string& out) {
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto r = WriteTrunkPack(**ckpt, out, {.codec = kBf16Codec, .block_bytes = 16 << 10});
  ASSERT_TRUE(r.ok()) << r.status();
}

}  // namespace k3::testing
