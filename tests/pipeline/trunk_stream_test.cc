// The trunk streamer on its own: a compressed piece decoded ahead leaves its ring slot for the
// next read, and every piece, however it was decoded, holds the checkpoint's own rows.
#include "pipeline/trunk_stream.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "core/checkpoint.h"
#include "core/trunk_codec.h"
#include "core/trunk_pack.h"
#include "io/read_engine.h"
#include "pipeline/memory_plan.h"
#include "tests/util/temp_dir.h"
#include "tests/util/tiny_model.h"

namespace k3 {
namespace {

using ::k3::testing::TempDir;

class TrunkStreamTest : public ::k3::testing::TinyModelSuite {
 protected:
  // A bf16-e3 pack in blocks of 16 KiB, and a streamer of the `ultra` plan with a ring of
  // `slots` pieces of 64 KiB.
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
        MeasureFootprint(*ckpt_, 64, 4, {.piece_bytes = 64 << 10, .slots = slots, .pack = &*pack_}),
        {.preset = "ultra"}, 0);
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_EQ(plan->ring_slots, slots);
    auto reads = io::ReadEngine::Create({});
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
  std::unique_ptr<io::ReadEngine> reads_;
  BusyClock disk_;
  std::unique_ptr<TrunkStreamer> streamer_;
};

// With two ring slots and piece 0 in use, pieces decoded ahead move to the decode-ahead buffers
// and the ring reads on: pieces 0-3 are read (two of them decoded ahead). A ring that kept
// decoded pieces in their slots would stop at pieces 0 and 1.
TEST_F(TrunkStreamTest, APieceDecodedAheadLeavesItsRingSlotForTheNextRead) {
  ASSERT_NO_FATAL_FAILURE(Open(2));
  ASSERT_GE(streamer_->pieces(), 6);
  auto first = streamer_->AcquirePiece(0, PieceForm::kDecoded);
  ASSERT_TRUE(first.ok()) << first.status();
  // The decoder runs on a thread of its own; wait for it (only a hang fails this, not a slow
  // machine: the count cannot pass 4 while piece 0 is in use).
  const uint64_t expected = 2 + kDecodeAheadBuffers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (reads_->stats().completed < expected && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(reads_->stats().completed, expected);
  std::vector<const TensorInfo*> tensor_of(streamer_->pieces(), nullptr);
  for (const TensorInfo& listed : ckpt_->tensors()) {
    const TensorInfo* t = ckpt_->Find(listed.name);  // the streamer knows tensors by address
    const Matrix m = streamer_->Handle(*t);
    for (int64_t i = 0; i < m.pieces; ++i) tensor_of[m.first_piece + i] = t;
  }
  // Pieces 0-3 held at once, 2 and 3 as a product takes them. Pieces 0 and 1 hold both
  // decode-ahead buffers (or 1 and 2 do, when piece 0 was acquired before it was decoded), so at
  // least one of 2 and 3 is still compressed and comes as its blocks.
  std::vector<RowPiece> held = {*first};
  int compressed = 0;
  for (int64_t i = 1; i < 4; ++i) {
    const PieceForm form = i < 2 ? PieceForm::kDecoded : PieceForm::kStoredIfCompressed;
    auto piece = streamer_->AcquirePiece(i, form);
    ASSERT_TRUE(piece.ok()) << "piece " << i << ": " << piece.status();
    EXPECT_TRUE(!piece->compressed() || form == PieceForm::kStoredIfCompressed) << "piece " << i;
    compressed += piece->compressed();
    held.push_back(*piece);
  }
  EXPECT_GE(compressed, 1);
  // Every piece, in the order of use, holds its matrix's rows: decoded ahead, on use, or as its
  // blocks; a piece's blocks are not to be had once it is released (and asking fails the step).
  for (int64_t i = 0; i < streamer_->pieces(); ++i) {
    ASSERT_NE(tensor_of[i], nullptr) << "piece " << i;
    if (i >= 4) {
      auto piece = streamer_->AcquirePiece(
          i, i % 2 == 1 ? PieceForm::kStoredIfCompressed : PieceForm::kDecoded);
      ASSERT_TRUE(piece.ok()) << "piece " << i << ": " << piece.status();
      held.push_back(*piece);
    }
    ASSERT_NO_FATAL_FAILURE(ExpectCheckpointRows(i, held[i], *tensor_of[i]));
    streamer_->ReleasePiece(i);
    std::vector<uint8_t> out(held[i].rows.rows * held[i].rows.cols * 2);
    EXPECT_EQ(streamer_->DecodeBlock(i, 0, out).code(), absl::StatusCode::kInternal);
    EXPECT_EQ(streamer_->TakeError().code(), absl::StatusCode::kInternal);
  }
  StepMetrics m;
  streamer_->TakeMetrics(m);
  EXPECT_EQ(m.trunk_pieces_out_of_order, 0u);
  EXPECT_EQ(streamer_->out_of_order(), 0);
}

}  // namespace
}  // namespace k3
