// The engine tests' runs: the plain synchronous model as the reference (Baseline), a
// streaming engine run over the same prompt (Stream), and a compressed trunk pack to run from.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/checkpoint.h"
#include "core/model/model.h"
#include "core/trunk_codec.h"
#include "core/trunk_pack.h"
#include "pipeline/engine.h"

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

inline absl::StatusOr<StreamRun> Stream(const EngineOptions& options) {
  auto engine = Engine::Open(options);
  if (!engine.ok()) return engine.status();
  SequenceState state = (*engine)->NewState();
  StreamRun run;
  std::vector<float> logits;
  if (auto s = (*engine)->Prefill(kPrompt, state, logits, &run.prefill); !s.ok()) return s;
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

// A compressed trunk pack of `dir` in `out`, in blocks of 16 KiB.
inline void PackCompressed(const std::string& dir, const std::string& out) {
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto r = WriteTrunkPack(**ckpt, out, {.codec = kBf16Codec, .block_bytes = 16 << 10});
  ASSERT_TRUE(r.ok()) << r.status();
}

}  // namespace k3::testing
