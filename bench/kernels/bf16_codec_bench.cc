// Benchmarks of the lossless BF16 codec (kernels/bf16_codec.h), linked into k3_bench_kernels.
// Data: Gaussian BF16 with the scale of trained weights (sigma 0.0118). Rates are per CPU second:
// in_bytes_per_second counts compressed bytes consumed (to compare with the disk), and
// out_bytes_per_second the BF16 bytes produced.
//
//   L1L2:  8 x 7168 values, in L2: the compute ceiling.
//   Hot:   one group of 64 x 7168 values, input and output stay in L2/L3.
//   Large: one call of 2^24 values (32 MiB out, ~22 MiB in): neither fits in cache.
//   Cold:  rotates through 512 MiB of copies of the compressed group, so the input comes from
//          DRAM as after a disk read, into one reused (cache-resident) output group.
//   BlockCold: the same for one block of a trunk pack (256 x 7168, 3.7 MiB decoded), decoded
//          alone, and checked (its XXH3, BlockHash) then decoded, as the streamer does each block.
//   Piece: a trunk ring piece (2048 x 7168, 28 MiB decoded) in 8 blocks of 256 rows, decoded and
//          multiplied by a vector: all 8 blocks into one buffer, then the product (DecodeThen), or
//          each block into a reused scratch and multiplied at once (Fused, what a product does
//          with a compressed piece or a matrix held compressed); FineFused the same in blocks of 8
//          rows (112 KiB, in L2: measured no faster than 4 MiB blocks, so the pack keeps 4 MiB);
//          Raw the product alone over the decoded piece (the raw pack's cost). Rates are of
//          compressed input.
//
// Run: k3_bench_kernels --benchmark_filter=Bf16Codec
#include <benchmark/benchmark.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "core/checkpoint/trunk_codec.h"
#include "kernels/bf16.h"
#include "kernels/bf16_codec.h"

namespace k3::bench {
namespace {

constexpr size_t kGroupValues = 64 * 7168;
constexpr size_t kSmallValues = 8 * 7168;
constexpr size_t kLargeValues = size_t{1} << 24;
constexpr size_t kColdPoolBytes = size_t{512} << 20;

// Page-aligned, touched before timing (as the weight buffers the engine reads into).
template <class T>
struct PageArray {
  explicit PageArray(size_t n)
      : data(static_cast<T*>(::operator new[](n * sizeof(T), std::align_val_t{4096}))), size(n) {
    std::memset(data.get(), 0, n * sizeof(T));
  }
  struct Delete {
    void operator()(T* p) const { ::operator delete[](p, std::align_val_t{4096}); }
  };
  std::unique_ptr<T[], Delete> data;
  size_t size;
  std::span<T> span() const { return {data.get(), size}; }
};

std::vector<uint16_t> GaussianBf16(size_t n) {
  std::mt19937 rng(42);
  std::normal_distribution<float> dist(0.0f, 0.0118f);
  std::vector<uint16_t> v(n);
  for (uint16_t& x : v) {
    const uint32_t u = std::bit_cast<uint32_t>(dist(rng));
    x = static_cast<uint16_t>((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
  }
  return v;
}

struct Encoded {
  explicit Encoded(size_t n) : values(GaussianBf16(n)), bytes(kernels::Bf16EncodedBound(n)) {
    bytes.size = kernels::Bf16Encode(values, bytes.span());
  }
  std::vector<uint16_t> values;
  PageArray<uint8_t> bytes;
};

const Encoded& Group() {
  static const Encoded* e = new Encoded(kGroupValues);
  return *e;
}
const Encoded& Small() {
  static const Encoded* e = new Encoded(kSmallValues);
  return *e;
}
const Encoded& Large() {
  static const Encoded* e = new Encoded(kLargeValues);
  return *e;
}

void SetRates(benchmark::State& state, size_t in_bytes, size_t values) {
  const auto iters = static_cast<double>(state.iterations());
  state.counters["in_bytes_per_second"] =
      benchmark::Counter(static_cast<double>(in_bytes) * iters, benchmark::Counter::kIsRate);
  state.counters["out_bytes_per_second"] =
      benchmark::Counter(static_cast<double>(values * 2) * iters, benchmark::Counter::kIsRate);
  state.counters["ratio"] = static_cast<double>(in_bytes) / static_cast<double>(values * 2);
}

using DecodeFn = bool (*)(std::span<const uint8_t>, std::span<uint16_t>);

void DecodeBench(benchmark::State& state, const Encoded& e, DecodeFn decode) {
  PageArray<uint16_t> out(e.values.size());
  for (auto _ : state) {
    if (!decode(e.bytes.span(), out.span())) throw std::runtime_error("decode failed");
    benchmark::DoNotOptimize(out.data.get());
    benchmark::ClobberMemory();
  }
  if (std::memcmp(out.data.get(), e.values.data(), e.values.size() * 2) != 0)
    throw std::runtime_error("decode mismatch");
  SetRates(state, e.bytes.size, e.values.size());
}

void BM_Bf16CodecDecodeHot(benchmark::State& s) { DecodeBench(s, Group(), kernels::Bf16Decode); }
void BM_Bf16CodecDecodeScalarHot(benchmark::State& s) {
  DecodeBench(s, Group(), kernels::Bf16DecodeScalar);
}
void BM_Bf16CodecDecodeLarge(benchmark::State& s) { DecodeBench(s, Large(), kernels::Bf16Decode); }
void BM_Bf16CodecDecodeScalarLarge(benchmark::State& s) {
  DecodeBench(s, Large(), kernels::Bf16DecodeScalar);
}
void BM_Bf16CodecDecodeL1L2(benchmark::State& s) { DecodeBench(s, Small(), kernels::Bf16Decode); }
BENCHMARK(BM_Bf16CodecDecodeL1L2)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Bf16CodecDecodeHot)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Bf16CodecDecodeScalarHot)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Bf16CodecDecodeLarge)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Bf16CodecDecodeScalarLarge)->Unit(benchmark::kMillisecond);

// kColdPoolBytes of page-aligned copies of e's bytes, `stride` apart; made once per encoding
// (the benchmark function runs several times).
const PageArray<uint8_t>& ColdPool(const Encoded& e, size_t stride) {
  static std::map<const Encoded*, std::unique_ptr<PageArray<uint8_t>>> pools;
  std::unique_ptr<PageArray<uint8_t>>& pool = pools[&e];
  if (pool == nullptr) {
    const size_t copies = kColdPoolBytes / stride;
    pool = std::make_unique<PageArray<uint8_t>>(copies * stride);
    for (size_t c = 0; c < copies; ++c) {
      std::memcpy(pool->data.get() + c * stride, e.bytes.data.get(), e.bytes.size);
    }
  }
  return *pool;
}

void DecodeColdBench(benchmark::State& state, DecodeFn decode, const Encoded& e = Group()) {
  // Page-aligned copies, each read once per pass over the pool.
  const size_t stride = (e.bytes.size + 4095) / 4096 * 4096;
  const size_t copies = kColdPoolBytes / stride;
  const PageArray<uint8_t>* pool = &ColdPool(e, stride);
  PageArray<uint16_t> out(e.values.size());
  size_t next = 0;
  for (auto _ : state) {
    const std::span<const uint8_t> in(pool->data.get() + next * stride, e.bytes.size);
    if (!decode(in, out.span())) throw std::runtime_error("decode failed");
    benchmark::DoNotOptimize(out.data.get());
    benchmark::ClobberMemory();
    next = next + 1 == copies ? 0 : next + 1;
  }
  SetRates(state, e.bytes.size, e.values.size());
}
void BM_Bf16CodecDecodeCold(benchmark::State& s) { DecodeColdBench(s, kernels::Bf16Decode); }
// What the trunk streamer does with each block of a compressed pack: check the block's XXH3
// (BlockHash), then decode. Against DecodeCold, the cost of the check.
bool CheckThenDecode(std::span<const uint8_t> in, std::span<uint16_t> out) {
  benchmark::DoNotOptimize(BlockHash(in));
  return kernels::Bf16Decode(in, out);
}
const Encoded& TrunkBlock() {
  static const Encoded* e = new Encoded(256 * 7168);
  return *e;
}
void BM_Bf16CodecCheckThenDecodeBlockCold(benchmark::State& s) {
  DecodeColdBench(s, CheckThenDecode, TrunkBlock());
}
void BM_Bf16CodecDecodeBlockCold(benchmark::State& s) {
  DecodeColdBench(s, kernels::Bf16Decode, TrunkBlock());
}
BENCHMARK(BM_Bf16CodecDecodeBlockCold)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Bf16CodecCheckThenDecodeBlockCold)->Unit(benchmark::kMicrosecond);
void BM_Bf16CodecDecodeScalarCold(benchmark::State& s) {
  DecodeColdBench(s, kernels::Bf16DecodeScalar);
}
BENCHMARK(BM_Bf16CodecDecodeCold)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_Bf16CodecDecodeScalarCold)->Unit(benchmark::kMicrosecond);

void BM_Bf16CodecEncode(benchmark::State& state) {
  const Encoded& e = Group();
  PageArray<uint8_t> out(kernels::Bf16EncodedBound(e.values.size()));
  size_t bytes = 0;
  for (auto _ : state) {
    bytes = kernels::Bf16Encode(e.values, out.span());
    benchmark::DoNotOptimize(out.data.get());
    benchmark::ClobberMemory();
  }
  // Encode rates are of the raw input (BF16 bytes read).
  SetRates(state, bytes, e.values.size());
}
BENCHMARK(BM_Bf16CodecEncode)->Unit(benchmark::kMicrosecond);

constexpr size_t kPieceRows = 2048, kPieceCols = 7168;

// The piece encoded in `blocks` blocks of kPieceRows / blocks rows each.
struct EncodedPiece {
  explicit EncodedPiece(size_t blocks)
      : block_rows(kPieceRows / blocks), values(GaussianBf16(kPieceRows * kPieceCols)) {
    const size_t n = block_rows * kPieceCols;
    for (size_t b = 0; b < blocks; ++b) {
      coded.emplace_back(std::span<const uint16_t>(values).subspan(b * n, n));
    }
  }
  struct Block {
    explicit Block(std::span<const uint16_t> v) : bytes(kernels::Bf16EncodedBound(v.size())) {
      bytes.size = kernels::Bf16Encode(v, bytes.span());
    }
    PageArray<uint8_t> bytes;
  };
  size_t block_rows;
  std::vector<uint16_t> values;  // the whole piece, decoded
  std::vector<Block> coded;
  size_t in_bytes() const {
    size_t n = 0;
    for (const Block& b : coded) n += b.bytes.size;
    return n;
  }
};

// As the trunk pack cuts it (blocks of about 4 MiB decoded), and in blocks of 8 rows (112 KiB).
const EncodedPiece& Piece() {
  static const EncodedPiece* p = new EncodedPiece(8);
  return *p;
}
const EncodedPiece& FinePiece() {
  static const EncodedPiece* p = new EncodedPiece(kPieceRows / 8);
  return *p;
}

void PieceMatVecBench(benchmark::State& state, const EncodedPiece& piece, bool fused) {
  const size_t block_values = piece.block_rows * kPieceCols;
  PageArray<uint16_t> decoded(fused ? block_values : kPieceRows * kPieceCols);
  std::vector<float> x(kPieceCols, 0.5f), y(kPieceRows);
  for (auto _ : state) {
    for (size_t b = 0; b < piece.coded.size(); ++b) {
      const std::span<uint16_t> out =
          decoded.span().subspan(fused ? 0 : b * block_values, block_values);
      if (!kernels::Bf16Decode(piece.coded[b].bytes.span(), out)) {
        throw std::runtime_error("decode failed");
      }
      if (fused) {
        kernels::Bf16MatVec({out, piece.block_rows, kPieceCols}, x,
                            std::span(y).subspan(b * piece.block_rows, piece.block_rows), 0,
                            piece.block_rows);
      }
    }
    if (!fused) kernels::Bf16MatVec({decoded.span(), kPieceRows, kPieceCols}, x, y, 0, kPieceRows);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, piece.in_bytes(), kPieceRows * kPieceCols);
}
void BM_Bf16CodecPieceDecodeThenMatVec(benchmark::State& s) { PieceMatVecBench(s, Piece(), false); }
void BM_Bf16CodecPieceFusedMatVec(benchmark::State& s) { PieceMatVecBench(s, Piece(), true); }
void BM_Bf16CodecPieceFineFusedMatVec(benchmark::State& s) {
  PieceMatVecBench(s, FinePiece(), true);
}
// The raw pack's product: the decoded piece multiplied as it is.
void BM_Bf16CodecPieceRawMatVec(benchmark::State& state) {
  const EncodedPiece& piece = Piece();
  PageArray<uint16_t> w(piece.values.size());
  std::memcpy(w.data.get(), piece.values.data(), piece.values.size() * sizeof(uint16_t));
  std::vector<float> x(kPieceCols, 0.5f), y(kPieceRows);
  for (auto _ : state) {
    kernels::Bf16MatVec({w.span(), kPieceRows, kPieceCols}, x, y, 0, kPieceRows);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  SetRates(state, piece.in_bytes(), kPieceRows * kPieceCols);
}
BENCHMARK(BM_Bf16CodecPieceDecodeThenMatVec)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Bf16CodecPieceFusedMatVec)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Bf16CodecPieceFineFusedMatVec)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Bf16CodecPieceRawMatVec)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace k3::bench
