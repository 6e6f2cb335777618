// The trunk streamer: the trunk matrices the memory plan does not keep resident (those of the
// streamed layers, the routers when they are not resident, lm_head when it is not) are read
// piece by piece into a ring of equal slots, in the order the forward pass multiplies them
// (LayerMatrixOrder, lm_head last), and around again for the next token. A piece is up to the
// plan's piece size of consecutive rows of one matrix (a matrix used row by row is one piece),
// so the ring costs a few pieces, not two whole layers. While a product uses one piece, the
// next ones load into the other slots; releasing a piece frees its slot for the next one in
// line. A matrix's pieces come from the trunk pack when it holds the matrix, else from the
// shards; a piece of a compressed matrix is whole blocks, each checked and decoded by the
// piece's user: a product takes the blocks and decodes each into a per-thread scratch as it
// multiplies it (DecodeBlock), so the decoded rows never pass through memory; a row-by-row user
// (of a one-piece matrix) has the piece decoded whole into one of kDecodeBuffers decode buffers.
// (A decoder thread that decoded pieces ahead of use was measured against this: no faster where
// the disk is the limit, 1.2-1.35x slower on a fast host-cached disk, since it writes and reads
// back every decoded byte and takes a core from the products; see docs/PERFORMANCE.md.) F16
// pieces are widened to fp32 by their user. When the embedding is not resident, the rows a
// token needs are read on demand, kEmbeddingRowsPerRead at a time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/trunk_pack.h"
#include "core/model/model.h"
#include "core/model/weights.h"
#include "io/aligned_buffer.h"
#include "io/reads.h"
#include "pipeline/busy_clock.h"
#include "pipeline/memory_plan.h"
#include "pipeline/step_metrics.h"

namespace k3 {

class TrunkStreamer : public LayerSource, public PieceSource {
 public:
  // The pieces of what `plan` streams; `pack` may be null; `shard_files` are the reads'
  // ids of the shards, `pack_file` of the pack (or -1). Reads of the first pieces start at once.
  static absl::StatusOr<std::unique_ptr<TrunkStreamer>> Create(
      const Checkpoint& ckpt, const MemoryPlan& plan, const TrunkPack* pack, io::Reads& reads,
      std::vector<io::FileId> shard_files, io::FileId pack_file, BusyClock& disk);
  // Waits for reads still landing in the ring.
  ~TrunkStreamer() override;

  // The handle of a streamed matrix (TrunkResidency::stream).
  Matrix Handle(const TensorInfo& tensor);
  // The weights, built with these handles; before the first token.
  void Attach(const TrunkWeights& trunk) { trunk_ = &trunk; }
  // Another source of the layers' matrices (the pinned ones held compressed) whose errors
  // TakeError reports too: the model asks this streamer, its LayerSource, after each layer.
  void ReportErrorsOf(PieceSource* other) { other_ = other; }

  absl::StatusOr<const LayerWeights*> AcquireLayer(int64_t layer) override;
  void ReleaseLayer(int64_t) override {}
  absl::Status Embed(std::span<const int32_t> ids, std::span<float> out) override;

  absl::StatusOr<RowPiece> AcquirePiece(int64_t index, PieceForm form) override;
  absl::Status DecodeBlock(int64_t index, size_t block, std::span<uint8_t> out) override;
  void ReleasePiece(int64_t index) override;
  absl::Status TakeError() override;

  // Adds trunk bytes read and time waited since the last call to `m`.
  void TakeMetrics(StepMetrics& m);
  int64_t pieces() const { return static_cast<int64_t>(pieces_.size()); }
  // Pieces asked for before the ring had read them in order (a product order that differs from
  // LayerMatrixOrder, or a pass cut short by an error): each costs a read the ring did not
  // overlap. Zero in a healthy run.
  int64_t out_of_order() const;

 private:
  struct Piece {
    const TensorInfo* tensor = nullptr;
    io::FileId file = -1;
    uint64_t offset = 0, length = 0;  // in the file
    size_t row_begin = 0, rows = 0, cols = 0;
    // A compressed piece: blocks [block_begin, block_end) of `packed`.
    const PackedTensor* packed = nullptr;
    size_t block_begin = 0, block_end = 0;
    std::vector<size_t> block_row_begin = {};  // RowPiece::block_row_begin
    // The matrix's only piece: only such a piece may be used whole (row by row, WholeMatrix), so
    // the decode buffers are sized for those.
    bool whole_matrix = false;
  };
  enum class SlotState { kFree, kLoading, kReady, kInUse, kFailed };
  struct Slot {
    int64_t piece = -1;
    SlotState state = SlotState::kFree;
    absl::Status status;
    std::span<uint8_t> memory;      // the ring's memory the piece is read into
    std::span<const uint8_t> data;  // the piece's bytes, once loaded
    std::vector<float> widened;     // F16 pieces, widened to fp32
    std::span<uint8_t> decoded;     // a compressed piece used whole: its decode buffer
  };

  TrunkStreamer(const Checkpoint& ckpt, io::Reads& reads, std::vector<io::FileId> shard_files,
                BusyClock& disk)
      : ckpt_(ckpt), reads_(reads), shard_files_(std::move(shard_files)), disk_(disk) {}

  void AddPieces(const TensorInfo& t, bool whole, uint64_t piece_bytes, const TrunkPack* pack,
                 io::FileId pack_file);
  Slot* SlotOf(int64_t piece);
  Slot* FreeSlot();  // a free ring slot
  void FreeSlotLocked(Slot& slot);
  void StartRead(Slot& slot, int64_t piece);
  void ScheduleAheadLocked();
  void OnRead(Slot& slot, io::ReadResult result);
  absl::StatusOr<RowPiece> View(Slot& slot);
  // Checks block `block` of the piece and decodes it into `out` (its rows).
  absl::Status DecodeOneBlock(const Piece& p, size_t block, std::span<const uint8_t> stored,
                              std::span<uint8_t> out) const;
  // Checks and decodes the piece's blocks into `out`, in parallel.
  absl::Status DecodeWhole(const Piece& p, std::span<const uint8_t> stored, std::span<uint8_t> out);
  absl::Status ReadEmbeddingRows(std::span<const int32_t> ids, std::span<float> out);

  const Checkpoint& ckpt_;
  io::Reads& reads_;
  const std::vector<io::FileId> shard_files_;
  BusyClock& disk_;
  const TrunkWeights* trunk_ = nullptr;
  PieceSource* other_ = nullptr;
  std::vector<Piece> pieces_;  // every streamed piece of one pass, in the order of use
  absl::flat_hash_map<const TensorInfo*, std::pair<int64_t, int64_t>> by_tensor_;  // first, count
  uint64_t slot_bytes_ = 0;     // the read part of a slot
  uint64_t decoded_bytes_ = 0;  // one decode buffer (0 without compressed one-piece matrices)
  std::unique_ptr<io::BufferArena> decode_arena_;
  std::string pack_path_;
  std::unique_ptr<io::BufferArena> arena_;
  std::unique_ptr<io::BufferArena> embedding_rows_;  // kEmbeddingRowsPerRead row buffers

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::unique_ptr<Slot>> slots_;
  // Decode buffers for compressed pieces used whole (never more than kDecodeBuffers at once).
  std::vector<std::span<uint8_t>> free_decode_buffers_;
  int64_t next_ = 0;  // the next piece to read ahead
  int reads_in_flight_ = 0;
  absl::Status error_;
  int64_t out_of_order_ = 0;
  int64_t out_of_order_reported_ = 0;
  uint64_t bytes_read_ = 0;
  double wait_seconds_ = 0;
  double decode_seconds_ = 0;                       // summed over threads
  uint64_t decoded_fused_ = 0, decoded_whole_ = 0;  // pieces, since the last TakeMetrics
};

}  // namespace k3
