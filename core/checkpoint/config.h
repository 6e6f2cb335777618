// The Kimi K3 model configuration: read from the release's nested config.json or the flat
// form of small test checkpoints (MODEL.md section 0), validated as a whole.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace k3 {

enum class AttentionKind { kKda, kMla };

struct ModelConfig {
  // Trunk.
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t vocab_size = 0;
  double rms_norm_eps = 1e-5;
  std::string hidden_act = "situ";
  double situ_beta = 4.0;          // gate cap
  double situ_linear_beta = 25.0;  // up cap
  int64_t attn_res_block_size = 12;
  // The longest context the model is made for (MODEL.md: 1M, NoPE, so only a limit the memory
  // plan's auto context stops at).
  int64_t max_position_embeddings = 1048576;

  // KDA (linear attention).
  int64_t kda_num_heads = 0;
  int64_t kda_head_dim = 0;
  int64_t short_conv_kernel_size = 4;
  double gate_lower_bound = -5.0;

  // MLA (global attention).
  int64_t num_attention_heads = 0;
  int64_t q_lora_rank = 0;
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool mla_use_output_gate = true;

  // Layer map: ONE-based lists as in the file; they partition 1..num_layers.
  std::vector<int64_t> full_attn_layers;
  std::vector<int64_t> kda_layers;

  // Feed-forward.
  int64_t first_k_dense_replace = 1;
  int64_t intermediate_size = 0;  // dense FFN width
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t num_shared_experts = 0;
  int64_t moe_intermediate_size = 0;
  int64_t routed_expert_hidden_size = 0;  // latent width the experts run in
  double routed_scaling_factor = 1.0;
  bool moe_renormalize = true;
  bool latent_moe_use_norm = true;

  // Special ids from the wrapper (-1 when absent).
  int64_t bos_token_id = -1;
  int64_t eos_token_id = -1;

  // ---- Derived (layers are ZERO-based here) ----
  AttentionKind attention_kind(int64_t layer) const { return layer_kinds[layer]; }
  bool is_dense(int64_t layer) const { return layer < first_k_dense_replace; }
  bool is_block_boundary(int64_t layer) const { return layer % attn_res_block_size == 0; }
  int64_t kda_width() const { return kda_num_heads * kda_head_dim; }
  int64_t mla_q_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  int64_t shared_width() const { return num_shared_experts * moe_intermediate_size; }
  // Bytes of one routed expert in MXFP4 (three matrices, packed nibbles plus E8M0 scales).
  int64_t expert_bytes() const;
  // A stable digest of everything that changes the arithmetic (for saved sequence state).
  std::string Fingerprint() const;

  std::vector<AttentionKind> layer_kinds;
};

// Parses and validates; every problem is listed in one InvalidArgument message that starts
// with `source` (usually the file path).
absl::StatusOr<ModelConfig> ParseModelConfig(const nlohmann::json& json, std::string_view source);
absl::StatusOr<ModelConfig> ParseModelConfigText(std::string_view text, std::string_view source);
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// The release (nested) form with quantization_config, as `k3 synth` writes it.
nlohmann::json ToReleaseConfigJson(const ModelConfig& config);

// The flat form (every field, flat key names), as the tiny fixtures spell it.
nlohmann::json ToFlatConfigJson(const ModelConfig& config);

// Applies `key=value` overrides by flat key name (e.g. "hidden_size=256",
// "full_attn_layers=4,8") and validates the result once.
absl::StatusOr<ModelConfig> ApplyConfigOverrides(
    const ModelConfig& config, const std::vector<std::pair<std::string, std::string>>& overrides);

}  // namespace k3
