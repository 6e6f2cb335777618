// Which tensors a Kimi K3 checkpoint must hold for a given config, with their shapes: the one
// place that knows tensor names (MODEL.md section 3.2).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/config.h"

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

// The six tensors of one routed expert, in the order the release stores them.
inline constexpr const char* kExpertParts[6] = {"w1.weight_packed", "w1.weight_scale",
                                                "w2.weight_packed", "w2.weight_scale",
                                                "w3.weight_packed", "w3.weight_scale"};

class TensorNames {
 public:
  // `prefix` is "language_model." for the release layout.
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
