// Panel products of larger batches, shared by the MXFP4 and BF16 kernels.
//
// With many tokens, decoding the weights once per register block of tokens (as the small-batch
// products do) costs a lane permute or widening per chunk on the ports the multiply-adds need.
// So a panel of kPanelRows rows x kPanelCols columns is decoded once into fp32 in a buffer that
// stays in L1, and tiles of kTileRows x kTileTokens accumulators stream every token over it.
// A batch too large for L2 goes in groups of tokens that fit, each group through all the rows.
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

// Each panel streams every token of its group over itself, so the group's activations must stay
// in L2 (2 MiB here) with the weights passing through: a batch whose activations take more than
// this goes in groups of tokens that fit, and the rows are decoded once per group. At 256 tokens
// of 3584 columns (3.5 MiB), one group ran at 0.4x the speed of groups of 72.
inline constexpr size_t kTokenGroupBytes = 1024 * 1024;

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

// Tokens per group for a batch of `tokens` x `cols`: all of them if they fit in
// kTokenGroupBytes, else as many as fit, in whole tiles.
HWY_INLINE size_t GroupTokens(size_t tokens, size_t cols) {
  const size_t fit = kTokenGroupBytes / (cols * sizeof(float));
  if (tokens <= fit) return tokens;
  return std::max(kTileTokens, fit / kTileTokens * kTileTokens);
}

// Y[t, r] (at y + t * y_stride + r) for r in [row_begin, row_end) and `tokens` tokens of `cols`
// columns, over `blocks` >= 1 column blocks of the weights. The operands come as callbacks:
//   decode(r, rows, b, wd):  block b of rows [r, r + rows) in fp32, row i at wd + i * kPanelCols;
//                            returns its number of chunks (kPanelCols / kLanes but for a short
//                            last block)
//   prefetch(r, rows, b):    asks for the bytes of that panel, the one decoded next
//   x_block(b, t0, count):   the activations of tokens [t0, t0 + count) in block b
//   finish(r, rows, t0, count, acc): anything after the last block, before the reduction (a tail
//                            chunk); (token t0 + t, row r + i) at acc + (t * rows + i) * kLanes
template <class Decode, class Prefetch, class XBlock, class Finish>
void GroupedPanelProduct(size_t blocks, size_t tokens, size_t cols, size_t row_begin,
                         size_t row_end, float* y, size_t y_stride, const Decode& decode,
                         const Prefetch& prefetch, const XBlock& x_block, const Finish& finish) {
  const size_t group = GroupTokens(tokens, cols);
  float* wd =
      internal::ThreadScratch(internal::ScratchSlot::kDecodedPanel, kPanelRows * kPanelCols);
  float* acc =
      internal::ThreadScratch(internal::ScratchSlot::kAccumulators, kPanelRows * group * kLanes);
  const auto rows_at = [&](size_t r) { return std::min(kPanelRows, row_end - r); };
  for (size_t t0 = 0; t0 < tokens; t0 += group) {
    const size_t count = std::min(group, tokens - t0);
    for (size_t r = row_begin; r < row_end; r += kPanelRows) {
      for (size_t b = 0; b < blocks; ++b) {
        // The next panel: this one's next block, else the next rows' first (in this group or,
        // after the last rows, the next group).
        if (b + 1 < blocks) {
          prefetch(r, rows_at(r), b + 1);
        } else if (r + kPanelRows < row_end) {
          prefetch(r + kPanelRows, rows_at(r + kPanelRows), 0);
        } else if (t0 + group < tokens) {
          prefetch(row_begin, rows_at(row_begin), 0);
        }
        const size_t chunks = decode(r, rows_at(r), b, wd);
        PanelTiles({wd, kPanelCols, rows_at(r)}, x_block(b, t0, count), chunks, b == 0, acc);
      }
      finish(r, rows_at(r), t0, count, acc);
      StorePanel(acc, rows_at(r), count, y + t0 * y_stride + r, y_stride);
    }
  }
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace k3::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // per-target include guard
