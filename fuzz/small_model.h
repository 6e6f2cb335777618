// The small model of the fuzz targets: a checkpoint of it, or a whole state (a seed), fits in a
// few kilobytes.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <span>

#include "core/checkpoint/config.h"
#include "core/model/sequence_state.h"

namespace k3::fuzzing {

// Two layers (a dense KDA layer, then an MLA layer with two experts): every kind of tensor and
// of state, in a few kilobytes.
inline constexpr char kSmallModelConfig[] = R"({
  "hidden_size": 32, "num_hidden_layers": 2, "vocab_size": 16,
  "kda_num_heads": 1, "kda_head_dim": 8, "num_attention_heads": 1, "q_lora_rank": 8,
  "kv_lora_rank": 8, "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8,
  "full_attn_layers": [2], "first_k_dense_replace": 1, "intermediate_size": 8,
  "num_experts": 2, "num_experts_per_token": 1, "num_shared_experts": 1,
  "moe_intermediate_size": 32, "routed_expert_hidden_size": 32, "attn_res_block_size": 1
})";

inline const ModelConfig& SmallModel() {
  static const ModelConfig* const kModel = [] {
    auto c = ParseModelConfigText(kSmallModelConfig, "fuzz config");
    if (!c.ok()) std::abort();
    return new ModelConfig(*std::move(c));
  }();
  return *kModel;
}

// A state of that model after `tokens`, with a few nonzero values.
inline SequenceState SmallState(std::span<const int32_t> tokens) {
  const ModelConfig& model = SmallModel();
  SequenceState state(model);
  state.AppendTokens(tokens);
  for (int64_t l = 0; l < model.num_layers; ++l) {
    if (model.attention_kind(l) == AttentionKind::kMla) {
      state.mla_cache(l).assign(tokens.size() * state.latent_width(), 0.5f);
    } else {
      state.kda_state(l)[0] = 1.0f;
    }
  }
  return state;
}

}  // namespace k3::fuzzing
