// What a sequence carries from token to token (MODEL.md 2.8): per KDA layer the recurrent
// state S and the short-convolution history, per MLA layer the absorbed latent cache (the
// normalised 512-wide latent plus the 64-wide shared key part per position), and the tokens.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "core/checkpoint/config.h"

namespace k3 {

class SequenceState {
 public:
  explicit SequenceState(const ModelConfig& config);

  int64_t position() const { return static_cast<int64_t>(tokens_.size()); }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  void AppendTokens(std::span<const int32_t> ids) {
    tokens_.insert(tokens_.end(), ids.begin(), ids.end());
  }

  // KDA layer: S for all heads [heads, head_dim, head_dim]; conv history of q, k or v
  // (which = 0, 1, 2) [kernel - 1, channels].
  std::span<float> kda_state(int64_t layer) { return kda_state_[layer]; }
  std::span<float> conv_history(int64_t layer, int which) { return conv_[layer][which]; }
  // MLA layer: one row of latent_width() floats per position.
  std::vector<float>& mla_cache(int64_t layer) { return mla_cache_[layer]; }
  int64_t latent_width() const { return latent_width_; }

  uint64_t bytes() const;

  // The state as versioned bytes (magic, version, config fingerprint, tokens, every array with
  // its length), bit for bit: the same state always gives the same bytes.
  std::string Serialize() const;
  // The same bytes handed out piece by piece (a layer's array at a time), so that a writer of a
  // large state (465 MB at full size) need not hold a second copy of it.
  void SerializeTo(absl::FunctionRef<void(std::string_view)> out) const;
  uint64_t SerializedBytes() const;
  // Refused (DataLoss, or FailedPrecondition for another model) when the config fingerprint,
  // version or sizes do not match `config`; messages start with `where` (a file name).
  static absl::StatusOr<SequenceState> Deserialize(std::string_view bytes,
                                                   const ModelConfig& config,
                                                   std::string_view where);

  // Serialize() as a file, written atomically; Load reads it back through Deserialize().
  absl::Status Save(const std::string& path) const;
  static absl::StatusOr<SequenceState> Load(const std::string& path, const ModelConfig& config);

 private:
  std::string fingerprint_;
  int64_t latent_width_ = 0;
  std::vector<int32_t> tokens_;
  std::vector<std::vector<float>> kda_state_;            // [layer] (empty for MLA layers)
  std::vector<std::array<std::vector<float>, 3>> conv_;  // [layer][q, k, v]
  std::vector<std::vector<float>> mla_cache_;            // [layer] (empty for KDA layers)
};

}  // namespace k3
