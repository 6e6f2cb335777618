#include "core/checkpoint/tensor_names.h"

#include <algorithm>
#include <utility>

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

namespace {

// "<prefix>model.layers.<L>.<suffix>"; a routed expert's suffix is "block_sparse_moe.experts.
// <E>.<part>".
constexpr char kLayers[] = "model.layers.";
constexpr char kExperts[] = ".block_sparse_moe.experts.";

}  // namespace

std::string TensorNames::Global(std::string_view suffix) const {
  return absl::StrCat(prefix_, std::string(suffix));
}

std::string TensorNames::Layer(int64_t layer, std::string_view suffix) const {
  return absl::StrCat(prefix_, kLayers, layer, ".", std::string(suffix));
}

std::string TensorNames::Expert(int64_t layer, int64_t expert, int part) const {
  return absl::StrCat(prefix_, kLayers, layer, kExperts, expert, ".", kExpertParts[part]);
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
  constexpr std::string_view kRelease = tensor_name::kReleasePrefix;
  std::string_view s = name;
  out->prefix = TakePrefix(s, kRelease) ? name.substr(0, kRelease.size()) : name.substr(0, 0);
  if (!TakePrefix(s, kLayers) || !TakeNumber(s, &out->layer) || !TakePrefix(s, kExperts) ||
      !TakeNumber(s, &out->expert) || !TakePrefix(s, ".")) {
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
namespace tn = tensor_name;

void AddKda(const ModelConfig& c, int64_t l, SpecList& s) {
  const int64_t d = c.hidden_size, p = c.kda_width(), dh = c.kda_head_dim;
  const TensorGroup a = TensorGroup::kAttention;
  for (const auto& [proj, conv] :
       {std::pair{tn::kKdaQ, tn::kKdaQConv}, std::pair{tn::kKdaK, tn::kKdaKConv},
        std::pair{tn::kKdaV, tn::kKdaVConv}}) {
    s.Layer(l, proj, {p, d}, kMat, a);
    s.Layer(l, conv, {p, 1, c.short_conv_kernel_size}, kVec, a);
  }
  s.Layer(l, tn::kKdaFA, {dh, d}, kMat, a);
  s.Layer(l, tn::kKdaFB, {p, dh}, kMat, a);
  s.Layer(l, tn::kKdaB, {c.kda_num_heads, d}, kMat, a);
  s.Layer(l, tn::kKdaALog, {c.kda_num_heads}, kVec, a);
  s.Layer(l, tn::kKdaDtBias, {p}, kVec, a);
  s.Layer(l, tn::kKdaONorm, {dh}, kVec, a);
  s.Layer(l, tn::kAttnGate, {p, d}, kMat, a);
  s.Layer(l, tn::kAttnOut, {d, p}, kMat, a);
}

void AddMla(const ModelConfig& c, int64_t l, SpecList& s) {
  const int64_t d = c.hidden_size, h = c.num_attention_heads;
  const TensorGroup a = TensorGroup::kAttention;
  s.Layer(l, tn::kMlaQA, {c.q_lora_rank, d}, kMat, a);
  s.Layer(l, tn::kMlaQANorm, {c.q_lora_rank}, kVec, a);
  s.Layer(l, tn::kMlaQB, {h * c.mla_q_head_dim(), c.q_lora_rank}, kMat, a);
  s.Layer(l, tn::kMlaKvA, {c.kv_lora_rank + c.qk_rope_head_dim, d}, kMat, a);
  s.Layer(l, tn::kMlaKvANorm, {c.kv_lora_rank}, kVec, a);
  s.Layer(l, tn::kMlaKvB, {h * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, kMat, a);
  if (c.mla_use_output_gate) s.Layer(l, tn::kAttnGate, {h * c.v_head_dim, d}, kMat, a);
  s.Layer(l, tn::kAttnOut, {d, h * c.v_head_dim}, kMat, a);
}

void AddFfn(const ModelConfig& c, int64_t l, SpecList& s) {
  const int64_t d = c.hidden_size;
  if (c.is_dense(l)) {
    const int64_t i = c.intermediate_size;
    s.Layer(l, tn::kDenseGate, {i, d}, kMat, TensorGroup::kDenseFfn);
    s.Layer(l, tn::kDenseUp, {i, d}, kMat, TensorGroup::kDenseFfn);
    s.Layer(l, tn::kDenseDown, {d, i}, kMat, TensorGroup::kDenseFfn);
    return;
  }
  const int64_t e = c.num_experts, lat = c.routed_expert_hidden_size;
  s.Layer(l, tn::kRouter, {e, d}, kMat, TensorGroup::kRouter);
  s.Layer(l, tn::kRouterBias, {e}, kVec, TensorGroup::kRouter);
  s.Layer(l, tn::kLatentDown, {lat, d}, kMat, TensorGroup::kLatentProjection);
  s.Layer(l, tn::kLatentNorm, {lat}, kVec, TensorGroup::kLatentProjection);
  s.Layer(l, tn::kLatentUp, {d, lat}, kMat, TensorGroup::kLatentProjection);
  if (c.num_shared_experts > 0) {
    const int64_t w = c.shared_width();
    s.Layer(l, tn::kSharedGate, {w, d}, kMat, TensorGroup::kSharedExpert);
    s.Layer(l, tn::kSharedUp, {w, d}, kMat, TensorGroup::kSharedExpert);
    s.Layer(l, tn::kSharedDown, {d, w}, kMat, TensorGroup::kSharedExpert);
  }
}

}  // namespace

std::vector<TensorSpec> TrunkTensorSpecs(const ModelConfig& c, const TensorNames& names) {
  std::vector<TensorSpec> out;
  SpecList s(names, out);
  const int64_t d = c.hidden_size;
  s.Global(tn::kEmbedding, {c.vocab_size, d}, kMat, TensorGroup::kEmbedding);
  s.Global(tn::kFinalNorm, {d}, kVec, TensorGroup::kNorm);
  s.Global(tn::kOutputResNorm, {d}, kVec, TensorGroup::kNorm);
  s.Global(tn::kOutputResProj, {1, d}, kVec, TensorGroup::kNorm);
  s.Global(tn::kLmHead, {c.vocab_size, d}, kMat, TensorGroup::kLmHead);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    for (std::string_view norm :
         {tn::kInputNorm, tn::kPostAttentionNorm, tn::kAttnResNorm, tn::kMlpResNorm}) {
      s.Layer(l, norm, {d}, kVec, TensorGroup::kNorm);
    }
    s.Layer(l, tn::kAttnResProj, {1, d}, kVec, TensorGroup::kNorm);
    s.Layer(l, tn::kMlpResProj, {1, d}, kVec, TensorGroup::kNorm);
    if (c.attention_kind(l) == AttentionKind::kKda) {
      AddKda(c, l, s);
    } else {
      AddMla(c, l, s);
    }
    AddFfn(c, l, s);
  }
  for (TensorSpec& spec : out) {
    spec.shape_is_minimum = spec.name.ends_with(tn::kKdaALog);
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
