// The trunk streamer on its own: a compressed piece comes as its blocks to a product and decoded
// whole to a row-by-row user, each holding the checkpoint's own rows, and the decode buffers are
// only for matrices of one piece.
#include "pipeline/trunk_stream.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/trunk_codec.h"
#include "core/checkpoint/trunk_pack.h"
#include "io/read_router.h"
#include "pipeline/memory_plan.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::TempDir;

class TrunkStreamTest : public ::k3::testing::TinyModelSuite {
 protected:
  // A bf16-e3 pack in blocks of 16 KiB, and a streamer of the `ultra` plan with a ring of
  // `slots` pieces of 32 KiB (two blocks).
  void Open(int slots) {
    auto ckpt = Checkpoint::Open(ModelDir());
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = *std::move(ckpt);
    auto written =
        WriteTrunkPack(*ckpt_, pack_dir_.path(), {.codec = kBf16Codec, .block_bytes = 16 << 10});
    ASSERT_TRUE(written.ok()) << written.status();
    auto pack = TrunkPack::Open(pack_dir_.path(), *ckpt_);
    ASSERT_TRUE(pack.ok()) << pack.status();
    pack_ = *std::move(pack);
    auto plan = PlanMemory(
        MeasureFootprint(*ckpt_, 64, 4, {.piece_bytes = 32 << 10, .slots = slots, .pack = &*pack_}),
        {.preset = "ultra"}, 0);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->ring_slots, slots);
    auto reads = io::ReadRouter::Create({});
    ASSERT_TRUE(reads.ok()) << reads.status();
    reads_ = *std::move(reads);
    std::vector<io::FileId> shards;
    for (const std::string& path : ckpt_->shard_paths()) {
      auto id = reads_->OpenFile(path);
      ASSERT_TRUE(id.ok()) << id.status();
      shards.push_back(*id);
    }
    auto pack_file = reads_->OpenFile(pack_->pack_path());
    ASSERT_TRUE(pack_file.ok()) << pack_file.status();
    auto streamer =
        TrunkStreamer::Create(*ckpt_, *plan, &*pack_, *reads_, shards, *pack_file, disk_);
    ASSERT_TRUE(streamer.ok()) << streamer.status();
    streamer_ = *std::move(streamer);
  }

  // The piece `index` holds its rows as the checkpoint stores them: decoded, or in blocks that
  // decode to them one by one.
  void ExpectCheckpointRows(int64_t index, const RowPiece& piece, const TensorInfo& tensor) {
    std::vector<uint8_t> whole(tensor.byte_size);
    ASSERT_TRUE(ckpt_->ReadTensor(tensor, whole).ok());
    const uint64_t row_bytes = tensor.byte_size / tensor.shape[0];
    std::vector<uint8_t> rows(piece.rows.rows * row_bytes);
    if (piece.compressed()) {
      size_t at = 0;
      for (size_t b = 0; b < piece.blocks(); ++b) {
        const size_t bytes = (piece.block_row_begin[b + 1] - piece.block_row_begin[b]) * row_bytes;
        ASSERT_TRUE(streamer_->DecodeBlock(index, b, {rows.data() + at, bytes}).ok());
        at += bytes;
      }
      ASSERT_EQ(at, rows.size());
    } else {
      std::memcpy(rows.data(), piece.rows.data, rows.size());
    }
    ASSERT_EQ(0, std::memcmp(rows.data(), whole.data() + piece.row_begin * row_bytes, rows.size()))
        << tensor.name << " rows from " << piece.row_begin;
  }

  TempDir pack_dir_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::unique_ptr<TrunkPack> pack_;
  std::unique_ptr<io::ReadRouter> reads_;
  BusyClock disk_;
  std::unique_ptr<TrunkStreamer> streamer_;
};

// One pass in the order of use, as the forward pass takes the pieces: a matrix of one piece
// decoded whole (as MLA's kv_b is), every other piece as a product takes it. Every piece holds
// its matrix's rows; a compressed piece asked for as stored comes as its blocks, each decoded
// once; its blocks are not to be had once it is released (and asking fails the step).
TEST_F(TrunkStreamTest, EveryPieceHoldsItsRowsAsBlocksForAProductOrDecodedWhole) {
  ASSERT_NO_FATAL_FAILURE(Open(2));
  ASSERT_GE(streamer_->pieces(), 6);
  std::vector<const TensorInfo*> tensor_of(streamer_->pieces(), nullptr);
  std::vector<int64_t> pieces_of(streamer_->pieces(), 0);
  for (const TensorInfo& listed : ckpt_->tensors()) {
    const TensorInfo* t = ckpt_->Find(listed.name);  // the streamer knows tensors by address
    const Matrix m = streamer_->Handle(*t);
    for (int64_t i = 0; i < m.pieces; ++i) {
      tensor_of[m.first_piece + i] = t;
      pieces_of[m.first_piece + i] = m.pieces;
    }
  }
  uint64_t fused = 0, whole = 0;
  for (int64_t i = 0; i < streamer_->pieces(); ++i) {
    ASSERT_NE(tensor_of[i], nullptr) << "piece " << i;
    const bool compressed = pack_->Find(tensor_of[i]->name)->compressed();
    const PieceForm form = pieces_of[i] == 1 ? PieceForm::kDecoded : PieceForm::kStoredIfCompressed;
    auto piece = streamer_->AcquirePiece(i, form);
    ASSERT_TRUE(piece.ok()) << "piece " << i << ": " << piece.status();
    EXPECT_EQ(piece->compressed(), compressed && form == PieceForm::kStoredIfCompressed)
        << "piece " << i;
    fused += piece->compressed();
    whole += compressed && form == PieceForm::kDecoded;
    ASSERT_NO_FATAL_FAILURE(ExpectCheckpointRows(i, *piece, *tensor_of[i]));
    streamer_->ReleasePiece(i);
    std::vector<uint8_t> out(piece->rows.rows * piece->rows.cols * 2);
    EXPECT_EQ(streamer_->DecodeBlock(i, 0, out).code(), absl::StatusCode::kInternal);
    EXPECT_EQ(streamer_->TakeError().code(), absl::StatusCode::kInternal);
  }
  EXPECT_GT(fused, 0u);
  EXPECT_GT(whole, 0u);
  StepMetrics m;
  streamer_->TakeMetrics(m);
  EXPECT_EQ(m.trunk_pieces_decoded_fused, fused);
  EXPECT_EQ(m.trunk_pieces_decoded_whole, whole);
  EXPECT_GT(m.trunk_decode_seconds, 0);
  EXPECT_EQ(m.trunk_pieces_out_of_order, 0u);
  EXPECT_EQ(streamer_->out_of_order(), 0);
}

// The decode buffers hold the largest matrix of one piece, not a piece of a larger matrix: a
// compressed piece of a matrix in several pieces asked for whole is refused, and the step fails;
// the ring goes on.
TEST_F(TrunkStreamTest, APieceOfALargerMatrixAskedForWholeIsRefused) {
  ASSERT_NO_FATAL_FAILURE(Open(2));
  int64_t first = -1, pieces = 0;
  for (const TensorInfo& listed : ckpt_->tensors()) {
    const TensorInfo* t = ckpt_->Find(listed.name);
    const Matrix m = streamer_->Handle(*t);
    const PackedTensor* packed = pack_->Find(t->name);
    if (m.pieces > pieces && packed != nullptr && packed->compressed()) {
      first = m.first_piece, pieces = m.pieces;
    }
  }
  ASSERT_GT(pieces, 1);
  for (int64_t i = 0; i < first; ++i) {
    ASSERT_TRUE(streamer_->AcquirePiece(i, PieceForm::kStoredIfCompressed).ok()) << i;
    streamer_->ReleasePiece(i);
  }
  auto piece = streamer_->AcquirePiece(first, PieceForm::kDecoded);
  EXPECT_EQ(piece.status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(streamer_->TakeError().code(), absl::StatusCode::kInternal);
  auto next = streamer_->AcquirePiece(first + 1, PieceForm::kStoredIfCompressed);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE(next->compressed());
  streamer_->ReleasePiece(first + 1);
}

}  // namespace
}  // namespace k3
