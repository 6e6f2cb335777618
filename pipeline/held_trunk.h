// Pinned trunk matrices held compressed: when the memory plan pins layers of a compressed pack
// it cannot hold decoded as a whole (MemoryPlan::pinned_compressed), their compressed matrices
// stay in RAM as the pack stores them, about 0.7 of the decoded bytes, so that more of the
// trunk fits the budget and less streams. A product decodes such a matrix block by block into a
// per-thread scratch as it multiplies it, exactly as it does a streamed compressed piece
// (CompressedPieceMatMul): on one AVX-512 core that costs about what multiplying the decoded
// rows from memory does, since the rows never go through memory (docs/PERFORMANCE.md). Each
// block's checksum is checked on every use, so a bit flipped in memory or on disk fails the step
// rather than changing a token. Matrices used row by row (MLA's kv_b) are held decoded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/trunk_pack.h"
#include "core/model/weights.h"
#include "io/aligned_buffer.h"
#include "io/reads.h"
#include "pipeline/step_metrics.h"

namespace k3 {

class HeldTrunk : public PieceSource {
 public:
  // Reads the stored blocks of `tensors` (each compressed in `pack`) from the pack file into
  // memory, one O_DIRECT read per tensor; `progress(done, total)` in bytes after each.
  static absl::StatusOr<std::unique_ptr<HeldTrunk>> Load(
      const TrunkPack& pack, const std::vector<const TensorInfo*>& tensors, io::Reads& reads,
      io::FileId pack_file, const std::function<void(uint64_t, uint64_t)>& progress);
  // The memory holding a compressed matrix takes (the memory plan counts it so).
  static uint64_t MemoryFor(const PackedTensor& packed);

  bool Holds(const TensorInfo& tensor) const { return index_.contains(&tensor); }
  // The handle of a held matrix: one piece, all of its blocks.
  Matrix Handle(const TensorInfo& tensor);

  absl::StatusOr<RowPiece> AcquirePiece(int64_t index, PieceForm form) override;
  absl::Status DecodeBlock(int64_t index, size_t block, std::span<uint8_t> out) override;
  void ReleasePiece(int64_t) override {}
  absl::Status TakeError() override;

  // Adds the decode time and the pieces multiplied since the last call to `m`.
  void TakeMetrics(StepMetrics& m);

 private:
  struct Held {
    const TensorInfo* tensor = nullptr;
    const PackedTensor* packed = nullptr;
    uint64_t offset = 0, length = 0;       // the blocks' span in the pack file
    std::span<const uint8_t> stored = {};  // those bytes, once read
    std::vector<size_t> block_row_begin = {};
  };
  HeldTrunk() = default;

  std::vector<Held> held_;
  absl::flat_hash_map<const TensorInfo*, int64_t> index_;
  std::unique_ptr<io::BufferArena> arena_;
  std::string pack_path_;

  std::mutex mu_;
  absl::Status error_;
  double decode_seconds_ = 0;  // summed over threads
  uint64_t multiplied_ = 0;    // pieces, since the last TakeMetrics
};

}  // namespace k3
