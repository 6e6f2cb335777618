#include "kernels/bf16.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/bf16.cc"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "kernels/internal/panel-inl.h"
#include "kernels/internal/scratch.h"
#include "kernels/internal/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace k3::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
// Internal linkage: the per-target helpers of different files share a namespace.
namespace {

#if HWY_TARGET == HWY_SCALAR

void WidenImpl(const uint16_t* in, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = Bf16ToF32(in[i]);
}
void MatMulImpl(const Bf16Matrix& w, const float* x, size_t tokens, float* y, size_t row_begin,
                size_t row_end) {
  Bf16MatMulScalar(w, {x, tokens * w.cols}, tokens, {y, tokens * w.rows}, row_begin, row_end);
}

#else  // HWY_TARGET != HWY_SCALAR

// kLanes bfloat16 -> fp32, exactly: the 16 bits become the upper half of each lane.
HWY_INLINE VF WidenBf16(const uint16_t* HWY_RESTRICT p) {
  const DF df;
  const hn::RebindToUnsigned<DF> du32;
  const hn::Rebind<uint16_t, DF> du16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du32, hn::LoadU(du16, p))));
}

// The last n < kLanes values of a row, zero-padded (the canonical tail chunk).
HWY_INLINE VF WidenBf16Tail(const uint16_t* HWY_RESTRICT p, size_t n) {
  alignas(64) uint16_t buf[kLanes] = {};
  std::memcpy(buf, p, n * sizeof(uint16_t));
  return WidenBf16(buf);
}

HWY_INLINE VF LoadTail(const float* HWY_RESTRICT p, size_t n) {
  alignas(64) float buf[kLanes] = {};
  std::memcpy(buf, p, n * sizeof(float));
  return hn::Load(DF(), buf);
}

void WidenImpl(const uint16_t* HWY_RESTRICT in, size_t n, float* HWY_RESTRICT out) {
  const DF df;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) hn::StoreU(WidenBf16(in + i), df, out + i);
  for (; i < n; ++i) out[i] = Bf16ToF32(in[i]);
}

// kRows consecutive rows starting at w (stride cols) times kTokens tokens starting at x
// (stride cols): each weight chunk is widened once for all the tokens, with one accumulator per
// (row, token) in registers (the canonical arithmetic, with a zero-padded tail chunk).
// 2 KiB ahead in each row (prefetching past a row's end is harmless).
inline constexpr size_t kPrefetchValues = 1024;

template <size_t kRows, size_t kTokens>
HWY_INLINE void ProductBlock(const uint16_t* HWY_RESTRICT w, size_t cols,
                             const float* HWY_RESTRICT x, float* HWY_RESTRICT y, size_t y_stride) {
  const DF df;
  VF acc[kRows][kTokens];
  for (size_t i = 0; i < kRows; ++i) {
    for (size_t t = 0; t < kTokens; ++t) acc[i][t] = hn::Zero(df);
  }
  const size_t full = cols / kLanes * kLanes;
  for (size_t c = 0; c < full; c += kLanes) {
    // Once per 64-byte line of each row, ask for the line kPrefetchValues ahead: with kRows
    // interleaved streams the hardware prefetchers alone reached only about 60 % of the read
    // bandwidth on cold matrices.
    if (c % 32 == 0) {
      for (size_t i = 0; i < kRows; ++i) hwy::Prefetch(w + i * cols + c + kPrefetchValues);
    }
    VF wv[kRows];
    for (size_t i = 0; i < kRows; ++i) wv[i] = WidenBf16(w + i * cols + c);
    for (size_t t = 0; t < kTokens; ++t) {
      const VF xv = hn::LoadU(df, x + t * cols + c);
      for (size_t i = 0; i < kRows; ++i) acc[i][t] = hn::MulAdd(wv[i], xv, acc[i][t]);
    }
  }
  if (full < cols) {
    VF wv[kRows];
    for (size_t i = 0; i < kRows; ++i) wv[i] = WidenBf16Tail(w + i * cols + full, cols - full);
    for (size_t t = 0; t < kTokens; ++t) {
      const VF xv = LoadTail(x + t * cols + full, cols - full);
      for (size_t i = 0; i < kRows; ++i) acc[i][t] = hn::MulAdd(wv[i], xv, acc[i][t]);
    }
  }
  for (size_t i = 0; i < kRows; ++i) {
    for (size_t t = 0; t < kTokens; ++t) y[t * y_stride + i] = ReduceAcc(acc[i][t]);
  }
}

// Y[t, r] for r in [row_begin, row_end). Rows go in blocks, and a block meets every token
// (kBlockTokens at a time) before the next, so each weight byte comes from memory once; later
// token blocks read the block's rows again from L1/L2.
void Product(const Bf16Matrix& w, const float* x, size_t tokens, float* y, size_t row_begin,
             size_t row_end) {
  const auto rows = [&]<size_t kRows>(size_t r) {
    const uint16_t* block = w.data.data() + r * w.cols;
    ForEachTokenBlock(tokens, [&]<size_t kTokens>(size_t t0) {
      ProductBlock<kRows, kTokens>(block, w.cols, x + t0 * w.cols, y + t0 * w.rows + r, w.rows);
    });
  };
  size_t r = row_begin;
  for (; r + kBlockRows <= row_end; r += kBlockRows) rows.template operator()<kBlockRows>(r);
  for (; r < row_end; ++r) rows.template operator()<1>(r);
}

// Larger batches: the panel product of kernels/internal/panel-inl.h over the full chunks (each
// weight widened once for all the tokens), then the zero-padded tail chunk.
void PanelGroupProduct(const Bf16Matrix& w, const float* x, size_t tokens, float* y,
                       size_t row_begin, size_t row_end) {
  const size_t cols = w.cols, full = cols / kLanes * kLanes, tail = cols - full;
  const size_t blocks = (full + kPanelCols - 1) / kPanelCols;
  const uint16_t* data = w.data.data();
  // The full chunks copied in column blocks, token after token within a block: rows of 1024 or
  // 7168 columns are a multiple of 4 KiB apart, so a tile's tokens read in place all fall into
  // the same L1 sets (the product at 64 tokens ran at 0.7-0.8x the speed). The copy is a load
  // and a store per vector against `rows` multiply-adds: about 3 % of a 64-row task.
  float* xl =
      internal::ThreadScratch(internal::ScratchSlot::kActivations, blocks * tokens * kPanelCols);
  for (size_t b = 0; b < blocks; ++b) {
    const size_t c0 = b * kPanelCols, n = std::min(kPanelCols, full - c0);
    for (size_t t = 0; t < tokens; ++t) {
      std::memcpy(xl + (b * tokens + t) * kPanelCols, x + t * cols + c0, n * sizeof(float));
    }
  }
  const auto decode = [&](size_t r, size_t rows, size_t b, float* HWY_RESTRICT wd) {
    const DF df;
    const size_t c0 = b * kPanelCols, n = std::min(kPanelCols, full - c0);
    for (size_t i = 0; i < rows; ++i) {
      const uint16_t* row = data + (r + i) * cols + c0;
      for (size_t c = 0; c < n; c += kLanes) {
        hn::Store(WidenBf16(row + c), df, wd + i * kPanelCols + c);
      }
    }
    return n / kLanes;
  };
  const auto prefetch = [&](size_t r, size_t rows, size_t b) {
    const size_t c0 = b * kPanelCols, bytes = std::min(kPanelCols, cols - c0) * sizeof(uint16_t);
    for (size_t i = 0; i < rows; ++i) {
      const auto* row = reinterpret_cast<const uint8_t*>(data + (r + i) * cols + c0);
      for (size_t k = 0; k < bytes; k += 64) hwy::Prefetch(row + k);
    }
  };
  const auto x_block = [&](size_t b, size_t t0, size_t count) {
    return PanelOperand{xl + (b * tokens + t0) * kPanelCols, kPanelCols, count};
  };
  const auto finish = [&](size_t r, size_t rows, size_t t0, size_t count, float* HWY_RESTRICT acc) {
    if (tail == 0) return;
    const DF df;
    VF wv[kPanelRows];
    for (size_t i = 0; i < rows; ++i) wv[i] = WidenBf16Tail(data + (r + i) * cols + full, tail);
    for (size_t t = 0; t < count; ++t) {
      const VF xv = LoadTail(x + (t0 + t) * cols + full, tail);
      for (size_t i = 0; i < rows; ++i) {
        float* a = acc + (t * rows + i) * kLanes;
        hn::Store(hn::MulAdd(wv[i], xv, hn::Load(df, a)), df, a);
      }
    }
  };
  GroupedPanelProduct(blocks, tokens, cols, row_begin, row_end, y, w.rows, decode, prefetch,
                      x_block, finish);
}

// One token group at a time (GroupTokens: what L2 keeps), so that the copy of the activations in
// this thread's scratch is one group's, not the whole chunk's: at Kimi K3's 33,792-wide dense
// layer the whole chunk's copy took 135 KB per token in each compute thread, the largest share
// of a long prompt's memory. GroupedPanelProduct goes group by group anyway: the same sequence
// of operations, the same bits.
void PanelProduct(const Bf16Matrix& w, const float* x, size_t tokens, float* y, size_t row_begin,
                  size_t row_end) {
  const size_t group = GroupTokens(tokens, w.cols);
  for (size_t t0 = 0; t0 < tokens; t0 += group) {
    PanelGroupProduct(w, x + t0 * w.cols, std::min(group, tokens - t0), y + t0 * w.rows, row_begin,
                      row_end);
  }
}

void MatMulImpl(const Bf16Matrix& w, const float* x, size_t tokens, float* y, size_t row_begin,
                size_t row_end) {
  if (tokens >= kPanelMinTokens && w.cols >= kLanes) {
    return PanelProduct(w, x, tokens, y, row_begin, row_end);
  }
  Product(w, x, tokens, y, row_begin, row_end);
}

#endif  // HWY_TARGET != HWY_SCALAR

}  // namespace
}  // namespace k3::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace k3::kernels {

HWY_EXPORT(WidenImpl);
HWY_EXPORT(MatMulImpl);

namespace {

void CheckProduct(const Bf16Matrix& w, size_t x_size, size_t y_size, size_t tokens,
                  size_t row_begin, size_t row_end, const char* fn) {
  const auto fail = [fn](const std::string& what) {
    throw std::invalid_argument(std::string("k3::kernels::") + fn + ": " + what);
  };
  if (w.cols == 0 || w.data.size() != w.rows * w.cols) fail("data size does not match rows x cols");
  if (x_size != tokens * w.cols || y_size != tokens * w.rows) {
    fail("activation or output size does not match the matrix");
  }
  if (row_begin > row_end || row_end > w.rows) fail("bad row range");
}

}  // namespace

void Bf16ToF32(std::span<const uint16_t> in, std::span<float> out) {
  if (in.size() != out.size()) throw std::invalid_argument("k3::kernels::Bf16ToF32: size mismatch");
  HWY_DYNAMIC_DISPATCH(WidenImpl)(in.data(), in.size(), out.data());
}

void Bf16MatVec(const Bf16Matrix& w, std::span<const float> x, std::span<float> y, size_t row_begin,
                size_t row_end) {
  CheckProduct(w, x.size(), y.size(), 1, row_begin, row_end, "Bf16MatVec");
  if (row_begin == row_end) return;
  HWY_DYNAMIC_DISPATCH(MatMulImpl)(w, x.data(), 1, y.data(), row_begin, row_end);
}

void Bf16MatVecScalar(const Bf16Matrix& w, std::span<const float> x, std::span<float> y,
                      size_t row_begin, size_t row_end) {
  CheckProduct(w, x.size(), y.size(), 1, row_begin, row_end, "Bf16MatVecScalar");
  for (size_t r = row_begin; r < row_end; ++r) {
    // Double accumulation: the reference the SIMD kernels are measured against.
    double sum = 0.0;
    for (size_t k = 0; k < w.cols; ++k) {
      sum += static_cast<double>(Bf16ToF32(w.data[r * w.cols + k])) * x[k];
    }
    y[r] = static_cast<float>(sum);
  }
}

void Bf16MatMul(const Bf16Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
                size_t row_begin, size_t row_end) {
  CheckProduct(w, x.size(), y.size(), tokens, row_begin, row_end, "Bf16MatMul");
  if (row_begin == row_end || tokens == 0) return;
  HWY_DYNAMIC_DISPATCH(MatMulImpl)(w, x.data(), tokens, y.data(), row_begin, row_end);
}

void Bf16MatMulScalar(const Bf16Matrix& w, std::span<const float> x, size_t tokens,
                      std::span<float> y, size_t row_begin, size_t row_end) {
  CheckProduct(w, x.size(), y.size(), tokens, row_begin, row_end, "Bf16MatMulScalar");
  for (size_t t = 0; t < tokens; ++t) {
    Bf16MatVecScalar(w, x.subspan(t * w.cols, w.cols), y.subspan(t * w.rows, w.rows), row_begin,
                     row_end);
  }
}

}  // namespace k3::kernels
#endif  // HWY_ONCE
