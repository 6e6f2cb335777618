#include "core/tensor_names.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace k3 {

const char* TensorGroupName(TensorGroup group) {
  switch (group) {
    case TensorGroup::kEmbedding:
      return "embedding";
    case TensorGroup::kLmHead:
      return "lm_head";
    case TensorGroup::kNorm:
      return "norms and AttnRes";
    case TensorGroup::kAttention:
      return "attention";
    case TensorGroup::kDenseFfn:
      return "dense FFN";
    case TensorGroup::kRouter:
      return "router";
    case TensorGroup::kLatentProjection:
      return "latent projections";
    case TensorGroup::kSharedExpert:
      return "shared experts";
    case TensorGroup::kRoutedExpert:
      return "routed experts";
  }
  return "?";
}

std::string TensorNames::Global(std::string_view suffix) const {
  return absl::StrCat(prefix_, std::string(suffix));
}

std::string TensorNames::Layer(int64_t layer, std::string_view suffix) const {
  return absl::StrCat(prefix_, "model.layers.", layer, ".", std::string(suffix));
}

std::string TensorNames::Expert(int64_t layer, int64_t expert, int part) const {
  return absl::StrCat(prefix_, "model.layers.", layer, ".block_sparse_moe.experts.", expert, ".",
                      kExpertParts[part]);
}

namespace {

// A decimal number without sign or leading zeros, as StrCat writes it; advances `s`.
bool TakeNumber(std::string_view& s, int64_t* out) {
  size_t n = 0;
  int64_t v = 0;
  while (n < s.size() && n < 9 && s[n] >= '0' && s[n] <= '9') v = v * 10 + (s[n++] - '0');
  if (n == 0 || (n > 1 && s[0] == '0') || (n < s.size() && s[n] >= '0' && s[n] <= '9')) {
    return false;
  }
  s.remove_prefix(n);
  *out = v;
  return true;
}

bool TakePrefix(std::string_view& s, std::string_view prefix) {
  if (!s.starts_with(prefix)) return false;
  s.remove_prefix(prefix.size());
  return true;
}

}  // namespace

bool ParseExpertName(std::string_view name, ExpertName* out) {
  constexpr std::string_view kRelease = "language_model.";
  std::string_view s = name;
  out->prefix = TakePrefix(s, kRelease) ? name.substr(0, kRelease.size()) : name.substr(0, 0);
  if (!TakePrefix(s, "model.layers.") || !TakeNumber(s, &out->layer) ||
      !TakePrefix(s, ".block_sparse_moe.experts.") || !TakeNumber(s, &out->expert) ||
      !TakePrefix(s, ".")) {
    return false;
  }
  for (int part = 0; part < 6; ++part) {
    if (s == kExpertParts[part]) {
      out->part = part;
      return true;
    }
  }
  return false;
}

namespace {

class SpecList {
 public:
  SpecList(const TensorNames& names, std::vector<TensorSpec>& out) : names_(names), out_(out) {}
  void Global(std::string_view suffix, std::vector<int64_t> shape, TensorRole role,
              TensorGroup group) {
    out_.push_back({names_.Global(suffix), std::move(shape), role, group, -1});
  }
  void Layer(int64_t layer, std::string_view suffix, std::vector<int64_t> shape, TensorRole role,
             TensorGroup group) {
    out_.push_back(
        {names_.Layer(layer, suffix), std::move(shape), role, group, static_cast<int>(layer)});
  }

 private:
  const TensorNames& names_;
  std::vector<TensorSpec>& out_;
};

constexpr TensorRole kVec = TensorRole::kVector;
constexpr TensorRole kMat = TensorRole::kMatrix;

void AddKda(const ModelConfig& c, int64_t l, SpecList& s) {
  const int64_t d = c.hidden_size, p = c.kda_width(), dh = c.kda_head_dim;
  const TensorGroup a = TensorGroup::kAttention;
  for (const char* x : {"q", "k", "v"}) {
    s.Layer(l, absl::StrCat("self_attn.", x, "_proj.weight"), {p, d}, kMat, a);
    s.Layer(l, absl::StrCat("self_attn.", x, "_conv1d.weight"), {p, 1, c.short_conv_kernel_size},
            kVec, a);
  }
  s.Layer(l, "self_attn.f_a_proj.weight", {dh, d}, kMat, a);
  s.Layer(l, "self_attn.f_b_proj.weight", {p, dh}, kMat, a);
  s.Layer(l, "self_attn.b_proj.weight", {c.kda_num_heads, d}, kMat, a);
  s.Layer(l, "self_attn.A_log", {c.kda_num_heads}, kVec, a);
  s.Layer(l, "self_attn.dt_bias", {p}, kVec, a);
  s.Layer(l, "self_attn.o_norm.weight", {dh}, kVec, a);
  s.Layer(l, "self_attn.g_proj.weight", {p, d}, kMat, a);
  s.Layer(l, "self_attn.o_proj.weight", {d, p}, kMat, a);
}

void AddMla(const ModelConfig& c, int64_t l, SpecList& s) {
  const int64_t d = c.hidden_size, h = c.num_attention_heads;
  const TensorGroup a = TensorGroup::kAttention;
  s.Layer(l, "self_attn.q_a_proj.weight", {c.q_lora_rank, d}, kMat, a);
  s.Layer(l, "self_attn.q_a_layernorm.weight", {c.q_lora_rank}, kVec, a);
  s.Layer(l, "self_attn.q_b_proj.weight", {h * c.mla_q_head_dim(), c.q_lora_rank}, kMat, a);
  s.Layer(l, "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, d}, kMat,
          a);
  s.Layer(l, "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank}, kVec, a);
  s.Layer(l, "self_attn.kv_b_proj.weight",
          {h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, kMat, a);
  if (c.mla_use_output_gate) {
    s.Layer(l, "self_attn.g_proj.weight", {h * c.v_head_dim, d}, kMat, a);
  }
  s.Layer(l, "self_attn.o_proj.weight", {d, h * c.v_head_dim}, kMat, a);
}

void AddFfn(const ModelConfig& c, int64_t l, SpecList& s) {
  const int64_t d = c.hidden_size;
  if (c.is_dense(l)) {
    const int64_t i = c.intermediate_size;
    s.Layer(l, "mlp.gate_proj.weight", {i, d}, kMat, TensorGroup::kDenseFfn);
    s.Layer(l, "mlp.up_proj.weight", {i, d}, kMat, TensorGroup::kDenseFfn);
    s.Layer(l, "mlp.down_proj.weight", {d, i}, kMat, TensorGroup::kDenseFfn);
    return;
  }
  const int64_t e = c.num_experts, lat = c.routed_expert_hidden_size;
  s.Layer(l, "block_sparse_moe.gate.weight", {e, d}, kMat, TensorGroup::kRouter);
  s.Layer(l, "block_sparse_moe.gate.e_score_correction_bias", {e}, kVec, TensorGroup::kRouter);
  s.Layer(l, "block_sparse_moe.routed_expert_down_proj.weight", {lat, d}, kMat,
          TensorGroup::kLatentProjection);
  s.Layer(l, "block_sparse_moe.routed_expert_norm.weight", {lat}, kVec,
          TensorGroup::kLatentProjection);
  s.Layer(l, "block_sparse_moe.routed_expert_up_proj.weight", {d, lat}, kMat,
          TensorGroup::kLatentProjection);
  if (c.num_shared_experts > 0) {
    const int64_t w = c.shared_width();
    s.Layer(l, "block_sparse_moe.shared_experts.gate_proj.weight", {w, d}, kMat,
            TensorGroup::kSharedExpert);
    s.Layer(l, "block_sparse_moe.shared_experts.up_proj.weight", {w, d}, kMat,
            TensorGroup::kSharedExpert);
    s.Layer(l, "block_sparse_moe.shared_experts.down_proj.weight", {d, w}, kMat,
            TensorGroup::kSharedExpert);
  }
}

}  // namespace

std::vector<TensorSpec> TrunkTensorSpecs(const ModelConfig& c, const TensorNames& names) {
  std::vector<TensorSpec> out;
  SpecList s(names, out);
  const int64_t d = c.hidden_size;
  s.Global("model.embed_tokens.weight", {c.vocab_size, d}, kMat, TensorGroup::kEmbedding);
  s.Global("model.norm.weight", {d}, kVec, TensorGroup::kNorm);
  s.Global("model.output_attn_res_norm.weight", {d}, kVec, TensorGroup::kNorm);
  s.Global("model.output_attn_res_proj.weight", {1, d}, kVec, TensorGroup::kNorm);
  s.Global("lm_head.weight", {c.vocab_size, d}, kMat, TensorGroup::kLmHead);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (const char* n : {"input_layernorm.weight", "post_attention_layernorm.weight",
                          "self_attention_res_norm.weight", "mlp_res_norm.weight"}) {
      s.Layer(l, n, {d}, kVec, TensorGroup::kNorm);
    }
    s.Layer(l, "self_attention_res_proj.weight", {1, d}, kVec, TensorGroup::kNorm);
    s.Layer(l, "mlp_res_proj.weight", {1, d}, kVec, TensorGroup::kNorm);
    if (c.attention_kind(l) == AttentionKind::kKda) {
      AddKda(c, l, s);
    } else {
      AddMla(c, l, s);
    }
    AddFfn(c, l, s);
  }
  for (TensorSpec& spec : out) {
    spec.shape_is_minimum = spec.name.ends_with("self_attn.A_log");
  }
  return out;
}

std::vector<TensorSpec> ExpertTensorSpecs(const ModelConfig& c, const TensorNames& names,
                                          int64_t layer, int64_t expert) {
  const int64_t m = c.moe_intermediate_size, lat = c.routed_expert_hidden_size;
  // w1 (gate) and w3 (up): [m, lat]; w2 (down): [lat, m]. Packed: two weights a byte.
  const std::vector<int64_t> shapes[6] = {{m, lat / 2},  {m, lat / 32}, {lat, m / 2},
                                          {lat, m / 32}, {m, lat / 2},  {m, lat / 32}};
  std::vector<TensorSpec> out;
  for (int part = 0; part < 6; ++part) {
    out.push_back({names.Expert(layer, expert, part), shapes[part], TensorRole::kExpert,
                   TensorGroup::kRoutedExpert, static_cast<int>(layer)});
  }
  return out;
}

}  // namespace k3
