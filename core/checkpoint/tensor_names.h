// Which tensors a Kimi K3 checkpoint must hold for a given config, with their shapes, and their
// names: the one place that spells them (MODEL.md section 3.2).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/checkpoint/config.h"

namespace k3 {

enum class TensorRole {
  kVector,  // norms, AttnRes projections, conv kernels, A_log, dt_bias, router bias: any float
  kMatrix,  // projections, embedding, lm_head: BF16 in the release, any float accepted
  kExpert,  // routed expert MXFP4 bytes: U8
};

// What the tensor is for, for byte censuses (`k3 inspect`) and trunk planning.
enum class TensorGroup {
  kEmbedding,
  kLmHead,
  kNorm,
  kAttention,
  kDenseFfn,
  kRouter,
  kLatentProjection,
  kSharedExpert,
  kRoutedExpert
};

struct TensorSpec {
  std::string name;  // full name, with the checkpoint's prefix
  std::vector<int64_t> shape;
  TensorRole role;
  TensorGroup group;
  int layer;                      // -1 for global tensors
  bool shape_is_minimum = false;  // A_log: length >= heads (the release ships head_dim)
};

const char* TensorGroupName(TensorGroup group);

// The checkpoint's tensor names, spelled here and nowhere else: the global ones (for
// TensorNames::Global) and those of a layer (for TensorNames::Layer), without the prefix.
namespace tensor_name {

inline constexpr char kReleasePrefix[] = "language_model.";

inline constexpr char kEmbedding[] = "model.embed_tokens.weight";
inline constexpr char kFinalNorm[] = "model.norm.weight";
inline constexpr char kOutputResNorm[] = "model.output_attn_res_norm.weight";
inline constexpr char kOutputResProj[] = "model.output_attn_res_proj.weight";
inline constexpr char kLmHead[] = "lm_head.weight";

// Every layer: its norms and AttnRes projections.
inline constexpr char kInputNorm[] = "input_layernorm.weight";
inline constexpr char kPostAttentionNorm[] = "post_attention_layernorm.weight";
inline constexpr char kAttnResNorm[] = "self_attention_res_norm.weight";
inline constexpr char kAttnResProj[] = "self_attention_res_proj.weight";
inline constexpr char kMlpResNorm[] = "mlp_res_norm.weight";
inline constexpr char kMlpResProj[] = "mlp_res_proj.weight";

// Attention, both kinds: the output gate and projection.
inline constexpr char kAttnGate[] = "self_attn.g_proj.weight";
inline constexpr char kAttnOut[] = "self_attn.o_proj.weight";
// KDA attention.
inline constexpr char kKdaQ[] = "self_attn.q_proj.weight";
inline constexpr char kKdaK[] = "self_attn.k_proj.weight";
inline constexpr char kKdaV[] = "self_attn.v_proj.weight";
inline constexpr char kKdaQConv[] = "self_attn.q_conv1d.weight";
inline constexpr char kKdaKConv[] = "self_attn.k_conv1d.weight";
inline constexpr char kKdaVConv[] = "self_attn.v_conv1d.weight";
inline constexpr char kKdaFA[] = "self_attn.f_a_proj.weight";
inline constexpr char kKdaFB[] = "self_attn.f_b_proj.weight";
inline constexpr char kKdaB[] = "self_attn.b_proj.weight";
inline constexpr char kKdaALog[] = "self_attn.A_log";
inline constexpr char kKdaDtBias[] = "self_attn.dt_bias";
inline constexpr char kKdaONorm[] = "self_attn.o_norm.weight";
// MLA attention.
inline constexpr char kMlaQA[] = "self_attn.q_a_proj.weight";
inline constexpr char kMlaQANorm[] = "self_attn.q_a_layernorm.weight";
inline constexpr char kMlaQB[] = "self_attn.q_b_proj.weight";
inline constexpr char kMlaKvA[] = "self_attn.kv_a_proj_with_mqa.weight";
inline constexpr char kMlaKvANorm[] = "self_attn.kv_a_layernorm.weight";
inline constexpr char kMlaKvB[] = "self_attn.kv_b_proj.weight";

// Dense layers' FFN.
inline constexpr char kDenseGate[] = "mlp.gate_proj.weight";
inline constexpr char kDenseUp[] = "mlp.up_proj.weight";
inline constexpr char kDenseDown[] = "mlp.down_proj.weight";
// MoE layers: router, latent projections, shared experts.
inline constexpr char kRouter[] = "block_sparse_moe.gate.weight";
inline constexpr char kRouterBias[] = "block_sparse_moe.gate.e_score_correction_bias";
inline constexpr char kLatentDown[] = "block_sparse_moe.routed_expert_down_proj.weight";
inline constexpr char kLatentNorm[] = "block_sparse_moe.routed_expert_norm.weight";
inline constexpr char kLatentUp[] = "block_sparse_moe.routed_expert_up_proj.weight";
inline constexpr char kSharedGate[] = "block_sparse_moe.shared_experts.gate_proj.weight";
inline constexpr char kSharedUp[] = "block_sparse_moe.shared_experts.up_proj.weight";
inline constexpr char kSharedDown[] = "block_sparse_moe.shared_experts.down_proj.weight";

}  // namespace tensor_name

// The six tensors of one routed expert, in the order the release stores them.
inline constexpr const char* kExpertParts[6] = {"w1.weight_packed", "w1.weight_scale",
                                                "w2.weight_packed", "w2.weight_scale",
                                                "w3.weight_packed", "w3.weight_scale"};

class TensorNames {
 public:
  // `prefix` is tensor_name::kReleasePrefix for the release layout.
  explicit TensorNames(std::string prefix) : prefix_(std::move(prefix)) {}
  const std::string& prefix() const { return prefix_; }
  std::string Global(std::string_view suffix) const;  // e.g. "model.norm.weight"
  std::string Layer(int64_t layer, std::string_view suffix) const;
  std::string Expert(int64_t layer, int64_t expert, int part) const;

 private:
  std::string prefix_;
};

// A routed-expert part's name taken apart: "<prefix>model.layers.<L>.block_sparse_moe.experts.
// <E>.<part>" with a prefix TensorNames can have ("" or "language_model."), L and E in canonical
// decimal (what TensorNames::Expert() writes) and part one of kExpertParts.
struct ExpertName {
  std::string_view prefix;
  int64_t layer = 0;
  int64_t expert = 0;
  int part = 0;
};
bool ParseExpertName(std::string_view name, ExpertName* out);

// Every tensor of the trunk (everything but routed experts), global ones first, then per layer.
std::vector<TensorSpec> TrunkTensorSpecs(const ModelConfig& config, const TensorNames& names);
// The six specs of one routed expert.
std::vector<TensorSpec> ExpertTensorSpecs(const ModelConfig& config, const TensorNames& names,
                                          int64_t layer, int64_t expert);

}  // namespace k3
