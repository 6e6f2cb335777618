// The trunk streamer: the trunk matrices the memory plan does not keep resident (those of the
// streamed layers, the routers when they are not resident, lm_head) are read piece by piece into
// a ring of equal slots, in the order the forward pass multiplies them (LayerMatrixOrder), and
// around again for the next token. A piece is up to the plan's piece size of consecutive rows of
// one matrix, so the ring costs a few pieces, not two whole layers. While a product uses one
// piece, the next ones load into the other slots; releasing a piece frees its slot for the next
// one in line. Pieces come from the trunk pack when there is one, else from the shards; a piece
// of a compressed pack is whole blocks, each checked and decoded: ahead of use by the streamer's
// decoder thread, after which the piece moves out of the ring into its decode buffer so that its
// slot reads the next piece at once (the decode-ahead buffers deepen the ring); or, if the
// decoder has not got to it, by its user: a product takes the blocks and decodes each as it
// multiplies it (DecodeBlock), a row-by-row user has the piece decoded whole. When the embedding
// is not resident, the rows a token needs are read on demand.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "core/checkpoint.h"
#include "core/model/model.h"
#include "core/model/weights.h"
#include "core/trunk_pack.h"
#include "io/aligned_buffer.h"
#include "io/read_engine.h"
#include "pipeline/busy_clock.h"
#include "pipeline/engine.h"
#include "pipeline/memory_plan.h"

namespace k3 {

class TrunkStreamer : public LayerSource, public PieceSource {
 public:
  // The pieces of what `plan` streams; `pack` may be null; `shard_files` are the read engine's
  // ids of the shards, `pack_file` of the pack (or -1). Reads of the first pieces start at once.
  static absl::StatusOr<std::unique_ptr<TrunkStreamer>> Create(
      const Checkpoint& ckpt, const MemoryPlan& plan, const TrunkPack* pack, io::ReadEngine& engine,
      std::vector<io::FileId> shard_files, io::FileId pack_file, BusyClock& disk);
  // Stops the decoder and waits for reads still landing in the ring.
  ~TrunkStreamer() override;

  // The handle of a streamed matrix (TrunkResidency::stream).
  Matrix Handle(const TensorInfo& tensor);
  // The weights, built with these handles; before the first token.
  void Attach(const TrunkWeights& trunk) { trunk_ = &trunk; }

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
  };
  // kDecoding: a compressed piece read and being decoded ahead of its use by the decoder.
  enum class SlotState { kFree, kLoading, kReady, kDecoding, kInUse, kFailed };
  // A ring slot reads into `memory`. The kDecodeAheadBuffers slots without memory hold pieces
  // decoded ahead (kReady, then kInUse), moved there from the ring slots they were read into.
  struct Slot {
    int64_t piece = -1;
    SlotState state = SlotState::kFree;
    absl::Status status;
    std::span<uint8_t> memory;      // empty: a slot for a piece decoded ahead
    std::span<const uint8_t> data;  // the piece's bytes, once loaded
    std::vector<float> widened;     // F16 pieces, widened to fp32
    std::span<uint8_t> decoded;     // compressed pieces: a decode buffer, while in use
    bool ahead_buffer = false;      // `decoded` came from the decode-ahead pool
    bool is_decoded = false;        // `decoded` holds the piece
  };

  TrunkStreamer(const Checkpoint& ckpt, io::ReadEngine& engine, std::vector<io::FileId> shard_files,
                BusyClock& disk)
      : ckpt_(ckpt), engine_(engine), shard_files_(std::move(shard_files)), disk_(disk) {}

  void AddPieces(const TensorInfo& t, bool whole, uint64_t piece_bytes, const TrunkPack* pack,
                 io::FileId pack_file);
  Slot* SlotOf(int64_t piece);
  Slot* FreeSlot();  // a free ring slot
  void MoveDecodedOutOfRingLocked(Slot& slot);
  void FreeSlotLocked(Slot& slot);
  void DropDecodedLocked(Slot& slot);
  Slot* NextToDecodeLocked();
  void DecoderLoop();
  void StartRead(Slot& slot, int64_t piece);
  void ScheduleAheadLocked();
  void OnRead(Slot& slot, io::ReadResult result);
  absl::StatusOr<RowPiece> View(Slot& slot);
  // Checks block `block` of the piece and decodes it into `out` (its rows).
  absl::Status DecodeOneBlock(const Piece& p, size_t block, std::span<const uint8_t> stored,
                              std::span<uint8_t> out) const;
  // Checks and decodes the piece's blocks into `out`; `ahead`: on the decoder thread, before its
  // use, one block after another (on use, the blocks are decoded in parallel).
  absl::Status Decode(const Piece& p, std::span<const uint8_t> stored, std::span<uint8_t> out,
                      bool ahead);
  absl::Status ReadEmbeddingRows(std::span<const int32_t> ids, std::span<float> out);

  const Checkpoint& ckpt_;
  io::ReadEngine& engine_;
  const std::vector<io::FileId> shard_files_;
  BusyClock& disk_;
  const TrunkWeights* trunk_ = nullptr;
  std::vector<Piece> pieces_;  // every streamed piece of one pass, in the order of use
  absl::flat_hash_map<const TensorInfo*, std::pair<int64_t, int64_t>> by_tensor_;  // first, count
  uint64_t slot_bytes_ = 0;     // the read part of a slot
  uint64_t decoded_bytes_ = 0;  // one decode buffer (0 without compressed pieces)
  std::unique_ptr<io::BufferArena> decode_arena_;
  std::string pack_path_;
  std::unique_ptr<io::BufferArena> arena_;
  std::unique_ptr<io::BufferArena> embedding_rows_;  // kEmbeddingRowsPerRead row buffers

  mutable std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::unique_ptr<Slot>> slots_;
  // Decode buffers: those for a piece decoded when it is acquired (never more than two pieces
  // are in use at once) and those for pieces decoded ahead by the decoder.
  std::vector<std::span<uint8_t>> free_decode_buffers_, free_ahead_buffers_;
  int64_t last_acquired_ = -1;
  // The decoder: a thread of its own, not a task, so that a piece is decoded as soon as it lands.
  // Both ways were measured: a task waited behind the products and the experts' matmuls (the
  // acquiring thread blocks outside the task scheduler while it waits for the disk), and the
  // disk went idle with the ring full of pieces read but not decoded.
  std::condition_variable decoder_wake_;
  bool stopping_ = false;
  std::thread decoder_;  // with compressed pieces only
  int64_t next_ = 0;     // the next piece to read ahead
  int reads_in_flight_ = 0;
  absl::Status error_;
  int64_t out_of_order_ = 0;
  int64_t out_of_order_reported_ = 0;
  uint64_t bytes_read_ = 0;
  double wait_seconds_ = 0;
  double decode_seconds_ = 0;
  uint64_t decoded_ahead_ = 0, decoded_on_use_ = 0;  // pieces, since the last TakeMetrics
};

}  // namespace k3
