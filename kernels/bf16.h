// BF16 weights times fp32 activations. A bfloat16 is passed as its raw 16 bits (uint16_t); it
// widens to fp32 exactly (the bits become the top half of the fp32).
//
// Like the MXFP4 kernels: single-threaded over a row range [row_begin, row_end), a row's
// arithmetic fixed and independent of the range and thread count, a scalar twin per kernel.
#ifndef K3_KERNELS_BF16_H_
#define K3_KERNELS_BF16_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <span>

namespace k3::kernels {

inline float Bf16ToF32(uint16_t bits) { return std::bit_cast<float>(uint32_t{bits} << 16); }

// Widens in.size() bfloat16 values into out (same size).
void Bf16ToF32(std::span<const uint16_t> in, std::span<float> out);

// A read-only view of a row-major BF16 matrix [rows, cols]; data holds rows * cols values.
struct Bf16Matrix {
  std::span<const uint16_t> data;
  size_t rows = 0;
  size_t cols = 0;
};

// y[r] = sum_k W[r, k] * x[k] for r in [row_begin, row_end); any cols >= 1.
// x has w.cols floats; y has w.rows floats, of which only [row_begin, row_end) are written.
void Bf16MatVec(const Bf16Matrix& w, std::span<const float> x, std::span<float> y, size_t row_begin,
                size_t row_end);
void Bf16MatVecScalar(const Bf16Matrix& w, std::span<const float> x, std::span<float> y,
                      size_t row_begin, size_t row_end);

// Y = X W^T with X [tokens, w.cols] and Y [tokens, w.rows] row-major; only columns
// [row_begin, row_end) of Y are written. Token t's results are bit-identical to Bf16MatVec of X[t].
void Bf16MatMul(const Bf16Matrix& w, std::span<const float> x, size_t tokens, std::span<float> y,
                size_t row_begin, size_t row_end);
void Bf16MatMulScalar(const Bf16Matrix& w, std::span<const float> x, size_t tokens,
                      std::span<float> y, size_t row_begin, size_t row_end);

}  // namespace k3::kernels

#endif  // K3_KERNELS_BF16_H_
