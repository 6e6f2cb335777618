#include "core/checkpoint/trunk_codec.h"

#include <xxhash.h>
#if defined(__x86_64__)
// The library's XXH3_64bits is its baseline (SSE2) build, measured at 4 GB/s here: slower than
// the disk, and the largest cost of a compressed trunk's products. Its _dispatch entry points
// pick AVX2 or AVX-512 at run time (18.6 GB/s from DRAM, 64 GB/s from cache): the same hash.
#include <xxh_x86dispatch.h>
#define K3_XXH3_64 XXH3_64bits_dispatch
#else
#define K3_XXH3_64 XXH3_64bits
#endif

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"
#include "kernels/bf16_codec.h"
#include "kernels/ops.h"

namespace k3 {
namespace {

uint64_t RowBytes(const PackedTensor& t) { return t.length / static_cast<uint64_t>(t.shape[0]); }

// Names the block in messages (its first row is counted only then, off the decode path).
std::string BlockText(const PackedTensor& t, const PackedBlock& b) {
  uint64_t first_row = 0;
  for (const PackedBlock& other : t.blocks) {
    if (&other == &b) break;
    first_row += other.rows;
  }
  return absl::StrCat("tensor ", t.name, " rows ", first_row, "-", first_row + b.rows - 1,
                      " (block at offset ", b.offset, ", ", b.length, " bytes)");
}

std::span<const uint16_t> AsValues(std::span<const uint8_t> bytes) {
  return {reinterpret_cast<const uint16_t*>(bytes.data()), bytes.size() / 2};
}

std::span<uint16_t> AsValues(std::span<uint8_t> bytes) {
  return {reinterpret_cast<uint16_t*>(bytes.data()), bytes.size() / 2};
}

}  // namespace

absl::Status PadTo(io::SequentialWriter& w, uint64_t offset) {
  while (w.bytes_written() < offset) {
    std::span<uint8_t> dst = w.Reserve(offset - w.bytes_written());
    std::memset(dst.data(), 0, dst.size());
    if (absl::Status s = w.Advance(dst.size()); !s.ok()) return s;
  }
  return absl::OkStatus();
}

bool IsCompressible(const TensorInfo& info, bool is_embedding) {
  return !is_embedding && info.dtype == DType::kBF16 && info.shape.size() == 2 &&
         info.shape[0] > 0 && info.byte_size > 0;
}

uint64_t RowsPerBlock(uint64_t rows, uint64_t row_bytes, uint64_t block_bytes) {
  const uint64_t fit = std::max<uint64_t>(1, block_bytes / std::max<uint64_t>(1, row_bytes));
  if (fit >= rows) return rows;
  using kernels::kMatMulRowsPerTask;
  return std::max(kMatMulRowsPerTask, fit / kMatMulRowsPerTask * kMatMulRowsPerTask);
}

std::vector<std::pair<size_t, size_t>> BlockPieces(const PackedTensor& t, uint64_t piece_bytes,
                                                   bool whole) {
  std::vector<std::pair<size_t, size_t>> pieces;
  const uint64_t row_bytes = RowBytes(t);
  for (size_t first = 0; first < t.blocks.size();) {
    size_t last = first + 1;
    uint64_t bytes = t.blocks[first].rows * row_bytes;
    while (last < t.blocks.size() &&
           (whole || bytes + t.blocks[last].rows * row_bytes <= piece_bytes)) {
      bytes += t.blocks[last++].rows * row_bytes;
    }
    pieces.emplace_back(first, last);
    first = last;
  }
  return pieces;
}

std::vector<size_t> BlockRowBegin(const PackedTensor& t, std::pair<size_t, size_t> piece) {
  std::vector<size_t> begin = {0};
  for (size_t b = piece.first; b < piece.second; ++b)
    begin.push_back(begin.back() + t.blocks[b].rows);
  return begin;
}

uint64_t PieceStoredBytes(const PackedTensor& t, std::pair<size_t, size_t> piece) {
  const PackedBlock& last = t.blocks[piece.second - 1];
  return last.offset + last.length - t.blocks[piece.first].offset;
}

uint64_t BlockHash(std::span<const uint8_t> stored) {
  return K3_XXH3_64(stored.data(), stored.size());
}

absl::Status WriteCompressedTensor(const Checkpoint& ckpt, const TensorInfo& info,
                                   uint64_t block_bytes, io::SequentialWriter& w, PackedTensor& out,
                                   const std::function<void(uint64_t)>& advanced) {
  const uint64_t rows = static_cast<uint64_t>(info.shape[0]);
  const uint64_t row_bytes = info.byte_size / rows;
  const uint64_t per_block =
      RowsPerBlock(rows, row_bytes, block_bytes > 0 ? block_bytes : kBlockTargetBytes);
  std::vector<uint8_t> raw(per_block * row_bytes);
  std::vector<uint8_t> coded(kernels::Bf16EncodedBound(raw.size() / 2));
  out.codec = kBf16Codec;
  out.blocks.clear();
  out.offset = io::AlignUpTo(w.bytes_written(), kRunAlignment);
  uint32_t crc = 0;
  for (uint64_t r = 0; r < rows; r += per_block) {
    const uint64_t n = std::min(per_block, rows - r);
    const std::span<uint8_t> src(raw.data(), n * row_bytes);
    if (absl::Status s =
            ckpt.ReadSpan({info.shard, info.file_offset + r * row_bytes, src.size()}, src);
        !s.ok()) {
      return s;
    }
    crc = Crc32c(crc, src.data(), src.size());
    const size_t length = kernels::Bf16Encode(AsValues(std::span<const uint8_t>(src)), coded);
    PackedBlock block{io::AlignUpTo(w.bytes_written(), kRunAlignment), length, n,
                      BlockHash({coded.data(), length})};
    if (absl::Status s = PadTo(w, block.offset); !s.ok()) return s;
    if (absl::Status s = w.Append({coded.data(), length}); !s.ok()) return s;
    out.blocks.push_back(block);
    advanced(src.size());
  }
  out.stored = w.bytes_written() - out.offset;
  out.hash = crc;
  return absl::OkStatus();
}

absl::Status DecodeBlock(const PackedTensor& t, const PackedBlock& block,
                         std::span<const uint8_t> stored, std::span<uint8_t> out,
                         const std::string& file) {
  if (stored.size() != block.length || BlockHash(stored) != block.hash) {
    return absl::DataLossError(absl::StrCat(file, ": ", BlockText(t, block),
                                            ": checksum mismatch, the pack is damaged; re-run ",
                                            "k3 pack"));
  }
  if (out.size() != block.rows * RowBytes(t) || !kernels::Bf16Decode(stored, AsValues(out))) {
    return absl::DataLossError(absl::StrCat(file, ": ", BlockText(t, block),
                                            ": the codec refuses the block (codec ", t.codec,
                                            " version ", kPackCodecVersion, ")"));
  }
  return absl::OkStatus();
}

absl::Status VerifyCompressedTensor(const Checkpoint& ckpt, const io::RandomAccessFile& pack,
                                    const PackedTensor& t,
                                    const std::function<void(uint64_t)>& advanced) {
  const TensorInfo* info = ckpt.Find(t.name);
  if (info == nullptr || info->byte_size != t.length) {
    return absl::FailedPreconditionError(
        absl::StrCat(pack.path(), ": tensor ", t.name, " does not match the checkpoint"));
  }
  const uint64_t row_bytes = RowBytes(t);
  std::vector<uint8_t> stored, decoded, expected;
  uint64_t row = 0;
  uint32_t crc = 0;
  for (const PackedBlock& b : t.blocks) {
    stored.resize(b.length);
    decoded.resize(b.rows * row_bytes);
    expected.resize(decoded.size());
    absl::Status s = pack.ReadAt(b.offset, stored);
    if (s.ok()) s = DecodeBlock(t, b, stored, decoded, pack.path());
    if (s.ok()) {
      s = ckpt.ReadSpan({info->shard, info->file_offset + row * row_bytes, expected.size()},
                        expected);
    }
    if (!s.ok()) return s;
    if (decoded != expected) {
      const auto at =
          std::mismatch(decoded.begin(), decoded.end(), expected.begin()).first - decoded.begin();
      return absl::DataLossError(absl::StrCat(
          "tensor ", t.name, " decodes to a byte differing from the checkpoint at byte ",
          row * row_bytes + at, " of the tensor (block at offset ", b.offset, " of ", pack.path(),
          ")"));
    }
    crc = Crc32c(crc, decoded.data(), decoded.size());
    row += b.rows;
    advanced(decoded.size());
  }
  if (crc != t.hash) {
    return absl::DataLossError(
        absl::StrCat("tensor ", t.name, " at offset ", t.offset, " of ", pack.path(), ": CRC-32C ",
                     crc, " of the decoded bytes differs from the manifest's ", t.hash));
  }
  return absl::OkStatus();
}

}  // namespace k3
