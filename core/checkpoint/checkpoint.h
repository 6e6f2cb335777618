// A checkpoint directory as released: config.json plus one model.safetensors or shards listed
// by model.safetensors.index.json. Opening it parses and checks every header and that every
// tensor the config needs is present with the right shape; nothing is converted.
//
// The release has 497,052 language-model tensors, 494,592 of them routed-expert parts with
// names and shapes that the config determines. Those are kept only as each expert's spans
// (ExpertLocation) and made into TensorInfo on request; every other tensor is kept as it is.
// The index of the full model then costs ~10 MB instead of ~200 MB (docs/CHECKPOINT.md).
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <iterator>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/node_hash_map.h"
#include "absl/status/statusor.h"
#include "core/checkpoint/config.h"
#include "core/checkpoint/safetensors.h"
#include "core/checkpoint/tensor_names.h"
#include "io/file.h"

namespace k3 {

class JsonReader;

struct ByteSpan {
  int shard = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
};

// Where one routed expert's six tensors live: one span when they tile one byte range (as
// released, or in any other order), else up to six, in file order. `part_offset[i]` is where
// part i (kExpertParts order) starts in the concatenation of the spans; part i + 1 need not
// follow it, so a part's end is part_offset[i] + Checkpoint::PartBytes(i).
struct ExpertLocation {
  std::vector<ByteSpan> spans;
  std::array<uint64_t, 6> part_offset{};
  uint64_t total_bytes = 0;
  bool contiguous() const { return spans.size() == 1; }
};

class Checkpoint {
 public:
  // Every tensor: the ones kept as listed (trunk, vision, anything else), then each routed
  // expert's six parts by layer, expert and part, made as they are visited.
  class TensorList {
   public:
    class iterator {
     public:
      using iterator_category = std::input_iterator_tag;
      using value_type = TensorInfo;
      using difference_type = std::ptrdiff_t;
      using pointer = void;
      using reference = TensorInfo;
      iterator(const Checkpoint* c, size_t i) : c_(c), i_(i) {}
      TensorInfo operator*() const { return c_->TensorAt(i_); }
      iterator& operator++() {
        ++i_;
        return *this;
      }
      bool operator==(const iterator& o) const { return i_ == o.i_; }

     private:
      const Checkpoint* c_;
      size_t i_;
    };
    explicit TensorList(const Checkpoint* c) : c_(c) {}
    iterator begin() const { return {c_, 0}; }
    iterator end() const { return {c_, size()}; }
    size_t size() const { return c_->listed_.size() + c_->expert_part_count_; }

   private:
    const Checkpoint* c_;
  };

  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const TensorNames& names() const { return names_; }
  const std::vector<std::string>& shard_paths() const { return shard_paths_; }
  TensorList tensors() const { return TensorList(this); }
  uint64_t total_bytes() const;

  // Any tensor by its full name (an expert part's TensorInfo is made on first request and kept).
  const TensorInfo* Find(std::string_view full_name) const;
  const ExpertLocation& expert(int64_t layer, int64_t e) const {
    return experts_[layer * config_.num_experts + e];
  }
  // The bytes of an expert's part i (kExpertParts order), the same for every expert.
  uint64_t PartBytes(int part) const;

  // Reads a (small) tensor's bytes; for trunk tensors and tools, not the streaming path.
  absl::Status ReadTensor(const TensorInfo& tensor, std::span<uint8_t> out) const;
  // A large tensor read past the page cache into `buffer` (RandomAccessFile::ReadDirect: 4 KiB
  // aligned, BufferBytesFor its range); returns where its bytes landed.
  absl::StatusOr<std::span<const uint8_t>> ReadTensorDirect(const TensorInfo& tensor,
                                                            std::span<uint8_t> buffer) const;
  // Reads a byte span of a shard (out.size() == span.length).
  absl::Status ReadSpan(const ByteSpan& span, std::span<uint8_t> out) const;
  // Reads a float tensor (BF16, F16 or F32) widened to fp32.
  absl::StatusOr<std::vector<float>> ReadTensorAsFloat(const TensorInfo& tensor) const;

 private:
  class HeaderSink;
  struct IndexScan;

  Checkpoint() : names_("") {}
  absl::Status LoadShards();
  absl::Status ScanIndex(const std::string& path, JsonReader& reader, IndexScan& index);
  absl::Status CheckIndex(const std::string& path, const IndexScan& index,
                          std::span<const int> shard_of_file) const;
  // Files a header's tensor: in its expert slot when it is a part of the expected form,
  // else as listed. Names seen twice are refused here.
  absl::Status AddTensor(std::string_view name, DType dtype, std::span<const int64_t> shape,
                         int shard, uint64_t offset, uint64_t size);
  absl::Status Duplicate(std::string_view name, int first_shard, int second_shard) const;
  void KeepExpertsUnder(const std::string& prefix);
  absl::Status CheckTensors();
  void LocateExperts();
  size_t Slot(int64_t layer, int64_t e, int part) const {
    return static_cast<size_t>((layer * config_.num_experts + e) * 6 + part);
  }
  // The slot of an expert part under `prefix`, or -1 when it has none (layer or expert out
  // of range, another prefix).
  int64_t SlotOf(const ExpertName& name, std::string_view prefix) const;
  // SlotOf() under the prefix of expert parts, which the first part-like name sets.
  int64_t NoteExpertName(std::string_view name, ExpertName* n);
  TensorInfo ExpertPart(int64_t layer, int64_t e, int part) const;
  TensorInfo TensorAt(size_t i) const;
  const TensorInfo* FindListed(std::string_view full_name) const;

  std::string dir_;
  ModelConfig config_;
  TensorNames names_;
  std::vector<std::string> shard_paths_;
  std::vector<std::unique_ptr<io::RandomAccessFile>> files_;
  // A deque, so that the names stay where they are while by_name_ refers to them.
  std::deque<TensorInfo> listed_;
  absl::flat_hash_map<std::string_view, size_t> by_name_;
  std::vector<ExpertLocation> experts_;  // [layer * num_experts + e]; empty for dense layers
  std::array<std::vector<int64_t>, 6> part_shape_;  // what every expert's part i must be
  size_t expert_part_count_ = 0;
  size_t listed_expert_names_ = 0;  // listed tensors named like a part (wrong dtype or shape)

  // While opening: the shard of each expert part (-1: not seen), with its absolute offset
  // kept in part_offset until LocateExperts() makes it relative.
  std::vector<int32_t> part_shard_;
  std::string expert_prefix_;  // the prefix of the parts held in slots
  bool expert_prefix_set_ = false;

  mutable std::mutex made_mu_;
  mutable absl::node_hash_map<std::string, TensorInfo> made_;  // Find() of expert parts
};

}  // namespace k3
