#include "kernels/mxfp4.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/internal/scratch.h"

#ifndef K3_KERNELS_MXFP4_CC_ONCE_
#define K3_KERNELS_MXFP4_CC_ONCE_
namespace k3::kernels::detail {

alignas(64) inline constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                                                4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                                                -2.0f, -3.0f, -4.0f, -6.0f};
// Twice the E2M1 magnitude (an integer, so a byte shuffle can look it up) with the sign in bit
// 7. Sign-magnitude rather than two's complement keeps code 8 a negative zero.
alignas(16) inline constexpr uint8_t kE2M1DoubledSignMagnitude[16] = {
    0x00, 0x01, 0x02, 0x03, 0x04, 0x06, 0x08, 0x0C, 0x80, 0x81, 0x82, 0x83, 0x84, 0x86, 0x88, 0x8C};

// table[s] = 2^(s - bias) for s = 0..254 (subnormal where needed), NaN for s = 255.
constexpr std::array<float, 256> MakePow2Table(int bias) {
  std::array<float, 256> table{};
  for (int s = 0; s < 256; ++s) {
    const int field = s - bias + 127;  // biased fp32 exponent
    uint32_t bits = 0;
    if (s == 255) {
      bits = 0x7FC00000u;
    } else if (field >= 1) {
      bits = static_cast<uint32_t>(field) << 23;
    } else if (field >= -22) {
      bits = 1u << (22 + field);
    }
    table[s] = std::bit_cast<float>(bits);
  }
  return table;
}
alignas(64) inline constexpr std::array<float, 256> kE8M0 = MakePow2Table(127);
// Half the scale, to undo the doubling of kE2M1DoubledSignMagnitude. Products stay exact: both
// factors are small integers times powers of two.
alignas(64) inline constexpr std::array<float, 256> kHalfE8M0 = MakePow2Table(128);

// The activation layout of Mxfp4Activations, the same on every target: column block b (512
// columns, 16 groups) of token t starts at (b * tokens + t) * kLayoutBlockCols, and within a
// group the 16 even columns come before the 16 odd ones (the order GroupDecoder decodes in).
inline constexpr size_t kLayoutBlockGroups = 16;
// Its vectors are loaded aligned: Mxfp4Activations and the scratch buffers are aligned to this.
static_assert(HWY_ALIGNMENT >= 64, "64-byte vector loads need 64-byte aligned buffers");
inline constexpr size_t kLayoutBlockCols = kLayoutBlockGroups * 32;

inline size_t LayoutBlocks(size_t cols) {
  return (cols / 32 + kLayoutBlockGroups - 1) / kLayoutBlockGroups;
}
inline size_t LaidOutSize(size_t tokens, size_t cols) {
  return LayoutBlocks(cols) * tokens * kLayoutBlockCols;
}
// Offset of group g of token t in the layout.
inline size_t LaidOutGroup(size_t tokens, size_t t, size_t g) {
  return ((g / kLayoutBlockGroups) * tokens + t) * kLayoutBlockCols + (g % kLayoutBlockGroups) * 32;
}

}  // namespace k3::kernels::detail
#endif  // K3_KERNELS_MXFP4_CC_ONCE_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/mxfp4.cc"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/internal/panel-inl.h"
#include "kernels/internal/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace k3::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
// Internal linkage: the per-target helpers of different files share a namespace.
namespace {

// Index of the first 0xFF in p[0, n), n if none.
size_t FindInvalidScaleImpl(const uint8_t* HWY_RESTRICT p, size_t n) {
  const hn::ScalableTag<uint8_t> d;
  const size_t lanes = hn::Lanes(d);
  const auto invalid = hn::Set(d, kMxfp4InvalidScale);
  size_t i = 0;
  // Four vectors per test keeps the loop bound by loads rather than by the branch.
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const auto m01 =
        hn::Or(hn::Eq(hn::LoadU(d, p + i), invalid), hn::Eq(hn::LoadU(d, p + i + lanes), invalid));
    const auto m23 = hn::Or(hn::Eq(hn::LoadU(d, p + i + 2 * lanes), invalid),
                            hn::Eq(hn::LoadU(d, p + i + 3 * lanes), invalid));
    if (!hn::AllFalse(d, hn::Or(m01, m23))) break;
  }
  for (; i + lanes <= n; i += lanes) {
    const intptr_t first = hn::FindFirstTrue(d, hn::Eq(hn::LoadU(d, p + i), invalid));
    if (first >= 0) return i + static_cast<size_t>(first);
  }
  for (; i < n; ++i) {
    if (p[i] == kMxfp4InvalidScale) return i;
  }
  return n;
}

#if HWY_TARGET == HWY_SCALAR

// One-lane vectors gain nothing over the scalar twins.
void DecodeRowImpl(const uint8_t* packed, const uint8_t* scales, size_t cols, float* out) {
  DecodeMxfp4RowScalar({packed, cols / 2}, {scales, cols / kMxfp4GroupSize}, {out, cols});
}
void LayOutImpl(const float* HWY_RESTRICT x, size_t tokens, size_t cols, float* HWY_RESTRICT out) {
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t g = 0; g < cols / 32; ++g) {
      float* group = out + detail::LaidOutGroup(tokens, t, g);
      for (size_t m = 0; m < 16; ++m) {
        group[m] = x[t * cols + 32 * g + 2 * m];
        group[16 + m] = x[t * cols + 32 * g + 2 * m + 1];
      }
    }
  }
}
void MatMulImpl(const Mxfp4Matrix& w, const float* HWY_RESTRICT xb, size_t tokens, float* y,
                size_t row_begin, size_t row_end) {
  std::vector<float> x(w.cols);
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t g = 0; g < w.cols / 32; ++g) {
      const float* group = xb + detail::LaidOutGroup(tokens, t, g);
      for (size_t m = 0; m < 16; ++m) {
        x[32 * g + 2 * m] = group[m];
        x[32 * g + 2 * m + 1] = group[16 + m];
      }
    }
    Mxfp4MatVecScalar(w, x, {y + t * w.rows, w.rows}, row_begin, row_end);
  }
}

#else  // HWY_TARGET != HWY_SCALAR

// A group (32 columns: 16 packed bytes and one scale) decodes to kVecsPerGroup vectors: first
// the 16 even columns (low nibbles), then the 16 odd columns (high nibbles). The activations are
// permuted the same way (PermuteActivations), which is cheaper than interleaving the weights.
inline constexpr size_t kVecsPerGroup = 32 / kLanes;
inline constexpr size_t kVecsPerHalf = kVecsPerGroup / 2;

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3

// 16 fp32 lanes: the whole E2M1 table is one vector. Scaled by the group's power of two it holds
// the group's exact weights, and one lane permute per 16 nibbles picks them.
class GroupDecoder {
 public:
  GroupDecoder() : table_(hn::LoadU(DF(), detail::kE2M1)) {}

  HWY_INLINE void Decode(const uint8_t* HWY_RESTRICT bytes, uint8_t scale, VF* w) const {
    const DF df;
    const hn::RebindToSigned<DF> di;
    const hn::Rebind<uint8_t, DF> du8;
    const VF scaled = hn::Mul(table_, hn::Set(df, detail::kE8M0[scale]));
    const auto q = hn::PromoteTo(di, hn::LoadU(du8, bytes));
    // vpermps reads only the low 4 bits of each index, so the low nibble needs no mask (which
    // TableLookupLanes would require); this path is x86-only.
    w[0] = VF{_mm512_permutexvar_ps(q.raw, scaled.raw)};
    w[1] = VF{_mm512_permutexvar_ps(hn::ShiftRight<4>(q).raw, scaled.raw)};
  }

 private:
  VF table_;
};

#else

// Narrower vectors: look the nibbles up as small sign-magnitude integers with a byte shuffle,
// widen, convert and scale the magnitude, then OR in the sign. int -> float and the power-of-two
// product are exact, so the weights are too (including -0 for code 8).
class GroupDecoder {
 public:
  using D8 = hn::FixedTag<uint8_t, 16>;

  GroupDecoder() : table_(hn::LoadU(D8(), detail::kE2M1DoubledSignMagnitude)) {}

  HWY_INLINE void Decode(const uint8_t* HWY_RESTRICT bytes, uint8_t scale, VF* w) const {
    const D8 du8;
    const auto b = hn::LoadU(du8, bytes);
    alignas(16) int8_t q[32];
    hn::StoreU(hn::TableLookupBytes(table_, hn::And(b, hn::Set(du8, 0x0F))), du8,
               reinterpret_cast<uint8_t*>(q));
    hn::StoreU(hn::TableLookupBytes(table_, hn::ShiftRight<4>(b)), du8,
               reinterpret_cast<uint8_t*>(q + 16));
    const DF df;
    const hn::RebindToSigned<DF> di32;
    const hn::Rebind<int8_t, DF> di8;
    const VF half_scale = hn::Set(df, detail::kHalfE8M0[scale]);
    const auto magnitude_mask = hn::Set(di32, 0x7F);
    const auto sign_mask = hn::Set(di32, static_cast<int32_t>(0x80000000u));
    for (size_t j = 0; j < kVecsPerGroup; ++j) {
      // Sign extension copies bit 7 into bit 31.
      const auto v = hn::PromoteTo(di32, hn::LoadU(di8, q + j * kLanes));
      const VF magnitude = hn::Mul(hn::ConvertTo(df, hn::And(v, magnitude_mask)), half_scale);
      w[j] = hn::Or(magnitude, hn::BitCast(df, hn::And(v, sign_mask)));
    }
  }

 private:
  hn::Vec<D8> table_;
};

#endif

// A column block of the layout is a panel block: kPanelCols floats per block and token.
inline constexpr size_t kPanelGroups = detail::kLayoutBlockGroups;
static_assert(kPanelCols == detail::kLayoutBlockCols, "a layout block is a panel block");

// The layout of Mxfp4Activations: each 32-column group reordered to its 16 even then its 16 odd
// columns, in column blocks of kPanelCols per token.
void LayOutImpl(const float* HWY_RESTRICT x, size_t tokens, size_t cols, float* HWY_RESTRICT out) {
  const DF df;
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t g = 0; g < cols / kMxfp4GroupSize; ++g) {
      const float* in = x + t * cols + g * kMxfp4GroupSize;
      float* group = out + detail::LaidOutGroup(tokens, t, g);
      for (size_t j = 0; j < kVecsPerHalf; ++j) {
        VF even, odd;
        hn::LoadInterleaved2(df, in + 2 * kLanes * j, even, odd);
        hn::Store(even, df, group + kLanes * j);
        hn::Store(odd, df, group + 16 + kLanes * j);
      }
    }
  }
}

void DecodeRowImpl(const uint8_t* HWY_RESTRICT packed, const uint8_t* HWY_RESTRICT scales,
                   size_t cols, float* HWY_RESTRICT out) {
  const DF df;
  const GroupDecoder decoder;
  for (size_t g = 0; g < cols / kMxfp4GroupSize; ++g) {
    VF w[kVecsPerGroup];
    decoder.Decode(packed + 16 * g, scales[g], w);
    for (size_t j = 0; j < kVecsPerHalf; ++j) {
      hn::StoreInterleaved2(w[j], w[kVecsPerHalf + j], df, out + 32 * g + 2 * kLanes * j);
    }
  }
}

// kRows consecutive rows (row i at packed + i * groups * 16, scales + i * groups) times
// kTokens tokens from t0 of the laid-out batch xb of `tokens`: each group is decoded once for
// all the tokens, with one accumulator per (row, token) in registers (the canonical arithmetic).
// The kRows x kTokens independent chains also hide the latency of the multiply-adds.
inline constexpr size_t kPrefetchBlocks = 2;

template <size_t kRows, size_t kTokens>
HWY_INLINE void ProductBlock(const GroupDecoder& decoder, const uint8_t* HWY_RESTRICT packed,
                             const uint8_t* HWY_RESTRICT scales, size_t groups,
                             const float* HWY_RESTRICT xb, size_t tokens, size_t t0,
                             float* HWY_RESTRICT y, size_t y_stride) {
  const DF df;
  VF acc[kRows][kTokens];
  for (size_t i = 0; i < kRows; ++i) {
    for (size_t t = 0; t < kTokens; ++t) acc[i][t] = hn::Zero(df);
  }
  for (size_t g = 0; g < groups; ++g) {
    VF xv[kTokens][kVecsPerGroup];
    const float* xg = xb + detail::LaidOutGroup(tokens, t0, g);
    for (size_t t = 0; t < kTokens; ++t) {
      for (size_t j = 0; j < kVecsPerGroup; ++j) {
        xv[t][j] = hn::Load(df, xg + t * kPanelCols + j * kLanes);
      }
    }
    // Sweep the bytes of the row block kPrefetchBlocks ahead (rows are contiguous, so that is
    // a linear range) at the pace this block is consumed. The hardware prefetchers alone lose
    // track of the kRows interleaved streams: cold matrices then ran at about half the speed.
    const size_t ahead = kPrefetchBlocks * kRows * groups;
    hwy::Prefetch(packed + (ahead + g * kRows) * 16);
    if (g % 16 == 0) hwy::Prefetch(scales + ahead + g * kRows);
    for (size_t i = 0; i < kRows; ++i) {
      VF w[kVecsPerGroup];
      decoder.Decode(packed + (i * groups + g) * 16, scales[i * groups + g], w);
      for (size_t t = 0; t < kTokens; ++t) {
        for (size_t j = 0; j < kVecsPerGroup; ++j)
          acc[i][t] = hn::MulAdd(w[j], xv[t][j], acc[i][t]);
      }
    }
  }
  for (size_t i = 0; i < kRows; ++i) {
    for (size_t t = 0; t < kTokens; ++t) y[t * y_stride + i] = ReduceAcc(acc[i][t]);
  }
}

// Y[t, r] for r in [row_begin, row_end); xb holds the tokens laid out. Rows go in blocks, and a
// block meets every token (kBlockTokens at a time) before the next, so each weight byte comes
// from memory once; later token blocks decode the block's rows again from L1.
void Product(const Mxfp4Matrix& w, const float* xb, size_t tokens, float* y, size_t row_begin,
             size_t row_end) {
  const size_t groups = w.cols / kMxfp4GroupSize;
  const GroupDecoder decoder;
  const auto rows = [&]<size_t kRows>(size_t r) {
    const uint8_t* packed = w.packed.data() + r * groups * 16;
    const uint8_t* scales = w.scales.data() + r * groups;
    ForEachTokenBlock(tokens, [&]<size_t kTokens>(size_t t0) {
      ProductBlock<kRows, kTokens>(decoder, packed, scales, groups, xb, tokens, t0,
                                   y + t0 * w.rows + r, w.rows);
    });
  };
  size_t r = row_begin;
  for (; r + kBlockRows <= row_end; r += kBlockRows) rows.template operator()<kBlockRows>(r);
  for (; r < row_end; ++r) rows.template operator()<1>(r);
}

// ---- Panel product (larger batches, kernels/internal/panel-inl.h) ---------------------------

void PanelProduct(const Mxfp4Matrix& w, const float* xb, size_t tokens, float* y, size_t row_begin,
                  size_t row_end) {
  const size_t groups = w.cols / kMxfp4GroupSize;
  const uint8_t* packed = w.packed.data();
  const uint8_t* scales = w.scales.data();
  const GroupDecoder decoder;
  const auto decode = [&](size_t r, size_t rows, size_t b, float* HWY_RESTRICT wd) {
    const DF df;
    const size_t g0 = b * kPanelGroups, count = std::min(kPanelGroups, groups - g0);
    for (size_t i = 0; i < rows; ++i) {
      const uint8_t* row = packed + ((r + i) * groups + g0) * 16;
      const uint8_t* row_scales = scales + (r + i) * groups + g0;
      for (size_t g = 0; g < count; ++g) {
        VF v[kVecsPerGroup];
        decoder.Decode(row + g * 16, row_scales[g], v);
        for (size_t j = 0; j < kVecsPerGroup; ++j) {
          hn::Store(v[j], df, wd + i * kPanelCols + (g * kVecsPerGroup + j) * kLanes);
        }
      }
    }
    return count * kVecsPerGroup;
  };
  // The panel's packed bytes (the scales are 1/16 as many and measured no faster prefetched).
  const auto prefetch = [&](size_t r, size_t rows, size_t b) {
    for (size_t i = 0; i < rows; ++i) {
      const uint8_t* row = packed + ((r + i) * groups + b * kPanelGroups) * 16;
      for (size_t k = 0; k < kPanelGroups * 16; k += 64) hwy::Prefetch(row + k);
    }
  };
  // Block b of the layout holds every token's columns [512 b, 512 b + 512), token after token.
  const auto x_block = [&](size_t b, size_t t0, size_t count) {
    return PanelOperand{xb + (b * tokens + t0) * kPanelCols, kPanelCols, count};
  };
  GroupedPanelProduct(detail::LayoutBlocks(w.cols), tokens, w.cols, row_begin, row_end, y, w.rows,
                      decode, prefetch, x_block, [](size_t, size_t, size_t, size_t, float*) {});
}

// xb: the batch laid out by LayOutImpl.
void MatMulImpl(const Mxfp4Matrix& w, const float* xb, size_t tokens, float* y, size_t row_begin,
                size_t row_end) {
  if (tokens >= kPanelMinTokens) return PanelProduct(w, xb, tokens, y, row_begin, row_end);
  Product(w, xb, tokens, y, row_begin, row_end);
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace
}  // namespace k3::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3::kernels {

HWY_EXPORT(FindInvalidScaleImpl);
HWY_EXPORT(DecodeRowImpl);
HWY_EXPORT(MatMulImpl);
HWY_EXPORT(LayOutImpl);

namespace {

[[noreturn]] void Fail(const std::string& what) {
  throw std::invalid_argument("k3::kernels::" + what);
}

void CheckMatrix(const Mxfp4Matrix& w, const char* fn) {
  if (w.cols == 0 || w.cols % kMxfp4GroupSize != 0) {
    Fail(std::string(fn) + ": cols " + std::to_string(w.cols) +
         " is not a positive multiple of 32");
  }
  if (w.packed.size() != w.rows * w.cols / 2 ||
      w.scales.size() != w.rows * w.cols / kMxfp4GroupSize) {
    Fail(std::string(fn) + ": packed/scale sizes do not match a " + std::to_string(w.rows) + "x" +
         std::to_string(w.cols) + " matrix");
  }
}

void CheckProduct(const Mxfp4Matrix& w, size_t x_size, size_t y_size, size_t tokens,
                  size_t row_begin, size_t row_end, const char* fn) {
  CheckMatrix(w, fn);
  if (x_size != tokens * w.cols || y_size != tokens * w.rows) {
    Fail(std::string(fn) + ": activation or output size does not match the matrix");
  }
  if (row_begin > row_end || row_end > w.rows) {
    Fail(std::string(fn) + ": bad row range [" + std::to_string(row_begin) + ", " +
         std::to_string(row_end) + ")");
  }
}

void CheckRow(std::span<const uint8_t> packed_row, std::span<const uint8_t> scale_row,
              std::span<float> out, const char* fn) {
  const size_t cols = out.size();
  if (cols % kMxfp4GroupSize != 0 || packed_row.size() * 2 != cols ||
      scale_row.size() * kMxfp4GroupSize != cols) {
    Fail(std::string(fn) + ": row sizes do not match");
  }
}

// The product for callers that pass X as is: laid out in this thread's scratch.
void MatMulViaScratch(const Mxfp4Matrix& w, std::span<const float> x, size_t tokens,
                      std::span<float> y, size_t row_begin, size_t row_end) {
  float* xb = internal::ThreadScratch(internal::ScratchSlot::kActivations,
                                      detail::LaidOutSize(tokens, w.cols));
  HWY_DYNAMIC_DISPATCH(LayOutImpl)(x.data(), tokens, w.cols, xb);
  HWY_DYNAMIC_DISPATCH(MatMulImpl)(w, xb, tokens, y.data(), row_begin, row_end);
}

}  // namespace

float E2M1Value(uint8_t code) { return detail::kE2M1[code & 0x0F]; }

float E8M0Value(uint8_t scale) {
  if (scale == kMxfp4InvalidScale) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, static_cast<int>(scale) - 127);
}

void DecodeMxfp4Row(std::span<const uint8_t> packed_row, std::span<const uint8_t> scale_row,
                    std::span<float> out) {
  CheckRow(packed_row, scale_row, out, "DecodeMxfp4Row");
  HWY_DYNAMIC_DISPATCH(DecodeRowImpl)(packed_row.data(), scale_row.data(), out.size(), out.data());
}

void DecodeMxfp4RowScalar(std::span<const uint8_t> packed_row, std::span<const uint8_t> scale_row,
                          std::span<float> out) {
  CheckRow(packed_row, scale_row, out, "DecodeMxfp4RowScalar");
  for (size_t k = 0; k < out.size(); ++k) {
    const uint8_t byte = packed_row[k / 2];
    const uint8_t code = (k % 2 == 0) ? (byte & 0x0F) : (byte >> 4);  // low nibble = even column
    const uint8_t scale = scale_row[k / kMxfp4GroupSize];
    out[k] = scale == kMxfp4InvalidScale
                 ? std::numeric_limits<float>::quiet_NaN()
                 : std::ldexp(E2M1Value(code), static_cast<int>(scale) - 127);
  }
}

std::optional<size_t> FindInvalidMxfp4Scale(std::span<const uint8_t> scales) {
  const size_t i = HWY_DYNAMIC_DISPATCH(FindInvalidScaleImpl)(scales.data(), scales.size());
  if (i == scales.size()) return std::nullopt;
  return i;
}

std::optional<size_t> FindInvalidMxfp4ScaleScalar(std::span<const uint8_t> scales) {
  for (size_t i = 0; i < scales.size(); ++i) {
    if (scales[i] == kMxfp4InvalidScale) return i;
  }
  return std::nullopt;
}

void Mxfp4MatVec(const Mxfp4Matrix& w, std::span<const float> x, std::span<float> y,
                 size_t row_begin, size_t row_end) {
  CheckProduct(w, x.size(), y.size(), 1, row_begin, row_end, "Mxfp4MatVec");
  if (row_begin == row_end) return;
  MatMulViaScratch(w, x, 1, y, row_begin, row_end);
}

void Mxfp4MatVecScalar(const Mxfp4Matrix& w, std::span<const float> x, std::span<float> y,
                       size_t row_begin, size_t row_end) {
  CheckProduct(w, x.size(), y.size(), 1, row_begin, row_end, "Mxfp4MatVecScalar");
  const size_t packed_cols = w.cols / 2;
  const size_t scale_cols = w.cols / kMxfp4GroupSize;
  std::vector<float> row(w.cols);
  for (size_t r = row_begin; r < row_end; ++r) {
    DecodeMxfp4RowScalar(w.packed.subspan(r * packed_cols, packed_cols),
                         w.scales.subspan(r * scale_cols, scale_cols), row);
    // Double accumulation: the reference the SIMD kernels are measured against.
    double sum = 0.0;
    for (size_t k = 0; k < w.cols; ++k) sum += static_cast<double>(row[k]) * x[k];
    y[r] = static_cast<float>(sum);
  }
}

void Mxfp4MatMul(const Mxfp4Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
                 size_t row_begin, size_t row_end) {
  CheckProduct(w, x.size(), y.size(), tokens, row_begin, row_end, "Mxfp4MatMul");
  if (row_begin == row_end || tokens == 0) return;
  MatMulViaScratch(w, x, tokens, y, row_begin, row_end);
}

void Mxfp4Activations::Assign(std::span<const float> x, size_t tokens, size_t cols) {
  if (cols == 0 || cols % kMxfp4GroupSize != 0 || x.size() != tokens * cols) {
    Fail("Mxfp4Activations::Assign: " + std::to_string(x.size()) + " floats are not " +
         std::to_string(tokens) + " tokens of a positive multiple of 32 columns (" +
         std::to_string(cols) + ")");
  }
  const size_t size = detail::LaidOutSize(tokens, cols);
  if (capacity_ < size) {
    storage_ = hwy::AllocateAligned<float>(size);
    capacity_ = size;
  }
  tokens_ = tokens;
  cols_ = cols;
  if (tokens > 0) HWY_DYNAMIC_DISPATCH(LayOutImpl)(x.data(), tokens, cols, storage_.get());
}

void Mxfp4MatMul(const Mxfp4Matrix& w, const Mxfp4Activations& x, std::span<float> y,
                 size_t row_begin, size_t row_end) {
  if (x.cols() != w.cols) {
    Fail("Mxfp4MatMul: activations of " + std::to_string(x.cols()) + " columns for a matrix of " +
         std::to_string(w.cols));
  }
  CheckProduct(w, x.tokens() * w.cols, y.size(), x.tokens(), row_begin, row_end, "Mxfp4MatMul");
  if (row_begin == row_end || x.tokens() == 0) return;
  HWY_DYNAMIC_DISPATCH(MatMulImpl)(w, x.laid_out(), x.tokens(), y.data(), row_begin, row_end);
}

void Mxfp4MatMulScalar(const Mxfp4Matrix& w, std::span<const float> x, size_t tokens,
                       std::span<float> y, size_t row_begin, size_t row_end) {
  CheckProduct(w, x.size(), y.size(), tokens, row_begin, row_end, "Mxfp4MatMulScalar");
  for (size_t t = 0; t < tokens; ++t) {
    Mxfp4MatVecScalar(w, x.subspan(t * w.cols, w.cols), y.subspan(t * w.rows, w.rows), row_begin,
                      row_end);
  }
}

}  // namespace k3::kernels
#endif  // HWY_ONCE
