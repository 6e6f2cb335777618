// MXFP4 (OCP microscaling FP4) weights: decoding, scale validation and matrix products.
//
// Layout (MODEL.md 3.3): a logical matrix W [rows, cols] (cols a multiple of 32) is stored as
//   packed [rows, cols / 2]:  byte (r, c) holds W[r, 2c] in its low nibble, W[r, 2c + 1] in its
//                             high nibble; each nibble is an E2M1 code;
//   scales [rows, cols / 32]: one E8M0 byte per 32 consecutive columns of a row;
//   W[r, k] = E2M1(nibble) * 2^(scale - 127).
//
// Every kernel works on a row range [row_begin, row_end) and is single-threaded, so a caller can
// split rows across threads; the arithmetic of a row never depends on the range it was computed
// in, nor on how many threads there are. Each SIMD kernel (runtime dispatch: AVX-512, AVX2, SSE4,
// NEON, ...) has a `...Scalar` twin used as the reference by the tests.
#ifndef K3_KERNELS_MXFP4_H_
#define K3_KERNELS_MXFP4_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>

#include "hwy/aligned_allocator.h"

namespace k3::kernels {

inline constexpr size_t kMxfp4GroupSize = 32;
// E8M0 0xFF is NaN. The engine treats it as a corrupt checkpoint (MODEL.md Q3), so callers scan
// with FindInvalidMxfp4Scale before using a matrix; the product kernels would propagate NaN.
inline constexpr uint8_t kMxfp4InvalidScale = 0xFF;

// A read-only view of one MXFP4 matrix. The spans must hold exactly rows * cols / 2 and
// rows * cols / 32 bytes; cols must be a positive multiple of 32.
struct Mxfp4Matrix {
  std::span<const uint8_t> packed;
  std::span<const uint8_t> scales;
  size_t rows = 0;
  size_t cols = 0;
};

// The value of E2M1 code `code` (0..15): 0, 0.5, 1, 1.5, 2, 3, 4, 6, then the negatives.
float E2M1Value(uint8_t code);
// 2^(scale - 127) as fp32 (0x00 gives the subnormal 2^-127), NaN for 0xFF.
float E8M0Value(uint8_t scale);

// Decodes one row: packed_row has cols / 2 bytes, scale_row cols / 32 bytes, out cols floats.
// Exact: every output equals E2M1 * 2^(scale - 127) rounded once to fp32 (which only overflows
// to +-inf for scale 0xFE and |E2M1| >= 2).
void DecodeMxfp4Row(std::span<const uint8_t> packed_row, std::span<const uint8_t> scale_row,
                    std::span<float> out);
void DecodeMxfp4RowScalar(std::span<const uint8_t> packed_row, std::span<const uint8_t> scale_row,
                          std::span<float> out);

// Index of the first 0xFF byte in `scales`, or nullopt when there is none.
std::optional<size_t> FindInvalidMxfp4Scale(std::span<const uint8_t> scales);
std::optional<size_t> FindInvalidMxfp4ScaleScalar(std::span<const uint8_t> scales);

// y[r] = sum_k W[r, k] * x[k] for r in [row_begin, row_end).
// x has w.cols floats; y has w.rows floats, of which only [row_begin, row_end) are written.
void Mxfp4MatVec(const Mxfp4Matrix& w, std::span<const float> x, std::span<float> y,
                 size_t row_begin, size_t row_end);
void Mxfp4MatVecScalar(const Mxfp4Matrix& w, std::span<const float> x, std::span<float> y,
                       size_t row_begin, size_t row_end);

// The activations of a batched product, laid out once for the product kernels (each 32-column
// group as its 16 even then its 16 odd columns, in column blocks of 512 per token). A product
// split into row ranges across threads reads one layout instead of each range laying out the
// whole batch again, which at 40 tokens cost as much as a sixth of the product.
class Mxfp4Activations {
 public:
  // x is [tokens, cols] row-major; cols must be a positive multiple of 32. Storage is reused
  // when the next batch fits.
  void Assign(std::span<const float> x, size_t tokens, size_t cols);

  size_t tokens() const { return tokens_; }
  size_t cols() const { return cols_; }
  const float* laid_out() const { return storage_.get(); }

 private:
  hwy::AlignedFreeUniquePtr<float[]> storage_;
  size_t capacity_ = 0;
  size_t tokens_ = 0;
  size_t cols_ = 0;
};

// Y = X W^T on activations laid out by Mxfp4Activations (x.cols() must equal w.cols): the same
// results, bit for bit, as Mxfp4MatMul of the original X.
void Mxfp4MatMul(const Mxfp4Matrix& w, const Mxfp4Activations& x, std::span<float> y,
                 size_t row_begin, size_t row_end);

// Small-batch product Y = X W^T: X is [tokens, w.cols] and Y is [tokens, w.rows], both
// row-major; only columns [row_begin, row_end) of Y are written. Each weight byte is read from
// memory once for all tokens. Token t's results are bit-identical to Mxfp4MatVec of X[t] (same
// arithmetic), so batching tokens never changes an answer. Tuned for 1..64 tokens; any count
// works. Lays X out in a per-thread scratch buffer of about tokens * cols floats (kept between
// calls); callers that split one product across threads use Mxfp4Activations instead.
void Mxfp4MatMul(const Mxfp4Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
                 size_t row_begin, size_t row_end);
void Mxfp4MatMulScalar(const Mxfp4Matrix& w, std::span<const float> x, size_t tokens,
                       std::span<float> y, size_t row_begin, size_t row_end);

}  // namespace k3::kernels

#endif  // K3_KERNELS_MXFP4_H_
