// The Kimi K3 forward pass (MODEL.md section 2): embedding, 93 layers of KDA or MLA attention
// and a dense or Stable LatentMoE feed-forward, joined by Block Attention Residuals, then the
// final AttnRes, norm and lm_head. It runs a chunk of tokens per call (prefill) or one
// (decode), carrying state in a SequenceState; a token's arithmetic is the same whichever
// chunk it is in, so incremental decoding and full recompute agree bit for bit.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "core/config.h"
#include "core/model/expert_provider.h"
#include "core/model/sequence_state.h"
#include "core/model/weights.h"

namespace k3 {

// Per-layer hook: called after each layer with the token count and the layer's output prefix
// P [tokens, hidden] (for tests that check activations layer by layer).
using LayerObserver = std::function<void(int64_t layer, std::span<const float> prefix)>;

class Model {
 public:
  Model(const ModelConfig& config, const TrunkWeights& trunk, ExpertProvider& experts)
      : config_(config), trunk_(trunk), experts_(experts) {}

  // Runs `ids` after the tokens already in `state` and appends them to it. Writes the logits
  // of the last token ([vocab]) or, with all_positions, of every token ([ids.size(), vocab]).
  // Ids outside the vocabulary are InvalidArgument; I/O and corrupt experts are errors that
  // leave `state` unusable.
  absl::Status Forward(std::span<const int32_t> ids, SequenceState& state, bool all_positions,
                       std::vector<float>& logits, const LayerObserver& observer = {});

  const ModelConfig& config() const { return config_; }

 private:
  void AttnRes(const std::vector<std::vector<float>>& snapshots, std::span<const float> prefix,
               size_t tokens, std::span<const float> fold, std::span<float> out) const;
  void Kda(int64_t layer, std::span<const float> x, size_t tokens, SequenceState& state,
           std::span<float> out) const;
  void Mla(int64_t layer, std::span<const float> x, size_t tokens, SequenceState& state,
           std::span<float> out) const;
  void DenseFfn(int64_t layer, std::span<const float> x, size_t tokens, std::span<float> out) const;
  absl::Status Moe(int64_t layer, std::span<const float> x, size_t tokens,
                   std::span<float> out) const;
  void NormRows(std::span<const float> x, size_t tokens, std::span<const float> weight, float eps,
                std::span<float> out) const;

  const ModelConfig& config_;
  const TrunkWeights& trunk_;
  ExpertProvider& experts_;
};

}  // namespace k3
