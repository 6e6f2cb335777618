// The compressed tensors of a trunk pack (`k3 pack --codec bf16-e3`): each BF16 matrix is cut
// into blocks of whole rows, about kBlockTargetBytes decoded, and each block is encoded on its
// own (kernels/bf16_codec.h: exact, the decoded bytes are the checkpoint's) at a 4 KiB-aligned
// offset, with an XXH3-64 of its stored bytes in the manifest. A block decodes without its
// neighbours, so the trunk streamer reads whole blocks and decodes them as they arrive.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "core/checkpoint/checkpoint.h"
#include "core/checkpoint/trunk_pack.h"
#include "io/file.h"

namespace k3 {

inline constexpr uint64_t kBlockTargetBytes = 4ull << 20;

// Whether `k3 pack --codec` compresses this tensor: BF16 matrices but the embedding (read by
// rows on demand, never streamed through the ring).
bool IsCompressible(const TensorInfo& info, bool is_embedding);

// Rows in each block (the last may hold fewer) of a matrix of `rows` rows of `row_bytes`, for
// blocks of about `block_bytes` decoded: a multiple of kMatMulRowsPerTask where the matrix has
// more, as the ring's pieces are.
uint64_t RowsPerBlock(uint64_t rows, uint64_t row_bytes, uint64_t block_bytes);

// The pieces the trunk ring reads a compressed matrix in: ranges [first, last) of its blocks,
// each up to `piece_bytes` decoded but at least one block; one piece when the matrix is used
// whole.
std::vector<std::pair<size_t, size_t>> BlockPieces(const PackedTensor& t, uint64_t piece_bytes,
                                                   bool whole);
// A piece's stored span: from its first block's offset to its last block's end.
uint64_t PieceStoredBytes(const PackedTensor& t, std::pair<size_t, size_t> piece);
// Where each block of a piece starts among the piece's rows, and the piece's rows at the end:
// blocks + 1 offsets (RowPiece::block_row_begin).
std::vector<size_t> BlockRowBegin(const PackedTensor& t, std::pair<size_t, size_t> piece);

// Zero bytes up to `offset` of the file.
absl::Status PadTo(io::SequentialWriter& w, uint64_t offset);

// The checksum a block's stored bytes carry in the manifest.
uint64_t BlockHash(std::span<const uint8_t> stored);

// Encodes the tensor's rows block by block into `w` (each block at the next 4 KiB boundary),
// filling out.offset, .blocks, .stored and .hash (CRC-32C of the decoded bytes);
// `advanced(n)` reports decoded bytes done.
absl::Status WriteCompressedTensor(const Checkpoint& ckpt, const TensorInfo& info,
                                   uint64_t block_bytes, io::SequentialWriter& w, PackedTensor& out,
                                   const std::function<void(uint64_t)>& advanced);

// Reads every block of `t` from the pack, decodes it and compares it with the checkpoint.
// DataLoss naming the tensor, the pack file and the offset of the block at fault.
absl::Status VerifyCompressedTensor(const Checkpoint& ckpt, const io::RandomAccessFile& pack,
                                    const PackedTensor& t,
                                    const std::function<void(uint64_t)>& advanced);

// Decodes one block whose stored bytes are `stored` into `out` (block.rows rows of the tensor)
// after checking its hash. DataLoss naming `file`, the block's offset and the tensor when the
// hash differs or the codec refuses the bytes: the caller never sees wrong weights.
absl::Status DecodeBlock(const PackedTensor& t, const PackedBlock& block,
                         std::span<const uint8_t> stored, std::span<uint8_t> out,
                         const std::string& file);

}  // namespace k3
