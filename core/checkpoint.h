// A checkpoint directory as released: config.json plus one model.safetensors or shards listed
// by model.safetensors.index.json. Opening it parses and checks every header and that every
// tensor the config needs is present with the right shape; nothing is converted.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/config.h"
#include "core/safetensors.h"
#include "core/tensor_names.h"
#include "io/file.h"

namespace k3 {

struct ByteSpan {
  int shard = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Where one routed expert's six tensors live: one span when they are adjacent (as released),
// else six. `part_offset[i]` is where part i (kExpertParts order) starts in the concatenation.
struct ExpertLocation {
  std::vector<ByteSpan> spans;
  std::array<uint64_t, 6> part_offset{};
  uint64_t total_bytes = 0;
  bool contiguous() const { return spans.size() == 1; }
};

class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const TensorNames& names() const { return names_; }
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }
  // Every tensor, sorted by shard and offset.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  uint64_t total_bytes() const;

  const TensorInfo* Find(std::string_view full_name) const;
  const ExpertLocation& expert(int64_t layer, int64_t e) const {
    return experts_[layer * config_.num_experts + e];
  }

  // Reads a (small) tensor's bytes; for trunk tensors and tools, not the streaming path.
  absl::Status ReadTensor(const TensorInfo& tensor, std::span<uint8_t> out) const;
  // Reads a byte span of a shard (out.size() == span.length).
  absl::Status ReadSpan(const ByteSpan& span, std::span<uint8_t> out) const;
  // Reads a float tensor (BF16, F16 or F32) widened to fp32.
  absl::StatusOr<std::vector<float>> ReadTensorAsFloat(const TensorInfo& tensor) const;

 private:
  Checkpoint() : names_("") {}
  absl::Status LoadShards();
  absl::Status CheckTensors();
  absl::Status LocateExperts();

  std::string dir_;
  ModelConfig config_;
  TensorNames names_;
  std::vector<std::string> shard_paths_;
  std::vector<std::unique_ptr<io::RandomAccessFile>> files_;
  std::vector<TensorInfo> tensors_;
  absl::flat_hash_map<std::string, size_t> by_name_;
  std::vector<ExpertLocation> experts_;  // [layer * num_experts + e]; empty for dense layers
};

}  // namespace k3
