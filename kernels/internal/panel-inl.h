// Panel products of larger batches, shared by the MXFP4 and BF16 kernels.
//
// With many tokens, decoding the weights once per register block of tokens (as the small-batch
// products do) costs a lane permute or widening per chunk on the ports the multiply-adds need.
// So a panel of kPanelRows rows x kPanelCols columns is decoded once into fp32 in a buffer that
// stays in L1, and tiles of kTileRows x kTileTokens accumulators stream every token over it.
// Rows go in bands; a band meets one column block of the batch at a time, every panel of it in
// turn, so that block's activations come from L2 for all the band's rows.
//
// Each (row, token) accumulator still visits the row's chunks in order from zero; between
// column blocks it waits in memory (a store and a reload are exact), and StorePanel reduces it
// with the tree of ReduceAcc, so every bit of the result is the canonical one of simd-inl.h.

// Highway per-target include guard: this file is included once per SIMD target.
#if defined(K3_KERNELS_INTERNAL_PANEL_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef K3_KERNELS_INTERNAL_PANEL_INL_H_
#undef K3_KERNELS_INTERNAL_PANEL_INL_H_
#else
#define K3_KERNELS_INTERNAL_PANEL_INL_H_
#endif

#include <algorithm>
#include <cstddef>

#include "hwy/highway.h"
#include "kernels/internal/scratch.h"
#include "kernels/internal/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace k3::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// 24 accumulators, 4 weight vectors and one activation vector of the 32 registers.
inline constexpr size_t kTileRows = 4;
inline constexpr size_t kTileTokens = 6;
#else
inline constexpr size_t kTileRows = 2;
inline constexpr size_t kTileTokens = 4;
#endif
// Below this many tokens the decode per token block costs less than the panel's round trips.
inline constexpr size_t kPanelMinTokens = 8;

// A panel of 4 rows x 512 columns is 8 KiB of weights; with a tile's activations (12 KiB) and
// its accumulators it stays in a 48 KiB L1. Wider panels round trip the accumulators less often
// but spill out of L1; 8 rows or 768 and 1024 columns measured no faster.
inline constexpr size_t kPanelRows = kTileRows;
inline constexpr size_t kPanelCols = 512;
inline constexpr size_t kPanelChunks = kPanelCols / kLanes;

// When the batch's activations fit in this much memory, L2 keeps them for every panel anyway, and
// the panels go one at a time (a band of one), their accumulators in L1. Larger batches go in
// bands whose accumulators fit in kBandAccumulatorBytes, so L2 holds them with one column block
// of the batch, and of at most kMaxBandPanels panels, since a band reads its rows' weights as
// that many interleaved streams. In the kernel benchmark (3072 x 3584), bands ran at 0.7-0.95x
// the speed of single panels at 40 and 64 tokens, and single panels at 0.45-0.5x the speed of
// bands at 256 tokens (2.8 MB of activations).
inline constexpr size_t kSinglePanelBatchBytes = 1024 * 1024;
inline constexpr size_t kBandAccumulatorBytes = 1024 * 1024;
inline constexpr size_t kMaxBandPanels = 16;

// Row-major fp32 operands of a panel: `count` rows (or tokens), row i at data + i * stride.
struct PanelOperand {
  const float* data;
  size_t stride;
  size_t count;
};

// The tile's kRows x kTokens accumulators wait in memory as one run, (token t, row i) at
// acc_mem + (t * kRows + i) * kLanes, so they load and store at fixed offsets from one pointer.
// `chunks` chunks of the weights (row i at wd + i * ldw) against the tokens (token t at
// xp + t * ldx).
template <size_t kRows, size_t kTokens>
HWY_INLINE void PanelTile(const float* HWY_RESTRICT wd, size_t ldw, const float* HWY_RESTRICT xp,
                          size_t ldx, size_t chunks, bool first, float* HWY_RESTRICT acc_mem) {
  const DF df;
  VF acc[kRows][kTokens];
  for (size_t i = 0; i < kRows; ++i) {
    for (size_t t = 0; t < kTokens; ++t) {
      acc[i][t] = first ? hn::Zero(df) : hn::Load(df, acc_mem + (t * kRows + i) * kLanes);
    }
  }
  for (size_t c = 0; c < chunks; ++c) {
    VF wv[kRows];
    for (size_t i = 0; i < kRows; ++i) wv[i] = hn::Load(df, wd + i * ldw + c * kLanes);
    for (size_t t = 0; t < kTokens; ++t) {
      const VF xv = hn::LoadU(df, xp + t * ldx + c * kLanes);
      for (size_t i = 0; i < kRows; ++i) acc[i][t] = hn::MulAdd(wv[i], xv, acc[i][t]);
    }
  }
  for (size_t i = 0; i < kRows; ++i) {
    for (size_t t = 0; t < kTokens; ++t) {
      hn::Store(acc[i][t], df, acc_mem + (t * kRows + i) * kLanes);
    }
  }
}

// Every tile of one column block: `chunks` chunks of the decoded rows w (at most kTileRows)
// against every token x, into the accumulators, (token t, row i) at acc + (t * w.count + i) *
// kLanes; `first` starts them from zero.
HWY_INLINE void PanelTiles(PanelOperand w, PanelOperand x, size_t chunks, bool first,
                           float* HWY_RESTRICT acc) {
  ForEachBlock<kTileRows>(w.count, [&]<size_t kRows>(size_t) {
    ForEachBlock<kTileTokens>(x.count, [&]<size_t kTokens>(size_t t0) {
      PanelTile<kRows, kTokens>(w.data, w.stride, x.data + t0 * x.stride, x.stride, chunks, first,
                                acc + t0 * kRows * kLanes);
    });
  });
}

// y[t * y_stride + i] = the reduced accumulator of (row i, token t).
HWY_INLINE void StorePanel(const float* HWY_RESTRICT acc, size_t rows, size_t tokens,
                           float* HWY_RESTRICT y, size_t y_stride) {
  const DF df;
  // Accumulator k is (token k / rows, row k % rows). The destination follows it by counting:
  // a 64-bit division per result took 7 % of the panel product's time in the engine's prefill.
  float* token_row = y;
  size_t i = 0;
  const auto put = [&](float sum) {
    token_row[i] = sum;
    if (++i == rows) {
      i = 0;
      token_row += y_stride;
    }
  };
  size_t k = 0;
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
  for (; k + 16 <= rows * tokens; k += 16) {
    alignas(64) float sums[16];
    ReduceSixteen(acc + k * kLanes, sums);
    for (size_t j = 0; j < 16; ++j) put(sums[j]);
  }
#endif
  for (; k < rows * tokens; ++k) put(ReduceAcc(hn::Load(df, acc + k * kLanes)));
}

// Rows per band for a batch of `tokens` x `cols`: a multiple of kPanelRows, at least one panel.
HWY_INLINE size_t BandRows(size_t tokens, size_t cols) {
  if (tokens * cols * sizeof(float) <= kSinglePanelBatchBytes) return kPanelRows;
  const size_t panels = kBandAccumulatorBytes / (kPanelRows * tokens * kLanes * sizeof(float));
  return std::clamp<size_t>(panels, 1, kMaxBandPanels) * kPanelRows;
}

// Y[t, r] (at y + t * y_stride + r) for r in [row_begin, row_end) and `tokens` tokens of `cols`
// columns, over `blocks` >= 1 column blocks of the weights. The weights' side comes as callbacks:
//   decode(r, rows, b, wd): block b of rows [r, r + rows) in fp32, row i at wd + i * kPanelCols;
//                           returns its number of chunks (kPanelChunks but for a short last block)
//   prefetch(r, rows, b):   asks for the bytes of that panel, the one decoded next
//   x_block(b):             the tokens' activations in block b
//   finish(r, rows, acc):   anything after the last block, before the reduction (a tail chunk)
// The accumulators of the panel at row r of a band from r0 are at acc + (r - r0) * tokens * kLanes.
template <class Decode, class Prefetch, class XBlock, class Finish>
void BandedPanelProduct(size_t blocks, size_t tokens, size_t cols, size_t row_begin, size_t row_end,
                        float* y, size_t y_stride, const Decode& decode, const Prefetch& prefetch,
                        const XBlock& x_block, const Finish& finish) {
  const size_t band = std::min(BandRows(tokens, cols), row_end - row_begin);
  float* wd =
      internal::ThreadScratch(internal::ScratchSlot::kDecodedPanel, kPanelRows * kPanelCols);
  float* acc =
      internal::ThreadScratch(internal::ScratchSlot::kAccumulators, band * tokens * kLanes);
  for (size_t r0 = row_begin; r0 < row_end; r0 += band) {
    const size_t r1 = std::min(r0 + band, row_end);
    const auto rows_at = [&](size_t r) { return std::min(kPanelRows, r1 - r); };
    for (size_t b = 0; b < blocks; ++b) {
      const PanelOperand x = x_block(b);
      for (size_t r = r0; r < r1; r += kPanelRows) {
        // The next panel: the band's next in this block, else its first in the next block, else
        // the next band's first.
        if (r + kPanelRows < r1) {
          prefetch(r + kPanelRows, rows_at(r + kPanelRows), b);
        } else if (b + 1 < blocks) {
          prefetch(r0, rows_at(r0), b + 1);
        } else if (r1 < row_end) {
          prefetch(r1, std::min(kPanelRows, row_end - r1), 0);
        }
        const size_t chunks = decode(r, rows_at(r), b, wd);
        PanelTiles({wd, kPanelCols, rows_at(r)}, x, chunks, b == 0,
                   acc + (r - r0) * tokens * kLanes);
      }
    }
    for (size_t r = r0; r < r1; r += kPanelRows) {
      float* panel_acc = acc + (r - r0) * tokens * kLanes;
      finish(r, rows_at(r), panel_acc);
      StorePanel(panel_acc, rows_at(r), tokens, y + r, y_stride);
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace k3::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
